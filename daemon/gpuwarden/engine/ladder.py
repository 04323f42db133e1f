"""The escalation ladder of a firing incident: which step is due, the intent it becomes, and
the bookkeeping that keeps a step from running twice or a process from being killed twice.

``Ladder`` holds what outlives one incident: the intents in flight (until the executor reports
through ``Engine.complete``), the processes killed or being killed (no later step of any
incident chooses them again), the acknowledged incidents, and the victim planner. The state
machine (``lifecycle.Lifecycle``) calls ``run`` when an incident fires and on each tick it
stays open; ``Engine`` (engine.py) owns the one ``Ladder`` and forwards ``ack`` and
``complete`` to it. This module imports neither of them.

A step is due ``after`` seconds from firing and once the step before it has finished (a notify
step finishes at once; the others when their outcome comes back). A due step whose rule's
``when`` no longer holds, or whose incident was acknowledged under ``pause_on_ack``, waits.
"""

from __future__ import annotations

from dataclasses import replace

from gpuwarden.engine.incident import Incident
from gpuwarden.engine.planner import Env, Planner, candidates, process_env, projector
from gpuwarden.engine.scopes import Scope
from gpuwarden.model import Intent, Outcome, Reason, RuleChange, Transition
from gpuwarden.playbook.loader import CompiledRule, CompiledStep
from gpuwarden.playbook.schema import ENDING_KINDS, SELECTING_KINDS

__all__ = ["Env", "Ladder", "Records", "ladder_done"]

Records = list[RuleChange | Intent]  # a tick's records, in the order they happened


def ladder_done(rule: CompiledRule, incident: Incident) -> bool:
    """Every step of ``rule`` has run for ``incident`` and none is still in flight."""
    return incident.next_step >= len(rule.steps) and not incident.running


class Ladder:
    """The ladder bookkeeping shared by every incident of one engine (see the module doc)."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner  # replaced with the config (Engine.replace)
        # intent id -> (its incident, its step index, the intent), until ``complete``
        self.in_flight: dict[str, tuple[Incident, int, Intent]] = {}
        # (pid, start time) of every process a non-shadow kill (or requeue) step chose
        self.killed: set[tuple[int, float | None]] = set()
        self.acked: set[str] = set()  # incident ids a person took over

    def complete(self, intent_id: str, outcome: Outcome) -> None:
        """An executor finished an intent: its step counts as finished."""
        found = self.in_flight.pop(intent_id, None)
        if found is None:
            return
        incident, index, intent = found
        incident.running.pop(index, None)
        incident.finished.add(index)
        if intent.kind in ENDING_KINDS and not outcome.ok:
            # A target a kill (or requeue) did not end (it failed, or the rails left it out)
            # is still there: later steps may choose it.
            ended = {(r.pid, r.create_time) for r in outcome.targets if r.ok}
            for target in intent.targets:
                if (target.pid, target.create_time) not in ended:
                    self.killed.discard((target.pid, target.create_time))

    def forget(self, incident: Incident) -> None:
        """The incident resolved: what it still has in flight no longer moves any ladder."""
        for intent_id in incident.running.values():
            self.in_flight.pop(intent_id, None)

    def run(
        self,
        rule: CompiledRule,
        incident: Incident,
        scope: Scope,
        env: Env,
        holds: bool,
        now: float,
        changes: Records,
        intents: Records,
    ) -> None:
        """Turn every step of ``incident`` that is due now into an intent (appended to
        ``intents``), in order, stopping at the first that is not; a step that is due but
        held back by ``holds`` being false, or by an acknowledgement, is noted once in
        ``changes`` as waiting."""
        while incident.next_step < len(rule.steps):
            index = incident.next_step
            step = rule.steps[index]
            previous = index - 1
            if previous >= 0 and previous in incident.running:
                return  # the step before is still running
            if now < incident.opened + step.spec.after:
                return
            paused = rule.spec.pause_on_ack and incident.id in self.acked
            if not holds or paused:
                if incident.waiting_noted != index:
                    incident.waiting_noted = index
                    changes.append(
                        RuleChange(
                            Transition.WAITING,
                            rule.name,
                            incident.scope,
                            now,
                            Reason.ACKNOWLEDGED if paused else Reason.CONDITION_NOT_HOLDING,
                            incident.id,
                            step.spec.label,
                            where=incident.label,
                        )
                    )
                return
            intent = self._intent(rule, incident, step, scope, env, now)
            intents.append(intent)
            incident.next_step += 1
            if step.blocking and (bool(intent.targets) or step.kind not in SELECTING_KINDS):
                incident.running[index] = intent.id
                self.in_flight[intent.id] = (incident, index, intent)
            else:
                incident.finished.add(index)

    def _intent(
        self,
        rule: CompiledRule,
        incident: Incident,
        step: CompiledStep,
        scope: Scope,
        env: Env,
        now: float,
    ) -> Intent:
        """The intent of one due step; for a step that acts on processes, with the targets
        the planner chose (and why it skipped the others)."""
        intent = Intent(
            id=f"{incident.id}/{step.index}",
            incident=incident.id,
            rule=rule.name,
            scope=incident.scope,
            step=step.index,
            kind=step.kind,
            label=step.spec.label,
            time=now,
            reason=Reason.STEP_DUE,
            severity=rule.spec.severity,
            shadow=incident.shadow,
            gpu=incident.gpu,
            params=step.spec.params,
            where=incident.label,
        )
        if step.kind not in SELECTING_KINDS:
            return intent
        found = candidates(rule.spec.for_each, scope, env)
        already = self.killed | {
            (pid, ct) for kind, pid, ct in incident.targeted if kind == step.kind
        }
        plan = self.planner.plan(
            step,
            found,
            lambda p: process_env(env, p),
            already,
            projector(env),
        )
        for target in plan.targets:
            incident.targeted.add((step.kind, target.pid, target.create_time))
            if step.kind in ENDING_KINDS and not incident.shadow:
                self.killed.add((target.pid, target.create_time))
        return replace(intent, reason=plan.reason, targets=plan.targets, skipped=plan.skipped)
