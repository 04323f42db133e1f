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
import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence

from gpuwarden.engine.history import History
from gpuwarden.engine.scopes import SCOPES, Scope
from gpuwarden.model import Snapshot
from gpuwarden.playbook.bounds import (
    Abstract,
    Const,
    HistoryBounds,
    Span,
    Truth,
    decide,
    parse,
)
from gpuwarden.playbook.fields import tick_env
from gpuwarden.playbook.loader import CompiledRule, PlaybookSet

__all__ = ["decide_stretch", "quiet_rules", "still_series"]

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
    *,
    history: History | None = None,
    ticks: Sequence[float] = (),
) -> frozenset[str]:
    """The rules of ``playbooks`` whose ``when`` holds at no tick from ``first`` to ``last``
    (each a snapshot and its instant), given that every ``gpu.*`` and ``process.*`` field
    between them lies between its values in the two (see the module doc). With ``history``
    (the engine's, as it stands before the first tick) and ``ticks`` (every instant of the
    stretch, in order), ``avg``, ``min``, ``max`` and ``predict`` of such a field are bounded
    too (see ``_Windows``); without them they are unknown."""
    return _Stretch(playbooks, first, last, tz).quiet(history, ticks)


def still_series(
    playbooks: PlaybookSet,
    first: tuple[Snapshot, float],
    last: tuple[Snapshot, float],
    tz: dt.tzinfo,
) -> frozenset[int]:
    """The ids of the held series (``held_for``'s conditions) of ``playbooks`` that are the
    same at every tick from ``first`` to ``last`` in every scope of their root: always true,
    or never true, shown by ``decide`` over the fields' bounds (see the module doc); none
    unless the GPUs and processes are the same at both ends. At a tick of the stretch after
    its first, recording such a series again changes nothing (``Engine.step``'s ``still``).
    Only ``gpu`` and ``process`` series that a rule of the same kind reads are decided."""
    return _Stretch(playbooks, first, last, tz).still()


def decide_stretch(
    playbooks: PlaybookSet,
    first: tuple[Snapshot, float],
    last: tuple[Snapshot, float],
    tz: dt.tzinfo,
    *,
    history: History | None = None,
    ticks: Sequence[float] = (),
) -> tuple[frozenset[str], frozenset[int]]:
    """``quiet_rules`` and ``still_series`` of one stretch, its ends' scopes, environments
    and field bounds worked out once for both."""
    stretch = _Stretch(playbooks, first, last, tz)
    return stretch.quiet(history, ticks), stretch.still()


class _Stretch:
    """A stretch's two ends, and the bounds of each scope's fields found so far."""

    def __init__(
        self,
        playbooks: PlaybookSet,
        first: tuple[Snapshot, float],
        last: tuple[Snapshot, float],
        tz: dt.tzinfo,
    ) -> None:
        self.playbooks = playbooks
        self.ranks = playbooks.compiler.ranks
        self.ends = (_Envs(*first, tz), _Envs(*last, tz))
        self.hulls: dict[tuple[str, str], Abstract] = {}  # (scope key, field) -> its bounds

    def same_scopes(self, kind: str) -> bool:
        """Whether the ends have the same scopes of ``kind``, no key twice."""
        keys = [s.key for s in self.ends[0].scopes(kind)]
        return keys == [s.key for s in self.ends[1].scopes(kind)] and len(set(keys)) == len(keys)

    def bounds(self, rule: CompiledRule, a: Scope, b: Scope) -> dict[str, Abstract]:
        return _bounds(rule, self.ends[0].env(a), self.ends[1].env(b), a, b, self.hulls)

    def pairs(self, kind: str) -> zip[tuple[Scope, Scope]]:
        return zip(self.ends[0].scopes(kind), self.ends[1].scopes(kind), strict=True)

    def quiet(self, history: History | None, ticks: Sequence[float]) -> frozenset[str]:
        rules = [r for r in self.playbooks.rules if candidate(r)]
        if not rules:
            return frozenset()
        windows: _Windows | None = None
        if history is not None and ticks:
            windows = _Windows(self.playbooks, history, ticks)
        quiet: set[str] = set()
        for rule in rules:
            tree = _tree(rule.when.text)
            kind = rule.spec.for_each
            if tree is None or not self.same_scopes(kind):
                continue  # nothing is decided (the scopes differ between the ends)
            for a, b in self.pairs(kind):
                bounds = self.bounds(rule, a, b)
                seen = None if windows is None else windows.of(kind, a.key, bounds)
                if not decide(tree, bounds, self.ranks, seen).never_true:
                    break
            else:
                quiet.add(rule.name)
        return frozenset(quiet)

    def still(self) -> frozenset[int]:
        if not all(self.same_scopes(kind) for kind in _KINDS):
            return frozenset()  # the scopes differ between the ends: nothing is promised
        still: set[int] = set()
        for series in self.playbooks.series:
            if series.kind != "held" or series.root not in _KINDS:
                continue
            tree = _tree(series.text)
            rule = next(
                (
                    r
                    for r in self.playbooks.rules
                    if r.spec.for_each == series.root and series in r.when.series
                ),
                None,
            )
            if tree is None or rule is None:
                continue
            for a, b in self.pairs(series.root):
                truth = decide(tree, self.bounds(rule, a, b), self.ranks)
                if truth is not Truth.ALWAYS and not truth.never_true:
                    break
            else:
                still.add(series.id)
        return frozenset(still)


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
        self._envs: dict[str, dict[str, object]] = {}

    def scopes(self, kind: str) -> list[Scope]:
        found = self._scopes.get(kind)
        if found is None:
            found = self._scopes[kind] = SCOPES[kind](self.snapshot)
        return found

    def env(self, scope: Scope) -> dict[str, object]:
        env = self._envs.get(scope.key)
        if env is None:
            env = self._envs[scope.key] = dict(self.base)
            env.update(gpu=scope.gpu, process=scope.process, event=scope.event)
        return env


