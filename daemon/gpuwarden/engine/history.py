"""History for the expression functions: recent samples per scope and series. Pure.

Each tick the engine records every registered ``Series`` for every scope of the series' root
(``record`` for a numeric field, ``record_held`` for a ``held_for`` condition; ``observe`` does
either from an environment), then evaluates rules with ``view(scope_key, now)`` as ``_h``.

- A numeric series keeps its ``(time, value)`` samples, oldest first, trimmed to the series'
  window (the longest any expression asks of it); an unknown (``None``) value is not recorded.
- A held series keeps only since when its condition has been true without a break.
- A query over a window ``W`` reads the samples with ``now - W <= time <= now`` (both ends
  count). The window's ends are found by bisection and running sums make ``avg``, ``rate``
  and ``predict`` cost the same however many samples the window holds; ``min``/``max`` scan
  the window's slice.

A process rule may read a GPU's or the host's history (``avg(gpu.power_w, 5m)`` in a process
rule): that series is recorded under the GPU's (or the host's) scope key, and the process's
view names those keys too: ``view(process_key, now, also=(gpu_key, host_key))``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuwarden.playbook.expr import HistoryView, Series

MAX_SAMPLES = 100_000  # per scope and series, whatever the window: a bound on memory
_COMPACT_AFTER = 256  # dropped samples before the lists are shifted down

_EMPTY: Mapping[int, Any] = {}  # a scope with no history yet (never written to)


def _sid(series: Series | int) -> int:
    return series if isinstance(series, int) else series.id


def _number(value: object) -> float | None:
    """``value`` as a value series records it: a number, or None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


class Track:
    """The samples of one series in one scope: times and values from ``start`` on are live.

    ``sx``, ``sv``, ``sxx``, ``sxv`` are running sums (index k: over the first k samples) of
    x = time - ``base``, of the value, of x² and of x·value, so any window's sums are two
    subtractions. They are written when first read (``sum_up``), most ticks read none: the
    same additions in the same order as at each append, so the same floats. Dropped samples
    are shifted out (and the sums rebuilt) once they are the larger part, which keeps appends
    amortized O(1) and ``base`` close to the samples.
    """

    __slots__ = ("base", "start", "sv", "sx", "sxv", "sxx", "times", "values")

    def __init__(self, base: float) -> None:
        self.base = base
        self.start = 0
        self.times: list[float] = []
        self.values: list[float] = []
        self.sx: list[float] = [0.0]
        self.sv: list[float] = [0.0]
        self.sxx: list[float] = [0.0]
        self.sxv: list[float] = [0.0]

    def __len__(self) -> int:
        return len(self.times) - self.start

    def append(self, t: float, value: float) -> None:
        self.times.append(t)
        self.values.append(value)

    def sum_up(self) -> None:
        """Write the running sums of the samples appended since they were last read."""
        sx, sv, sxx, sxv = self.sx, self.sv, self.sxx, self.sxv
        times, values, base = self.times, self.values, self.base
        for k in range(len(sx) - 1, len(times)):
            x = times[k] - base
            v = values[k]
            sx.append(sx[-1] + x)
            sv.append(sv[-1] + v)
            sxx.append(sxx[-1] + x * x)
            sxv.append(sxv[-1] + x * v)

    def pop(self) -> None:
        if len(self.sx) > len(self.times):  # the last sample's sums are written
            for column in (self.sx, self.sv, self.sxx, self.sxv):
                column.pop()
        self.times.pop()
        self.values.pop()
        self.start = min(self.start, len(self.times))

    def last_time(self) -> float | None:
        return self.times[-1] if len(self) else None

    def trim(self, oldest: float | None, max_samples: int) -> None:
        """Drop samples older than ``oldest`` and all but the newest ``max_samples``."""
        start = self.start
        if oldest is not None:
            start = bisect_left(self.times, oldest, start)
        self.start = max(start, len(self.times) - max_samples)
        if self.start > _COMPACT_AFTER and 2 * self.start > len(self.times):
            self._compact()

    def _compact(self) -> None:
        times, values = self.times[self.start :], self.values[self.start :]
        self.base = times[0] if times else self.base
        self.start = 0
        self.times, self.values = [], []
        base = self.base
        xs = [t - base for t in times]
        # The sums ``append`` would write, one by one, in the same order (the same floats).
        self.times, self.values = times, values
        self.sx = list(accumulate(xs, initial=0.0))
        self.sv = list(accumulate(values, initial=0.0))
        self.sxx = list(accumulate([x * x for x in xs], initial=0.0))
        self.sxv = list(accumulate([x * v for x, v in zip(xs, values, strict=True)], initial=0.0))

    def span(self, now: float, window: float) -> tuple[int, int]:
        """Indexes [i, j) of the samples with ``now - window <= time <= now``."""
        i = bisect_left(self.times, now - window, self.start)
        return i, bisect_right(self.times, now, i)


