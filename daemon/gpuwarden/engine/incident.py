"""The engine's bookkeeping: an open incident, the state of one rule for one scope, a tick's
records, and how incident ids and schedules are stamped. Pure data and arithmetic."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.model import Intent, RuleChange
from gpuwarden.timewindow import Schedule


@dataclass
class Incident:
    id: str
    rule: str
    scope: str
    label: str
    opened: float
    severity: str
    shadow: bool
    gpu: int | None
    next_step: int = 0
    running: dict[int, str] = field(default_factory=dict)  # step index -> intent id
    finished: set[int] = field(default_factory=set)
    waiting_noted: tuple[int, str] | None = None  # (step index, why) last noted as waiting
    # (step kind, pid, start time) of every process a step of this incident chose
    targeted: set[tuple[str, int, float | None]] = field(default_factory=set)
    event: Any = None
    # What the ladder last saw of the incident (its scope, that scope's environment, whether
    # `when` held): what ``Ladder.preview`` plans the next step on. Replaced every tick.
    seen: tuple[Any, Any, bool] | None = None


@dataclass
class ScopeState:
    phase: str = "inactive"  # inactive | pending | firing
    since: float = 0.0
    incident: Incident | None = None
    cooldown_until: float = 0.0
    cooldown_noted: bool = False
    label: str = ""
    # Aborted by a person: the scope does not fire again until `when` has been false once.
    stood_down: bool = False


@dataclass(frozen=True)
class Tick:
    records: tuple[RuleChange | Intent, ...]

    @property
    def changes(self) -> tuple[RuleChange, ...]:
        return tuple(r for r in self.records if isinstance(r, RuleChange))

    @property
    def intents(self) -> tuple[Intent, ...]:
        return tuple(r for r in self.records if isinstance(r, Intent))


def stamp(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def latest_instant(schedule: Schedule, last: float, now: float, tz: dt.tzinfo) -> float:
    """The latest scheduled instant in ``(last, now]`` (one is due). The next run counts from
    it, not from ``now``: ticks that miss the instants do not make an interval drift."""
    run = schedule.next_run(last, tz)
    if schedule.interval is not None:
        return run + (now - run) // schedule.interval * schedule.interval
    while (following := schedule.next_run(run, tz)) <= now:
        run = following
    return run
