"""Text shown to people: timestamps, and attacker-controlled strings made safe for a terminal.

Process names and command lines are chosen by the users whose jobs gpuwarden watches: before
they reach a terminal every control character is replaced, so a cmdline cannot move the cursor,
recolour the screen or hide itself. Every view (``status``, ``incident``, ``cloud``) uses these.
"""

from __future__ import annotations

import datetime as dt
import unicodedata


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
