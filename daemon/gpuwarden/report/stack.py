"""The memory panel of a GPU figure: the GPU's memory stacked by process (a hatch and a
colour each, so that print tells them apart), the line of all memory in use (above the stack:
memory no listed process holds), the capacity, and the legend rows naming each process."""

from __future__ import annotations

import math

from gpuwarden.report.layout import BUCKETS, LEFT, MAX_PROCS, PLOT, STACK_H, grid, path
from gpuwarden.report.model import Report
from gpuwarden.report.series import GpuSeries, reduce, stack_indexes
from gpuwarden.report.svg import PALETTE, Scale, esc, num, value_range, value_ticks


def _proc_order(series: GpuSeries) -> list[int]:
    def peak(pid: int) -> float:
        values = [v for v in series.procs[pid] if math.isfinite(v)]
        return max(values, default=0.0)

    return sorted(series.procs, key=lambda pid: (-peak(pid), pid))


def _who(series: GpuSeries, pid: int) -> str:
    facts = series.who.get(pid)
    if facts is None:
        return f"pid {pid}"
    return f"pid {pid} · {facts.user or '?'} · {facts.priority} · {facts.command}"


def stack(
    report: Report, series: GpuSeries, x: Scale, top: float, prefix: str
) -> tuple[str, list[tuple[str, str, str]]]:
    """The memory panel's areas, lines and the legend rows (fill, title, text)."""
    start, end = report.start, report.end
    chosen = stack_indexes(series, start, end, BUCKETS)
    used = series.gauges["used_mib"]
    total = series.gauges["total_mib"]
    peak_total = max((v for v in total if math.isfinite(v)), default=float("nan"))
    peak_used = max((v for v in used if math.isfinite(v)), default=0.0)
    procs = [p for p in _proc_order(series)]
    drawn, rest = procs[:MAX_PROCS], procs[MAX_PROCS:]
    lo, hi = value_range([peak_used, peak_total], [], 0.0, None, zoom=False)
    y = Scale(lo, hi, top + STACK_H, top)
    out = [grid(value_ticks(lo, hi), y, "MiB")]
    legend: list[tuple[str, str, str]] = []
    base = [0.0] * len(chosen)
    groups: list[tuple[str, list[int], int]] = [
        (_who(series, p), [p], k) for k, p in enumerate(drawn)
    ]
    if rest:
        groups.append((f"{len(rest)} more processes", rest, len(drawn)))
    xs = [x(series.times[i]) for i in chosen]
    for text, pids, k in groups:
        upper = []
        for j, i in enumerate(chosen):
            add = sum(series.procs[p][i] for p in pids if math.isfinite(series.procs[p][i]))
            upper.append(base[j] + add)
        if xs:
            forward = "L".join(f"{num(a)} {num(y(b))}" for a, b in zip(xs, upper, strict=True))
            back = "L".join(
                f"{num(a)} {num(y(b))}" for a, b in zip(reversed(xs), reversed(base), strict=True)
            )
            peak = max(
                (
                    series.procs[p][i]
                    for p in pids
                    for i in range(len(series))
                    if math.isfinite(series.procs[p][i])
                ),
                default=0.0,
            )
            title = f"{text} (at most {peak:,.0f} MiB)"
            pid_attr = pids[0] if len(pids) == 1 else ""
            out.append(
                f'<path class="proc" data-pid="{pid_attr}" d="M{forward}L{back}Z" '
                f'fill="url(#{prefix}-proc{k})" stroke="{PALETTE[k % len(PALETTE)]}">'
                f"<title>{esc(title)}</title></path>"
            )
            legend.append((f"url(#{prefix}-proc{k})", title, text))
        base = upper
    runs = reduce(series.times, used, start, end, BUCKETS)
    out.append(
        f'<path class="used" d="{path(runs, x, y)}"><title>memory in use (all of it, '
        "as the GPU reports: above the stack is memory no listed process holds)</title></path>"
    )
    if math.isfinite(peak_total):
        yy = num(y(peak_total))
        out.append(
            f'<g class="capacity"><line x1="{LEFT}" x2="{LEFT + PLOT}" y1="{yy}" y2="{yy}"/>'
            f'<text x="{LEFT + 4}" y="{num(y(peak_total) - 4)}">'
            f"capacity {peak_total:,.0f} MiB</text></g>"
        )
    attrs = (
        f'data-top="{num(top)}" data-bottom="{num(top + STACK_H)}" '
        f'data-min="{lo:g}" data-max="{hi:g}"'
    )
    return f'<g class="panel stack" data-field="memory" {attrs}>' + "".join(out) + "</g>", legend
