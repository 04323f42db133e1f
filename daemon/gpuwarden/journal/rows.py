"""What comes out of the journal: typed rows, and the queries that read them.

Times are seconds since the epoch (UTC). A column that was never known reads as ``None``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.journal.records import target_from
from gpuwarden.model import Target, Undo

_INCIDENTS = """
    SELECT i.id, i.rule, i.scope, i.label, i.severity, i.shadow, i.gpu, i.opened_at,
        i.pending_at, i.resolved_at, i.resolve_reason, i.acked_at,
        (SELECT count(*) FROM intents WHERE incident = i.id) AS steps,
        (SELECT count(*) FROM intents WHERE incident = i.id AND status = 'failed') AS failed,
        i.acked_by, i.ack_comment, i.abort_at, i.abort_by
    FROM incidents AS i"""
_INTENTS = """
    SELECT id, incident, rule, scope, step_index, kind, label, time, reason, shadow, targets,
        params, status, outcome, finished_at
    FROM intents"""
_UNDOS = """
    SELECT id, incident, intent, kind, pid, create_time, gpu, value, ionice, created_at,
        done_at, result
    FROM undos"""
_RECORDS = """
    SELECT seq, time, recorded_at, incident, rule, scope, kind, reason, step, intent, data
    FROM records"""


@dataclass(frozen=True, slots=True)
class IncidentRow:
    id: str
    rule: str
    scope: str
    label: str  # the scope as people read it: "GPU 0"
    severity: str | None  # None until known (a firing recorded without the engine's incident)
    shadow: bool | None
    gpu: int | None
    opened_at: float  # when it fired
    pending_at: float | None = None  # when its condition first held (rules with `for`)
    resolved_at: float | None = None
    resolve_reason: str | None = None
    acked_at: float | None = None
    steps: int = 0  # steps planned (intents written)
    steps_failed: int = 0
    acked_by: str | None = None  # `ack --by`
    ack_comment: str | None = None
    abort_at: float | None = None  # when `gpuwarden abort` asked (the daemon ends it)
    abort_by: str | None = None

    @property
    def open(self) -> bool:
        return self.resolved_at is None

    def duration(self, now: float | None = None) -> float | None:
        """Seconds from firing to resolution (or to ``now`` while open; else ``None``)."""
        end = self.resolved_at if self.resolved_at is not None else now
        return None if end is None else max(0.0, end - self.opened_at)


@dataclass(frozen=True, slots=True)
class OpenIncident:
    """An open incident as a restarted engine needs it, so that no step runs twice."""

    incident: IncidentRow
    steps: Mapping[int, str]  # step index -> intent status (planned | done | failed | ...)
    targeted: frozenset[tuple[str, int, float | None]]  # (step kind, pid, create_time)

    @property
    def next_step(self) -> int:
        return max(self.steps, default=-1) + 1


@dataclass(frozen=True, slots=True)
class IntentRow:
    id: str
    incident: str
    rule: str
    scope: str
    step: int
    kind: str
    label: str
    time: float
    reason: str
    shadow: bool
    targets: tuple[Target, ...]
    params: Any  # the step's parameters as stored (JSON, redacted)
    status: str  # planned | done | failed | interrupted
    outcome: dict[str, Any] | None
    finished_at: float | None


@dataclass(frozen=True, slots=True)
class UndoRow:
    id: int
    incident: str
    intent: str
    kind: str  # resume | slurm_resume | renice | power_limit
    pid: int | None
    create_time: float | None
    gpu: int | None
    value: float | int | None
    ionice: str | None
    created_at: float
    done_at: float | None
    result: str | None

    def undo(self) -> Undo:
        return Undo(self.kind, self.pid, self.create_time, self.gpu, self.value, self.ionice)


@dataclass(frozen=True, slots=True)
class TimelineRow:
    seq: int
    time: float
    recorded_at: float
    incident: str | None
    rule: str
    scope: str
    kind: str  # see journal.records: pending, firing, step, skip, outcome, ...
    reason: str
    step: int | None
    intent: str | None
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BreakerState:
    tripped_at: float
    reason: str


def _bool(value: object) -> bool | None:
    return None if value is None else bool(value)


def incident_row(row: tuple[Any, ...]) -> IncidentRow:
    return IncidentRow(
        id=row[0],
        rule=row[1],
        scope=row[2],
        label=row[3],
        severity=row[4],
        shadow=_bool(row[5]),
        gpu=row[6],
        opened_at=row[7],
        pending_at=row[8],
        resolved_at=row[9],
        resolve_reason=row[10],
        acked_at=row[11],
        steps=row[12],
        steps_failed=row[13],
        acked_by=row[14],
        ack_comment=row[15],
        abort_at=row[16],
        abort_by=row[17],
    )


def intent_row(row: tuple[Any, ...]) -> IntentRow:
    return IntentRow(
        id=row[0],
        incident=row[1],
        rule=row[2],
        scope=row[3],
        step=row[4],
        kind=row[5],
        label=row[6],
        time=row[7],
        reason=row[8],
        shadow=bool(row[9]),
        targets=tuple(target_from(t) for t in json.loads(row[10])),
        params=None if row[11] is None else json.loads(row[11]),
        status=row[12],
        outcome=None if row[13] is None else json.loads(row[13]),
        finished_at=row[14],
    )


def undo_row(row: tuple[Any, ...]) -> UndoRow:
    return UndoRow(*row)


def timeline_row(row: tuple[Any, ...]) -> TimelineRow:
    seq, time, recorded_at, incident, rule, scope, kind, reason, step, intent, data = row
    return TimelineRow(
        seq, time, recorded_at, incident, rule, scope, kind, reason, step, intent, json.loads(data)
    )


# -- queries ----------------------------------------------------------------------------------


def read_incidents(
    conn: sqlite3.Connection, since: float | None, open_only: bool
) -> list[IncidentRow]:
    clauses: list[str] = []
    args: list[float] = []
    if since is not None:
        clauses.append("(i.opened_at >= ? OR i.resolved_at IS NULL OR i.resolved_at >= ?)")
        args += [since, since]
    if open_only:
        clauses.append("i.resolved_at IS NULL")
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = conn.execute(f"{_INCIDENTS}{where} ORDER BY i.opened_at, i.id", args)
    return [incident_row(r) for r in rows]


def read_incident(conn: sqlite3.Connection, incident_id: str) -> IncidentRow | None:
    row = conn.execute(f"{_INCIDENTS} WHERE i.id = ?", (incident_id,)).fetchone()
    return None if row is None else incident_row(row)


def ids_starting(conn: sqlite3.Connection, prefix: str, limit: int) -> list[str]:
    pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = conn.execute(
        "SELECT id FROM incidents WHERE id LIKE ? ESCAPE '\\' ORDER BY opened_at, id LIMIT ?",
        (pattern, limit),
    )
    return [str(r[0]) for r in rows]


def read_open(conn: sqlite3.Connection) -> list[OpenIncident]:
    found: list[OpenIncident] = []
    for incident in read_incidents(conn, None, open_only=True):
        steps: dict[int, str] = {}
        targeted: set[tuple[str, int, float | None]] = set()
        intents = conn.execute(
            "SELECT step_index, status, kind, targets FROM intents WHERE incident = ?",
            (incident.id,),
        )
        for index, status, kind, targets in intents:
            steps[int(index)] = str(status)
            for t in json.loads(targets):
                targeted.add((str(kind), int(t["pid"]), t.get("create_time")))
        found.append(OpenIncident(incident, steps, frozenset(targeted)))
    return found


def read_intents(conn: sqlite3.Connection, status: str, other_than_run: str) -> list[IntentRow]:
    rows = conn.execute(
        f"{_INTENTS} WHERE status = ? AND run != ? ORDER BY time, id", (status, other_than_run)
    )
    return [intent_row(r) for r in rows]


def read_intent(conn: sqlite3.Connection, intent_id: str) -> IntentRow | None:
    row = conn.execute(f"{_INTENTS} WHERE id = ?", (intent_id,)).fetchone()
    return None if row is None else intent_row(row)


def read_undos(conn: sqlite3.Connection, incident: str | None) -> list[UndoRow]:
    if incident is None:
        rows = conn.execute(f"{_UNDOS} WHERE done_at IS NULL ORDER BY id")
    else:
        rows = conn.execute(
            f"{_UNDOS} WHERE done_at IS NULL AND incident = ? ORDER BY id", (incident,)
        )
    return [undo_row(r) for r in rows]


def read_timeline(conn: sqlite3.Connection, incident_id: str) -> list[TimelineRow]:
    rows = conn.execute(f"{_RECORDS} WHERE incident = ? ORDER BY seq", (incident_id,))
    return [timeline_row(r) for r in rows]
