"""The readings of one GPU over a report's time span, and the curves drawn from them.

``GpuSeries`` keeps every reading at full resolution (arrays of floats; NaN is "unknown"), so
that a marker's title can give the exact values at its instant. Only drawing thins them:
``reduce`` keeps, per pixel-wide bucket, the lowest and the highest value in time order (a
one-tick spike stays visible), and ``stack_indexes`` keeps, per bucket, the reading with the
most memory in use (the peak of the stacked area). Decisions never read this module.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpuwarden.journal.samples import GAUGES, GpuSample, ProcFacts

NAN = float("nan")


@dataclass
class GpuSeries:
    gpu: int
    name: str | None = None
    times: array[float] = field(default_factory=lambda: array("d"))
    gauges: dict[str, array[float]] = field(default_factory=lambda: {g: array("d") for g in GAUGES})
    lost: array[int] = field(default_factory=lambda: array("b"))  # 1: the GPU could not be read
    procs: dict[int, array[float]] = field(default_factory=dict)  # pid -> MiB per reading
    who: dict[int, ProcFacts] = field(default_factory=dict)  # pid -> who it was

    def add(self, sample: GpuSample) -> None:
        """One reading; readings come in time order."""
        index = len(self.times)
        if index and sample.time <= self.times[-1]:
            return
        self.times.append(sample.time)
        self.lost.append(1 if sample.lost else 0)
        for name in GAUGES:
            value = getattr(sample, name)
            self.gauges[name].append(NAN if value is None else float(value))
        for pid, mib in sample.procs:
            values = self.procs.get(pid)
            if values is None:
                values = self.procs[pid] = array("d")
            if len(values) < index:
                values.extend([NAN] * (index - len(values)))
            if len(values) == index:
                values.append(NAN if mib is None else float(mib))

    def finish(self) -> GpuSeries:
        """Pad every process's readings to the full length (absent: NaN)."""
        n = len(self.times)
        for values in self.procs.values():
            if len(values) < n:
                values.extend([NAN] * (n - len(values)))
        return self

    def __len__(self) -> int:
        return len(self.times)

    def index_at(self, t: float) -> int | None:
        """The reading at or just before ``t`` (the first one when ``t`` is earlier)."""
        times = self.times
        if not times:
            return None
        lo, hi = 0, len(times)
        while lo < hi:
            mid = (lo + hi) // 2
            if times[mid] <= t:
                lo = mid + 1
            else:
                hi = mid
        return max(0, lo - 1)

    def lost_spans(self) -> list[tuple[float, float]]:
        """The stretches in which the GPU could not be read (from the first such reading to
        the next good one, or the last reading)."""
        spans: list[tuple[float, float]] = []
        began: float | None = None
        for t, lost in zip(self.times, self.lost, strict=True):
            if lost and began is None:
                began = t
            elif not lost and began is not None:
                spans.append((began, t))
                began = None
        if began is not None:
            spans.append((began, self.times[-1]))
        return spans

    def process_total(self, i: int) -> float:
        return sum(v[i] for v in self.procs.values() if not math.isnan(v[i]))


