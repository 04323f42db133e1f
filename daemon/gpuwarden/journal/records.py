"""What goes into the journal, and how: rule changes, intents, outcomes, each as records.

Everything stored passes through ``redact`` (structured values: step parameters) or
``redact_text`` (free text: command lines, outcome details, exec output). Values under keys
that name secrets (``token``, ``password``, ``api_key``, ``secret``, ...) are replaced, and so
are credentials inside text: ``scheme://user:pass@`` (apprise URLs), ``?token=…``,
``password=…``, ``--token VALUE`` (in an argv or a command line), ``Bearer …``. Strings are
cut at ``MAX_TEXT`` characters. Telemetry strings (process names and command lines are
attacker-controlled) are stored as data only: bound parameters and JSON, never part of a
statement.

Record kinds (``records.kind``): the rule transitions (``pending``, ``firing``, ``waiting``,
``resolved``, ``cancelled``, ``cooldown``), ``step`` (an intent, before acting), ``skip`` (a
candidate a step left out), ``refused`` (an intent already recorded: not acted on twice),
``finished`` (a step's outcome), ``outcome`` (one target's result), ``undo`` (something to put
back), ``undone``, ``interrupted`` (in flight when the daemon stopped) and ``ack``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
from typing import Any, Protocol

from gpuwarden.model import Intent, Outcome, RuleChange, Target, Transition

MAX_TEXT = 16 * 1024  # characters kept of one stored string (a cmdline, an exec's output)
REDACTED = "[redacted]"

_WORD = r"[\w.-]*(?:token|passw|passphrase|secret|key|credential|auth|pwd)[\w.-]*"
_SECRET_KEY = re.compile(
    r"token|passw|passphrase|secret|key|credential|auth|pwd|cookie|(?:^|[^a-z])pass(?:[^a-z]|$)",
    re.IGNORECASE,
)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^\s/@:]*):([^\s/@]*)@")
_ASSIGNMENT = re.compile(rf"(?i)((?:^|[\s?&;,'\"])(?:{_WORD})[\"']?\s*[=:]\s*[\"']?)([^\s&;,'\"]+)")
_FLAG_VALUE = re.compile(rf"(?i)((?:^|\s)-{{1,2}}{_WORD}\s+)([^\s-]\S*)")
_BEARER = re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=\-]{8,}")
_SECRET_FLAG = re.compile(rf"(?i)^-{{1,2}}{_WORD}$")


class IncidentFacts(Protocol):
    """What the journal reads from the engine's ``Incident`` when it fires (a RuleChange does
    not carry severity, shadow mode or GPU)."""

    @property
    def id(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def shadow(self) -> bool: ...
    @property
    def gpu(self) -> int | None: ...


# -- redaction --------------------------------------------------------------------------------


def secret_key(name: str) -> bool:
    """A mapping key whose value is never stored (``token``, ``api_key``, ``password``)."""
    return bool(_SECRET_KEY.search(name))


def cap(text: str, limit: int = MAX_TEXT) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text) - limit} more characters]"


def redact_text(text: str) -> str:
    """``text``, cut to ``MAX_TEXT``, with credentials masked (see the module docstring)."""
    text = _URL_USERINFO.sub(lambda m: f"{m[1]}{m[2]}:{REDACTED}@", cap(text))
    text = _BEARER.sub(lambda m: f"{m[1]} {REDACTED}", text)
    text = _FLAG_VALUE.sub(lambda m: f"{m[1]}{REDACTED}", text)
    return _ASSIGNMENT.sub(lambda m: f"{m[1]}{REDACTED}", text)


def redact(value: object) -> Any:
    """A JSON-ready copy of ``value`` (a pydantic model, dataclass, mapping, sequence or
    scalar) with its secrets masked."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        value = dump(mode="json")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): REDACTED if secret_key(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        out: list[Any] = []
        for item in value:
            flag = out and isinstance(out[-1], str) and _SECRET_FLAG.match(out[-1])
            out.append(REDACTED if flag and isinstance(item, str) else redact(item))
        return out
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact_text(str(value))


