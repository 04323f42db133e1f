"""A report of one incident, from what the journal recorded: its records, the readings kept
around it (``journal.samples``), the rule as it stood when it fired, and its messages.

Pure: the command reads the journal and hands the rows in (``cli/report.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuwarden.journal.rows import IncidentRow, TimelineRow
from gpuwarden.journal.samples import GpuSample, ProcFacts, RuleFacts
from gpuwarden.notify.outbox import OutboxRow
from gpuwarden.report.model import (
    IncidentView,
    NoteView,
    NoticeView,
    Report,
    ResultView,
    RuleView,
    StepView,
    TargetView,
)
from gpuwarden.report.series import GpuSeries
from gpuwarden.report.svg import esc
from gpuwarden.report.tables import words
from gpuwarden.text import iso
from gpuwarden.units import format_duration

GAP = 180.0  # seconds without a reading that end the stretch drawn around an incident
PAD = 30.0  # seconds drawn before and after the incident when no reading was kept


def target_view(data: dict[str, Any] | None) -> TargetView:
    data = data or {}
    return TargetView(
        pid=int(data.get("pid") or 0),
        user=data.get("user"),
        priority=str(data.get("priority") or "?"),
        gpu_memory_mib=data.get("gpu_memory_mib"),
        command=str(data.get("command") or ""),
        gpu=data.get("gpu"),
    )


def what_of(kind: str | None, params: object, gpu: int | None) -> str:
    """What a step without targets does, from its stored parameters."""
    if not isinstance(params, dict):
        return ""
    if kind == "notify":
        return "→ " + ", ".join(str(t) for t in params.get("targets") or ())
    if kind == "exec":
        return "→ " + " ".join(str(a) for a in params.get("argv") or ())
    if kind == "power_cap":
        watts, percent = params.get("watts"), params.get("percent")
        limit = f"{watts:g} W" if watts else f"{percent:g}% of default" if percent else "?"
        return f"→ GPU {gpu} limited to {limit}"
    if kind == "provision":
        return f"→ cloud profile {params.get('profile')}"
    return ""


def steps_and_notes(
    incident: IncidentRow, rows: Sequence[TimelineRow]
) -> tuple[list[StepView], list[NoteView]]:
    """The incident's steps (with skips, outcomes and per-target results) and the records
    that explain a step that did not run, or ran differently."""
    drafts: dict[str, dict[str, Any]] = {}
    notes: list[NoteView] = []
    for row in rows:
        data = row.data
        if row.kind == "step" and row.intent is not None:
            drafts[row.intent] = {
                "incident": incident.id,
                "rule": incident.rule,
                "gpu": data.get("gpu", incident.gpu),
                "index": row.step if row.step is not None else -1,
                "kind": str(data.get("step_kind") or "?"),
                "label": str(data.get("label") or data.get("step_kind") or "?"),
                "time": row.time,
                "reason": row.reason,
                "targets": tuple(target_view(t) for t in data.get("targets") or ()),
                "skipped": [],
                "results": [],
                "what": ""
                if data.get("targets")
                else what_of(data.get("step_kind"), data.get("params"), data.get("gpu")),
                "shadow": bool(data.get("shadow")),
            }
            continue
        draft = drafts.get(row.intent or "")
        if row.kind == "skip" and draft is not None:
            draft["skipped"].append((target_view(data.get("target")), row.reason))
        elif row.kind == "finished" and draft is not None:
            draft.update(
                status=row.reason,
                finished_at=row.time,
                detail=str(data.get("detail") or ""),
                dry_run=bool(data.get("dry_run")),
            )
        elif row.kind == "outcome" and draft is not None:
            draft["results"].append(
                ResultView(
                    data.get("pid"),
                    str(data.get("state") or row.reason),
                    bool(data.get("ok")),
                    str(data.get("detail") or ""),
                )
            )
        elif row.kind == "interrupted" and draft is not None:
            draft.update(status="interrupted", finished_at=row.time)
        elif row.kind in ("waiting", "refused", "interrupted", "undo", "undone", "ack"):
            notes.append(_note(incident, row))
    ordered = sorted(drafts.values(), key=lambda d: (d["time"], d["index"]))
    steps = [
        StepView(
            number=n,
            incident=d["incident"],
            rule=d["rule"],
            gpu=d["gpu"],
            index=d["index"],
            kind=d["kind"],
            label=d["label"],
            time=d["time"],
            reason=d["reason"],
            targets=d["targets"],
            skipped=tuple(d["skipped"]),
            status=d.get("status", "planned"),
            finished_at=d.get("finished_at"),
            detail=d.get("detail", ""),
            results=tuple(d["results"]),
            what=d["what"],
            shadow=d["shadow"],
            dry_run=d.get("dry_run", False),
        )
        for n, d in enumerate(ordered, start=1)
    ]
    return steps, notes


def _note(incident: IncidentRow, row: TimelineRow) -> NoteView:
    data = row.data
    label = str(data.get("label") or "")
    if row.kind == "waiting":
        text = f"a due step waits: {words(row.reason)}"
    elif row.kind == "refused":
        text = f"{label} not run: {words(row.reason)} (a step never runs twice)"
    elif row.kind == "interrupted":
        text = f"{label} was in flight when the daemon stopped: not run again"
    elif row.kind == "undo":
        who = f"pid {data.get('pid')}" if data.get("pid") is not None else f"GPU {data.get('gpu')}"
        value = f" to {data['value']}" if data.get("value") is not None else ""
        text = f"to put back when the incident ends: {words(row.reason)} {who}{value}"
    elif row.kind == "undone":
        text = f"put back: {data.get('undo')} pid {data.get('pid')}: {words(row.reason)}"
    else:
        text = "a person acknowledged the incident"
    return NoteView(row.time, incident.id, incident.rule, row.kind, row.reason, text, row.step)


def stretch(
    samples: Sequence[GpuSample], first: float, last: float
) -> tuple[list[GpuSample], float, float]:
    """The readings that run without a long gap into [first, last], and the span to draw."""
    times = sorted({s.time for s in samples})
    lo, hi = first, last
    before = [t for t in times if t <= first]
    for t in reversed(before):
        if lo - t > GAP:
            break
        lo = min(lo, t)
    after = [t for t in times if t >= last]
    for t in after:
        if t - hi > GAP:
            break
        hi = max(hi, t)
    kept = [s for s in samples if lo <= s.time <= hi]
    if kept:
        lo, hi = min(lo, kept[0].time), max(hi, kept[-1].time)
    else:
        lo, hi = lo - PAD, hi + PAD
    return kept, lo, hi


def build(
    incident: IncidentRow,
    rows: Sequence[TimelineRow],
    *,
    rule: RuleFacts | None,
    fallback: RuleView | None,
    missing: str = "",
    samples: Sequence[GpuSample],
    procs: Sequence[ProcFacts],
    messages: Sequence[OutboxRow],
    host: str,
    now: float,
    version: str,
) -> Report:
    first = incident.pending_at if incident.pending_at is not None else incident.opened_at
    last_record = max((r.time for r in rows), default=incident.opened_at)
    last = incident.resolved_at if incident.resolved_at is not None else max(last_record, first)
    kept, start, end = stretch(samples, first, last)
    if end - start < 60:
        end = start + 60
    remarks: list[str] = []
    if rule is not None:
        rule_view = RuleView(rule.rule, rule.when, rule.until, rule.for_s, rule.description or "")
    elif fallback is not None:
        rule_view = fallback
        remarks.append(
            "The journal did not keep this incident's rule (it fired before journals did): "
            "the thresholds drawn are those of the rule as the playbooks define it now."
        )
    else:
        rule_view = None
        why = f" and {missing}" if missing else ""
        remarks.append(
            f"The journal did not keep the rule {incident.rule}{why}: no threshold is drawn."
        )
    gpus: dict[int, GpuSeries] = {}
    wanted = None if incident.gpu is None else incident.gpu
    for sample in kept:
        if wanted is not None and sample.gpu != wanted:
            continue
        gpus.setdefault(sample.gpu, GpuSeries(sample.gpu)).add(sample)
    for facts in procs:  # latest first: the first seen for a (GPU, pid) is the latest
        series = gpus.get(facts.gpu)
        if series is not None and facts.pid in series.procs:
            series.who.setdefault(facts.pid, facts)
    for series in gpus.values():
        series.finish()
    if not kept:
        remarks.append(
            "No GPU readings were kept for this incident (a journal from before reports, or "
            "readings pruned): the chart shows the rule's bands and steps only."
        )
        if incident.gpu is not None:
            gpus[incident.gpu] = GpuSeries(incident.gpu)
    steps, notes = steps_and_notes(incident, rows)
    notices = [
        NoticeView(
            time=m.created,
            target=m.target,
            title=m.title,
            status=m.status,
            kind=m.kind,
            severity=m.severity,
            body=m.body,
            attempts=m.attempts,
            error=m.last_error,
            sent_at=m.sent_at,
        )
        for m in sorted(messages, key=lambda m: (m.created, m.target))
        if incident.id in m.incidents
    ]
    view = IncidentView(
        id=incident.id,
        rule=incident.rule,
        scope=incident.scope,
        where=incident.label or incident.scope,
        gpu=incident.gpu,
        severity=incident.severity,
        pending_at=incident.pending_at,
        opened_at=incident.opened_at,
        resolved_at=incident.resolved_at,
        resolve_reason=incident.resolve_reason,
        shadow=bool(incident.shadow),
        acked_at=incident.acked_at,
    )
    return Report(
        kind="incident",
        title=f"{incident.rule} on {incident.label or incident.scope}",
        subtitle=f"incident {incident.id}",
        host=host,
        start=start,
        end=end,
        origin=incident.opened_at,
        facts=_facts(incident, host, now),
        incidents=[view],
        rules={} if rule_view is None else {rule_view.name: rule_view},
        gpus=gpus,
        steps=steps,
        notes=notes,
        notices=notices,
        notices_note="" if notices else "No message about this incident is in the outbox.",
        remarks=remarks,
        generated_at=now,
        version=version,
    )


def _facts(incident: IncidentRow, host: str, now: float) -> list[tuple[str, str]]:
    facts = [("host", esc(host))] if host else []
    facts.append(("severity", esc(incident.severity or "unknown")))
    if incident.shadow:
        facts.append(("mode", "shadow: recorded, nothing acted on"))
    if incident.pending_at is not None:
        facts.append(("pending", esc(iso(incident.pending_at))))
    facts.append(("fired", esc(iso(incident.opened_at))))
    if incident.resolved_at is not None:
        took = format_duration(incident.resolved_at - incident.opened_at)
        reason = words(incident.resolve_reason or "?")
        facts.append(("resolved", esc(f"{iso(incident.resolved_at)} after {took}: {reason}")))
    else:
        took = format_duration(max(0.0, now - incident.opened_at))
        facts.append(("resolved", esc(f"no: open for {took}")))
    if incident.acked_at is not None:
        facts.append(("acknowledged", esc(iso(incident.acked_at))))
    failed = f" ({incident.steps_failed} failed)" if incident.steps_failed else ""
    facts.append(("steps", esc(f"{incident.steps}{failed}")))
    return facts
