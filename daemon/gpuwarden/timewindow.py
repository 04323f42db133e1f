"""When a rule may fire (``active:``) and when a scheduled rule runs (``every:``).

Pure: the time comes in as an argument (epoch seconds) with the zone to read it in. The syntax
of both, and its error messages, is in ``gpuwarden/timewindow_parse.py``; this module holds the
schedule itself: whether an instant is inside a window, when that next changes, and when a
schedule next runs or is due.

``active`` ranges are wall-clock time: when clocks spring forward ``02:00-03:00`` does not happen
and ``01:00-04:00`` lasts two hours; when they fall back ``02:00-03:00`` lasts two.

``every``: ``hourly`` runs at that minute of every real hour (twice in the hour that repeats, not
in the one skipped). ``daily 03:00``, ``Mon 09:00`` and the like run at those wall-clock times; a
time the clocks skip runs as much later as they jumped (02:30 at 03:30, as in iCalendar), a time
that happens twice runs at the first. An interval (``6h``, ``30m``, ``90`` seconds) is measured
from the last run.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, tzinfo

from gpuwarden.timewindow_parse import (
    ALWAYS_SPANS,
    DAY_MINUTES,
    DAY_NAMES,
    EXPECT_EVERY,
    EXPECT_WINDOW,
    WEEK_MINUTES,
    WindowError,
    schedule_parts,
    window_spans,
)

__all__ = [
    "DAY_NAMES",
    "DEFAULT_GRACE",
    "ActiveWindows",
    "Schedule",
    "WindowError",
    "parse_active",
    "parse_every",
]

DEFAULT_GRACE = 300.0
"""How late (seconds) a first run may still be when a calendar schedule has never run."""


def _offset(epoch: float, tz: tzinfo) -> timedelta | None:
    return datetime.fromtimestamp(epoch, tz).utcoffset()


def _transitions(lo: int, hi: int, tz: tzinfo) -> list[float]:
    """Instants in ``(lo, hi]`` where the zone's UTC offset changes (at most one per 3 hours)."""
    out: list[float] = []
    t, off = lo, _offset(lo, tz)
    while t < hi:
        u = min(t + 3 * 3600, hi)
        new = _offset(u, tz)
        if new != off:
            a, b = t, u
            while b - a > 1:
                mid = (a + b) // 2
                a, b = (mid, b) if _offset(mid, tz) == off else (a, mid)
            out.append(float(b))
        t, off = u, new
    return out


def _wall(day: date, minute: int, tz: tzinfo, fold: int = 0) -> float:
    hour, minute = divmod(minute, 60)
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz, fold=fold).timestamp()


@dataclass(frozen=True)
class ActiveWindows:
    """When a rule may fire. Build with ``parse_active`` (or from a window string directly)."""

    text: str
    spans: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spans", window_spans(self.text))

    @property
    def always(self) -> bool:
        return self.spans == ALWAYS_SPANS

    def contains(self, epoch: float, tz: tzinfo) -> bool:
        local = datetime.fromtimestamp(epoch, tz)
        minute = local.weekday() * DAY_MINUTES + local.hour * 60 + local.minute
        i = bisect_right(self.spans, (minute, WEEK_MINUTES + 1)) - 1
        return i >= 0 and minute < self.spans[i][1]

    def next_change(self, epoch: float, tz: tzinfo) -> float | None:
        """The first instant after ``epoch`` when ``contains`` changes; None if it never does."""
        if self.always:
            return None
        state = self.contains(epoch, tz)
        edges = sorted({lo for lo, _ in self.spans} | {hi % WEEK_MINUTES for _, hi in self.spans})
        first = datetime.fromtimestamp(epoch, tz).date() - timedelta(days=1)
        for week in range(60):  # a window the clocks skip entirely one week shows up the next
            start = first + timedelta(days=7 * week)
            days = [start + timedelta(days=k) for k in range(10)]
            found = set(_transitions(int(_wall(days[0], 0, tz)), int(_wall(days[-1], 0, tz)), tz))
            for day in days[:-1]:
                for edge in edges:
                    if edge // DAY_MINUTES == day.weekday():
                        found.update(_wall(day, edge % DAY_MINUTES, tz, fold) for fold in (0, 1))
            # contains() depends on the wall-clock minute of the week only, so between these
            # instants (edges reached, and clock changes that jump over edges) it is constant.
            for t in sorted(found):
                if t > epoch and self.contains(t, tz) != state:
                    return t
        return None