# -- encoding ---------------------------------------------------------------------------------


def dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def target_dict(target: Target) -> dict[str, Any]:
    return {
        "pid": target.pid,
        "create_time": target.create_time,
        "gpu": target.gpu,
        "user": None if target.user is None else cap(target.user, 256),
        "uid": target.uid,
        "priority": target.priority,
        "gpu_memory_mib": target.gpu_memory_mib,
        "command": redact_text(target.command),
        "checkpoint_signal": target.checkpoint_signal,
        "ack_dir": None if target.ack_dir is None else cap(target.ack_dir, 4096),
        "slurm_job": None if target.slurm_job is None else cap(target.slurm_job, 64),
        "job": None if target.job is None else cap(target.job, 256),
    }


def target_from(data: dict[str, Any]) -> Target:
    return Target(
        pid=int(data["pid"]),
        create_time=data.get("create_time"),
        gpu=data.get("gpu"),
        user=data.get("user"),
        priority=str(data.get("priority", "normal")),
        gpu_memory_mib=data.get("gpu_memory_mib"),
        command=str(data.get("command", "")),
        checkpoint_signal=data.get("checkpoint_signal"),
        uid=data.get("uid"),
        ack_dir=data.get("ack_dir"),
        slurm_job=data.get("slurm_job"),
        job=data.get("job"),
    )


# -- writing ----------------------------------------------------------------------------------


def insert(
    conn: sqlite3.Connection,
    where: tuple[str | None, str, str],
    time: float,
    now: float,
    kind: str,
    reason: str,
    data: dict[str, Any],
    step: int | None = None,
    intent: str | None = None,
) -> None:
    """One record; ``where`` is (incident, rule, scope)."""
    conn.execute(
        "INSERT INTO records (time, recorded_at, incident, rule, scope, kind, reason, step,"
        " intent, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (time, now, *where, kind, reason, step, intent, dumps(data)),
    )


def write_change(
    conn: sqlite3.Connection, change: RuleChange, now: float, facts: IncidentFacts | None
) -> None:
    data: dict[str, Any] = {"where": change.where}
    if change.detail:
        data["detail"] = redact_text(change.detail)
    if change.kind == Transition.FIRING and change.incident:
        conn.execute(
            "INSERT INTO incidents (id, rule, scope, label, severity, shadow, gpu, opened_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            (
                change.incident,
                change.rule,
                change.scope,
                change.where,
                None if facts is None else facts.severity,
                None if facts is None else int(facts.shadow),
                None if facts is None else facts.gpu,
                change.time,
            ),
        )
        # The pending record that led here (if the rule went through pending) joins it.
        before = conn.execute(
            "SELECT seq, kind, time FROM records WHERE rule = ? AND scope = ? AND incident"
            " IS NULL AND kind IN ('pending', 'cancelled') ORDER BY seq DESC LIMIT 1",
            (change.rule, change.scope),
        ).fetchone()
        if before is not None and before[1] == Transition.PENDING:
            conn.execute(
                "UPDATE records SET incident = ? WHERE seq = ?", (change.incident, before[0])
            )
            conn.execute(
                "UPDATE incidents SET pending_at = ? WHERE id = ? AND pending_at IS NULL",
                (before[2], change.incident),
            )
    elif change.kind == Transition.RESOLVED and change.incident:
        conn.execute(
            "UPDATE incidents SET resolved_at = ?, resolve_reason = ? WHERE id = ?"
            " AND resolved_at IS NULL",
            (change.time, str(change.reason), change.incident),
        )
    where = (change.incident, change.rule, change.scope)
    insert(conn, where, change.time, now, str(change.kind), str(change.reason), data)