# -- the metrics a chart can draw -------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """A playbook field drawn as a curve: ``values`` per reading; the axis floor and ceiling
    (None: from the data)."""

    field: str
    label: str
    unit: str
    values: Callable[[GpuSeries, int | None], Sequence[float]]
    floor: float | None = 0.0
    ceiling: float | None = None
    per_process: bool = False


def _ratio(
    top: str, bottom: str, invert: bool = False
) -> Callable[[GpuSeries, int | None], list[float]]:
    def values(series: GpuSeries, _pid: int | None) -> list[float]:
        out = []
        for a, b in zip(series.gauges[top], series.gauges[bottom], strict=True):
            if math.isnan(a) or math.isnan(b) or b <= 0:
                out.append(NAN)
            else:
                pct = 100.0 * a / b
                out.append(100.0 - pct if invert else pct)
        return out

    return values


def _gauge(name: str) -> Callable[[GpuSeries, int | None], Sequence[float]]:
    def values(series: GpuSeries, _pid: int | None) -> Sequence[float]:
        return series.gauges[name]

    return values


def _free_mib(series: GpuSeries, _pid: int | None) -> list[float]:
    used, total = series.gauges["used_mib"], series.gauges["total_mib"]
    return [t - u for u, t in zip(used, total, strict=True)]


def _process_mib(series: GpuSeries, pid: int | None) -> Sequence[float]:
    if pid is None or pid not in series.procs:
        return [NAN] * len(series)
    return series.procs[pid]


METRICS: dict[str, Metric] = {
    m.field: m
    for m in (
        Metric("gpu.memory.used_pct", "memory used", "%", _ratio("used_mib", "total_mib"), 0, 100),
        Metric(
            "gpu.memory.free_pct",
            "memory free",
            "%",
            _ratio("used_mib", "total_mib", invert=True),
            0,
            100,
        ),
        Metric("gpu.memory.used_mib", "memory used", "MiB", _gauge("used_mib")),
        Metric("gpu.memory.free_mib", "memory free", "MiB", _free_mib),
        Metric("gpu.temperature_c", "temperature", "°C", _gauge("temperature_c"), None),
        Metric("gpu.power_w", "power", "W", _gauge("power_w")),
        Metric("gpu.power_pct", "power of limit", "%", _ratio("power_w", "power_limit_w"), 0, 100),
        Metric("gpu.power_limit_w", "power limit", "W", _gauge("power_limit_w")),
        Metric("gpu.utilization_pct", "utilisation", "%", _gauge("utilization_pct"), 0, 100),
        Metric(
            "gpu.memory_utilization_pct",
            "memory bandwidth used",
            "%",
            _gauge("memory_utilization_pct"),
            0,
            100,
        ),
        Metric(
            "process.gpu_memory_mib",
            "process memory",
            "MiB",
            _process_mib,
            per_process=True,
        ),
    )
}
DEFAULT_METRIC = "gpu.memory.used_pct"  # drawn when a rule reads nothing drawable


# -- thinning for drawing ---------------------------------------------------------------------


def buckets(times: Sequence[float], start: float, end: float, count: int) -> list[list[int]]:
    """Reading indexes grouped into ``count`` equal slices of [start, end]."""
    width = (end - start) / count if end > start else 1.0
    groups: list[list[int]] = [[] for _ in range(count)]
    for i, t in enumerate(times):
        slot = min(count - 1, max(0, int((t - start) / width)))
        groups[slot].append(i)
    return groups


def reduce(
    times: Sequence[float], values: Sequence[float], start: float, end: float, count: int
) -> list[list[tuple[float, float]]]:
    """The curve as runs of (time, value) points, broken where a value is unknown; at most
    about ``2 * count`` points, keeping each bucket's lowest and highest value."""
    if len(times) <= 2 * count:
        chosen: Sequence[int] = range(len(times))
    else:
        picked: list[int] = []
        for group in buckets(times, start, end, count):
            known = [i for i in group if not math.isnan(values[i])]
            if not known:
                if group:
                    picked.append(group[0])  # keep the gap
                continue
            low = min(known, key=lambda i: values[i])
            high = max(known, key=lambda i: values[i])
            picked.extend(sorted({low, high}))
        chosen = picked
    runs: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    for i in chosen:
        value = values[i]
        if math.isnan(value):
            if current:
                runs.append(current)
                current = []
            continue
        current.append((times[i], value))
    if current:
        runs.append(current)
    return runs


def stack_indexes(series: GpuSeries, start: float, end: float, count: int) -> list[int]:
    """Which readings the stacked memory area is drawn from: all of them, or per bucket the
    one with the most memory in use."""
    n = len(series)
    if n <= 2 * count:
        return list(range(n))
    used = series.gauges["used_mib"]
    chosen = []
    for group in buckets(series.times, start, end, count):
        if group:
            chosen.append(max(group, key=lambda i: -1.0 if math.isnan(used[i]) else used[i]))
    return chosen
