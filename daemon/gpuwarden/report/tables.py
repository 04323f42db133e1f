"""The tables under the charts: incidents, steps (with the "why not" of every skipped
candidate and every step that waited), and the notifications. Real HTML tables with captions
and header cells, so that a screen reader and a printer both read them."""

from __future__ import annotations

from collections.abc import Sequence

from gpuwarden.report.model import IncidentView, NoteView, NoticeView, Report, StepView, TargetView
from gpuwarden.report.svg import clock, esc
from gpuwarden.text import iso
from gpuwarden.units import format_duration

NONE = "\u2013"  # an en dash: nothing to show
COMMAND_CHARS = 300  # characters of a command line shown in a table (the title has more)


def words(reason: str) -> str:
    return reason.replace("_", " ")


def stamp(report: Report, t: float | None) -> str:
    """A time cell: UTC, or the offset for a drill; the full instant in the title."""
    if t is None:
        return NONE
    if report.relative:
        return f'<time title="{esc(iso(t))}">{esc(clock(t, origin=report.origin))}</time>'
    return f'<time datetime="{esc(iso(t))}">{esc(clock(t))}</time>'


def _command(text: str) -> str:
    if len(text) <= COMMAND_CHARS:
        return f"<code>{esc(text)}</code>"
    return f'<code title="{esc(text[:4000])}">{esc(text[:COMMAND_CHARS])}…</code>'


def target_html(target: TargetView) -> str:
    mib = "" if target.gpu_memory_mib is None else f", {target.gpu_memory_mib:,} MiB"
    job = f" ({esc(target.job)})" if target.job else ""
    gpu = "" if target.gpu is None else f", GPU {target.gpu}"
    head = (
        f"<b>pid {target.pid}</b>{job} {esc(target.user or '?')}/"
        f'<span class="prio">{esc(target.priority)}</span>{esc(mib)}{esc(gpu)}'
    )
    return head + (f"<br>{_command(target.command)}" if target.command else "")


