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
``when`` no longer holds, whose incident is on hold (``gpuwarden hold``), or whose incident was
acknowledged under ``pause_on_ack``, waits. A due step of an incident a silence matches runs
as a shadow step does: its targets are chosen and recorded, nothing is acted on or told, and
it is not run again once the silence ends.

``preview`` answers "what next" for an open incident without changing anything: the next
step, when it is due, what keeps it waiting, and the targets the planner would choose now.
"""

from __future__ import annotations

from dataclasses import replace

from gpuwarden.engine.incident import Incident
from gpuwarden.engine.planner import Env, Plan, Planner, candidates, process_env, projector
from gpuwarden.engine.scopes import Scope
from gpuwarden.model import (
    Hold,
    Intent,
    NextStep,
    Outcome,
    Reason,
    RuleChange,
    Silence,
    Target,
    Transition,
)
from gpuwarden.playbook.loader import CompiledRule, CompiledStep
from gpuwarden.playbook.schema import ENDING_KINDS, SELECTING_KINDS
from gpuwarden.text import iso

__all__ = ["Env", "Ladder", "Records", "ladder_done", "silence_note"]

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
        self.holds: dict[str, Hold] = {}  # incident id -> its hold (`gpuwarden hold`)
        self.silences: tuple[Silence, ...] = ()  # `gpuwarden silence`, active or not yet

    def silence_of(self, rule: str, incident: Incident, now: float) -> Silence | None:
        """The first active silence that matches ``incident`` of ``rule``, if any."""
        for silence in self.silences:
            if silence.active(now) and silence.matches(rule, incident.gpu):
                return silence
        return None

    def held(self, incident: Incident, now: float) -> Hold | None:
        hold = self.holds.get(incident.id)
        return hold if hold is not None and hold.active(now) else None

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
        incident.seen = (scope, env, holds)
        while incident.next_step < len(rule.steps):
            index = incident.next_step
            step = rule.steps[index]
            previous = index - 1
            if previous >= 0 and previous in incident.running:
                return  # the step before is still running
            if now < incident.opened + step.spec.after:
                return
            hold = self.held(incident, now)
            paused = rule.spec.pause_on_ack and incident.id in self.acked
            if hold is not None or not holds or paused:
                reason = (
                    Reason.HELD
                    if hold is not None
                    else Reason.ACKNOWLEDGED
                    if paused
                    else Reason.CONDITION_NOT_HOLDING
                )
                if incident.waiting_noted != (index, reason):
                    incident.waiting_noted = (index, reason)
                    changes.append(
                        RuleChange(
                            Transition.WAITING,
                            rule.name,
                            incident.scope,
                            now,
                            reason,
                            incident.id,
                            hold.note if hold is not None else "",
                            where=incident.label,
                        )
                    )
                return
            silence = self.silence_of(rule.name, incident, now)
            intent = self._intent(rule, incident, step, scope, env, now, silence)
            intents.append(intent)
            incident.next_step += 1
            if step.blocking and (bool(intent.targets) or step.kind not in SELECTING_KINDS):
                incident.running[index] = intent.id
                self.in_flight[intent.id] = (incident, index, intent)
            else:
                incident.finished.add(index)

    def preview(
        self, rule: CompiledRule, incident: Incident, now: float, *, plan: bool = True
    ) -> NextStep:
        """What ``incident``'s ladder does next, seen from the last tick (see the module
        doc). Changes nothing: the targets are planned as the step would plan them now
        (unless ``plan`` is false: planning is the costly part)."""
        index = incident.next_step
        if index >= len(rule.steps):
            running = sorted(incident.running)
            detail = f"step {running[-1]} is still running" if running else ""
            return NextStep(
                incident.id,
                rule.name,
                None,
                state="done",
                detail=detail,
                pause_on_ack=rule.spec.pause_on_ack,
            )
        step = rule.steps[index]
        due = incident.opened + step.spec.after
        hold = self.held(incident, now)
        silence = self.silence_of(rule.name, incident, now)
        seen = incident.seen
        holds = seen[2] if seen is not None else True
        detail = ""
        if index - 1 in incident.running:
            state, detail = "after_previous", f"step {index - 1} is still running"
        elif hold is not None:
            state, detail = "held", hold.note
        elif rule.spec.pause_on_ack and incident.id in self.acked:
            state = "acknowledged"
        elif not holds and now >= due:
            state = "condition_not_holding"
        elif silence is not None:
            state, detail = "silenced", silence_note(silence)
        else:
            state = "due" if now >= due else "scheduled"
        selects = step.kind in SELECTING_KINDS
        targets: tuple[Target, ...] = ()
        skipped = 0
        if selects and plan and seen is not None:
            chosen = self._plan(rule, incident, step, seen[0], seen[1])
            targets, skipped = chosen.targets, len(chosen.skipped)
        return NextStep(
            incident.id,
            rule.name,
            index,
            kind=step.kind,
            label=step.spec.label,
            due=due,
            state=state,
            detail=detail,
            targets=targets,
            skipped=skipped,
            selects=selects,
            pause_on_ack=rule.spec.pause_on_ack,
        )

    def _plan(
        self, rule: CompiledRule, incident: Incident, step: CompiledStep, scope: Scope, env: Env
    ) -> Plan:
        """The planner's choice for ``step`` of ``incident`` now (no state is changed)."""
        found = candidates(rule.spec.for_each, scope, env)
        already = self.killed | {
            (pid, ct) for kind, pid, ct in incident.targeted if kind == step.kind
        }
        return self.planner.plan(
            step,
            found,
            lambda p: process_env(env, p),
            already,
            projector(env),
        )

    def _intent(
        self,
        rule: CompiledRule,
        incident: Incident,
        step: CompiledStep,
        scope: Scope,
        env: Env,
        now: float,
        silence: Silence | None = None,
    ) -> Intent:
        """The intent of one due step; for a step that acts on processes, with the targets
        the planner chose (and why it skipped the others). Under ``silence`` it is a shadow
        step: recorded, never acted on."""
        shadow = incident.shadow or silence is not None
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
            shadow=shadow,
            gpu=incident.gpu,
            params=step.spec.params,
            where=incident.label,
            silenced="" if silence is None else silence_note(silence),
        )
        if step.kind not in SELECTING_KINDS:
            return intent
        plan = self._plan(rule, incident, step, scope, env)
        for target in plan.targets:
            incident.targeted.add((step.kind, target.pid, target.create_time))
            if step.kind in ENDING_KINDS and not shadow:
                self.killed.add((target.pid, target.create_time))
        return replace(intent, reason=plan.reason, targets=plan.targets, skipped=plan.skipped)


def silence_note(silence: Silence) -> str:
    """``#3 (GPU 1) by alice until 2026-…Z: firmware update``: which silence, for the record."""
    by = f" by {silence.by}" if silence.by else ""
    why = f": {silence.reason}" if silence.reason else ""
    return f"#{silence.id} ({silence.matcher}){by} until {iso(silence.ends)}{why}"