class History:
    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self.max_samples = max_samples
        self._values: dict[Hashable, dict[int, Track]] = {}
        self._since: dict[Hashable, dict[int, float]] = {}
        # Series id -> the longest window anything needs of it: from the Series when one is
        # recorded, and from the queries themselves (a bare id brings no window).
        self._windows: dict[int, float] = {}
        # (scope key, also) -> the series maps a view of it reads; emptied whenever a scope's
        # maps are added or dropped (see _scope_values, _scope_since, forget).
        self._maps: dict[
            tuple[Hashable, tuple[Hashable, ...]],
            tuple[tuple[Mapping[int, Track], ...], tuple[Mapping[int, float], ...]],
        ] = {}
        self._kept: dict[tuple[Hashable, tuple[Hashable, ...]], ScopeHistory] = {}  # views()
        # Series id -> (scope keys, when, their tracks): what record_many recorded last, when
        # every key has a track and none repeats; dropped when anything else may change them.
        self._lanes: dict[int, tuple[list[Hashable], float, list[Track]]] = {}
        # Held series id -> (scope keys, their maps of since-when): the same while no scope's
        # maps are added or dropped.
        self._held_lanes: dict[int, tuple[list[Hashable], list[dict[int, float]]]] = {}
        self.generation = 0  # counts the times scopes' maps were added or dropped

    def _scope_values(self, scope_key: Hashable) -> dict[int, Track]:
        tracks = self._values.get(scope_key)
        if tracks is None:
            tracks = self._values[scope_key] = {}
            self._changed()
        return tracks

    def _scope_since(self, scope_key: Hashable) -> dict[int, float]:
        since = self._since.get(scope_key)
        if since is None:
            since = self._since[scope_key] = {}
            self._changed()
        return since

    # -- recording ----------------------------------------------------------------------------

    def record(
        self, scope_key: Hashable, series: Series | int, value: float | None, now: float
    ) -> None:
        sid = _sid(series)
        if not isinstance(series, int):
            self.need_window(sid, series.window)
        self._lanes.pop(sid, None)  # a track of the series may change here
        tracks = self._scope_values(scope_key)
        track = tracks.get(sid)
        if track is None:
            if value is None:
                return
            track = tracks[sid] = Track(now)
        last = track.last_time()
        if last is not None and last > now:
            track = tracks[sid] = Track(now)  # the clock went back (a new drill): start over
        if value is not None:
            if last == now:
                track.pop()  # recorded twice in one tick: the last value wins
            track.append(now, float(value))
        window = self._windows.get(sid)
        track.trim(None if window is None else now - window, self.max_samples)

    def record_held(
        self, scope_key: Hashable, series: Series | int, is_true: bool, now: float
    ) -> None:
        since = self._scope_since(scope_key)
        sid = _sid(series)
        if not is_true:
            since.pop(sid, None)
        elif since.get(sid, now) > now:
            since[sid] = now  # the clock went back
        else:
            since.setdefault(sid, now)

    def observe(
        self, scope_key: Hashable, series: Series, env: dict[str, object], now: float
    ) -> None:
        """Sample ``series`` in a scope's environment and record it."""
        value = series.sample(env)
        if series.kind == "held":
            self.record_held(scope_key, series, value is True, now)
        else:
            self.record(scope_key, series, None if isinstance(value, bool) else value, now)

    def record_many(
        self,
        scope_keys: Sequence[Hashable],
        series: Series,
        values: Sequence[object],
        now: float,
    ) -> None:
        """``series`` sampled in many scopes (``Series.sample_rows``, or ``sample_raw``: a
        value that is not a number counts as unknown, one that is not True as false): as
        ``observe`` in each (``record_held`` or ``record``, written out here: this runs every
        tick)."""
        sid = series.id
        if series.kind == "held":
            held = self._held_lanes.get(sid)
            if held is not None and held[0] == scope_keys:  # the maps of the keys: known
                for known, value in zip(held[1], values, strict=True):
                    if value is not True:
                        if sid in known:
                            del known[sid]
                    else:
                        began = known.get(sid)
                        if began is None or began > now:  # newly true, or the clock went back
                            known[sid] = now
                return
            since_of = self._since
            for key, value in zip(scope_keys, values, strict=True):
                since = since_of.get(key)
                if since is None:
                    since = self._scope_since(key)
                if value is not True:
                    since.pop(sid, None)
                elif since.get(sid, now) > now:
                    since[sid] = now  # the clock went back
                else:
                    since.setdefault(sid, now)
            self._held_lanes[sid] = (list(scope_keys), [since_of[key] for key in scope_keys])
            return
        self.need_window(sid, series.window)
        window = self._windows.get(sid)
        oldest = None if window is None else now - window
        max_samples = self.max_samples
        lane = self._lanes.get(sid)
        if lane is not None and lane[1] < now and lane[0] == scope_keys:
            self._record_lane(lane[2], values, now, oldest)
            self._lanes[sid] = (lane[0], now, lane[2])
            return
        tracks_of = self._values
        for key, sampled in zip(scope_keys, values, strict=True):
            tracks = tracks_of.get(key)
            if tracks is None:
                tracks = self._scope_values(key)
            track = tracks.get(sid)
            value = sampled if sampled.__class__ is float else _number(sampled)
            if track is None:
                if value is None:
                    continue
                track = tracks[sid] = Track(now)
            if len(track.times) > track.start:
                last = track.times[-1]
                if last > now:
                    track = tracks[sid] = Track(now)  # the clock went back (a new drill)
                elif last == now and value is not None:
                    track.pop()  # recorded twice in one tick: the last value wins
            if value is not None:
                track.append(now, float(value))
            track.trim(oldest, max_samples)
        self._lanes.pop(sid, None)
        if len(set(scope_keys)) == len(scope_keys):
            kept: list[Track] = []
            for key in scope_keys:
                found = tracks_of[key].get(sid)
                if found is None:
                    break
                kept.append(found)
            else:
                self._lanes[sid] = (list(scope_keys), now, kept)

    def _record_lane(
        self, tracks: list[Track], values: Sequence[Any], now: float, oldest: float | None
    ) -> None:
        """``record_many`` for scopes whose tracks are known (the lane of the series: the
        same keys as the last call, each with a track, none with a sample at or after
        ``now``): the same appends and trims, with no look-ups and no checks of the clock."""
        max_samples = self.max_samples
        for track, sampled in zip(tracks, values, strict=True):
            times = track.times
            if sampled.__class__ is float:
                v: float | None = sampled
            else:
                number = _number(sampled)
                v = None if number is None else float(number)
            if v is not None:
                times.append(now)  # Track.append, written out
                track.values.append(v)
            # Track.trim, written out
            n = len(times)
            start = track.start
            if oldest is not None and start < n and times[start] < oldest:
                start = bisect_left(times, oldest, start + 1)
            if n - max_samples > start:  # noqa: PLR1730 - max() costs a call per sample
                start = n - max_samples
            track.start = start
            if start > _COMPACT_AFTER and 2 * start > n:
                track._compact()

    def track(self, scope_key: Hashable, sid: int) -> Track | None:
        """The samples of series ``sid`` kept for ``scope_key`` (read only)."""
        return self._values.get(scope_key, {}).get(sid)

    def need_window(self, sid: int, window: float) -> None:
        """Keep at least ``window`` seconds of series ``sid`` from now on."""
        if window > self._windows.get(sid, 0.0):
            self._windows[sid] = window

    # -- reading ------------------------------------------------------------------------------

    def view(
        self, scope_key: Hashable, now: float, *, also: Iterable[Hashable] = ()
    ) -> HistoryView:
        """The history of ``scope_key`` at ``now``; series not recorded under it are looked up
        under the keys in ``also`` (the scope's GPU, the host), first found wins."""
        also = tuple(also)
        maps = self._maps.get((scope_key, also))
        if maps is None:
            maps = self._scope_maps(scope_key, also)
        return ScopeHistory(maps[0], maps[1], now, self)

    def views(
        self, scope_keys: Sequence[Hashable], alsos: Sequence[tuple[Hashable, ...]], now: float
    ) -> list[ScopeHistory]:
        """``view(key, now, also=also)`` for each key and its ``also``, for one evaluation
        of many scopes at ``now``: the views are kept from tick to tick and moved to ``now``,
        so a view taken here is good only until the next call (``view`` makes one to keep)."""
        kept = self._kept
        out: list[ScopeHistory] = []
        for key, also in zip(scope_keys, alsos, strict=True):
            view = kept.get((key, also))
            if view is None:
                maps = self._maps.get((key, also)) or self._scope_maps(key, also)
                view = kept[(key, also)] = ScopeHistory(maps[0], maps[1], now, self)
            else:
                view._now = now
            out.append(view)
        return out

    def _scope_maps(
        self, scope_key: Hashable, also: tuple[Hashable, ...]
    ) -> tuple[tuple[Mapping[int, Track], ...], tuple[Mapping[int, float], ...]]:
        keys = (scope_key, *also)
        maps = self._maps[(scope_key, also)] = (
            tuple(self._values.get(key, _EMPTY) for key in keys),
            tuple(self._since.get(key, _EMPTY) for key in keys),
        )
        return maps

    def _changed(self) -> None:
        """A scope's series maps were added or dropped: views must look them up again."""
        self._maps.clear()
        self._kept.clear()
        self._lanes.clear()
        self._held_lanes.clear()
        self.generation += 1

    def scope_keys(self) -> set[Hashable]:
        return set(self._values) | set(self._since)

    def forget(self, scope_keys: Iterable[Hashable]) -> None:
        """Drop the history of scopes that are gone (a process that exited, a lost GPU)."""
        for key in scope_keys:
            self._values.pop(key, None)
            self._since.pop(key, None)
            self._changed()

    def forget_except(self, scope_keys_seen: Collection[Hashable]) -> None:
        """Drop the history of every scope not in ``scope_keys_seen``."""
        seen = scope_keys_seen
        if not isinstance(seen, set | frozenset):
            seen = set(seen)
        if seen.issuperset(self._values) and seen.issuperset(self._since):
            return  # the common case: every scope is still there
        self.forget([k for k in self.scope_keys() if k not in seen])


