"""``gpuwarden incidents`` and ``gpuwarden incident ID``: the journal for people and programs.

Text is for a terminal: every string from the journal passes through ``safe_text`` (command
lines and process names are attacker-controlled; they cannot move the cursor or recolour the
screen) and long commands are cut. Times are ISO 8601 UTC, with ``+M:SS`` from firing.

JSON (``--json``), version 1. Times are ISO 8601 UTC strings (``2026-01-01T00:00:30Z``),
durations seconds; a value never known is ``null``.

``incidents_json`` is a list of incident objects::

    {"id", "rule", "scope", "where", "severity", "shadow", "gpu",
     "pending_at", "opened_at", "resolved_at", "resolve_reason", "acked_at", "acked_by",
     "ack_comment", "abort_at" (an abort asked), "abort_by",
     "open": bool, "duration_s": seconds from firing to resolution (null while open),
     "steps": steps planned, "steps_failed"}

``timeline_json`` is one object::

    {"version": 1,
     "incident": {an incident object, as above},
     "events": [every record, in order:
        {"seq", "time", "from_firing": "+3:05", "from_firing_s": 185.0, "kind", "reason",
         "step": index or null, "intent": id or null, ...fields of the kind}],
     "steps": [one per step planned:
        {"index", "label", "kind", "intent", "time", "from_firing", "reason", "shadow",
         "status": "planned" | "done" | "failed" | "interrupted",
         "targets": [target], "skipped": [{"target": target, "reason"}], "params",
         "outcome": {"ok", "recoverable", "detail", "dry_run", "time"} or null,
         "results": [{"pid", "create_time", "ok", "state", "detail"}]}],
     "undos": [{"id", "kind", "pid", "create_time", "gpu", "value", "ionice",
                "recorded_at", "done": bool, "done_at", "result"}]}

A target is ``{"pid", "create_time", "gpu", "user", "uid", "priority", "gpu_memory_mib",
"command", "checkpoint_signal", "ack_dir", "slurm_job", "job"}``. Event kinds and their fields:
``pending``/``firing``/``waiting``/``resolved``/``cancelled``/``cooldown`` (``where``,
``detail``); ``step`` (``label``, ``step_kind``, ``targets``, ``params``, ``shadow``, ``gpu``);
``skip`` (``label``, ``step_kind``, ``target``; ``reason`` says why); ``refused`` (an intent
already recorded, not run twice); ``finished`` (``ok``, ``recoverable``, ``detail``,
``dry_run``; ``reason`` is the status); ``outcome`` (one target: ``pid``, ``create_time``,
``ok``, ``state``, ``detail``); ``undo`` (``undo_id``, ``pid``, ``gpu``, ``value``,
``ionice``; ``reason`` is the undo kind); ``undone`` (``undo_id``, ``undo``, ``pid``;
``reason`` is the result); ``interrupted`` (in flight when the daemon stopped); and what people
on call said: ``ack`` (``by``, ``comment``), ``hold`` (``by``, ``until``, ``reason_text``),
``release`` (``by``; ``reason`` ``released`` or ``expired``), ``abort`` (``by``,
``reason_text``). A ``step`` of a silenced incident has ``silenced`` (which silence).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuwarden.journal.rows import IncidentRow, TimelineRow
from gpuwarden.text import iso, safe_text
from gpuwarden.units import format_duration

JSON_VERSION = 1
COMMAND_WIDTH = 100
TRANSITIONS = frozenset({"pending", "firing", "waiting", "resolved", "cancelled", "cooldown"})


def _iso(ts: float | None) -> str | None:
    return None if ts is None else iso(ts)


def _text(value: object, limit: int = 200) -> str:
    text = safe_text("" if value is None else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _words(reason: str) -> str:
    return _text(reason.replace("_", " "))


def from_firing(t: float, opened: float) -> str:
    """``+M:SS`` (or ``-M:SS`` before firing); minutes keep counting past the hour."""
    delta = round(t - opened)
    minutes, seconds = divmod(abs(delta), 60)
    return f"{'-' if delta < 0 else '+'}{minutes}:{seconds:02d}"


# -- the list -----------------------------------------------------------------------------------


def incident_dict(row: IncidentRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "rule": row.rule,
        "scope": row.scope,
        "where": row.label,
        "severity": row.severity,
        "shadow": row.shadow,
        "gpu": row.gpu,
        "pending_at": _iso(row.pending_at),
        "opened_at": iso(row.opened_at),
        "resolved_at": _iso(row.resolved_at),
        "resolve_reason": row.resolve_reason,
        "acked_at": _iso(row.acked_at),
        "acked_by": row.acked_by,
        "ack_comment": row.ack_comment,
        "abort_at": _iso(row.abort_at),
        "abort_by": row.abort_by,
        "open": row.open,
        "duration_s": row.duration(),
        "steps": row.steps,
        "steps_failed": row.steps_failed,
    }


def incidents_json(rows: Sequence[IncidentRow]) -> list[dict[str, Any]]:
    return [incident_dict(row) for row in rows]


def render_incidents(rows: Sequence[IncidentRow], now: float) -> str:
    """A table, oldest first: id, rule, where, severity, fired, duration, steps, resolution."""
    if not rows:
        return "no incidents"
    header = ("ID", "RULE", "WHERE", "SEVERITY", "FIRED", "DURATION", "STEPS", "RESOLVED")
    table = [header]
    for row in rows:
        took = format_duration(row.duration(now) or 0.0)
        steps = str(row.steps) + (f" ({row.steps_failed} failed)" if row.steps_failed else "")
        table.append(
            (
                _text(row.id),
                _text(row.rule) + (" [shadow]" if row.shadow else ""),
                _text(row.label or row.scope, 40),
                _text(row.severity or "?"),
                iso(row.opened_at),
                f"open {took}" if row.open else took,
                steps,
                "-" if row.open else _words(row.resolve_reason or "?"),
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    )


# -- the timeline -------------------------------------------------------------------------------


def _event(row: TimelineRow, opened: float) -> dict[str, Any]:
    event: dict[str, Any] = {
        "seq": row.seq,
        "time": iso(row.time),
        "from_firing": from_firing(row.time, opened),
        "from_firing_s": round(row.time - opened, 3),
        "kind": row.kind,
        "reason": row.reason,
        "step": row.step,
        "intent": row.intent,
    }
    return event | {k: v for k, v in row.data.items() if k not in event}


def _steps(rows: Sequence[TimelineRow], opened: float) -> list[dict[str, Any]]:
    steps: dict[str, dict[str, Any]] = {}
    for row in rows:
        data = row.data
        if row.kind == "step" and row.intent is not None:
            steps[row.intent] = {
                "index": row.step,
                "label": data.get("label"),
                "kind": data.get("step_kind"),
                "intent": row.intent,
                "time": iso(row.time),
                "from_firing": from_firing(row.time, opened),
                "reason": row.reason,
                "shadow": data.get("shadow", False),
                "status": "planned",
                "targets": data.get("targets", []),
                "skipped": [],
                "params": data.get("params"),
                "outcome": None,
                "results": [],
            }
            continue
        step = steps.get(row.intent or "")
        if step is None:
            continue
        if row.kind == "skip":
            step["skipped"].append({"target": data.get("target"), "reason": row.reason})
        elif row.kind == "finished":
            step["status"] = row.reason
            summary = {k: data.get(k) for k in ("ok", "recoverable", "detail", "dry_run")}
            step["outcome"] = summary | {"time": iso(row.time)}
        elif row.kind == "outcome":
            fields = ("pid", "create_time", "ok", "state", "detail")
            step["results"].append({k: data.get(k) for k in fields})
        elif row.kind == "interrupted":
            step["status"] = "interrupted"
    return list(steps.values())


def _undos(rows: Sequence[TimelineRow]) -> list[dict[str, Any]]:
    undos: dict[int, dict[str, Any]] = {}
    for row in rows:
        data = row.data
        if row.kind == "undo" and data.get("undo_id") is not None:
            undos[int(data["undo_id"])] = {
                "id": data["undo_id"],
                "kind": row.reason,
                "pid": data.get("pid"),
                "create_time": data.get("create_time"),
                "gpu": data.get("gpu"),
                "value": data.get("value"),
                "ionice": data.get("ionice"),
                "recorded_at": iso(row.time),
                "done": False,
                "done_at": None,
                "result": None,
            }
        elif row.kind == "undone" and int(data.get("undo_id", -1)) in undos:
            undo = undos[int(data["undo_id"])]
            undo.update(done=True, done_at=iso(row.time), result=row.reason)
    return list(undos.values())


def timeline_json(incident: IncidentRow, rows: Sequence[TimelineRow]) -> dict[str, Any]:
    opened = incident.opened_at
    return {
        "version": JSON_VERSION,
        "incident": incident_dict(incident),
        "events": [_event(row, opened) for row in rows],
        "steps": _steps(rows, opened),
        "undos": _undos(rows),
    }


def _who(target: dict[str, Any] | None) -> str:
    if not target:
        return "?"
    mib = target.get("gpu_memory_mib")
    gpu = target.get("gpu")
    text = f"pid {target.get('pid')} {_text(target.get('user') or '?', 32)}"
    text += f"/{_text(target.get('priority'), 32)}"
    text += f", {mib} MiB" if mib is not None else ""
    text += f", GPU {gpu}" if gpu is not None else ""
    text += f", Slurm job {_text(target['slurm_job'], 32)}" if target.get("slurm_job") else ""
    command = target.get("command")
    return text + (f": {_text(command, COMMAND_WIDTH)}" if command else "")


def _what(data: dict[str, Any]) -> str:
    """What a step without targets does, from its parameters."""
    params = data.get("params")
    if not isinstance(params, dict):
        return ""
    kind = data.get("step_kind")
    if kind == "notify":
        return "→ " + _text(", ".join(str(t) for t in params.get("targets") or ()))
    if kind == "exec":
        return "→ " + _text(" ".join(str(a) for a in params.get("argv") or ()), COMMAND_WIDTH)
    if kind == "power_cap":
        watts, percent = params.get("watts"), params.get("percent")
        limit = f"{watts:g} W" if watts else f"{percent:g}% of default"
        return f"→ GPU {data.get('gpu')} limited to {limit}"
    if kind == "provision":
        return f"→ cloud profile {_text(params.get('profile'))}"
    return ""


def _line(row: TimelineRow) -> tuple[str, list[str]]:
    """One event as (headline, indented detail lines)."""
    data, kind = row.data, row.kind
    label = _text(data.get("label"))
    if kind in TRANSITIONS:
        detail = f" ({_text(data['detail'])})" if data.get("detail") else ""
        return f"{kind.upper():<9} {_words(row.reason)}{detail}", []
    if kind == "step":
        shadow = " [shadow: not acted on]" if data.get("shadow") else ""
        if data.get("silenced"):
            shadow = f" [silenced {_text(data['silenced'])}: not acted on]"
        head = f"STEP {row.step}: {label} ({_words(row.reason)})"
        targets = data.get("targets") or []
        lines = [f"target  {_who(t)}" for t in targets]
        what = "" if targets else _what(data)
        return f"{head}{' ' + what if what else ''}{shadow}", lines
    if kind == "skip":
        return "", [f"skip    {_who(data.get('target'))}: {_words(row.reason)}"]
    if kind == "finished":
        dry = " [dry run]" if data.get("dry_run") else ""
        detail = f": {_text(data.get('detail'), COMMAND_WIDTH)}" if data.get("detail") else ""
        return f"{row.reason.upper()} {row.step}: {label}{detail}{dry}", []
    if kind == "outcome":
        detail = f" — {_text(data.get('detail'), COMMAND_WIDTH)}" if data.get("detail") else ""
        return "", [f"pid {data.get('pid')}  {_text(data.get('state'))}{detail}"]
    if kind == "undo" and row.reason == "slurm_resume":
        job = f"Slurm job {data.get('value')} (pid {data.get('pid')})"
        return f"UNDO      scontrol resume {job} when the incident ends", []
    if kind == "undo":
        value = f" to {data['value']}" if data.get("value") is not None else ""
        where = (
            f"pid {data.get('pid')}" if data.get("pid") is not None else f"GPU {data.get('gpu')}"
        )
        return f"UNDO      {_words(row.reason)} {where}{value} when the incident ends", []
    if kind == "undone":
        return (
            f"UNDONE    {_text(data.get('undo'))} pid {data.get('pid')}: {_words(row.reason)}",
            [],
        )
    if kind == "interrupted":
        return f"INTERRUPTED {row.step}: {label} (the daemon stopped while it ran)", []
    if kind in PEOPLE:
        return f"{kind.upper():<9} {_said(row)}", []
    if kind == "refused":
        return f"REFUSED {row.step}: {label} ({_words(row.reason)}: never run twice)", []
    return f"{_text(kind).upper()} {_words(row.reason)}", []


PEOPLE = frozenset({"ack", "hold", "release", "abort"})  # what people on call said


def _said(row: TimelineRow) -> str:
    """An ``ack``/``hold``/``release``/``abort`` record: who, until when, why."""
    data = row.data
    if row.kind == "release" and row.reason == "expired":
        return f"the hold by {_text(data.get('by'))} expired"
    text = f"by {_text(data.get('by') or '?')}"
    if row.kind == "hold":
        until = data.get("until")
        text += f" until {iso(until)}" if isinstance(until, int | float) else " until released"
    why = data.get("reason_text") or data.get("comment")
    return text + (f": {_text(why)}" if why else "")


def render_timeline(
    incident: IncidentRow, rows: Sequence[TimelineRow], now: float | None = None
) -> str:
    """The post-mortem view: the incident, then every event with its time from firing."""
    opened = incident.opened_at
    severity = _text(incident.severity or "unknown severity")
    shadow = ", shadow mode: nothing acted on" if incident.shadow else ""
    where = _text(incident.label or incident.scope)
    lines = [
        f"incident {_text(incident.id)}",
        f"  rule      {_text(incident.rule)} ({severity}{shadow}) on {where}",
    ]
    if incident.pending_at is not None:
        lines.append(f"  pending   {iso(incident.pending_at)}")
    lines.append(f"  fired     {iso(opened)}")
    took = incident.duration(now)
    if incident.resolved_at is not None:
        reason = _words(incident.resolve_reason or "?")
        lines.append(
            f"  resolved  {iso(incident.resolved_at)} after "
            f"{format_duration(took or 0.0)}: {reason}"
        )
    else:
        lines.append("  resolved  no, still open" + (f" ({format_duration(took)})" if took else ""))
    failed = f" ({incident.steps_failed} failed)" if incident.steps_failed else ""
    lines.append(f"  steps     {incident.steps}{failed}")
    if incident.acked_at is not None:
        by = f" by {_text(incident.acked_by)}" if incident.acked_by else ""
        note = f": {_text(incident.ack_comment)}" if incident.ack_comment else ""
        lines.append(f"  acked     {iso(incident.acked_at)}{by}{note}")
    if incident.abort_at is not None and incident.open:
        lines.append(f"  abort     asked {iso(incident.abort_at)} by {_text(incident.abort_by)}")
    lines.append("")
    pad = " " * (len(iso(opened)) + 2)
    for row in rows:
        head, details = _line(row)
        if head:
            lines.append(f"{iso(row.time)}  {from_firing(row.time, opened):>6}  {head}")
        lines.extend(f"{pad}        {d}" for d in details)
    undos = _undos(rows)
    if undos:
        lines += ["", "undo"]
        for undo in undos:
            who = f"pid {undo['pid']}" if undo["pid"] is not None else f"GPU {undo['gpu']}"
            state = (
                f"done {undo['done_at']} ({_text(undo['result'])})" if undo["done"] else "NOT DONE"
            )
            lines.append(f"  #{undo['id']} {_text(undo['kind'])} {who}: {state}")
    return "\n".join(lines)
