"""The marker lanes of a GPU figure: a shape per step, its number and label, a bar to the
instant it finished, a guide line down through the panels, and a title with the exact readings
at that instant (a reader hovering, or a screen reader, gets the numbers)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.report.layout import LANE_H, MAX_LANES, RIGHT, Panel, W, when
from gpuwarden.report.model import Report, StepView
from gpuwarden.report.series import GpuSeries
from gpuwarden.report.svg import Scale, esc, num, quantity, shape
from gpuwarden.units import format_duration

MIN_SPAN = 8.0  # pixels: a step that finished sooner gets no bar


@dataclass
class _Marker:
    step: StepView
    x: float
    x_end: float | None
    label: str
    lane: int = 0
    anchor_end: bool = False


def lanes(steps: Sequence[StepView], x: Scale) -> tuple[list[_Marker], int]:
    markers: list[_Marker] = []
    ends: list[float] = []
    for step in sorted(steps, key=lambda s: (s.time, s.number)):
        xs = x(step.time)
        x_end = x(step.finished_at) if step.finished_at is not None else None
        if x_end is not None and x_end - xs < MIN_SPAN:
            x_end = None  # finished within a few pixels: a bar would only blur the marker
        label = f"{step.number} {step.label}"
        width = 6.4 * len(label) + 12
        anchor_end = xs + width > W - RIGHT
        lo = xs - width if anchor_end else xs - 8
        hi = xs + 8 if anchor_end else xs + width
        if x_end is not None:
            hi = max(hi, x_end + 4)
        lane = next((k for k, end in enumerate(ends) if end <= lo), None)
        if lane is None and len(ends) < MAX_LANES:
            lane = len(ends)
            ends.append(hi)
        elif lane is None:
            lane = min(range(len(ends)), key=lambda k: ends[k])
            ends[lane] = max(ends[lane], hi)
        else:
            ends[lane] = hi
        markers.append(_Marker(step, xs, x_end, label, lane, anchor_end))
    return markers, max(1, len(ends))


def _marker_title(
    report: Report, step: StepView, series: GpuSeries | None, panels: list[Panel]
) -> str:
    lines = [f"step {step.number}: {step.label} ({step.kind}) of {step.rule}"]
    lines.append(f"at {when(report, step.time)}" + ("" if report.relative else " UTC"))
    if step.finished_at is not None and step.finished_at > step.time:
        lines.append(
            f"finished {when(report, step.finished_at)} "
            f"(after {format_duration(step.finished_at - step.time)})"
        )
    for target in step.targets:
        mib = "" if target.gpu_memory_mib is None else f", {target.gpu_memory_mib:,} MiB"
        lines.append(
            f"target pid {target.pid} {target.user or '?'}/{target.priority}{mib}: "
            f"{target.command[:160]}"
        )
    if step.what:
        lines.append(step.what)
    outcome = step.status + (f": {step.detail}" if step.detail else "")
    lines.append(f"outcome: {outcome}")
    for result in step.results:
        lines.append(
            f"  pid {result.pid}: {result.state}" + (f" ({result.detail})" if result.detail else "")
        )
    for target, reason in step.skipped:
        lines.append(f"skipped pid {target.pid} {target.user or '?'}: {reason.replace('_', ' ')}")
    if series is not None and len(series):
        i = series.index_at(step.time)
        if i is not None:
            values = []
            for panel in panels:
                v = panel.metric.values(series, panel.pid)[i]
                values.append(f"{panel.metric.label} {quantity(v, panel.metric.unit)}")
            used, total = series.gauges["used_mib"][i], series.gauges["total_mib"][i]
            if math.isfinite(used) and math.isfinite(total):
                values.append(f"{used:,.0f} of {total:,.0f} MiB in use")
            lines.append(f"GPU {series.gpu} then: " + ", ".join(values))
    return "\n".join(lines)


def markers(
    report: Report,
    markers: list[_Marker],
    series: GpuSeries | None,
    panels: list[Panel],
    top: float,
    guide_bottom: float,
) -> str:
    out = []
    for m in markers:
        y = top + m.lane * LANE_H + LANE_H / 2
        step = m.step
        kind = esc(step.kind)
        title = _marker_title(report, step, series, panels)
        span = ""
        if m.x_end is not None:
            span = (
                f'<line class="span" x1="{num(m.x)}" x2="{num(m.x_end)}" y1="{num(y)}" '
                f'y2="{num(y)}"/>'
                f'<line class="span" x1="{num(m.x_end)}" x2="{num(m.x_end)}" y1="{num(y - 5)}" '
                f'y2="{num(y + 5)}"/>'
            )
        tx = m.x - 9 if m.anchor_end else m.x + 9
        anchor = ' text-anchor="end"' if m.anchor_end else ""
        state = "failed" if step.status == "failed" else ("shadow" if step.shadow else "")
        out.append(
            f'<g class="marker {kind} {state}" data-step="{step.number}" data-kind="{kind}" '
            f'data-time="{step.time:.3f}"><title>{esc(title)}</title>'
            f'<line class="guide" x1="{num(m.x)}" x2="{num(m.x)}" y1="{num(y + 7)}" '
            f'y2="{num(guide_bottom)}"/>{span}{shape(step.kind, m.x, y)}'
            f'<text x="{num(tx)}" y="{num(y)}" dy="0.32em"{anchor}>{esc(m.label)}</text></g>'
        )
    return "".join(out)
