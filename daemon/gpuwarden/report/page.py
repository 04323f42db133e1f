"""The report as one HTML file: inline CSS and SVG, no script, nothing fetched.

A Content-Security-Policy in the page itself forbids scripts and every fetch, so even a
string that escaped escaping could neither run nor call home; the file opens the same from
an e-mail attachment, a chat upload or a USB stick. A print stylesheet puts it on paper
(A4 landscape, a figure never split across pages).
"""

from __future__ import annotations

from gpuwarden.playbook.thresholds import Threshold
from gpuwarden.report import chart
from gpuwarden.report.model import Report, RuleView
from gpuwarden.report.series import METRICS
from gpuwarden.report.svg import DASHES, SHAPE_NAMES, esc, shape
from gpuwarden.report.tables import incidents_table, notices_table, steps_table
from gpuwarden.text import iso
from gpuwarden.units import format_duration

POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'"
)

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1000px; padding: 16px 20px 24px; color: #111; background: #fff;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
h1 { font-size: 22px; margin: 4px 0 2px; overflow-wrap: anywhere; }
h2 { font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid #ccc; padding-bottom: 3px; }
h3 { font-size: 15px; margin: 16px 0 4px; }
.sub { color: #444; margin: 0 0 10px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0; }
dl.facts dt { color: #555; } dl.facts dd { margin: 0; overflow-wrap: anywhere; }
code, pre { font: 12.5px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; overflow-wrap: anywhere;
  white-space: pre-wrap; }
.remarks { border-left: 4px solid #b8860b; background: #fff8e1; padding: 6px 10px; margin: 10px 0; }
.rule { border: 1px solid #ddd; border-radius: 4px; padding: 6px 10px; margin: 8px 0; }
.rule p { margin: 2px 0; }
figure { margin: 14px 0 20px; break-inside: avoid; page-break-inside: avoid; }
figcaption { font-weight: 600; margin-bottom: 4px; }
svg.chart { display: block; width: 100%; height: auto; font: 11px system-ui, "DejaVu Sans",
  sans-serif; }
svg.chart .frame { fill: none; stroke: #999; }
svg.chart .grid { stroke: #e3e3e3; } svg.chart .vgrid { stroke: #ececec; }
svg.chart .tick { stroke: #666; }
svg.chart .ytick { text-anchor: end; fill: #444; } svg.chart .xtick { fill: #333; }
svg.chart .xcaption, svg.chart .note { fill: #555; font-style: italic; }
svg.chart .ptitle { font-weight: 600; fill: #222; }
svg.chart .metric { fill: none; stroke: #0072B2; stroke-width: 1.8; stroke-linejoin: round; }
svg.chart .used { fill: none; stroke: #111; stroke-width: 1.4; }
svg.chart .capacity line { stroke: #555; stroke-dasharray: 1 2; }
svg.chart .capacity text { fill: #555; }
svg.chart .threshold line { stroke-width: 1.6; }
svg.chart .threshold.when line { stroke: #b02a37; }
svg.chart .threshold.when text { fill: #b02a37; }
svg.chart .threshold.until line { stroke: #1b6e3a; }
svg.chart .threshold.until text { fill: #1b6e3a; }
svg.chart .threshold text, svg.chart .marker text, svg.chart .ptitle { paint-order: stroke;
  stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }
svg.chart .band { opacity: 0.55; }
svg.chart .proc { stroke-width: 0.8; }
svg.chart .marker { fill: #222; stroke: #222; stroke-width: 1; }
svg.chart .marker text { stroke-width: 3px; fill: #111; font-weight: 600; }
svg.chart .marker.failed { fill: #b02a37; stroke: #b02a37; }
svg.chart .marker .guide { stroke: #333; stroke-opacity: 0.5; stroke-dasharray: 1 3; }
svg.chart .marker .span { stroke: #222; stroke-width: 2; }
svg.chart .nodata { fill: #777; font-style: italic; }
svg.chart .lost rect { fill: #d9d9d9; fill-opacity: 0.8; }
svg.chart .lost text { fill: #333; font-style: italic; }
svg.key { vertical-align: middle; }
ul.key { list-style: none; padding: 0; margin: 4px 0; columns: 2; column-gap: 24px; }
ul.key li { margin: 3px 0; break-inside: avoid; }
table { border-collapse: collapse; width: 100%; margin: 6px 0 12px; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
th, td { border: 1px solid #ccc; padding: 4px 6px; vertical-align: top; text-align: left;
  overflow-wrap: break-word; }
td code, td pre, td.msg { overflow-wrap: anywhere; }
thead th { background: #f2f2f2; white-space: nowrap; }
td.t { white-space: nowrap; }
tr.note td, tr.note th { color: #555; background: #fafafa; }
.status.failed { color: #b02a37; font-weight: 700; }
.whynot { margin-top: 4px; color: #333; } .whynot ul { margin: 2px 0 0; padding-left: 18px; }
.hint, .empty { color: #555; }
details summary { cursor: default; }
.print-only { display: none; }
footer { margin-top: 28px; color: #666; font-size: 12px; border-top: 1px solid #ddd;
  padding-top: 6px; }
@media print {
  @page { size: A4 landscape; margin: 12mm; }
  body { max-width: none; padding: 0; font-size: 10pt; }
  h2 { break-after: avoid; page-break-after: avoid; }
  tr, .rule { break-inside: avoid; page-break-inside: avoid; }
  details { display: none; }
  .print-only { display: block; }
  a { color: inherit; text-decoration: none; }
  svg.chart .band { opacity: 0.7; }
}
"""


def _threshold_text(lines: list[Threshold]) -> str:
    return ", ".join(f"<code>{esc(t.text)}</code>" for t in lines)


def _rule(rule: RuleView) -> str:
    parts = [f'<div class="rule"><h3>{esc(rule.name)}</h3>']
    if rule.description:
        parts.append(f"<p>{esc(rule.description)}</p>")
    hold = f" held for {esc(format_duration(rule.for_s))}" if rule.for_s else ""
    parts.append(f"<p><b>when</b> <code>{esc(rule.when)}</code>{hold}</p>")
    if rule.until:
        parts.append(f"<p><b>until</b> <code>{esc(rule.until)}</code></p>")
    drawn = [t for t in rule.when_lines + rule.until_lines if t.field in METRICS]
    if drawn:
        parts.append(f'<p class="hint">lines drawn: {_threshold_text(drawn)}</p>')
    if rule.note:
        parts.append(f'<p class="hint">{esc(rule.note)}</p>')
    parts.append("</div>")
    return "".join(parts)


def _swatch(inner: str, width: int = 36) -> str:
    return (
        f'<svg class="key" xmlns="http://www.w3.org/2000/svg" width="{width}" height="16" '
        f'viewBox="0 0 {width} 16" aria-hidden="true">{inner}</svg>'
    )


def _key(report: Report) -> str:
    kinds = sorted({s.kind for s in report.steps})
    items = [
        "<li>"
        + _swatch(
            '<pattern id="k-pending" width="8" height="8" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><rect width="8" height="8" fill="#fff3cd"/>'
            '<line x1="0" y1="0" x2="0" y2="8" stroke="#b8860b" stroke-width="1.2"/></pattern>'
            '<rect width="36" height="16" fill="url(#k-pending)" stroke="#999"/>'
        )
        + " <b>pending</b>: the rule's <code>when</code> holds, not yet for its <code>for</code>"
        "</li>",
        "<li>"
        + _swatch(
            '<pattern id="k-firing" width="6" height="6" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(-45)"><rect width="6" height="6" fill="#f8d7da"/>'
            '<line x1="0" y1="0" x2="0" y2="6" stroke="#b02a37" stroke-width="1.6"/></pattern>'
            '<rect width="36" height="16" fill="url(#k-firing)" stroke="#999"/>'
        )
        + " <b>firing</b>: the incident is open and its steps run</li>",
        "<li>"
        + _swatch(
            f'<line x1="0" y1="8" x2="36" y2="8" stroke="#b02a37" stroke-width="1.6" '
            f'stroke-dasharray="{DASHES["when"]}"/>'
        )
        + " <b>when</b> threshold (long dashes)</li>",
        "<li>"
        + _swatch(
            f'<line x1="0" y1="8" x2="36" y2="8" stroke="#1b6e3a" stroke-width="1.6" '
            f'stroke-dasharray="{DASHES["until"]}"/>'
        )
        + " <b>until</b> threshold (dots): the incident closes once it holds</li>",
        "<li>"
        + _swatch('<line x1="0" y1="8" x2="36" y2="8" stroke="#0072B2" stroke-width="1.8"/>')
        + " the metric, as the rule reads it (solid)</li>",
        "<li>"
        + _swatch(
            '<g fill="#222" stroke="#222"><line x1="4" y1="8" x2="30" y2="8" stroke-width="2"/>'
            '<line x1="30" y1="3" x2="30" y2="13" stroke-width="2"/></g>'
            + shape("checkpoint", 5, 8).replace("<polygon", '<polygon fill="#222"')
        )
        + " a step, and a bar to when it finished (a checkpoint's ack, a kill's grace)</li>",
    ]
    for kind in kinds:
        items.append(
            "<li>"
            + _swatch(f'<g fill="#222" stroke="#222">{shape(kind, 18, 8)}</g>')
            + f" {esc(kind)} ({esc(SHAPE_NAMES.get(kind, 'ring'))})</li>"
        )
    return f'<ul class="key">{"".join(items)}</ul>'


def render(report: Report) -> str:
    """The whole page."""
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in report.facts)
    remarks = (
        '<div class="remarks">' + "".join(f"<p>{esc(r)}</p>" for r in report.remarks) + "</div>"
        if report.remarks
        else ""
    )
    figures = []
    gpus = sorted(report.gpus) or sorted({i.gpu for i in report.incidents if i.gpu is not None})
    for n, gpu in enumerate(gpus):
        series = report.gpus.get(gpu)
        name = f"GPU {gpu}" + (f" · {series.name}" if series is not None and series.name else "")
        figures.append(
            f'<figure id="gpu-{gpu}"><figcaption>{esc(name)}</figcaption>'
            f"{chart.figure(report, gpu, f'f{n}')}</figure>"
        )
    rules = (
        "".join(_rule(r) for r in report.rules.values()) or '<p class="empty">No rule fired.</p>'
    )
    incidents = (
        "<h2>Incidents</h2>" + incidents_table(report, report.incidents)
        if report.kind == "drill"
        else ""
    )
    generated = f" at {esc(iso(report.generated_at))}" if report.generated_at is not None else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="color-scheme" content="light">'
        f"<title>{esc(report.title)}</title><style>{CSS}</style></head>\n<body>"
        f'<header><h1>{esc(report.title)}</h1><p class="sub">{esc(report.subtitle)}</p>'
        f'<dl class="facts">{facts}</dl>{remarks}</header>\n<main>'
        f"{incidents}<h2>Rules</h2>{rules}"
        f"<h2>What the GPU did</h2>{_key(report)}{''.join(figures)}"
        f"<h2>Steps</h2>{steps_table(report)}"
        f"<h2>Notifications</h2>{notices_table(report, report.notices)}"
        "</main>\n"
        f"<footer>gpuwarden {esc(report.version)}: report of {esc(report.kind)} "
        f"{esc(report.title)}{generated}. Times in UTC"
        f"{' (offsets: from the start of the scenario)' if report.relative else ''}. "
        "Curves are thinned for drawing; marker titles give the exact readings.</footer>"
        "</body></html>\n"
    )