def parse_active(value: str | Sequence[str]) -> ActiveWindows:
    """A window string, or a list of them (any of them)."""
    if isinstance(value, str):
        return ActiveWindows(value)
    if not isinstance(value, Sequence) or not value:
        empty = isinstance(value, Sequence)
        what = "empty list of time windows" if empty else f"not a time window: {value!r}"
        raise WindowError(what, repr(value), 0, EXPECT_WINDOW)
    texts: list[str] = []
    for index, item in enumerate(value):
        try:
            if not isinstance(item, str):
                raise WindowError(f"not a time window: {item!r}", repr(item), 0, EXPECT_WINDOW)
            window = ActiveWindows(item)
        except WindowError as exc:
            exc.index = index
            raise
        if window.always:
            return ActiveWindows("always")
        texts.append(item.strip())
    return ActiveWindows("; ".join(texts))


@dataclass(frozen=True)
class Schedule:
    """When a scheduled rule runs. Build with ``parse_every`` (or from a schedule string)."""

    text: str
    interval: float | None = field(init=False, default=None)  # seconds, for "6h"
    minutes: tuple[int, ...] = field(init=False, default=())  # past each hour, for "hourly"
    slots: tuple[tuple[int, int], ...] = field(init=False, default=())  # (weekday, minute)

    def __post_init__(self) -> None:
        interval, minutes, slots = schedule_parts(self.text)
        object.__setattr__(self, "interval", interval)
        object.__setattr__(self, "minutes", minutes)
        object.__setattr__(self, "slots", slots)

    def next_run(self, after: float, tz: tzinfo) -> float:
        """The first scheduled instant strictly after ``after`` (for an interval: ``after`` plus
        the interval, ``after`` being the last run)."""
        if self.interval is not None:
            return after + self.interval
        if self.minutes:
            return self._next_hourly(after, tz)
        first = datetime.fromtimestamp(after, tz).date() - timedelta(days=1)
        runs = [
            _wall(day, minute, tz)
            for day in (first + timedelta(days=k) for k in range(10))
            for weekday, minute in self.slots
            if weekday == day.weekday()
        ]
        return min(t for t in runs if t > after)

    def _next_hourly(self, after: float, tz: tzinfo) -> float:
        hour = math.floor(after / 3600) * 3600
        for h in range(hour, hour + 48 * 3600, 3600):
            runs: set[int] = set()
            for probe in (h, h + 3600):  # the offset at either end, in case it changes within
                offset = _offset(probe, tz)
                shift = int(offset.total_seconds()) if offset is not None else 0
                runs.update(h + (m * 60 - shift) % 3600 for m in self.minutes)
            for t in sorted(runs):
                local = datetime.fromtimestamp(t, tz)
                if t > after and local.second == 0 and local.minute in self.minutes:
                    return float(t)
        raise AssertionError("no hourly run within two days")  # pragma: no cover

    def due(
        self, last_run: float | None, now: float, tz: tzinfo, *, grace: float = DEFAULT_GRACE
    ) -> bool:
        """Whether a run is due at ``now``: a scheduled instant lies in ``(last_run, now]``.

        ``last_run`` None means it never ran. An interval is then due at once. A calendar or
        hourly schedule is due only if a scheduled instant lies in ``(now - grace, now]``, so a
        daemon started on Tuesday does not run last Monday's weekly check, and catches Monday's
        next one if it ticks at least every ``grace`` seconds. A caller that knows when the rule
        was loaded should pass that as ``last_run`` instead: then the first run is the first
        scheduled instant after loading, however long the ticks.
        """
        if last_run is None:
            if self.interval is not None:
                return True
            return self.next_run(now - grace, tz) <= now
        return self.next_run(last_run, tz) <= now


def parse_every(value: str | int | float) -> Schedule:
    """A schedule string, or a number of seconds."""
    bad_float = isinstance(value, float) and not math.isfinite(value)
    if isinstance(value, bool) or not isinstance(value, str | int | float) or bad_float:
        raise WindowError(f"not a schedule: {value!r}", repr(value), 0, EXPECT_EVERY)
    return Schedule(value if isinstance(value, str) else repr(value))