def write_intent(conn: sqlite3.Connection, intent: Intent, now: float, run: str) -> bool:
    """The intent (status ``planned``), its step record and its skip records; False (and a
    ``refused`` record) when an intent with its id is already in the journal."""
    where = (intent.incident, intent.rule, intent.scope)
    ids = (intent.step, intent.id)
    head = {"label": intent.label, "step_kind": intent.kind, "where": intent.where}
    found = conn.execute("SELECT status FROM intents WHERE id = ?", (intent.id,)).fetchone()
    if found is not None:
        insert(conn, where, intent.time, now, "refused", f"already_{found[0]}", head, *ids)
        return False
    targets = [target_dict(t) for t in intent.targets]
    params = None if intent.params is None else redact(intent.params)
    # An intent of an incident the journal has not seen open still gets its incident row.
    conn.execute(
        "INSERT INTO incidents (id, rule, scope, label, severity, shadow, gpu, opened_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
        " severity = coalesce(severity, excluded.severity),"
        " shadow = coalesce(shadow, excluded.shadow), gpu = coalesce(gpu, excluded.gpu)",
        (*where, intent.where, intent.severity, int(intent.shadow), intent.gpu, intent.time),
    )
    conn.execute(
        "INSERT INTO intents (id, incident, rule, scope, step_index, kind, label, time, reason,"
        " shadow, targets, params, status, run) VALUES"
        " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'planned', ?)",
        (
            intent.id,
            *where,
            intent.step,
            intent.kind,
            intent.label,
            intent.time,
            str(intent.reason),
            int(intent.shadow),
            dumps(targets),
            None if params is None else dumps(params),
            run,
        ),
    )
    step = {**head, "targets": targets, "params": params, "shadow": intent.shadow}
    step["gpu"] = intent.gpu
    if intent.silenced:
        step["silenced"] = redact_text(intent.silenced)
    insert(conn, where, intent.time, now, "step", str(intent.reason), step, *ids)
    for skipped in intent.skipped:
        skip = {**head, "target": target_dict(skipped.target)}
        insert(conn, where, intent.time, now, "skip", str(skipped.reason), skip, *ids)
    return True


def write_outcome(conn: sqlite3.Connection, intent_id: str, outcome: Outcome, now: float) -> str:
    """The outcome of a planned intent; returns the intent's new status. Raises ``LookupError``
    for an unknown intent and ``ValueError`` for one that is no longer planned."""
    row = conn.execute(
        "SELECT incident, rule, scope, step_index, kind, label, status FROM intents WHERE id = ?",
        (intent_id,),
    ).fetchone()
    if row is None:
        raise LookupError(intent_id)
    incident, rule, scope, step, kind, label, status = row
    if status != "planned":
        raise ValueError(status)
    status = "done" if outcome.ok else "failed"
    results = [
        {
            "pid": r.pid,
            "create_time": r.create_time,
            "ok": r.ok,
            "state": r.state,
            "detail": redact_text(r.detail),
        }
        for r in outcome.targets
    ]
    summary = {
        "ok": outcome.ok,
        "recoverable": outcome.recoverable,
        "detail": redact_text(outcome.detail),
        "dry_run": outcome.dry_run,
    }
    conn.execute(
        "UPDATE intents SET status = ?, outcome = ?, finished_at = ? WHERE id = ?",
        (status, dumps({**summary, "targets": results}), now, intent_id),
    )
    where = (incident, rule, scope)
    ids = (step, intent_id)
    head = {"label": label, "step_kind": kind}
    insert(conn, where, now, now, "finished", status, {**head, **summary}, *ids)
    for result in results:
        insert(conn, where, now, now, "outcome", str(result["state"]), {**head, **result}, *ids)
    # A dry run changed nothing: there is nothing to put back.
    for undo in () if outcome.dry_run else outcome.undo:
        cursor = conn.execute(
            "INSERT INTO undos (incident, intent, kind, pid, create_time, gpu, value, ionice,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                incident,
                intent_id,
                undo.kind,
                undo.pid,
                undo.create_time,
                undo.gpu,
                undo.value,
                undo.ionice,
                now,
            ),
        )
        data = {
            **head,
            "undo_id": cursor.lastrowid,
            "pid": undo.pid,
            "create_time": undo.create_time,
            "gpu": undo.gpu,
            "value": undo.value,
            "ionice": undo.ionice,
        }
        insert(conn, where, now, now, "undo", undo.kind, data, *ids)
    return str(status)
