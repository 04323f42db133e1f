"""Text shown to people: timestamps, and attacker-controlled strings made safe for a terminal.

Process names and command lines are chosen by the users whose jobs gpuwarden watches: before
they reach a terminal every control character is replaced, so a cmdline cannot move the cursor,
recolour the screen or hide itself. Every view (``status``, ``incident``, ``cloud``) uses these.
"""

from __future__ import annotations

import datetime as dt
import re
import unicodedata

_SGR = re.compile(r"\x1b\[[0-9;]*m")  # the colour codes our views write, nothing else


def iso(ts: float) -> str:
    """A Unix time as ISO 8601 in UTC, to the second (``2026-12-01T03:00:00Z``)."""
    return (
        dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def safe_text(text: str) -> str:
    """Printable text only: control and format characters become ``?``."""
    return "".join(
        "?" if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn") else ch for ch in text
    )


def _cell(ch: str) -> int:
    """Terminal columns one character takes: 0 for a combining mark, 2 for a wide one."""
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def visible_width(text: str) -> int:
    """Columns ``text`` takes on a terminal (colour codes take none)."""
    return sum(_cell(ch) for ch in _SGR.sub("", text))


def fit(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` terminal columns, ending in ``…`` where cut; colour
    codes are kept whole, and a cut line ends its colour."""
    if visible_width(text) <= width:
        return text
    out: list[str] = []
    used = 0
    coloured = False
    for piece in re.split(f"({_SGR.pattern})", text):
        if _SGR.fullmatch(piece):
            out.append(piece)
            coloured = True
            continue
        for ch in piece:
            if used + _cell(ch) > width - 1:
                out.append("…")
                return "".join(out) + ("\x1b[0m" if coloured else "")
            out.append(ch)
            used += _cell(ch)
    return "".join(out)
