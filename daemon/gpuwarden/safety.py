"""Rails for destructive steps: rate limits per rule and overall, and a circuit breaker.

Two principles keep them from being turned against the machine they protect:

- **A step is trimmed, not refused whole.** A step that would act on more processes than the
  limits have room for acts on as many as there is room for, in the planner's order (the ones
  that free what is needed come first); the rest are recorded as ``rate_limited``. Only a step
  with no room at all is refused. So five decoy processes cannot make a kill of six targets,
  the one that matters among them, go away entirely.
- **What was done counts, not what was planned.** Room is reserved for a step while it runs and
  given back when it ends; then only its actions carried out are noted (a process killed,
  terminated or stopped; not one that had exited, was not needed after all, or could not be
  touched). The breaker trips on those actions, so a plan inflated on purpose trips nothing.

Counts live in the journal, so a restarted daemon remembers what it did in the last minutes.
A refused step is not an error of the executor: it is an outcome with the reason, recorded like
any other, and the ladder moves on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from gpuwarden.config import Safety
from gpuwarden.model import Intent, Outcome, Target, TargetResult
from gpuwarden.playbook.schema import DESTRUCTIVE_KINDS, SELECTING_KINDS
from gpuwarden.units import format_duration

# Per-target states that mean something was done to the process (``would``: in a dry run,
# what stands for it, so that a rehearsal meets the limits a real run would).
ACTED = frozenset({"terminated", "killed", "survived", "suspended", "unconfirmed", "would"})
RATE_LIMITED = "rate_limited"


class ActionLog(Protocol):
    def actions_since(self, t: float, rule: str | None = None, kinds: Any = None) -> int: ...

    def note_action(self, rule: str, kind: str, pid: int | None, now: float) -> None: ...

    def breaker(self) -> Any: ...

    def trip_breaker(self, reason: str, now: float) -> Any: ...


def destructive(intent: Intent) -> bool:
    return intent.kind in DESTRUCTIVE_KINDS and not intent.shadow


def weight(intent: Intent) -> int:
    """How many actions a step may take: one per process it acts on (at least one)."""
    return max(1, len(intent.targets))


def acted(outcome: Outcome) -> list[int | None]:
    """The processes a finished step acted on (their PIDs); a step without targets counts
    once when it succeeded."""
    if outcome.targets:
        return [r.pid for r in outcome.targets if r.state in ACTED]
    return [None] if outcome.ok else []


@dataclass(frozen=True)
class Admission:
    """What the rails let run: ``intent`` (all its targets, or the first ones), or nothing
    (``refused`` says why). ``dropped`` are the targets left out and ``note`` why."""

    intent: Intent
    refused: str | None = None
    dropped: tuple[Target, ...] = ()
    note: str = ""

    def completed(self, outcome: Outcome) -> Outcome:
        """The step's outcome with a ``rate_limited`` result for each target left out."""
        if not self.dropped:
            return outcome
        left = tuple(
            TargetResult(t.pid, t.create_time, False, RATE_LIMITED, self.note) for t in self.dropped
        )
        detail = f"{outcome.detail}; {len(left)} more not acted on: {self.note}"
        return replace(
            outcome, ok=False, detail=detail.lstrip("; "), targets=outcome.targets + left
        )


class Rails:
    """The limits of one config; ``update`` replaces them (reload) and keeps what is reserved
    for the steps still running."""

    def __init__(self, safety: Safety, log: ActionLog) -> None:
        self.safety = safety
        self.log = log
        self._reserved: dict[str, tuple[str, int]] = {}  # running intent id -> (rule, room)

    def update(self, safety: Safety) -> None:
        self.safety = safety

    def _in_flight(self, rule: str | None = None) -> int:
        return sum(n for r, n in self._reserved.values() if rule is None or r == rule)

    def admit(self, intent: Intent, now: float) -> Admission:
        """Let a step run whole, trimmed to the room left, or not at all. Only destructive,
        non-shadow steps with something to act on are limited; room is reserved for a step
        admitted until ``finish``."""
        if not destructive(intent) or (intent.kind in SELECTING_KINDS and not intent.targets):
            return Admission(intent)
        if self.log.breaker() is not None:
            return Admission(
                intent,
                refused="circuit breaker open: destructive steps are halted until "
                "`gpuwarden reset-breaker`",
            )
        wanted = weight(intent)
        rule_limit, overall = self.safety.per_rule, self.safety.overall
        rule_done = self._in_flight(intent.rule) + self.log.actions_since(
            now - rule_limit.window, rule=intent.rule, kinds=DESTRUCTIVE_KINDS
        )
        all_done = self._in_flight() + self.log.actions_since(
            now - overall.window, kinds=DESTRUCTIVE_KINDS
        )
        room = min(rule_limit.actions - rule_done, overall.actions - all_done)
        if room >= wanted:
            self._reserved[intent.id] = (intent.rule, wanted)
            return Admission(intent)
        if rule_limit.actions - rule_done <= overall.actions - all_done:
            why = (
                f"rule {intent.rule} already did {rule_done} destructive action(s) in the "
                f"last {format_duration(rule_limit.window)} (limit {rule_limit.actions})"
            )
        else:
            why = (
                f"{all_done} destructive action(s) in the last "
                f"{format_duration(overall.window)} (limit {overall.actions})"
            )
        if room <= 0 or not intent.targets:
            return Admission(intent, refused=f"rate limit: {why}")
        self._reserved[intent.id] = (intent.rule, room)
        return Admission(
            replace(intent, targets=intent.targets[:room]),
            dropped=intent.targets[room:],
            note=f"rate limit: acted on the first {room} of {wanted} targets; {why}",
        )

    def interrupted(self, rule: str, kind: str, targets: tuple[Target, ...], now: float) -> None:
        """A destructive step a previous run did not see end: what it did is unknown, so each
        of its targets counts as acted on (a limit errs towards doing less)."""
        if kind not in DESTRUCTIVE_KINDS:
            return
        pids: list[int | None] = [t.pid for t in targets] or [None]
        for pid in pids:
            self.log.note_action(rule, kind, pid, now)

    def finish(self, intent: Intent, outcome: Outcome, now: float) -> str | None:
        """A step admitted has ended: give its room back and count what it did. Returns the
        breaker's reason when this trips it."""
        self._reserved.pop(intent.id, None)
        if not destructive(intent):
            return None
        done = acted(outcome)
        for pid in done:
            self.log.note_action(intent.rule, intent.kind, pid, now)
        if not done:
            return None
        breaker = self.safety.breaker
        count = self.log.actions_since(now - breaker.window, kinds=DESTRUCTIVE_KINDS)
        if count >= breaker.actions and self.log.breaker() is None:
            reason = (
                f"{count} destructive actions within {format_duration(breaker.window)} "
                f"(breaker at {breaker.actions}); last: {intent.kind} by rule "
                f"{intent.rule}"
            )
            self.log.trip_breaker(reason, now)
            return reason
        return None
