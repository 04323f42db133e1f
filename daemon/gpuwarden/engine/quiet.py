"""Which rules cannot hold anywhere over a stretch of ticks: a drill's fast-forward.

A drill plays a timeline it knows ahead. Within one keyframe stretch of a scenario the scopes
stay the same and every ``gpu.*`` and ``process.*`` field moves one way or stays put, so over
the stretch each field lies between its values at the stretch's first and last tick.
``quiet_rules`` takes the snapshots of those two ticks and returns the rules whose ``when``
``playbook.bounds.decide`` shows false (or unknown) in every scope at every tick between: the
engine may skip evaluating them there (``Engine.step``'s ``quiet``), which changes no record
as long as the rule has no state in any scope (the engine checks that itself).

Only ``gpu`` and ``process`` rules without a schedule are ever quiet; fields of other roots
(``host.*``, ``time.*``) are left unknown. A scenario's used GPU memory is the rounded sum of
its jobs' ramps, which floating point can move by a MiB against the ramp's direction: the
``gpu.memory.*`` bounds are widened by 2 MiB for it.

Pure: snapshots in, rule names out.
"""

from __future__ import annotations

import ast
import datetime as dt
import functools

from gpuwarden.engine.history import History
from gpuwarden.engine.scopes import SCOPES, Scope
from gpuwarden.model import Snapshot
from gpuwarden.playbook.bounds import Abstract, Const, Span, Truth, decide, parse
from gpuwarden.playbook.fields import tick_env
from gpuwarden.playbook.loader import CompiledRule, PlaybookSet

__all__ = ["quiet_rules"]

_KINDS = ("gpu", "process")
_ROOTS = ("gpu.", "process.")
_SLACK_MIB = 2.0


@functools.lru_cache(maxsize=256)
def _tree(text: str) -> ast.expr | None:
    return parse(text)


def candidate(rule: CompiledRule) -> bool:
    """Whether ``rule`` may ever be quiet: a ``gpu`` or ``process`` rule without a schedule."""
    return rule.every is None and rule.spec.for_each in _KINDS


def quiet_rules(
    playbooks: PlaybookSet,
    first: tuple[Snapshot, float],
    last: tuple[Snapshot, float],
    tz: dt.tzinfo,
) -> frozenset[str]:
    """The rules of ``playbooks`` whose ``when`` holds at no tick from ``first`` to ``last``
    (each a snapshot and its instant), given that every ``gpu.*`` and ``process.*`` field
    between them lies between its values in the two (see the module doc)."""
    rules = [r for r in playbooks.rules if candidate(r)]
    if not rules:
        return frozenset()
    ranks = playbooks.compiler.ranks
    ends = (_Envs(*first, tz), _Envs(*last, tz))
    quiet: set[str] = set()
    for rule in rules:
        tree = _tree(rule.when.text)
        if tree is None:
            continue
        pairs = ends[0].scopes(rule.spec.for_each), ends[1].scopes(rule.spec.for_each)
        keys = [s.key for s in pairs[0]]
        if keys != [s.key for s in pairs[1]] or len(set(keys)) != len(keys):
            continue  # the scopes differ between the ends: nothing is decided
        for a, b in zip(*pairs, strict=True):
            bounds = _bounds(rule, ends[0].env(a), ends[1].env(b), a, b)
            if not decide(tree, bounds, ranks).never_true:
                break
        else:
            quiet.add(rule.name)
    return frozenset(quiet)


class _Envs:
    """One end's scopes and their environments (as ``Engine.still_needed`` builds them)."""

    def __init__(self, snapshot: Snapshot, now: float, tz: dt.tzinfo) -> None:
        self.snapshot = snapshot
        self.now = now
        gpus = {g.index: g for g in snapshot.gpus}
        base = tick_env(snapshot, now, tz)
        base.update(gpu=None, process=None, event=None, _snapshot=snapshot, _gpus=gpus)
        base["_h"] = History().view("", now)
        self.base = base
        self._scopes: dict[str, list[Scope]] = {}

    def scopes(self, kind: str) -> list[Scope]:
        found = self._scopes.get(kind)
        if found is None:
            found = self._scopes[kind] = SCOPES[kind](self.snapshot)
        return found

    def env(self, scope: Scope) -> dict[str, object]:
        env = dict(self.base)
        env.update(gpu=scope.gpu, process=scope.process, event=scope.event)
        return env


def _bounds(
    rule: CompiledRule, env_a: dict[str, object], env_b: dict[str, object], a: Scope, b: Scope
) -> dict[str, Abstract]:
    out: dict[str, Abstract] = {}
    for show in rule.shows:
        if show.field.startswith(_ROOTS):
            out[show.field] = _hull(
                show.field, show.value.evaluate(env_a), show.value.evaluate(env_b), a, b
            )
    if "process.idle" in rule.when.fields and a.process is not None and b.process is not None:
        out["process.sm_util_pct"] = _hull(
            "process.sm_util_pct", a.process.sm_util_pct, b.process.sm_util_pct, a, b
        )
    return out


def _hull(path: str, x: object, y: object, a: Scope, b: Scope) -> Abstract:
    """The bounds of a field whose values at the two ends are ``x`` and ``y``."""
    if isinstance(x, bool) or isinstance(y, bool):
        if x is y:
            return Truth.ALWAYS if x else Truth.FALSE
        return None
    if isinstance(x, int | float) and isinstance(y, int | float):
        lo, hi = float(min(x, y)), float(max(x, y))
        if path.startswith("gpu.memory."):
            slack = _memory_slack(path, a, b)
            if slack is None:
                return None
            lo, hi = lo - slack, hi + slack
        return Span(lo, hi)
    if x is None and y is None:
        return Const(None)
    if isinstance(x, str | tuple) and x == y and type(x) is type(y):
        return Const(x)
    return None


def _memory_slack(path: str, a: Scope, b: Scope) -> float | None:
    if path.endswith("_mib"):
        return _SLACK_MIB
    totals = [
        s.gpu.memory.total_mib
        for s in (a, b)
        if s.gpu is not None and s.gpu.memory is not None and s.gpu.memory.total_mib
    ]
    if len(totals) != 2:
        return None
    return _SLACK_MIB * 100.0 / min(totals) + 1e-9
