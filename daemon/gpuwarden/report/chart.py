"""One GPU's figure: the rule's metrics with their thresholds, the pending and firing bands,
a marker per step, and the GPU's memory stacked by process, on one time axis.

Layout, top to bottom: the marker lanes (a step's shape, its number and label; a bar to the
instant it finished: a checkpoint's ack, a kill's grace), one panel per metric the rules read
(``when`` thresholds dashed, ``until`` dotted), the memory panel, the time axis, the legend of
processes. Elements carry ``data-*`` attributes with the numbers they were drawn from (a
panel's domain and pixel range, a threshold's value, a marker's step number), so a test can
check the picture against the data without parsing paths.
"""

from __future__ import annotations

import math

from gpuwarden.report import marks, stack
from gpuwarden.report.layout import (
    AXIS_H,
    BUCKETS,
    LANE_H,
    LEFT,
    LEGEND_ROW,
    PANEL_H,
    PLOT,
    STACK_H,
    TITLE_H,
    Panel,
    W,
    clock_span,
    cut,
    grid,
    incidents_on,
    panels_for,
    path,
    steps_on,
    when,
)
from gpuwarden.report.model import Report
from gpuwarden.report.series import GpuSeries, reduce
from gpuwarden.report.svg import (
    DASHES,
    PALETTE,
    Scale,
    clock,
    esc,
    num,
    patterns,
    quantity,
    time_ticks,
    value_range,
    value_ticks,
)


def _bands(report: Report, gpu: int, x: Scale, top: float, height: float, prefix: str) -> str:
    out = []
    series = report.gpus.get(gpu)
    for began, ended in [] if series is None else series.lost_spans():
        x0, x1 = x(began), x(max(ended, began))
        title = f"GPU {gpu} could not be read: {clock_span(report, began, ended)}"
        out.append(
            f'<g class="lost"><title>{esc(title)}</title><rect x="{num(x0)}" y="{num(top)}" '
            f'width="{num(max(2.0, x1 - x0))}" height="{num(height)}"/>'
            f'<text x="{num(x0 + 4)}" y="{num(top + 12)}">GPU lost</text></g>'
        )
    for incident in incidents_on(report, gpu):
        spans = []
        if incident.pending_at is not None:
            stop = incident.opened_at or incident.cancelled_at or report.end
            spans.append(("pending", incident.pending_at, stop))
        if incident.opened_at is not None:
            spans.append(("firing", incident.opened_at, incident.resolved_at or report.end))
        for kind, began, ended in spans:
            a, b = max(began, report.start), min(ended, report.end)
            if b < a:
                continue
            x0, x1 = x(a), x(b)
            title = f"{kind} {incident.rule} on {incident.where}: {clock_span(report, a, b)}"
            out.append(
                f'<rect class="band {kind}" data-rule="{esc(incident.rule)}" x="{num(x0)}" '
                f'y="{num(top)}" width="{num(max(1.0, x1 - x0))}" height="{num(height)}" '
                f'fill="url(#{prefix}-{kind})"><title>{esc(title)}</title></rect>'
            )
    return "".join(out)


def _thresholds(panel: Panel, y: Scale) -> str:
    out = []
    placed: list[float] = []
    for line in panel.lines:
        t = line.threshold
        yy = y(t.value)
        label = f"{line.role}: {t.text}"
        ly = yy - 4
        while any(abs(ly - p) < 12 for p in placed):
            ly -= 12
        placed.append(ly)
        title = (
            f"{line.rule}, {line.role}: {t.text} (line at {quantity(t.value, panel.metric.unit)})"
        )
        out.append(
            f'<g class="threshold {line.role}" data-value="{t.value:g}" '
            f'data-rule="{esc(line.rule)}">'
            f"<title>{esc(title)}</title>"
            f'<line x1="{LEFT}" x2="{LEFT + PLOT}" y1="{num(yy)}" y2="{num(yy)}" '
            f'stroke-dasharray="{DASHES[line.role]}"/>'
            f'<text x="{LEFT + PLOT - 4}" y="{num(ly)}" text-anchor="end">{esc(label)}</text></g>'
        )
    return "".join(out)


# -- the figure -------------------------------------------------------------------------------


def _summary(report: Report, gpu: int, panels: list[Panel], series: GpuSeries | None) -> str:
    parts = []
    for incident in incidents_on(report, gpu):
        if incident.opened_at is not None:
            end = incident.resolved_at
            parts.append(
                f"{incident.rule} fired at {when(report, incident.opened_at)}"
                + (f" and resolved at {when(report, end)}" if end is not None else ", still open")
            )
        elif incident.pending_at is not None:
            parts.append(
                f"{incident.rule} went pending at {when(report, incident.pending_at)} "
                "and did not fire"
            )
    if series is not None and len(series):
        for panel in panels:
            values = [v for v in panel.metric.values(series, panel.pid) if math.isfinite(v)]
            if values:
                unit = panel.metric.unit
                parts.append(
                    f"{panel.metric.label} between {quantity(min(values), unit)} and "
                    f"{quantity(max(values), unit)}"
                )
    steps = steps_on(report, gpu)
    if steps:
        parts.append(
            f"{len(steps)} step(s): " + ", ".join(f"{s.number} {s.label}" for s in steps[:20])
        )
    return "; ".join(parts) + "."