def _bounds(
    rule: CompiledRule,
    env_a: dict[str, object],
    env_b: dict[str, object],
    a: Scope,
    b: Scope,
    hulls: dict[tuple[str, str], Abstract],
) -> dict[str, Abstract]:
    out: dict[str, Abstract] = {}
    for show in rule.shows:
        name = show.field
        if name.startswith(_ROOTS):
            known = (a.key, name)
            if known not in hulls:
                ends = show.value.evaluate(env_a), show.value.evaluate(env_b)
                hulls[known] = _hull(name, *ends, a, b)
            out[name] = hulls[known]
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


class _Windows:
    """Bounds of ``avg``/``min``/``max``/``predict`` of a field over a stretch, in one scope.

    At each tick the window holds samples recorded before the stretch (known: the history)
    and the stretch's own, which lie within the field's bounds. ``avg``, ``min`` and ``max``
    lie between the least and the greatest of all of them. ``predict`` is the least-squares
    line at ``now + horizon``: a sum of the samples with weights ``w_i`` that add up to 1,
    ``|w_i| <= 1/n + |x0 - mean(x)| * |x_i - mean(x)| / Sxx``, so with every sample within
    ``mid ± r`` it lies within ``mid ± r * (1 + |x0 - mean(x)| * sqrt(n / Sxx))``; the sample
    times (the history's, then the ticks') give that factor at each tick, and the largest is
    taken. Only a scope's own series is read (not a wider scope's, as a process rule reading
    a GPU's history would), and the answers are widened for floating point."""

    def __init__(self, playbooks: PlaybookSet, history: History, ticks: Sequence[float]) -> None:
        self.series = {(s.root, s.text): s for s in playbooks.series if s.kind == "value"}
        self.history = history
        self.ticks = tuple(ticks)
        # (times before the stretch, horizon, window, factor): a stretch has few of them, and
        # every GPU's track holds the same times (compared as lists, without a tuple to hash).
        self._spread: list[tuple[list[float], float, float, float | None]] = []

    def of(self, kind: str, key: str, fields: Mapping[str, Abstract]) -> HistoryBounds:
        def bounds(name: str, path: str, args: tuple[float, ...]) -> Abstract:
            return self._bounds(kind, key, fields, name, path, args)

        return bounds

    def _bounds(
        self,
        kind: str,
        key: str,
        fields: Mapping[str, Abstract],
        name: str,
        path: str,
        args: tuple[float, ...],
    ) -> Abstract:
        span = fields.get(path)
        series = self.series.get((kind, path))
        if not isinstance(span, Span) or span.maybe_none or series is None:
            return None
        window = args[-1]
        first = self.ticks[0]
        times: list[float] = []
        values: list[float] = []
        track = self.history.track(key, series.id)
        if track is not None:
            start = track.start
            if len(track.times) > start and track.times[-1] > first:
                return None  # the clock went back: the track starts over
            i = bisect_left(track.times, first - window, start)
            j = bisect_left(track.times, first, i)  # one at `first` itself is replaced
            times, values = track.times[i:j], track.values[i:j]
        if len(times) + len(self.ticks) + 2 >= self.history.max_samples:
            return None
        lo, hi = min([span.lo, *values]), max([span.hi, *values])
        if name != "predict":
            slack = 1e-6 * (1.0 + abs(lo) + abs(hi))
            return Span(lo - slack, hi + slack, maybe_none=True)
        spread = self._factor(times, args[0], window)
        if spread is None:
            return None
        mid, reach = (lo + hi) / 2, (hi - lo) / 2 * spread
        slack = 1e-4 * (1.0 + abs(mid) + reach)
        return Span(mid - reach - slack, mid + reach + slack, maybe_none=True)

    def _factor(self, before: list[float], horizon: float, window: float) -> float | None:
        """The largest ``1 + |x0 - mean(x)| * sqrt(n / Sxx)`` over the ticks (see the class
        doc); None when some tick's times are too close together to bound it."""
        for known, at, over, factor in self._spread:
            if at == horizon and over == window and known == before:
                return factor
        origin = self.ticks[0]
        instants = (*before, *self.ticks)
        times = [t - origin for t in instants]  # for the sums; which samples a window
        sums, squares = [0.0], [0.0]  # holds is decided on the instants, as History does
        for x in times:
            sums.append(sums[-1] + x)
            squares.append(squares[-1] + x * x)
        largest: float | None = 1.0
        i = 0
        for j in range(len(before) + 1, len(times) + 1):  # samples [i, j) at tick j - 1
            now = times[j - 1]
            oldest = instants[j - 1] - window
            while instants[i] < oldest:
                i += 1
            n = j - i
            if n < 2:
                continue  # predict is None there
            sx = sums[j] - sums[i]
            sxx = squares[j] - squares[i] - sx * sx / n
            if sxx <= 1e-6 * n * (1.0 + window * window):
                largest = None  # nearly equal times: the line can be anything
                break
            assert largest is not None
            largest = max(largest, 1.0 + (now + horizon - sx / n) * math.sqrt(n / sxx))
        self._spread.append((before, horizon, window, largest))
        return largest
