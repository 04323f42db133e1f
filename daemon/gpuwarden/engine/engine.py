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

``Engine`` is the facade every caller uses; the parts live beside it and import nothing of it:

- lifecycle.py — ``Lifecycle``, the per-rule, per-scope state machine and incident ids;
- ladder.py — ``Ladder``, the due steps and their intents, what is in flight, what was killed;
- restore.py — ``restore_incident``, an incident a previous run left open, taken back;
- history.py, planner.py, scopes.py, incident.py — history, victims, scopes, bookkeeping.

This module keeps the tick itself: which rules are due (schedules), the history recorded,
and what each rule's ``when`` is evaluated over. A tick holds its scopes per kind as rows
(``scopes.ScopeSet``) and evaluates each rule's ``when`` over all rows of its kind in one
call (``Compiled.holding``, see playbook/expr_batch.py); the lifecycle then visits only the
scopes where it holds or that have a state, and only those get a ``Scope`` and an
environment (built once per scope and tick, shared by the rules). ``Engine(reference=True)``
does it the plain way instead — every rule in every scope, a fresh environment each — which
the tests compare the fast way with.

No I/O, no clock: ``now`` comes in, records and intents go out.
"""

from __future__ import annotations

import ast
import datetime as dt
import math
from collections.abc import Collection, Container, Iterable
from typing import Any, NamedTuple

from gpuwarden.config import Config
from gpuwarden.engine.history import History
from gpuwarden.engine.incident import Incident, ScopeState, Tick, latest_instant
from gpuwarden.engine.ladder import Env, Ladder, Records
from gpuwarden.engine.lifecycle import Lifecycle, at_rest_until
from gpuwarden.engine.planner import Planner
from gpuwarden.engine.protect import ProtectedMatcher
from gpuwarden.engine.restore import restore_incident
from gpuwarden.engine.scopes import (
    SCOPES,
    ProcessKeys,
    Scope,
    ScopeSet,
    history_keys,
    scope_sets,
)
from gpuwarden.model import (
    GpuState,
    Hold,
    Intent,
    NextStep,
    Outcome,
    RuleChange,
    Silence,
    Snapshot,
)
from gpuwarden.playbook.expr import Series, Shared
from gpuwarden.playbook.fields import TickEnvs, tick_env
from gpuwarden.playbook.loader import CompiledRule, PlaybookSet
from gpuwarden.timewindow import Schedule

__all__ = ["Engine", "Env", "Records"]


class Engine:
    """One host's rule engine: playbooks and config in, ``step`` once per tick. Holds the
    history, the schedules and the environments itself; the state machine and the ladder
    are its ``Lifecycle`` and ``Ladder`` (one each, kept across ``replace``)."""

    def __init__(
        self,
        playbooks: PlaybookSet,
        config: Config,
        *,
        self_pid: int | None = None,
        reference: bool = False,
    ) -> None:
        self.playbooks = playbooks
        self.config = config
        self.tz = config.tz
        self.history = History()
        self._self_pid = self_pid
        self._ladder = Ladder(Planner(ProtectedMatcher(config.protected, self_pid=self_pid)))
        self._lifecycle = Lifecycle(self._ladder, self._env, self.tz)
        self._last_run: dict[str, float] = {}
        # rule -> (last run, tz, schedule, the next run after it): see _due
        self._next_runs: dict[str, tuple[float, dt.tzinfo, Schedule, float]] = {}
        # Environments of this tick's scopes (see _env); emptied at the start of each tick.
        self._envs: dict[tuple[str, Any], Env] = {}
        # reference: evaluate every rule in every scope of every tick, each in a fresh
        # environment, one at a time (what tests compare the fast path with).
        self._reference = reference
        self._process_keys = ProcessKeys()
        self._tick_envs = TickEnvs()
        self._history_kinds = _history_kinds(playbooks)
        self._kinds = _kinds(playbooks)
        self._series_roots = tuple(dict.fromkeys(s.root for s in playbooks.series))
        self._series_shared = _series_read_shared(playbooks)
        # (history, its generation, the keys of each series root) after the last forget_except
        self._recorded: tuple[History, int, list[list[str]]] | None = None
        # The last plan made (see _plan): for its quiet rules, until its time.
        self._skipping: _Skipping | None = None
        # The last idle tick's ``still``, and the series it left to record and their roots.
        self._unstill: tuple[Collection[int], tuple[Series, ...], tuple[str, ...]] | None = None

    @property
    def planner(self) -> Planner:
        """The victim planner of the current config (it lives with the ladder)."""
        return self._ladder.planner

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
        restore_incident(
            self._lifecycle.states,
            self._ladder.killed,
            compiled,
            scope=scope,
            label=label,
            incident=incident,
            opened=opened,
            gpu=gpu,
            planned_steps=planned_steps,
            targeted=targeted,
        )
        return True

    def replace(self, playbooks: PlaybookSet, config: Config, now: float) -> list[RuleChange]:
        """Swap in a new playbook set (and config) between ticks. Incidents and states of
        rules that still exist are kept; a removed rule's open incidents resolve with
        ``RULE_REMOVED`` (returned, for the journal). History restarts: the new set's series
        are numbered afresh."""
        names = {r.name for r in playbooks.rules}
        closed = self._lifecycle.drop_rules_except(names, now)
        self.playbooks = playbooks
        self.config = config
        self.tz = self._lifecycle.tz = config.tz
        self._ladder.planner = Planner(ProtectedMatcher(config.protected, self_pid=self._self_pid))
        self.history = History()
        self._history_kinds = _history_kinds(playbooks)
        self._kinds = _kinds(playbooks)
        self._series_roots = tuple(dict.fromkeys(s.root for s in playbooks.series))
        self._series_shared = _series_read_shared(playbooks)
        self._skipping = None
        self._unstill = None
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
        return self._lifecycle.phase_counts()

    def pending_due(self) -> float | None:
        """The earliest time a pending scope's ``for`` is reached (the tick at or after it
        fires it); None when nothing is pending."""
        due: float | None = None
        for name, states in self._lifecycle.states.items():
            rule = self.playbooks.rule(name)
            if rule is None or rule.spec.for_ <= 0:
                continue
            for state in states.values():
                if state.phase == "pending":
                    at = state.since + rule.spec.for_
                    due = at if due is None else min(due, at)
        return due

    @property
    def incidents(self) -> list[Incident]:
        return self._lifecycle.open_incidents()

    # -- what people on call say (read from the journal by the run loop each tick) ---------

    def hold(self, incident_id: str, until: float | None = None, note: str = "") -> None:
        """No further step of the incident runs until ``release`` or ``until`` (a step already
        running finishes); each step that comes due meanwhile waits, recorded as ``held``."""
        self._ladder.holds[incident_id] = Hold(incident_id, until, note)

    def release(self, incident_id: str) -> None:
        """The incident's ladder goes on: a step that came due while held runs at this tick."""
        self._ladder.holds.pop(incident_id, None)

    @property
    def holds(self) -> dict[str, Hold]:
        return dict(self._ladder.holds)

    def silence(self, silences: Iterable[Silence]) -> None:
        """The silences in force from now on (replacing those given before)."""
        self._ladder.silences = tuple(silences)

    def silenced(self, now: float) -> set[str]:
        """The open incidents an active silence matches."""
        ladder = self._ladder
        return {i.id for i in self.incidents if ladder.silence_of(i.rule, i, now) is not None}

    def abort(self, incident_id: str, now: float, detail: str = "") -> RuleChange | None:
        """A person ends the incident: it resolves with ``ABORTED`` (``detail``: who and why)
        and its scope does not fire again until its condition has cleared (see
        ``Lifecycle.abort``). None when the engine has no such open incident."""
        found = self._lifecycle.find(incident_id)
        if found is None:
            return None
        name, state = found
        rule = self.playbooks.rule(name)
        if rule is None:
            return None
        self._ladder.holds.pop(incident_id, None)
        return self._lifecycle.abort(rule, state, now, detail)

    def next_steps(self, now: float, *, plan: Container[str] | None = None) -> list[NextStep]:
        """For every open incident, what its ladder does next (``Ladder.preview``): the due
        step, its time, what keeps it waiting and the targets the planner would choose now,
        from what the last ``step`` saw. Changes nothing. ``plan``: the incidents whose
        targets are planned (None: all; planning a step costs about as much as running it)."""
        out: list[NextStep] = []
        for incident in self.incidents:
            rule = self.playbooks.rule(incident.rule)
            if rule is not None:
                wanted = plan is None or incident.id in plan
                out.append(self._ladder.preview(rule, incident, now, plan=wanted))
        return out

    def ack(self, incident_id: str) -> None:
        """A person took over the incident: a rule with ``pause_on_ack`` runs no further step
        of it (the incident still resolves as usual)."""
        self._ladder.acked.add(incident_id)

    def complete(self, intent_id: str, outcome: Outcome) -> None:
        """An executor finished an intent; the ladder may move on."""
        self._ladder.complete(intent_id, outcome)

    def step(
        self,
        snapshot: Snapshot,
        now: float,
        *,
        quiet: Collection[str] = frozenset(),
        still: Collection[int] = frozenset(),
    ) -> Tick:
        """One tick. ``quiet``: rules whose ``when`` the caller has shown to hold in no scope
        of this tick (a drill's fast-forward, engine/quiet.py). Such a rule is not evaluated
        while it has no state in any scope (nothing pending, firing, cooling down or stood
        down), or while its states are only cooldowns none of which has ended: exactly when
        its evaluation would change nothing (see ``_plan``); scheduled and event rules are
        evaluated regardless. History is recorded as at any tick; a tick where no
        rule is left to evaluate does only that (``_idle``). ``still``: held series the caller
        has shown to be, in every scope, what they were at the last tick, the scopes the same
        (engine/quiet.py ``still_series``); the tick does not record them again (a held
        series keeps only since when its condition holds, which an unchanged value leaves
        as it is). A wrong ``quiet`` or ``still`` loses records: tests compare this with
        ``Engine(reference=True)``, which ignores both."""
        if quiet and not self._reference and self._idle(snapshot, now, quiet, still):
            return _QUIET_TICK
        records: Records = []
        changes = intents = records  # one ordered list; the names say what goes in
        if self._reference:
            gpus = {g.index: g for g in snapshot.gpus}
            base = tick_env(snapshot, now, self.tz)
            sets = {kind: ScopeSet.of(kind, make(snapshot)) for kind, make in SCOPES.items()}
        else:
            base = self._tick_envs(snapshot, now, self.tz)
            sets, gpus = scope_sets(snapshot, self._process_keys, self._kinds)
        common = _complete(base, snapshot, now, gpus)
        self._envs = {}
        self._record_history(sets, base, common, now, frozenset() if self._reference else still)
        # Views of history taken while recording would miss this tick's samples: rebuild.
        self._envs = {}
        lifecycle = self._lifecycle
        rules, history_kinds = self._plan(_EMPTY if self._reference or not quiet else quiet, now)
        if not self._reference:
            for kind in history_kinds:
                self._add_history(sets[kind], now)
        states = lifecycle.states
        for rule in rules:
            scopes = sets[rule.spec.for_each]
            if (
                not scopes.rows
                and rule.every is None
                and not self._reference
                and not states.get(rule.name)
            ):
                continue  # no scope (an event rule without events) and nothing going on
            if rule.every is not None:
                # Counted from when the engine first saw the rule: a daemon started on
                # Tuesday does not run last Monday's check, however long its ticks.
                last = self._last_run.setdefault(rule.name, now)
                if not self._due(rule, last, now):
                    if states.get(rule.name):
                        lifecycle.advance_open(rule, scopes, snapshot, base, now, changes, intents)
                    continue
                self._last_run[rule.name] = latest_instant(rule.every, last, now, self.tz)
            if self._reference:  # every scope, a fresh environment each
                holding = [
                    i
                    for i in range(len(scopes))
                    if rule.when.test(self._fresh_env(base, scopes.scope(i)))
                ]
            else:
                holding = rule.when.holding(scopes.rows, base, common)
            lifecycle.evaluate(
                rule,
                scopes,
                holding,
                snapshot,
                base,
                now,
                changes,
                intents,
                every_scope=self._reference,
            )
        return Tick(tuple(records)) if records else _QUIET_TICK

    def _idle(
        self, snapshot: Snapshot, now: float, quiet: Collection[str], still: Collection[int]
    ) -> bool:
        """Whether this tick evaluates no rule, and if so its work done: the history recorded,
        as ``step`` records it. A tick is idle when every rule is skipped (quiet, and without
        state or only cooling down: ``_plan``), or is an event rule without state, or only
        cooling down with none of its cooldowns ended, in a snapshot without events (there
        ``step`` would change nothing of it), or a scheduled rule that is not due and has no open
        incident (``step`` would only look at it). The series in ``still`` (held, unchanged,
        the scopes the same) are not recorded again."""
        if snapshot.events:
            return False
        rules, _ = self._plan(quiet, now)
        states = self._lifecycle.states
        for rule in rules:
            held = states.get(rule.name)
            if rule.every is None:
                if rule.spec.for_each != "event" or at_rest_until(held, now) is None:
                    return False
            elif self._due(rule, self._last_run.get(rule.name, now), now) or (
                held and any(state.incident is not None for state in held.values())
            ):
                return False
        for rule in rules:
            if rule.every is not None:
                self._last_run.setdefault(rule.name, now)  # first seen now, as in step
        self._envs = {}
        if not self.playbooks.series:
            return True
        # With ``still``, the scopes are the last tick's: only the others are recorded, from
        # rows of their kinds, and nothing is forgotten (no scope went).
        recorded = self.playbooks.series
        roots = self._series_roots
        if still:
            known = self._unstill
            # A drill's stretch passes one frozenset at each of its ticks.
            if known is None or known[0] is not still or not isinstance(still, frozenset):
                left = tuple(s for s in recorded if not (s.kind == "held" and s.id in still))
                known = self._unstill = (still, left, tuple(dict.fromkeys(s.root for s in left)))
            recorded, roots = known[1], known[2]
        sets, gpus = scope_sets(snapshot, self._process_keys, roots)
        if self._series_shared:
            base = self._tick_envs(snapshot, now, self.tz)
            common = _complete(base, snapshot, now, gpus)
        else:  # no series reads host, time, _now or _gpu_procs: nothing to build
            base, common = _NO_BASE, (None, None, now, None)
        if not still:
            self._record_history(sets, base, common, now)
            return True
        history = self.history
        for series in recorded:
            scopes = sets[series.root]
            values = series.sample_raw(scopes.rows, base, common)
            history.record_many(scopes.keys, series, values, now)
        return True

    def _plan(
        self, quiet: Collection[str], now: float
    ) -> tuple[tuple[CompiledRule, ...], tuple[str, ...]]:
        """The rules this tick evaluates (of ``quiet``, those ``step`` skips are left out),
        and the kinds whose rows need history views (some rule evaluated over them reads
        history). A quiet rule is skipped while it has no state, or while its every state is
        only cooling down (inactive, not stood down) and none of those cooldowns has ended:
        evaluating it there would only forget the cooldowns that ended. The plan is kept
        for the same quiet rules until the first such cooldown ends, while each skipped
        rule's states are the very ones it was made with and each quiet rule evaluated for
        its states is still not at rest (``lifecycle.at_rest_until``)."""
        states = self._lifecycle.states
        known = self._skipping
        if (
            known is not None
            and known.quiet is quiet
            and now < known.until
            and not any(map(states.get, known.bare))
        ):
            for name, had, size in known.cooling:
                if states.get(name) is not had or len(had) != size:
                    break
            else:
                for name in known.busy:
                    if at_rest_until(states.get(name), now) is not None:
                        break  # now at rest: it may be skipped
                else:
                    return known.plan
        bare: list[str] = []
        cooling: list[tuple[str, dict[str, ScopeState], int]] = []
        busy: list[str] = []
        until = math.inf
        for rule in self.playbooks.rules:
            if rule.name not in quiet or rule.every is not None or rule.spec.for_each == "event":
                continue
            held = states.get(rule.name)
            ends = at_rest_until(held, now)
            if ends is None:
                busy.append(rule.name)  # evaluated; the plan is made again once it is at rest
            elif held:
                until = min(until, ends)
                cooling.append((rule.name, held, len(held)))
            else:
                bare.append(rule.name)
        skip = {*bare, *(name for name, _, _ in cooling)}
        run = tuple(r for r in self.playbooks.rules if r.name not in skip)
        needed = {r.spec.for_each for r in run if r.when.series}
        plan = run, tuple(k for k in self._history_kinds if k in needed)
        self._skipping = _Skipping(quiet, tuple(bare), tuple(cooling), tuple(busy), plan, until)
        return plan

    # -- history and environments -----------------------------------------------------------

    def _due(self, rule: CompiledRule, last: float, now: float) -> bool:
        """``rule.every.due(last, now)``, the next run remembered until ``last`` changes."""
        every = rule.every
        assert every is not None
        known = self._next_runs.get(rule.name)
        if (
            known is None
            or known[0] != last
            or known[1] is not self.tz
            or (known[2] is not every and known[2] != every)
        ):
            known = self._next_runs[rule.name] = (
                last,
                self.tz,
                every,
                every.next_run(last, self.tz),
            )
        return known[3] <= now

    def _record_history(
        self,
        sets: dict[str, ScopeSet],
        base: Env,
        common: Shared,
        now: float,
        still: Collection[int] = frozenset(),
    ) -> None:
        """Each series' samples of this tick, but those of the held series in ``still``
        (unchanged, the scopes the last tick's: recording them again changes nothing)."""
        if not self.playbooks.series:
            return
        history = self.history
        keys = [sets[root].keys for root in self._series_roots]
        known = self._recorded
        for series in self.playbooks.series:
            if still and series.kind == "held" and series.id in still:
                continue
            scopes = sets[series.root]
            if self._reference:
                for i in range(len(scopes)):
                    scope = scopes.scope(i)
                    history.observe(scope.key, series, self._fresh_env(base, scope), now)
            else:
                values = series.sample_raw(scopes.rows, base, common)
                history.record_many(scopes.keys, series, values, now)
        if (
            self._reference
            or known is None
            or known[0] is not history
            or known[1] != history.generation
            or known[2] != keys
        ):  # else: the scopes of the last tick, and no scope's history added since
            history.forget_except({key for each in keys for key in each})
            self._recorded = (history, history.generation, keys)

    def _add_history(self, scopes: ScopeSet, now: float) -> None:
        """Give each row of ``scopes`` its scope's history view (what ``_h`` reads)."""
        alsos: list[tuple[str, ...]]
        if scopes.kind == "gpu":  # keyed gpu_key(index): only the host's after its own
            alsos = [_HOST] * len(scopes.keys)
        else:
            alsos = []
            for key, (gpu, _, event, _) in zip(scopes.keys, scopes.rows, strict=True):
                if gpu is not None:
                    alsos.append(history_keys(key, gpu.index))
                elif event is not None:
                    alsos.append(history_keys(key, event.gpu))
                else:
                    alsos.append(_HOST)
        views = self.history.views(scopes.keys, alsos, now)
        scopes.rows = [
            (gpu, process, event, view)
            for (gpu, process, event, _), view in zip(scopes.rows, views, strict=True)
        ]

    def _env(self, base: Env, scope: Scope) -> Env:
        """The environment expressions of ``scope`` see, built once per scope and tick and
        shared by every rule evaluated there. History functions over a wider root
        (``avg(gpu.…)`` in a process rule) read the GPU's and the host's series too."""
        event = scope.event
        key = (scope.key, None if event is None else (event.kind, event.time, event.xid))
        cached = self._envs.get(key)
        if cached is not None and cached["_base"] is base:
            return cached
        env = self._envs[key] = self._fresh_env(base, scope)
        return env

    def _fresh_env(self, base: Env, scope: Scope) -> Env:
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
        env["_h"] = self.history.view(scope.key, base["_now"], also=history_keys(scope.key, gpu))
        return env


