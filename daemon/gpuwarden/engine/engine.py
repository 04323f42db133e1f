"""The rule engine: ``step(snapshot, now)`` → what changed and what to do. Pure.

Per rule and scope a small state machine runs: inactive → pending (``when`` true) → firing
(``when`` held for ``for``; an incident opens) → resolved (``when`` false, or ``until`` true;
the incident closes and ``cooldown`` starts). Event rules fire on the event; scheduled rules
(``every``) are checked at their times. Both are one-shot: their incident closes once the
ladder has run (or when ``until`` holds, if given).

The ladder of a firing incident runs in order: a step is due ``after`` seconds from firing and
once the step before it has finished (a notify step finishes at once; the others when the
executor reports their outcome through ``complete``). Before a due step runs, ``when`` is
checked again: a step whose condition no longer holds waits. Each step runs at most once.

No I/O, no clock: ``now`` comes in, records and intents go out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from gpuwarden.config import Config
from gpuwarden.engine.history import History
from gpuwarden.engine.incident import Incident, ScopeState, Tick, latest_instant, stamp
from gpuwarden.engine.planner import Planner, candidates, process_env, projector
from gpuwarden.engine.protect import ProtectedMatcher
from gpuwarden.engine.scopes import SCOPES, Scope, gpu_key
from gpuwarden.model import (
    Intent,
    Outcome,
    Reason,
    RuleChange,
    Snapshot,
    Transition,
)
from gpuwarden.playbook.fields import tick_env
from gpuwarden.playbook.loader import CompiledRule, CompiledStep, PlaybookSet
from gpuwarden.playbook.schema import SELECTING_KINDS

Env = dict[str, Any]
Records = list[RuleChange | Intent]  # in the order they happened within the tick


class Engine:
    def __init__(
        self, playbooks: PlaybookSet, config: Config, *, self_pid: int | None = None
    ) -> None:
        self.playbooks = playbooks
        self.config = config
        self.tz = config.tz
        self.history = History()
        self._self_pid = self_pid
        self.planner = Planner(ProtectedMatcher(config.protected, self_pid=self_pid))
        self._states: dict[str, dict[str, ScopeState]] = {}  # rule -> scope key -> state
        self._last_run: dict[str, float] = {}
        self._intents: dict[str, tuple[Incident, int, Intent]] = {}
        self._killed: set[tuple[int, float | None]] = set()
        self._acked: set[str] = set()
        # Environments of this tick's scopes (see _env); emptied at the start of each tick.
        self._envs: dict[tuple[str, Any], Env] = {}
        # Incident ids opened within the current second (ids are stamped to the second).
        self._id_second = ""
        self._ids: dict[str, int] = {}

    # -- public -----------------------------------------------------------------------------

    def restore(
        self,
        *,
        rule: str,
        scope: str,
        label: str,
        incident: str,
        opened: float,
        gpu: int | None,
        planned_steps: Iterable[int],
        targeted: Iterable[tuple[str, int, float | None]],
    ) -> bool:
        """Take back an incident a previous run left open (from the journal), so that a restart
        repeats no step: every step already planned counts as finished, even one that was in
        flight when the daemon died. False when the rule no longer exists."""
        compiled = self.playbooks.rule(rule)
        if compiled is None:
            return False
        steps = set(planned_steps)
        state = self._states.setdefault(rule, {}).setdefault(scope, ScopeState())
        state.phase = "firing"
        state.label = label
        restored = Incident(
            id=incident,
            rule=rule,
            scope=scope,
            label=label,
            opened=opened,
            severity=compiled.spec.severity,
            shadow=compiled.spec.mode == "shadow",
            gpu=gpu,
            next_step=max(steps) + 1 if steps else 0,
        )
        restored.finished.update(steps)
        restored.targeted.update(targeted)
        for kind, pid, created in restored.targeted:
            if kind == "kill" and not restored.shadow:
                self._killed.add((pid, created))
        state.incident = restored
        return True

    def replace(self, playbooks: PlaybookSet, config: Config, now: float) -> list[RuleChange]:
        """Swap in a new playbook set (and config) between ticks. Incidents and states of
        rules that still exist are kept; a removed rule's open incidents resolve with
        ``RULE_REMOVED`` (returned, for the journal). History restarts: the new set's series
        are numbered afresh."""
        names = {r.name for r in playbooks.rules}
        closed: list[RuleChange] = []
        for rule, states in list(self._states.items()):
            if rule in names:
                continue
            for state in states.values():
                if state.incident is not None:
                    closed.append(
                        RuleChange(
                            Transition.RESOLVED,
                            rule,
                            state.incident.scope,
                            now,
                            Reason.RULE_REMOVED,
                            state.incident.id,
                            where=state.incident.label,
                        )
                    )
            del self._states[rule]
        self.playbooks = playbooks
        self.config = config
        self.tz = config.tz
        self.planner = Planner(ProtectedMatcher(config.protected, self_pid=self._self_pid))
        self.history = History()
        self._last_run = {k: v for k, v in self._last_run.items() if k in names}
        return closed

    def still_needed(self, intent: Intent, snapshot: Snapshot, now: float) -> bool:
        """For a kill in progress: does the step's ``free_until`` still fail on a fresh
        snapshot? (No ``free_until``: True; the step's targets were chosen for themselves.)
        Safe to call from another thread: it reads no engine state that changes."""
        rule = self.playbooks.rule(intent.rule)
        if rule is None or intent.step >= len(rule.steps):
            return False
        step = rule.steps[intent.step]
        if step.free_until is None:
            return True
        base = tick_env(snapshot, now, self.tz)
        gpus = {g.index: g for g in snapshot.gpus}
        base.update(
            process=None,
            event=None,
            _snapshot=snapshot,
            _gpus=gpus,
            gpu=gpus.get(intent.gpu) if intent.gpu is not None else None,
            _h=History().view("", now),
        )
        return not step.free_until.test(base)

    def phase_counts(self) -> dict[tuple[str, str], int]:
        """How many scopes each rule has pending and firing (for metrics)."""
        counts: dict[tuple[str, str], int] = {}
        for rule, states in self._states.items():
            for state in states.values():
                if state.phase in ("pending", "firing"):
                    key = (rule, state.phase)
                    counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def incidents(self) -> list[Incident]:
        return [
            s.incident
            for states in self._states.values()
            for s in states.values()
            if s.incident is not None
        ]

    def ack(self, incident_id: str) -> None:
        """A person took over the incident: a rule with ``pause_on_ack`` runs no further step
        of it (the incident still resolves as usual)."""
        self._acked.add(incident_id)

    def complete(self, intent_id: str, outcome: Outcome) -> None:
        """An executor finished an intent; the ladder may move on."""
        found = self._intents.pop(intent_id, None)
        if found is None:
            return
        incident, index, intent = found
        incident.running.pop(index, None)
        incident.finished.add(index)
        if intent.kind == "kill" and not outcome.ok:
            # A kill that failed did not remove its targets: later steps may choose them.
            for target in intent.targets:
                self._killed.discard((target.pid, target.create_time))

    def step(self, snapshot: Snapshot, now: float) -> Tick:
        records: Records = []
        changes = intents = records  # one ordered list; the names say what goes in
        gpus = {g.index: g for g in snapshot.gpus}
        base = tick_env(snapshot, now, self.tz)
        base.update(gpu=None, process=None, event=None, _snapshot=snapshot, _gpus=gpus)
        scopes_by_kind = {kind: make(snapshot) for kind, make in SCOPES.items()}
        self._envs = {}
        self._record_history(scopes_by_kind, base, now)
        # Views of history taken while recording would miss this tick's samples: rebuild.
        self._envs = {}
        envs_by_kind: dict[str, list[Env]] = {}  # each scope's environment, once per tick
        for rule in self.playbooks.rules:
            if rule.every is not None:
                # Counted from when the engine first saw the rule: a daemon started on
                # Tuesday does not run last Monday's check, however long its ticks.
                last = self._last_run.setdefault(rule.name, now)
                due = rule.every.due(last, now, self.tz)
                if not due:
                    self._advance_open(rule, scopes_by_kind, snapshot, base, now, changes, intents)
                    continue
                self._last_run[rule.name] = latest_instant(rule.every, last, now, self.tz)
            kind = rule.spec.for_each
            envs = envs_by_kind.get(kind)
            if envs is None:
                envs = envs_by_kind[kind] = [self._env(base, s) for s in scopes_by_kind[kind]]
            self._evaluate(
                rule,
                scopes_by_kind[kind],
                envs,
                snapshot,
                gpus,
                base,
                now,
                changes,
                intents,
            )
        return Tick(tuple(records))

    # -- history ----------------------------------------------------------------------------

    def _record_history(self, scopes: dict[str, list[Scope]], base: Env, now: float) -> None:
        if not self.playbooks.series:
            return
        seen: set[str] = set()
        for series in self.playbooks.series:
            for scope in scopes[series.root]:
                self.history.observe(scope.key, series, self._env(base, scope), now)
                seen.add(scope.key)
        self.history.forget_except(seen)

    # -- rules ------------------------------------------------------------------------------

    def _env(self, base: Env, scope: Scope) -> Env:
        """The environment expressions of ``scope`` see, built once per scope and tick and
        shared by every rule evaluated there. History functions over a wider root
        (``avg(gpu.…)`` in a process rule) read the GPU's and the host's series too."""
        event = scope.event
        key = (scope.key, None if event is None else (event.kind, event.time, event.xid))
        cached = self._envs.get(key)
        if cached is not None and cached["_base"] is base:
            return cached
        env = dict(base)
        env["_base"] = base
        env["gpu"] = scope.gpu
        env["process"] = scope.process
        env["event"] = scope.event
        gpu = (
            scope.gpu.index
            if scope.gpu is not None
            else (scope.event.gpu if scope.event is not None else None)
        )
        also = ("host",) if gpu is None or scope.key == gpu_key(gpu) else (gpu_key(gpu), "host")
        env["_h"] = self.history.view(scope.key, base["_now"], also=also)
        self._envs[key] = env
        return env

    def _evaluate(
        self,
        rule: CompiledRule,
        scopes: list[Scope],
        envs: list[Env],
        snapshot: Snapshot,
        gpus: dict[int, Any],
        base: Env,
        now: float,
        changes: Records,
        intents: Records,
    ) -> None:
        """``envs``: the environment of each of ``scopes``, in the same order."""
        states = self._states.setdefault(rule.name, {})
        present: set[str] = set()
        for scope, env in zip(scopes, envs, strict=True):
            if scope.key in present and rule.spec.for_each == "event":
                continue  # one incident per GPU, however many events arrive in one tick
            holds = rule.when.test(env)
            state = states.get(scope.key)
            if state is None:
                if not holds:
                    continue
                state = states[scope.key] = ScopeState()
            present.add(scope.key)
            state.label = scope.label
            if state.phase == "firing":
                continue  # handled below with every open incident of the rule
            self._idle_or_pending(rule, scope, state, holds, env, now, changes, intents)
        self._advance_open(
            rule,
            {rule.spec.for_each: scopes},
            snapshot,
            base,
            now,
            changes,
            intents,
            present=present if rule.spec.for_each != "event" else None,
        )
        for key in list(states):
            state = states[key]
            if state.phase == "pending" and key not in present:
                state.phase = "inactive"
                changes.append(
                    RuleChange(
                        Transition.CANCELLED,
                        rule.name,
                        key,
                        now,
                        Reason.SCOPE_GONE,
                        where=state.label,
                    )
                )
            if state.phase == "inactive" and state.cooldown_until <= now:
                del states[key]

    def _idle_or_pending(
        self,
        rule: CompiledRule,
        scope: Scope,
        state: ScopeState,
        holds: bool,
        env: Env,
        now: float,
        changes: Records,
        intents: Records,
    ) -> None:
        name = rule.name
        if not holds:
            if state.phase == "pending":
                state.phase = "inactive"
                changes.append(
                    RuleChange(
                        Transition.CANCELLED,
                        name,
                        scope.key,
                        now,
                        Reason.CONDITION_CLEARED,
                        where=scope.label,
                    )
                )
            return
        if rule.active is not None and not rule.active.contains(now, self.tz):
            if state.phase == "pending":
                state.phase = "inactive"
                changes.append(
                    RuleChange(
                        Transition.CANCELLED,
                        name,
                        scope.key,
                        now,
                        Reason.INACTIVE_WINDOW,
                        where=scope.label,
                    )
                )
            return
        if now < state.cooldown_until:
            if not state.cooldown_noted:
                state.cooldown_noted = True
                changes.append(
                    RuleChange(
                        Transition.COOLDOWN,
                        name,
                        scope.key,
                        now,
                        Reason.COOLDOWN,
                        detail=f"until {stamp(state.cooldown_until)}",
                        where=scope.label,
                    )
                )
            return
        if rule.one_shot:
            reason = Reason.EVENT if rule.spec.for_each == "event" else Reason.SCHEDULED
            self._fire(rule, scope, state, now, reason, changes, intents, env)
            return
        if state.phase == "inactive":
            state.phase = "pending"
            state.since = now
            changes.append(
                RuleChange(
                    Transition.PENDING,
                    name,
                    scope.key,
                    now,
                    Reason.CONDITION_MET,
                    where=scope.label,
                )
            )
        if now - state.since >= rule.spec.for_:
            self._fire(rule, scope, state, now, Reason.FOR_ELAPSED, changes, intents, env)

    def _fire(
        self,
        rule: CompiledRule,
        scope: Scope,
        state: ScopeState,
        now: float,
        reason: Reason,
        changes: Records,
        intents: Records,
        env: Env,
    ) -> None:
        state.phase = "firing"
        gpu = (
            scope.gpu.index
            if scope.gpu is not None
            else (scope.event.gpu if scope.event is not None else None)
        )
        incident = Incident(
            id=self._incident_id(rule, scope, now),
            rule=rule.name,
            scope=scope.key,
            label=scope.label,
            opened=now,
            severity=rule.spec.severity,
            shadow=rule.spec.mode == "shadow",
            gpu=gpu,
            event=scope.event,
        )
        state.incident = incident
        changes.append(
            RuleChange(
                Transition.FIRING,
                rule.name,
                scope.key,
                now,
                reason,
                incident.id,
                where=scope.label,
            )
        )
        self._ladder(rule, incident, scope, env, True, now, changes, intents)

    def _incident_id(self, rule: CompiledRule, scope: Scope, now: float) -> str:
        """``<UTC second>-<rule>-<scope>``; an incident of the same rule and scope opened
        again within that second (a flapping rule without cooldown, a reused PID) gets
        ``-2``, ``-3``, ... so that no two incidents, and no two intents, share an id."""
        second = stamp(now)
        if second != self._id_second:
            self._id_second, self._ids = second, {}
        base = f"{second}-{rule.name}-{scope.key.split('@')[0].replace('/', '-')}"
        count = self._ids[base] = self._ids.get(base, 0) + 1
        return base if count == 1 else f"{base}-{count}"

    def _advance_open(
        self,
        rule: CompiledRule,
        scopes: dict[str, list[Scope]],
        snapshot: Snapshot,
        base: Env,
        now: float,
        changes: Records,
        intents: Records,
        present: set[str] | None = None,
    ) -> None:
        """Resolve or advance every open incident of ``rule``."""
        current = {s.key: s for s in scopes.get(rule.spec.for_each, [])}
        gpus = {g.index: g for g in snapshot.gpus}
        for key, state in list(self._states.get(rule.name, {}).items()):
            incident = state.incident
            if state.phase != "firing" or incident is None:
                continue
            scope = current.get(key)
            if rule.spec.for_each == "event":
                scope = Scope(
                    key,
                    incident.label,
                    gpu=None if incident.gpu is None else gpus.get(incident.gpu),
                    event=incident.event,
                )
            if scope is None:
                self._resolve(rule, state, now, Reason.SCOPE_GONE, changes)
                continue
            env = self._env(base, scope)
            if rule.until is not None:
                if rule.until.test(env):
                    self._resolve(rule, state, now, Reason.UNTIL_MET, changes)
                    continue
                holds = rule.when.test(env) if not rule.one_shot else True
            elif rule.one_shot:
                holds = True
            else:
                holds = rule.when.test(env)
                if not holds:
                    self._resolve(rule, state, now, Reason.RESOLVED, changes)
                    continue
            self._ladder(rule, incident, scope, env, holds, now, changes, intents)
            if rule.one_shot and rule.until is None and self._ladder_done(rule, incident):
                self._resolve(rule, state, now, Reason.LADDER_DONE, changes)
        del present

    def _ladder_done(self, rule: CompiledRule, incident: Incident) -> bool:
        return incident.next_step >= len(rule.steps) and not incident.running

    def _resolve(
        self,
        rule: CompiledRule,
        state: ScopeState,
        now: float,
        reason: Reason,
        changes: Records,
    ) -> None:
        incident = state.incident
        assert incident is not None
        for intent_id in incident.running.values():
            self._intents.pop(intent_id, None)
        state.phase = "inactive"
        state.incident = None
        state.cooldown_until = now + rule.spec.cooldown
        state.cooldown_noted = False
        changes.append(
            RuleChange(
                Transition.RESOLVED,
                rule.name,
                incident.scope,
                now,
                reason,
                incident.id,
                where=incident.label,
            )
        )

    # -- the ladder -------------------------------------------------------------------------

    def _ladder(
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
        while incident.next_step < len(rule.steps):
            index = incident.next_step
            step = rule.steps[index]
            previous = index - 1
            if previous >= 0 and previous in incident.running:
                return  # the step before is still running
            if now < incident.opened + step.spec.after:
                return
            paused = rule.spec.pause_on_ack and incident.id in self._acked
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
                self._intents[intent.id] = (incident, index, intent)
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
        already = self._killed | {
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
            if step.kind == "kill" and not incident.shadow:
                self._killed.add((target.pid, target.create_time))
        return replace(intent, reason=plan.reason, targets=plan.targets, skipped=plan.skipped)