class ScopeHistory:
    """One scope's history at one instant: what ``_h`` is while a rule is evaluated."""

    __slots__ = ("_now", "_since", "_values", "_windows")

    def __init__(
        self,
        values: tuple[Mapping[int, Track], ...],
        since: tuple[Mapping[int, float], ...],
        now: float,
        history: History,
    ) -> None:
        # The scope's own series first, then the wider scopes' (its GPU, the host): looked up
        # when a function asks, first found wins, never merged into a copy.
        self._values = values
        self._since = since
        self._now = now
        self._windows = history._windows  # what need_window keeps

    def _window(self, series: int, window: float) -> tuple[Track | None, int, int]:
        windows = self._windows
        if window > windows.get(series, 0.0):  # History.need_window, written out
            windows[series] = window
        for found in self._values:  # the scope's own, then its GPU's, then the host's
            track = found.get(series)
            if track is not None:
                now = self._now
                times = track.times
                i = bisect_left(times, now - window, track.start)  # Track.span, written out
                return track, i, bisect_right(times, now, i)
        return None, 0, 0

    def avg(self, series: int, window: float) -> float | None:
        track, i, j = self._window(series, window)
        if track is None or j == i:
            return None
        if len(track.sx) <= j:
            track.sum_up()
        return (track.sv[j] - track.sv[i]) / (j - i)

    def min(self, series: int, window: float) -> float | None:
        track, i, j = self._window(series, window)
        return None if track is None or j == i else min(track.values[i:j])

    def max(self, series: int, window: float) -> float | None:
        track, i, j = self._window(series, window)
        return None if track is None or j == i else max(track.values[i:j])

    def rate(self, series: int, window: float) -> float | None:
        """Change per second: (last - first) / (their time span); None with < 2 samples."""
        track, i, j = self._window(series, window)
        if track is None or j - i < 2:
            return None
        span = track.times[j - 1] - track.times[i]
        return (track.values[j - 1] - track.values[i]) / span if span > 0 else None

    def predict(self, series: int, horizon: float, window: float) -> float | None:
        """The least-squares line through the window's samples, ``horizon`` seconds after now
        (Prometheus' predict_linear); None with < 2 samples."""
        track, i, j = self._window(series, window)
        n = j - i
        if track is None or n < 2:
            return None
        if len(track.sx) <= j:
            track.sum_up()
        sum_x = track.sx[j] - track.sx[i]
        sum_v = track.sv[j] - track.sv[i]
        mean_x, mean_v = sum_x / n, sum_v / n
        sxx = (track.sxx[j] - track.sxx[i]) - sum_x * mean_x
        if sxx <= 0:
            return None
        slope = ((track.sxv[j] - track.sxv[i]) - sum_x * mean_v) / sxx
        return mean_v + slope * (self._now + horizon - track.base - mean_x)

    def held_for(self, series: int) -> float:
        for found in self._since:  # the scope's own, then its GPU's, then the host's
            since = found.get(series)
            if since is not None:
                return max(0.0, self._now - since)
        return 0.0
