"""Rails for destructive steps: rate limits per rule and overall, and a circuit breaker.

Counts live in the journal, so a restarted daemon remembers what it did in the last minutes.
A refused step is not an error of the executor: it is an outcome with the reason, recorded like
any other, and the ladder moves on.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpuwarden.config import Safety
from gpuwarden.model import Intent
from gpuwarden.playbook.schema import DESTRUCTIVE_KINDS, SELECTING_KINDS
from gpuwarden.units import format_duration


class ActionLog(Protocol):
    def actions_since(self, t: float, rule: str | None = None, kinds: Any = None) -> int: ...

    def note_action(self, rule: str, kind: str, pid: int | None, now: float) -> None: ...

    def breaker(self) -> Any: ...

    def trip_breaker(self, reason: str, now: float) -> Any: ...


def destructive(intent: Intent) -> bool:
    return intent.kind in DESTRUCTIVE_KINDS and not intent.shadow


def weight(intent: Intent) -> int:
    """How many actions a step counts for: one per process it acts on (at least one)."""
    return max(1, len(intent.targets))


class Rails:
    def __init__(self, safety: Safety, log: ActionLog) -> None:
        self.safety = safety
        self.log = log

    def refuse(self, intent: Intent, now: float) -> str | None:
        """Why this step may not run now, or None. Only destructive, non-shadow steps with
        something to act on are limited."""
        if not destructive(intent) or (intent.kind in SELECTING_KINDS and not intent.targets):
            return None
        tripped = self.log.breaker()
        if tripped is not None:
            return (
                "circuit breaker open: destructive steps are halted until `gpuwarden reset-breaker`"
            )
        n = weight(intent)
        rule_limit, overall = self.safety.per_rule, self.safety.overall
        done = self.log.actions_since(
            now - rule_limit.window, rule=intent.rule, kinds=DESTRUCTIVE_KINDS
        )
        if done + n > rule_limit.actions:
            return (
                f"rate limit: rule {intent.rule} already did {done} destructive action(s) "
                f"in the last {format_duration(rule_limit.window)} (limit "
                f"{rule_limit.actions})"
            )
        done = self.log.actions_since(now - overall.window, kinds=DESTRUCTIVE_KINDS)
        if done + n > overall.actions:
            return (
                f"rate limit: {done} destructive action(s) in the last "
                f"{format_duration(overall.window)} (limit {overall.actions})"
            )
        return None

    def record(self, intent: Intent, now: float) -> str | None:
        """Count a destructive step that ran; the breaker's reason when this trips it."""
        if not destructive(intent):
            return None
        pids: list[int | None] = [t.pid for t in intent.targets] or [None]
        for pid in pids:
            self.log.note_action(intent.rule, intent.kind, pid, now)
        breaker = self.safety.breaker
        done = self.log.actions_since(now - breaker.window, kinds=DESTRUCTIVE_KINDS)
        if done >= breaker.actions and self.log.breaker() is None:
            reason = (
                f"{done} destructive actions within {format_duration(breaker.window)} "
                f"(breaker at {breaker.actions}); last: {intent.kind} by rule "
                f"{intent.rule}"
            )
            self.log.trip_breaker(reason, now)
            return reason
        return None
