"""The state machine each rule runs per scope: inactive → pending → firing → resolved.

``Lifecycle`` holds the state of every (rule, scope) pair the engine tracks and moves it on
each tick: pending once ``when`` holds, firing (an incident opens) once it held for ``for``
(event and scheduled rules fire at once), resolved when ``when`` clears or ``until`` holds,
the scope is gone, or a one-shot rule's ladder has run; ``cooldown`` then keeps the scope
from firing again for a while. While an incident is open, each tick hands it to the ladder
(ladder.py), which this module drives but does not know the inside of.

``Engine`` (engine.py) owns the one ``Lifecycle``: it decides which rules are evaluated in a
tick (schedules), evaluates ``when`` over a kind's scopes and passes in where it holds, builds
the environments of the scopes visited (``env_for``, its cached builder), and reads the
states back for its public views. Imports only downward: ladder,
incident, scopes; never engine.py.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence

from gpuwarden.engine.incident import Incident, ScopeState, stamp
from gpuwarden.engine.ladder import Env, Ladder, Records, ladder_done, silence_note
from gpuwarden.engine.scopes import Scope, ScopeSet
from gpuwarden.model import GpuState, Reason, RuleChange, Snapshot, Transition
from gpuwarden.playbook.loader import CompiledRule, Show
from gpuwarden.text import safe_text

EnvFor = Callable[[Env, Scope], Env]  # (the tick's base env, a scope) -> the scope's env


class Lifecycle:
    """The states of every rule's scopes, and the transitions between them (see the module
    doc). One per engine; it outlives playbook reloads."""

    def __init__(self, ladder: Ladder, env_for: EnvFor, tz: dt.tzinfo) -> None:
        self.ladder = ladder
        self.tz = tz  # replaced with the config (Engine.replace)
        self.states: dict[str, dict[str, ScopeState]] = {}  # rule -> scope key -> state
        self._env_for = env_for
        # Incident ids opened within the current second (ids are stamped to the second).
        self._id_second = ""
        self._ids: dict[str, int] = {}

    # -- views and changes from outside a tick ----------------------------------------------

    def phase_counts(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for rule, states in self.states.items():
            for state in states.values():
                if state.phase in ("pending", "firing"):
                    key = (rule, state.phase)
                    counts[key] = counts.get(key, 0) + 1
        return counts

    def open_incidents(self) -> list[Incident]:
        return [
            s.incident
            for states in self.states.values()
            for s in states.values()
            if s.incident is not None
        ]

    def drop_rules_except(self, names: Collection[str], now: float) -> list[RuleChange]:
        """Forget every rule not in ``names``; each open incident of one resolves with
        ``RULE_REMOVED`` (returned). What such an incident had in flight stays known to the
        ladder, so that its outcome is still taken when it comes."""
        closed: list[RuleChange] = []
        for rule, states in list(self.states.items()):
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
            del self.states[rule]
        return closed

    def find(self, incident_id: str) -> tuple[str, ScopeState] | None:
        """The rule and scope state of the open incident ``incident_id``."""
        for rule, states in self.states.items():
            for state in states.values():
                if state.incident is not None and state.incident.id == incident_id:
                    return rule, state
        return None

    def abort(self, rule: CompiledRule, state: ScopeState, now: float, detail: str) -> RuleChange:
        """A person ended the incident of ``state`` (``gpuwarden abort``): it resolves with
        ``ABORTED`` and, unless the rule is one-shot, its scope stands down until `when` has
        been false once, so that the same condition does not fire it again at once."""
        state.stood_down = not rule.one_shot
        return self._resolve(rule, state, now, Reason.ABORTED, [], detail=detail)

    # -- one rule in one tick ---------------------------------------------------------------

    def evaluate(
        self,
        rule: CompiledRule,
        scopes: ScopeSet,
        holding: Sequence[int],
        snapshot: Snapshot,
        base: Env,
        now: float,
        changes: Records,
        intents: Records,
        *,
        every_scope: bool = False,
    ) -> None:
        """Move ``rule``'s states and open incidents on: ``holding`` are the positions in
        ``scopes`` where its ``when`` holds this tick. Only those scopes and the ones with a
        state are visited (``every_scope``: all of them, in order — the plain way, which gives
        the same records); a scope that neither holds nor has a state has nothing to do."""
        states = self.states.setdefault(rule.name, {})
        if not holding and not states:
            return  # nothing holds and nothing was going on: the common case
        event = rule.spec.for_each == "event"
        if not (holding or every_scope or event) and all(map(_cooling, states.values())):
            # Nothing holds and every state is only cooling down: what the visit below does
            # comes to forgetting the cooled ones (and new labels, read only while pending).
            for key, cooling in list(states.items()):
                if cooling.cooldown_until <= now:
                    del states[key]
            return
        held = set(holding)
        order: Iterable[int]
        if every_scope or event or not scopes.unique:
            order = range(len(scopes))
        elif states:
            index = scopes.index
            order = sorted(held.union(i for k in states if (i := index.get(k)) is not None))
        else:
            order = holding
        keys = scopes.keys
        present: set[str] = set()
        for i in order:
            key = keys[i]
            if event and key in present:
                continue  # one incident per GPU, however many events arrive in one tick
            holds = i in held
            state = states.get(key)
            if state is None:
                if not holds:
                    continue
                state = states[key] = ScopeState()
            present.add(key)
            phase = state.phase
            if phase == "firing":
                state.label = scopes.label(i)
                continue  # handled below with every open incident of the rule
            if not holds and phase == "inactive" and not state.stood_down:
                state.label = scopes.label(i)
                continue  # _idle_or_pending would do nothing: no environment needed
            scope = scopes.scope(i)
            state.label = scope.label
            env = self._env_for(base, scope)
            self._idle_or_pending(rule, scope, state, holds, env, now, changes, intents)
        if not states:
            return
        self.advance_open(
            rule,
            scopes,
            snapshot,
            base,
            now,
            changes,
            intents,
            # (with a key twice, the environment is the first one's: test it there)
            held=held if not (every_scope or event) and scopes.unique else None,
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
            if state.stood_down and key not in present:
                state.stood_down = False  # the scope went away: it starts afresh
            if state.phase == "inactive" and state.cooldown_until <= now and not state.stood_down:
                del states[key]

    def advance_open(
        self,
        rule: CompiledRule,
        scopes: ScopeSet,
        snapshot: Snapshot,
        base: Env,
        now: float,
        changes: Records,
        intents: Records,
        *,
        held: Container[int] | None = None,
    ) -> None:
        """Resolve or advance every open incident of ``rule`` (``scopes``: this tick's of the
        rule's kind). (Called on its own for a scheduled rule between its runs.) ``held``:
        the positions in ``scopes`` where ``when`` holds this tick, when known (else it is
        tested in each open incident's scope)."""
        states = self.states.get(rule.name)
        if not states:
            return
        event = rule.spec.for_each == "event"
        gpus: dict[int, GpuState] | None = None
        for key, state in list(states.items()):
            incident = state.incident
            if state.phase != "firing" or incident is None:
                continue
            scope: Scope | None
            if event:
                if gpus is None:
                    gpus = {g.index: g for g in snapshot.gpus}
                scope = Scope(
                    key,
                    incident.label,
                    gpu=None if incident.gpu is None else gpus.get(incident.gpu),
                    event=incident.event,
                )
            else:
                i = scopes.index.get(key)
                scope = None if i is None else scopes.scope(i)
            if scope is None:
                self._resolve(rule, state, now, Reason.SCOPE_GONE, changes)
                continue
            env = self._env_for(base, scope)
            if rule.until is not None:
                if rule.until.test(env):
                    values = read_values(rule.until_shows, env)
                    self._resolve(rule, state, now, Reason.UNTIL_MET, changes, values)
                    continue
                if rule.one_shot:
                    holds = True
                else:
                    holds = rule.when.test(env) if held is None else i in held
            elif rule.one_shot:
                holds = True
            else:
                holds = rule.when.test(env) if held is None else i in held
                if not holds:
                    values = read_values(rule.shows, env)
                    self._resolve(rule, state, now, Reason.RESOLVED, changes, values)
                    continue
            self.ladder.run(rule, incident, scope, env, holds, now, changes, intents)
            if rule.one_shot and rule.until is None and ladder_done(rule, incident):
                self._resolve(rule, state, now, Reason.LADDER_DONE, changes)

    # -- transitions ------------------------------------------------------------------------

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
        if state.stood_down:
            if holds:
                return  # aborted by a person: fires again only once `when` has cleared
            state.stood_down = False
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
            values = read_values(rule.shows, env)
            changes.append(
                RuleChange(
                    Transition.PENDING,
                    name,
                    scope.key,
                    now,
                    Reason.CONDITION_MET,
                    where=scope.label,
                    detail=values_text(values),
                    values=values,
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
        values = read_values(rule.shows, env)
        silence = self.ladder.silence_of(rule.name, incident, now)
        silenced = "" if silence is None else f"silenced: {silence_note(silence)}"
        changes.append(
            RuleChange(
                Transition.FIRING,
                rule.name,
                scope.key,
                now,
                reason,
                incident.id,
                "; ".join(part for part in (silenced, values_text(values)) if part),
                where=scope.label,
                values=values,
            )
        )
        self.ladder.run(rule, incident, scope, env, True, now, changes, intents)

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

    def _resolve(
        self,
        rule: CompiledRule,
        state: ScopeState,
        now: float,
        reason: Reason,
        changes: Records,
        values: tuple[tuple[str, object], ...] = (),
        detail: str = "",
    ) -> RuleChange:
        incident = state.incident
        assert incident is not None
        self.ladder.forget(incident)
        state.phase = "inactive"
        state.incident = None
        state.cooldown_until = now + rule.spec.cooldown
        state.cooldown_noted = False
        change = RuleChange(
            Transition.RESOLVED,
            rule.name,
            incident.scope,
            now,
            reason,
            incident.id,
            detail or values_text(values),
            where=incident.label,
            values=values,
        )
        changes.append(change)
        return change


def _cooling(state: ScopeState) -> bool:
    """Inactive and not stood down: at most a cooldown left (see ``Lifecycle.evaluate``)."""
    return state.phase == "inactive" and not state.stood_down


def at_rest_until(states: Mapping[str, ScopeState] | None, now: float) -> float | None:
    """Until when evaluating a rule that holds nowhere changes none of its ``states``: for
    ever without states; where each is only cooling down (inactive, not stood down) and
    none of the cooldowns has ended, until the first ends (``evaluate`` then only forgets
    those ended). None where something is going on (pending, firing, stood down) or a
    cooldown has ended: evaluating the rule now may change its states."""
    if not states:
        return math.inf
    if not all(map(_cooling, states.values())):
        return None
    ends = min(state.cooldown_until for state in states.values())
    return ends if ends > now else None


def read_values(shows: tuple[Show, ...], env: Env) -> tuple[tuple[str, object], ...]:
    """What each field a condition reads holds in ``env`` (None: unknown)."""
    return tuple((show.field, show.read(env)) for show in shows)


def values_text(values: tuple[tuple[str, object], ...]) -> str:
    """``gpu.memory.used_pct = 95.3, gpu.temperature_c = 76`` for people; strings from
    processes are cut short and their control characters replaced."""
    return ", ".join(f"{name} = {_shown(value)}" for name, value in values)


def _shown(value: object) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.2f}".rstrip("0").rstrip(".") if math.isfinite(value) else "unknown"
    if isinstance(value, str):
        text = safe_text(value)
        return repr(text if len(text) <= 40 else text[:39] + "…")
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_shown(v) for v in value[:8]) + (", …]" if len(value) > 8 else "]")
    return safe_text(str(value))
