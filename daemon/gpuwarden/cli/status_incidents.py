"""The open incidents ``gpuwarden status`` shows under the GPUs: read only from the journal
of the config's state directory (``--state-dir``), when there is one, each with what is
next as the daemon last wrote it. Status never fails because of the journal: one that
cannot be read is one line saying why."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from gpuwarden import config
from gpuwarden.cli.common import journal, journal_path
from gpuwarden.errors import GpuwardenError
from gpuwarden.text import safe_text
from gpuwarden.units import format_duration


def read(args: argparse.Namespace, cfg: config.Config) -> tuple[list[Any], dict[str, Any], str]:
    """(open incidents, their next steps, a note); all empty when there is no journal."""
    path = journal_path(args, cfg)
    with contextlib.suppress(OSError):
        if not path.is_file():
            return [], {}, ""
    try:
        with journal(args, cfg) as reading:
            return reading.incidents(open_only=True), reading.next_steps(), ""
    except (GpuwardenError, OSError) as exc:
        text = getattr(exc, "message", None) or str(exc)
        return [], {}, f"open incidents: {safe_text(text)}"


def _flags(row: Any) -> str:
    flags = []
    if row.shadow:
        flags.append("shadow")
    if row.acked_at is not None:
        flags.append(f"acked by {row.acked_by}" if row.acked_by else "acked")
    if row.abort_at is not None:
        flags.append("abort asked")
    return "".join(f" [{safe_text(f)}]" for f in flags)


def render(rows: list[Any], upcoming: dict[str, Any], note: str, now: float, width: int) -> str:
    """The block under the GPU table ("" when nothing is open and nothing to say)."""
    from gpuwarden.journal.next_view import next_words

    if note:
        return _fit(note, width)
    if not rows:
        return ""
    lines = [f"open incidents ({len(rows)})"]
    for row in rows:
        took = format_duration(max(0.0, now - row.opened_at))
        head = (
            f"  {safe_text(row.id)}  {safe_text(row.severity or '?')}  "
            f"{safe_text(row.label or row.scope)}  open {took}{_flags(row)}"
        )
        lines.append(_fit(head, width))
        found = upcoming.get(row.id)
        if found is not None:
            lines.append(
                _fit(f"    next: {next_words(found[1], row.opened_at, now, found[0])}", width)
            )
    return "\n".join(lines)


def as_json(rows: list[Any], upcoming: dict[str, Any]) -> list[dict[str, Any]]:
    from gpuwarden.journal.next_view import next_json
    from gpuwarden.journal.view import incident_dict

    out = []
    for row in rows:
        doc = incident_dict(row)
        found = upcoming.get(row.id)
        doc["next"] = None if found is None else next_json(found[1], row.opened_at, found[0])
        out.append(doc)
    return out


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(1, width - 1)] + "…"
