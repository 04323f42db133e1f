"""A report of a drill: the drill's timeline records, every snapshot it played (``Readings``,
handed to ``drill.run`` as its observer), the playbooks it rehearsed, and the messages it
composed.

Pure: ``gpuwarden drill --html`` runs the drill and hands the results in (``cli/check.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from gpuwarden.journal.samples import GpuSample, ProcFacts, split
from gpuwarden.model import Snapshot
from gpuwarden.notify.outbox import OutboxRow
from gpuwarden.playbook.loader import PlaybookSet
from gpuwarden.report.model import (
    IncidentView,
    NoteView,
    NoticeView,
    Report,
    RuleView,
    StepView,
    TargetView,
)
from gpuwarden.report.series import GpuSeries
from gpuwarden.report.svg import esc
from gpuwarden.report.tables import NONE, words
from gpuwarden.text import iso
from gpuwarden.units import format_duration

MAX_GPUS = 8  # GPUs drawn when no incident says which matter


class Readings:
    """Every snapshot of a drill, kept per GPU at full resolution (arrays of floats)."""

    def __init__(self) -> None:
        self.gpus: dict[int, GpuSeries] = {}
        self.host = ""
        self.first: float | None = None
        self.last: float | None = None

    def __call__(self, snapshot: Snapshot, now: float) -> None:
        self.host = snapshot.host
        if self.first is None:
            self.first = now
        self.last = now
        by_gpu = split(snapshot)
        for state in snapshot.gpus:
            series = self.gpus.get(state.index)
            if series is None:
                series = self.gpus[state.index] = GpuSeries(state.index, state.name)
            procs = by_gpu.get(state.index, [])
            series.add(GpuSample.of(state, procs, now))
            for proc in procs:
                if proc.pid not in series.who:
                    series.who[proc.pid] = ProcFacts.of(proc, now)


def gpu_of_scope(scope: str) -> int | None:
    """The GPU a scope key names: ``gpu:3``, ``gpu:3/pid:…``, ``event:gpu:3``; else None."""
    head = scope.removeprefix("event:").split("/")[0]
    number = head.removeprefix("gpu:")
    return int(number) if head.startswith("gpu:") and number.isdigit() else None


def _what(record: dict[str, Any]) -> str:
    if "notify" in record:
        return "→ " + ", ".join(str(t) for t in record["notify"])
    if "power_cap" in record:
        cap = record["power_cap"]
        limit = (
            f"{cap['watts']:g} W"
            if cap.get("watts")
            else f"{cap.get('percent') or 0:g}% of default"
        )
        return f"→ GPU {cap.get('gpu')} limited to {limit}"
    if "argv" in record:
        return "→ " + " ".join(str(a) for a in record["argv"])
    if "profile" in record:
        cloud = record.get("cloud") or {}
        if cloud.get("count"):
            price = cloud.get("hourly_usd")
            cost = "unpriced" if price is None else f"${price:,.2f}/h"
            return (
                f"→ cloud profile {record['profile']}: would launch {cloud['count']} x "
                f"{cloud.get('instance_type')} ({cost})"
            )
        return f"→ cloud profile {record['profile']}"
    return ""


def _target(data: dict[str, Any], readings: Readings) -> TargetView:
    pid = int(data.get("pid") or 0)
    gpu = data.get("gpu")
    command = ""
    for series in readings.gpus.values() if gpu is None else [readings.gpus.get(gpu)]:
        facts = None if series is None else series.who.get(pid)
        if facts is not None:
            command = facts.command
            break
    return TargetView(
        pid=pid,
        user=data.get("user"),
        priority=str(data.get("priority") or "?"),
        gpu_memory_mib=data.get("gpu_memory_mib"),
        command=command,
        gpu=gpu,
        job=data.get("job"),
    )


def _step_kind(playbooks: PlaybookSet, rule: str, index: int, label: str) -> str:
    compiled = playbooks.rule(rule)
    if compiled is not None and 0 <= index < len(compiled.steps):
        return compiled.steps[index].kind
    return label


def build(
    records: Sequence[dict[str, Any]],
    readings: Readings,
    playbooks: PlaybookSet,
    *,
    scenario: str,
    description: str,
    start: float,
    duration: float,
    messages: Iterable[OutboxRow],
    delivered: bool,
    now: float,
    version: str,
    ticks: int = 0,
) -> Report:
    incidents: list[IncidentView] = []
    open_by_scope: dict[tuple[str, str], int] = {}  # (rule, scope) -> index in incidents
    drafts: list[dict[str, Any]] = []
    notes: list[NoteView] = []
    severities = {r.name: r.spec.severity for r in playbooks.rules}
    shadows = {r.name: r.spec.mode == "shadow" for r in playbooks.rules}
    for record in records:
        if record["kind"] == "message":
            continue  # the messages come from the drill's outbox (``messages``)
        t = start + float(record["t"])
        kind, rule, scope = record["kind"], record["rule"], record["scope"]
        key = (rule, scope)
        if kind in ("pending", "firing"):
            index = open_by_scope.get(key)
            if index is None:
                incidents.append(
                    IncidentView(
                        id=record.get("incident"),
                        rule=rule,
                        scope=scope,
                        where=record.get("where") or scope,
                        gpu=gpu_of_scope(scope),
                        severity=severities.get(rule),
                        shadow=shadows.get(rule, False),
                    )
                )
                index = open_by_scope[key] = len(incidents) - 1
            found = incidents[index]
            if kind == "pending":
                incidents[index] = _replace(found, pending_at=t)
            else:
                incidents[index] = _replace(found, id=record.get("incident"), opened_at=t)
        elif kind in ("resolved", "cancelled"):
            index = open_by_scope.pop(key, None)
            if index is not None:
                if kind == "resolved":
                    incidents[index] = _replace(
                        incidents[index], resolved_at=t, resolve_reason=record["reason"]
                    )
                else:
                    incidents[index] = _replace(
                        incidents[index], cancelled_at=t, cancel_reason=record["reason"]
                    )
        elif kind in ("cooldown", "waiting"):
            detail = f" ({record['detail']})" if record.get("detail") else ""
            text = (
                f"would fire on {record.get('where') or scope}, but the rule is cooling "
                f"down{detail}"
                if kind == "cooldown"
                else f"a due step waits: {words(record['reason'])}{detail}"
            )
            notes.append(NoteView(t, record.get("incident"), rule, kind, record["reason"], text))
        elif kind == "step":
            index = int(record.get("index", -1))
            label = str(record.get("step") or "?")
            drafts.append(
                {
                    "incident": record.get("incident") or "",
                    "rule": rule,
                    "gpu": gpu_of_scope(scope),
                    "index": index,
                    "kind": _step_kind(playbooks, rule, index, label),
                    "label": label,
                    "time": t,
                    "reason": record["reason"],
                    "targets": tuple(_target(x, readings) for x in record.get("targets") or ()),
                    "skipped": [],
                    "what": "" if record.get("targets") else _what(record),
                    "shadow": bool(record.get("shadow")),
                }
            )
        elif kind == "skip" and drafts:
            for target in record.get("targets") or ():
                drafts[-1]["skipped"].append((_target(target, readings), record["reason"]))
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
            status="simulated",
            detail="drill: nothing was done",
            what=d["what"],
            shadow=d["shadow"],
            dry_run=True,
        )
        for n, d in enumerate(drafts, start=1)
    ]
    end = max(readings.last or start, start + duration)
    chosen, remarks = _chosen_gpus(incidents, steps, readings)
    rules = {}
    for incident in incidents:
        compiled = playbooks.rule(incident.rule)
        if compiled is not None and incident.rule not in rules:
            rules[incident.rule] = RuleView(
                compiled.name,
                compiled.when.text,
                None if compiled.until is None else compiled.until.text,
                compiled.spec.for_,
                compiled.spec.description,
            )
    notices = [
        NoticeView(
            time=m.created,
            target=m.target,
            title=m.title,
            status=m.status if delivered else "not delivered (drill)",
            kind=m.kind,
            severity=m.severity,
            body=m.body,
            attempts=m.attempts,
            error=m.last_error,
        )
        for m in sorted(messages, key=lambda m: (m.created, m.target))
    ]
    fired = sum(1 for i in incidents if i.opened_at is not None)
    facts = [
        ("scenario", esc(scenario)),
        ("host", esc(readings.host or "?")),
        ("playbooks", esc(", ".join(playbooks.files) or NONE)),
        ("simulated", esc(f"{format_duration(duration)} from {iso(start)}, {ticks} ticks")),
        ("incidents", esc(f"{fired} fired, {sum(1 for i in incidents if i.resolved_at)} resolved")),
        ("steps", esc(", ".join(f"{k} {v}" for k, v in _count(s.kind for s in steps)) or "none")),
    ]
    return Report(
        kind="drill",
        title=f"Drill: {scenario}",
        subtitle=description or "a rehearsal on a simulated clock: nothing was touched",
        host=readings.host,
        start=start,
        end=end,
        origin=start,
        facts=facts,
        incidents=incidents,
        rules=rules,
        gpus={g: readings.gpus[g].finish() for g in chosen},
        steps=steps,
        notes=notes,
        notices=notices,
        notices_note=(
            "Delivered, marked [DRILL] (drill --notify)."
            if delivered
            else "What the drill would have sent; nobody was told (drill --notify delivers)."
        ),
        remarks=remarks,
        generated_at=now,
        version=version,
    )


def _replace(incident: IncidentView, **changes: Any) -> IncidentView:
    return dataclasses.replace(incident, **changes)


def _count(kinds: Iterable[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return sorted(counts.items())


def _chosen_gpus(
    incidents: Sequence[IncidentView], steps: Sequence[StepView], readings: Readings
) -> tuple[list[int], list[str]]:
    every = sorted(readings.gpus)
    named = {i.gpu for i in incidents} | {s.gpu for s in steps}
    if None in named or not incidents:
        chosen = every[:MAX_GPUS]
    else:
        chosen = sorted(g for g in named if g is not None and g in readings.gpus)
    left = [g for g in every if g not in chosen]
    remarks = []
    if left:
        names = ", ".join(str(g) for g in left[:16]) + ("…" if len(left) > 16 else "")
        why = "had no incident" if incidents else f"are beyond the first {MAX_GPUS}"
        remarks.append(f"GPU(s) {names} {why}: not drawn.")
    if not incidents:
        remarks.insert(0, "No rule went pending or fired in this drill.")
    return chosen, remarks