def incidents_table(report: Report, incidents: Sequence[IncidentView]) -> str:
    rows = []
    for i in incidents:
        if i.opened_at is None:
            status = (
                f"pending, cancelled: {words(i.cancel_reason or '?')}"
                if i.cancelled_at
                else "pending"
            )
        elif i.resolved_at is None:
            status = "open at the end" if report.relative else "still open"
        else:
            status = f"resolved: {words(i.resolve_reason or '?')}"
        took = ""
        if i.opened_at is not None and i.resolved_at is not None:
            took = format_duration(i.resolved_at - i.opened_at)
        shadow = " <em>(shadow: nothing acted on)</em>" if i.shadow else ""
        rows.append(
            "<tr>"
            f"<td><code>{esc(i.id or NONE)}</code></td><td>{esc(i.rule)}{shadow}</td>"
            f"<td>{esc(i.where)}</td><td>{esc(i.severity or '')}</td>"
            f'<td class="t">{stamp(report, i.pending_at)}</td>'
            f'<td class="t">{stamp(report, i.opened_at)}</td>'
            f'<td class="t">{stamp(report, i.resolved_at or i.cancelled_at)}</td>'
            f'<td class="t">{esc(took)}</td>'
            f"<td>{esc(status)}</td></tr>"
        )
    head = "".join(
        f'<th scope="col">{h}</th>'
        for h in (
            "incident",
            "rule",
            "where",
            "severity",
            "pending",
            "fired",
            "ended",
            "lasted",
            "how it ended",
        )
    )
    return (
        '<table class="incidents"><caption>Incidents</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _outcome(step: StepView) -> str:
    parts = [f'<span class="status {esc(step.status)}">{esc(step.status)}</span>']
    if step.dry_run:
        parts.append(" <em>(dry run)</em>")
    if step.shadow:
        parts.append(" <em>(shadow: not acted on)</em>")
    if step.finished_at is not None and step.finished_at > step.time:
        parts.append(f" after {esc(format_duration(step.finished_at - step.time))}")
    if step.detail:
        parts.append(f"<br>{esc(step.detail)}")
    for r in step.results:
        pid = "" if r.pid is None else f"pid {r.pid}: "
        detail = f" — {esc(r.detail)}" if r.detail else ""
        parts.append(f"<br>{esc(pid)}<b>{esc(r.state)}</b>{detail}")
    return "".join(parts)


def _reason(step: StepView) -> str:
    parts = [esc(words(step.reason))]
    if step.skipped:
        items = "".join(
            f"<li>{target_html(t)}: <b>{esc(words(reason))}</b></li>" for t, reason in step.skipped
        )
        parts.append(f'<div class="whynot">why not:<ul>{items}</ul></div>')
    return "".join(parts)


def steps_table(report: Report) -> str:
    many = len({s.incident for s in report.steps}) > 1
    rows = []
    entries: list[tuple[float, int, str]] = []
    for step in report.steps:
        targets = "<br>".join(target_html(t) for t in step.targets) or esc(step.what or NONE)
        rule = f"<br><small>{esc(step.rule)}</small>" if many else ""
        entries.append(
            (
                step.time,
                0,
                f'<tr id="step-{step.number}" class="step"><th scope="row">{step.number}</th>'
                f'<td class="t">{stamp(report, step.time)}</td>'
                f"<td><b>{esc(step.label)}</b> <small>({esc(step.kind)})</small>{rule}</td>"
                f"<td>{targets}</td><td>{_outcome(step)}</td><td>{_reason(step)}</td></tr>",
            )
        )
    for note in report.notes:
        entries.append((note.time, 1, _note_row(report, note)))
    for _, _, row in sorted(entries, key=lambda e: (e[0], e[1])):
        rows.append(row)
    if not rows:
        return '<p class="empty">No step ran.</p>'
    head = "".join(
        f'<th scope="col">{h}</th>'
        for h in (
            "#",
            "time",
            "step",
            "targets (pid, user/priority, memory)",
            "outcome",
            "reason, and why not",
        )
    )
    return (
        '<table class="steps"><caption>Steps, in the order they ran</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _note_row(report: Report, note: NoteView) -> str:
    step = "" if note.step is None else f"step {note.step + 1} "
    return (
        '<tr class="note"><th scope="row">&ndash;</th>'
        f'<td class="t">{stamp(report, note.time)}</td>'
        f"<td>{esc(step)}<em>{esc(note.kind)}</em></td><td></td><td></td>"
        f"<td>{esc(note.text)}</td></tr>"
    )


def notices_table(report: Report, notices: Sequence[NoticeView]) -> str:
    if not notices:
        return f'<p class="empty">{esc(report.notices_note or "No message was sent.")}</p>'
    rows = []
    for n in notices:
        error = f"<br><small>{esc(n.error)}</small>" if n.error else ""
        attempts = f" ({n.attempts} attempt{'s' if n.attempts != 1 else ''})" if n.attempts else ""
        body = esc(n.title)
        if n.body:  # folded on screen; on paper, where nothing unfolds, written out
            body = (
                f"<details><summary>{esc(n.title)}</summary><pre>{esc(n.body)}</pre></details>"
                f'<div class="print-only"><b>{esc(n.title)}</b><pre>{esc(n.body)}</pre></div>'
            )
        rows.append(
            f'<tr><td class="t">{stamp(report, n.time)}</td><td class="t">{esc(n.target)}</td>'
            f'<td class="t">{esc(n.kind)}</td><td class="msg">{body}</td>'
            f"<td>{esc(n.status)}{esc(attempts)}{error}</td></tr>"
        )
    head = "".join(
        f'<th scope="col">{h}</th>' for h in ("queued", "to", "kind", "message", "status")
    )
    note = f'<p class="hint">{esc(report.notices_note)}</p>' if report.notices_note else ""
    return (
        f'{note}<table class="notices"><caption>Notifications</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