_HOST = ("host",)
_QUIET_TICK = Tick(())  # most ticks: nothing changed, nothing to do (Tick is immutable)
_EMPTY: frozenset[str] = frozenset()  # no rule is quiet (one object: see _plan)


class _Skipping(NamedTuple):
    """A plan (``Engine._plan``) and what it holds for: the quiet rules it was made for
    (the very object), the rules skipped (without state; only cooling down, each with its
    states then and how many), the quiet rules evaluated for their states, and the time the
    first skipped cooldown ends."""

    quiet: Collection[str]
    bare: tuple[str, ...]  # skipped, without state
    cooling: tuple[tuple[str, dict[str, ScopeState], int], ...]  # skipped: states, how many
    busy: tuple[str, ...]  # quiet, evaluated for their states (see _plan)
    plan: tuple[tuple[CompiledRule, ...], tuple[str, ...]]
    until: float


_NO_BASE: Env = {}  # an idle tick's environment when no series reads it (see _idle)


def _complete(base: Env, snapshot: Snapshot, now: float, gpus: dict[int, GpuState]) -> Shared:
    """Make the tick's ``tick_env`` the environment every scope's starts from (no scope
    yet), and return what batch functions read of it (``shared(base)``)."""
    base["gpu"] = base["process"] = base["event"] = None
    base["_snapshot"] = snapshot
    base["_gpus"] = gpus
    return (base["host"], base["time"], now, base["_gpu_procs"])


_SHARED_NAMES = frozenset({"host", "time", "_now", "_gpu_procs"})


def _series_read_shared(playbooks: PlaybookSet) -> bool:
    """Whether some series reads the tick's shared environment (its batch form's arguments
    ``host``, ``time``, ``_now``, ``_gpu_procs``), or may (one without a batch form)."""
    return any(
        series.tree is None
        or any(isinstance(n, ast.Name) and n.id in _SHARED_NAMES for n in ast.walk(series.tree))
        for series in playbooks.series
    )


def _history_kinds(playbooks: PlaybookSet) -> tuple[str, ...]:
    """The scope kinds whose rows need history views: some rule's ``when`` there reads it."""
    return tuple(dict.fromkeys(r.spec.for_each for r in playbooks.rules if r.when.series))


def _kinds(playbooks: PlaybookSet) -> frozenset[str]:
    """The scope kinds a tick needs: those of the rules and the roots of the series."""
    return frozenset(r.spec.for_each for r in playbooks.rules) | {s.root for s in playbooks.series}
