"""What the parts of a GPU figure share: the geometry, the panels a rule's metrics need,
which incidents and steps belong to a GPU, time labels, and the path of a curve."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuwarden.playbook.thresholds import Threshold
from gpuwarden.report.model import IncidentView, Report, StepView
from gpuwarden.report.series import DEFAULT_METRIC, METRICS, Metric
from gpuwarden.report.svg import Scale, clock, esc, num, quantity
from gpuwarden.units import format_duration

W = 960
LEFT = 78
RIGHT = 18
PLOT = W - LEFT - RIGHT
TITLE_H = 22
PANEL_H = 124
STACK_H = 150
LANE_H = 22
MAX_LANES = 6
AXIS_H = 40
LEGEND_ROW = 18
BUCKETS = PLOT  # one bucket per pixel column
MAX_PANELS = 4
MAX_PROCS = 8
OPS = {">=": "≥", "<=": "≤", ">": ">", "<": "<", "==": "=", "!=": "≠"}


@dataclass
class Line:
    rule: str
    role: str  # when | until
    threshold: Threshold


@dataclass
class Panel:
    metric: Metric
    pid: int | None = None
    lines: list[Line] = field(default_factory=list)
    note: str = ""

    @property
    def title(self) -> str:
        who = f" of pid {self.pid}" if self.pid is not None else ""
        return f"{self.metric.label}{who} ({self.metric.unit}) · {self.metric.field}{self.note}"


def incidents_on(report: Report, gpu: int) -> list[IncidentView]:
    return [i for i in report.incidents if i.gpu is None or i.gpu == gpu]


def panels_for(report: Report, gpu: int) -> tuple[list[Panel], int]:
    """The metric panels of one GPU, and how many more the rules read than are drawn."""
    found: dict[tuple[str, int | None], Panel] = {}
    for incident in incidents_on(report, gpu):
        rule = report.rules.get(incident.rule)
        if rule is None:
            continue
        for name in rule.fields:
            metric = METRICS.get(name)
            if metric is not None:
                pid = incident.pid if metric.per_process else None
                found.setdefault((name, pid), Panel(metric, pid))
        for role, lines in (("when", rule.when_lines), ("until", rule.until_lines)):
            for threshold in lines:
                metric = METRICS.get(threshold.field)
                if metric is None:
                    continue
                pid = incident.pid if metric.per_process else None
                panel = found.setdefault((threshold.field, pid), Panel(metric, pid))
                line = Line(rule.name, role, threshold)
                if all(
                    (x.rule, x.role, x.threshold) != (line.rule, role, threshold)
                    for x in panel.lines
                ):
                    panel.lines.append(line)
    panels = list(found.values())
    if not panels:
        panels = [
            Panel(METRICS[DEFAULT_METRIC], note=" (the rule reads no curve: shown for context)")
        ]
    return panels[:MAX_PANELS], max(0, len(panels) - MAX_PANELS)


def steps_on(report: Report, gpu: int) -> list[StepView]:
    return [s for s in report.steps if s.gpu is None or s.gpu == gpu]


# -- pieces -----------------------------------------------------------------------------------


def clock_span(report: Report, a: float, b: float) -> str:
    return f"{when(report, a)} to {when(report, b)} ({format_duration(b - a)})"


def when(report: Report, t: float) -> str:
    return clock(t, origin=report.origin if report.relative else None)


def grid(ticks: Iterable[float], y: Scale, unit: str) -> str:
    out = []
    for value in ticks:
        yy = num(y(value))
        label = quantity(value, "") if unit != "MiB" else f"{value:,.0f}"
        out.append(
            f'<line class="grid" x1="{LEFT}" x2="{LEFT + PLOT}" y1="{yy}" y2="{yy}"/>'
            f'<text class="ytick" x="{LEFT - 6}" y="{yy}" dy="0.32em">{esc(label)}</text>'
        )
    return "".join(out)


def path(runs: Sequence[Sequence[tuple[float, float]]], x: Scale, y: Scale) -> str:
    parts = []
    for run in runs:
        if len(run) == 1:
            ((t, v),) = run
            parts.append(f"M{num(x(t) - 1)} {num(y(v))}h2")
            continue
        parts.append("M" + "L".join(f"{num(x(t))} {num(y(v))}" for t, v in run))
    return "".join(parts)


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