def figure(report: Report, gpu: int, prefix: str) -> str:
    """The SVG of one GPU."""
    series = report.gpus.get(gpu)
    panels, more = panels_for(report, gpu)
    x = Scale(report.start, report.end, LEFT, LEFT + PLOT)
    steps = steps_on(report, gpu)
    markers, lanes = marks.lanes(steps, x)
    lanes_top = 8.0
    y_cursor = lanes_top + lanes * LANE_H + 6
    plot_top = y_cursor
    body: list[str] = []
    frames: list[tuple[float, float]] = []
    for panel in panels:
        top = y_cursor + TITLE_H
        values = list(panel.metric.values(series, panel.pid)) if series is not None else []
        levels = [line.threshold.value for line in panel.lines]
        metric = panel.metric  # zoomed in to the thresholds; a context curve keeps its scale
        lo, hi = value_range(values, levels, metric.floor, metric.ceiling, zoom=bool(levels))
        y = Scale(lo, hi, top + PANEL_H, top)
        data = ""
        if series is not None and len(series):
            runs = reduce(series.times, values, report.start, report.end, BUCKETS)
            data = f'<path class="metric" d="{path(runs, x, y)}"/>'
        pid = "" if panel.pid is None else f' data-pid="{panel.pid}"'
        body.append(
            f'<g class="panel" data-field="{esc(panel.metric.field)}"{pid} data-top="{num(top)}" '
            f'data-bottom="{num(top + PANEL_H)}" data-min="{lo:g}" data-max="{hi:g}">'
            f'<text class="ptitle" x="{LEFT}" y="{num(top - 7)}">{esc(panel.title)}</text>'
            f'<rect class="frame" x="{LEFT}" y="{num(top)}" width="{PLOT}" height="{PANEL_H}"/>'
            f"{_bands(report, gpu, x, top, PANEL_H, prefix)}"
            f"{grid(value_ticks(lo, hi), y, panel.metric.unit)}{_thresholds(panel, y)}{data}</g>"
        )
        frames.append((top, top + PANEL_H))
        y_cursor = top + PANEL_H
    legend: list[tuple[str, str, str]] = []
    top = y_cursor + TITLE_H
    stack_title = "GPU memory by process (MiB), stacked; line: all memory in use"
    body.append(
        f'<text class="ptitle" x="{LEFT}" y="{num(top - 7)}">{esc(stack_title)}</text>'
        f'<rect class="frame" x="{LEFT}" y="{num(top)}" width="{PLOT}" height="{STACK_H}"/>'
        + _bands(report, gpu, x, top, STACK_H, prefix)
    )
    if series is not None and len(series):
        drawn, legend = stack.stack(report, series, x, top, prefix)
        body.append(drawn)
    else:
        body.append(
            f'<text class="nodata" x="{LEFT + PLOT / 2}" y="{num(top + STACK_H / 2)}" '
            'text-anchor="middle">no readings were kept for this GPU</text>'
        )
    frames.append((top, top + STACK_H))
    plot_bottom = top + STACK_H
    axis = _axis(report, x, plot_top, plot_bottom)
    height = plot_bottom + AXIS_H
    legend_svg = []
    for k, (fill, title, text) in enumerate(legend):
        ly = height + k * LEGEND_ROW
        legend_svg.append(
            f'<g class="legend"><title>{esc(title)}</title>'
            f'<rect x="{LEFT}" y="{num(ly)}" width="22" '
            f'height="12" fill="{fill}" stroke="{PALETTE[k % len(PALETTE)]}"/>'
            f'<text x="{LEFT + 30}" y="{num(ly + 6)}" dy="0.32em">{esc(cut(text, 120))}</text></g>'
        )
    height += len(legend) * LEGEND_ROW + (8 if legend else 0)
    if more:
        body.append(
            f'<text class="note" x="{LEFT}" y="{num(plot_bottom + AXIS_H - 4)}">'
            f"{more} more metric(s) the rules read are not drawn</text>"
        )
    name = f"GPU {gpu}" + (f" · {series.name}" if series is not None and series.name else "")
    title_id, desc_id = f"{prefix}-title", f"{prefix}-desc"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {W} {num(height)}" '
        f'width="{W}" height="{num(height)}" role="img" aria-labelledby="{title_id} {desc_id}" '
        f'data-gpu="{gpu}" data-start="{report.start:.3f}" data-end="{report.end:.3f}" '
        f'data-left="{LEFT}" data-width="{PLOT}">'
        f'<title id="{title_id}">{esc(name)}</title>'
        f'<desc id="{desc_id}">{esc(_summary(report, gpu, panels, series))}</desc>'
        f"{patterns(prefix, max(1, len(legend)))}"
        f"{axis}{''.join(body)}"
        f"{marks.markers(report, markers, series, panels, lanes_top, plot_bottom)}"
        f"{''.join(legend_svg)}</svg>"
    )


def _axis(report: Report, x: Scale, top: float, bottom: float) -> str:
    origin = report.origin if report.relative else 0.0
    ticks = time_ticks(report.start, report.end, origin)
    seconds = len(ticks) < 2 or (ticks[1] - ticks[0]) < 60
    out = []
    for t in ticks:
        xx = num(x(t))
        label = clock(t, origin=report.origin if report.relative else None, seconds=seconds)
        out.append(
            f'<line class="vgrid" x1="{xx}" x2="{xx}" y1="{num(top)}" y2="{num(bottom)}"/>'
            f'<line class="tick" x1="{xx}" x2="{xx}" y1="{num(bottom)}" y2="{num(bottom + 5)}"/>'
            f'<text class="xtick" x="{xx}" y="{num(bottom + 17)}" text-anchor="middle">'
            f"{esc(label)}</text>"
        )
    caption = "time from the start of the scenario (h:mm:ss)" if report.relative else "time (UTC)"
    out.append(
        f'<text class="xcaption" x="{LEFT + PLOT}" y="{num(bottom + 33)}" text-anchor="end">'
        f"{esc(caption)}</text>"
    )
    return '<g class="axis">' + "".join(out) + "</g>"
