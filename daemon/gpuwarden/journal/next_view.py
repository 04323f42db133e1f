"""An open incident's next step, as the daemon last wrote it (``journal.control.write_next``),
in words: ``next: kill at +2:00 (in 1:24), would target pid 6328 (bob, low, 28.9 GiB)``.

The daemon computes it with the planner in dry mode from its own latest snapshot: the views
never plan against live processes themselves (they may run without root, without NVML, and
without the engine's knowledge of what was already targeted). The age of the record is shown
when it is older than a few ticks, which says the daemon is not running.

JSON (``next`` in ``incidents --json`` and ``incident --json``)::

    {"step": index or null, "kind", "label", "due": ISO time or null, "due_from_firing":
     "+2:00", "state": "scheduled" | "due" | "after_previous" | "held" | "acknowledged" |
     "condition_not_holding" | "silenced" | "done", "detail", "targets": [target],
     "skipped": candidates left out, "selects": bool, "pause_on_ack": bool,
     "computed_at": ISO time}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuwarden.text import iso, safe_text

SHOWN_TARGETS = 3  # targets named in one line; the rest are counted
STALE_S = 30.0  # older than this, the line says how old it is


def _text(value: object, limit: int = 80) -> str:
    text = safe_text("" if value is None else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clock(delta: float) -> str:
    """``+M:SS`` (``-M:SS`` before firing)."""
    whole = round(delta)
    minutes, seconds = divmod(abs(whole), 60)
    return f"{'-' if whole < 0 else '+'}{minutes}:{seconds:02d}"


def target_words(target: Mapping[str, Any]) -> str:
    """``pid 6328 (bob, low, 28.9 GiB)``."""
    parts = [_text(target.get("user") or "?", 32), _text(target.get("priority") or "?", 32)]
    mib = target.get("gpu_memory_mib")
    if isinstance(mib, int | float):
        parts.append(f"{mib / 1024:.1f} GiB")
    return f"pid {target.get('pid')} ({', '.join(parts)})"


def targets_words(targets: Sequence[Mapping[str, Any]]) -> str:
    named = ", ".join(target_words(t) for t in targets[:SHOWN_TARGETS])
    more = len(targets) - SHOWN_TARGETS
    return named + (f" and {more} more" if more > 0 else "")


_STATES = {
    "after_previous": "after {detail}",
    "held": "ON HOLD {detail}",
    "acknowledged": "paused: acknowledged, and the rule pauses on ack",
    "condition_not_holding": "waiting: the rule's condition does not hold now",
    "silenced": "SILENCED {detail}: recorded, not acted on",
}


def next_words(data: Mapping[str, Any], opened: float, now: float, computed_at: float) -> str:
    """One line, without the leading ``next:``."""
    stale = now - computed_at
    age = f" [as of {iso(computed_at)}: is the daemon running?]" if stale > STALE_S else ""
    if data.get("step") is None:
        detail = data.get("detail")
        running = f"; {_text(detail)}" if detail else ""
        return f"none: every step has run; open until its condition clears{running}{age}"
    kind, label = _text(data.get("kind")), _text(data.get("label"))
    head = kind if label in ("", kind) else f"{kind} ({label})"
    due = data.get("due")
    text = head
    if isinstance(due, int | float):
        text += f" at {clock(due - opened)}"
        text += f" (in {clock(due - now)[1:]})" if due > now else " (due now)"
    state = str(data.get("state") or "")
    if state in _STATES:
        text += ", " + _STATES[state].format(detail=_text(data.get("detail"), 200))
    if data.get("selects"):
        targets = data.get("targets") or []
        if targets:
            text += f", would target {targets_words(targets)}"
        else:
            left = data.get("skipped") or 0
            text += ", would target nothing now" + (f" ({left} left out)" if left else "")
    return text + age


def next_json(data: Mapping[str, Any], opened: float, computed_at: float) -> dict[str, Any]:
    due = data.get("due")
    timed = isinstance(due, int | float)
    at = float(due) if isinstance(due, int | float) else 0.0
    return {
        "step": data.get("step"),
        "kind": data.get("kind"),
        "label": data.get("label"),
        "due": iso(at) if timed else None,
        "due_from_firing": clock(at - opened) if timed else None,
        "state": data.get("state"),
        "detail": data.get("detail") or "",
        "targets": list(data.get("targets") or []),
        "skipped": data.get("skipped", 0),
        "selects": bool(data.get("selects")),
        "pause_on_ack": bool(data.get("pause_on_ack")),
        "computed_at": iso(computed_at),
    }
