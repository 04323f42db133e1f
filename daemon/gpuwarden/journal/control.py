"""What people on call tell the daemon through the journal, and what the daemon tells them back.

The on-call commands write here (``ack --by``, ``hold``, ``release``, ``abort``, ``silence``),
in short transactions beside the running daemon; the daemon reads it all once per tick
(``controls``) and hands it to the engine as data, so each takes effect within one tick. Back
the other way, the daemon writes each open incident's next step (``write_next``), which the
read-only views show.

- ``holds``: one row per hold; an open one has no ``released_at``. A hold whose ``until`` has
  passed is closed by the daemon (``released_by = 'expired'``, ``expire_holds``).
- ``silences``: one row per silence, in force from ``starts_at`` to ``ends_at`` unless ended
  before (``ended_at``).
- ``incidents.abort_at``/``abort_by``/``abort_reason``: an abort asked for; the daemon ends
  the incident at its next tick (reason ``aborted``) and runs its undos.
- ``next_steps``: one row per open incident, rewritten when it changes.

Each request also leaves a record in the incident's timeline (``hold``, ``release``,
``abort``, ``ack``) with who asked and why. Free text (reasons, comments, names) is redacted
and cut like every other stored string (``records.redact_text``).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.journal.records import cap, dumps, insert, redact_text, target_dict
from gpuwarden.model import Hold, NextStep, Silence

NAME_LIMIT = 64  # characters kept of a person's name
TEXT_LIMIT = 500  # characters kept of a reason or a comment


@dataclass(frozen=True, slots=True)
class HoldRow:
    id: int
    incident: str
    created_at: float
    until: float | None
    by: str
    reason: str
    released_at: float | None = None
    released_by: str | None = None

    def hold(self) -> Hold:
        return Hold(self.incident, self.until, note=hold_note(self))


@dataclass(frozen=True, slots=True)
class SilenceRow:
    id: int
    rule: str | None
    gpu: int | None
    host: bool
    created_at: float
    starts_at: float
    ends_at: float
    by: str
    reason: str
    ended_at: float | None = None
    ended_by: str | None = None

    def silence(self) -> Silence:
        ends = self.ends_at if self.ended_at is None else min(self.ends_at, self.ended_at)
        return Silence(
            self.id, self.starts_at, ends, self.rule, self.gpu, self.host, self.by, self.reason
        )

    def active(self, now: float) -> bool:
        return self.silence().active(now)


@dataclass(frozen=True, slots=True)
class Controls:
    """Everything the daemon takes from the on-call commands at one tick."""

    acked: frozenset[str]  # open incidents someone acknowledged
    holds: Mapping[str, HoldRow]  # open incident -> its hold (not released, not expired)
    silences: tuple[SilenceRow, ...]  # in force now or later
    aborts: Mapping[str, str]  # open incident -> who asked and why


def hold_note(row: HoldRow) -> str:
    """``by alice until 2026-…Z: waiting for the owner`` (the engine's waiting record)."""
    from gpuwarden.text import iso

    until = f" until {iso(row.until)}" if row.until is not None else " until released"
    why = f": {row.reason}" if row.reason else ""
    return f"by {row.by}{until}{why}"


def name(text: str) -> str:
    return cap(redact_text(text.strip()), NAME_LIMIT) or "unknown"


def words(text: str | None) -> str:
    return cap(redact_text((text or "").strip()), TEXT_LIMIT)


def _hold_row(row: tuple[Any, ...]) -> HoldRow:
    return HoldRow(*row)


def _silence_row(row: tuple[Any, ...]) -> SilenceRow:
    values = list(row)
    values[3] = bool(values[3])
    return SilenceRow(*values)


_HOLDS = "SELECT id, incident, created_at, until, by, reason, released_at, released_by FROM holds"
_SILENCES = (
    "SELECT id, rule, gpu, host, created_at, starts_at, ends_at, by, reason, ended_at, ended_by"
    " FROM silences"
)


def next_dict(step: NextStep) -> dict[str, Any]:
    return {
        "step": step.step,
        "kind": step.kind,
        "label": step.label,
        "due": step.due,
        "state": step.state,
        "detail": redact_text(step.detail),
        "targets": [target_dict(t) for t in step.targets],
        "skipped": step.skipped,
        "selects": step.selects,
        "pause_on_ack": step.pause_on_ack,
    }


class ControlStore:
    """The on-call side of ``Journal`` (a mixin: it uses the journal's transactions)."""

    def _tx(self, *, write: bool = True) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError  # Journal's

    # -- written by the commands --------------------------------------------------------------

    def ack(self, incident_id: str, now: float, *, by: str = "", comment: str = "") -> bool:
        """Someone acknowledged the incident; False when unknown or already acknowledged."""
        with self._tx() as conn:
            row = conn.execute(
                "SELECT rule, scope FROM incidents WHERE id = ? AND acked_at IS NULL",
                (incident_id,),
            ).fetchone()
            if row is None:
                return False
            who, what = name(by), words(comment)
            conn.execute(
                "UPDATE incidents SET acked_at = ?, acked_by = ?, ack_comment = ? WHERE id = ?",
                (now, who, what, incident_id),
            )
            data = {"by": who, "comment": what}
            insert(conn, (incident_id, row[0], row[1]), now, now, "ack", "acknowledged", data)
            return True

    def hold(
        self,
        incident_id: str,
        now: float,
        *,
        until: float | None,
        by: str,
        reason: str = "",
    ) -> HoldRow:
        """Put an open incident on hold (a hold it already has is replaced)."""
        who, why = name(by), words(reason)
        with self._tx() as conn:
            where = _open_incident(conn, incident_id)
            conn.execute(
                "UPDATE holds SET released_at = ?, released_by = ? WHERE incident = ?"
                " AND released_at IS NULL",
                (now, who, incident_id),
            )
            cursor = conn.execute(
                "INSERT INTO holds (incident, created_at, until, by, reason)"
                " VALUES (?, ?, ?, ?, ?)",
                (incident_id, now, until, who, why),
            )
            data = {"by": who, "until": until, "reason_text": why}
            insert(conn, where, now, now, "hold", "held", data)
            assert cursor.lastrowid is not None
            return HoldRow(cursor.lastrowid, incident_id, now, until, who, why)

    def release(self, incident_id: str, now: float, *, by: str) -> HoldRow | None:
        """End the incident's hold; None when it has none (or it expired)."""
        who = name(by)
        with self._tx() as conn:
            found = conn.execute(
                f"{_HOLDS} WHERE incident = ? AND released_at IS NULL AND"
                " (until IS NULL OR until > ?) ORDER BY id DESC LIMIT 1",
                (incident_id, now),
            ).fetchone()
            if found is None:
                return None
            conn.execute(
                "UPDATE holds SET released_at = ?, released_by = ? WHERE id = ?",
                (now, who, found[0]),
            )
            where = _where(conn, incident_id)
            insert(conn, where, now, now, "release", "released", {"by": who})
            return _hold_row(found)

    def request_abort(self, incident_id: str, now: float, *, by: str, reason: str = "") -> bool:
        """Ask the daemon to end an open incident; False when an abort was already asked."""
        who, why = name(by), words(reason)
        with self._tx() as conn:
            where = _open_incident(conn, incident_id)
            cursor = conn.execute(
                "UPDATE incidents SET abort_at = ?, abort_by = ?, abort_reason = ? WHERE id = ?"
                " AND abort_at IS NULL",
                (now, who, why, incident_id),
            )
            if cursor.rowcount == 0:
                return False
            insert(conn, where, now, now, "abort", "requested", {"by": who, "reason_text": why})
            return True

    def add_silence(
        self,
        now: float,
        *,
        ends: float,
        by: str,
        reason: str,
        rule: str | None = None,
        gpu: int | None = None,
        host: bool = False,
    ) -> SilenceRow:
        who, why = name(by), words(reason)
        with self._tx() as conn:
            cursor = conn.execute(
                "INSERT INTO silences (rule, gpu, host, created_at, starts_at, ends_at, by,"
                " reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (rule, gpu, int(host), now, now, ends, who, why),
            )
            assert cursor.lastrowid is not None
            return SilenceRow(cursor.lastrowid, rule, gpu, host, now, now, ends, who, why)

    def end_silence(self, silence_id: int, now: float, *, by: str) -> SilenceRow | None:
        """End a silence now; None when there is no such silence still in force."""
        with self._tx() as conn:
            found = conn.execute(
                f"{_SILENCES} WHERE id = ? AND ended_at IS NULL AND ends_at > ?",
                (silence_id, now),
            ).fetchone()
            if found is None:
                return None
            conn.execute(
                "UPDATE silences SET ended_at = ?, ended_by = ? WHERE id = ?",
                (now, name(by), silence_id),
            )
            return _silence_row(found)

    # -- read by the commands -----------------------------------------------------------------

    def silences(self, *, since: float | None = None) -> list[SilenceRow]:
        """Every silence (``since``: only those in force at or after that time), oldest
        first."""
        with self._tx(write=False) as conn:
            if since is None:
                rows = conn.execute(f"{_SILENCES} ORDER BY id")
            else:
                rows = conn.execute(
                    f"{_SILENCES} WHERE coalesce(min(ends_at, ended_at), ends_at) > ? ORDER BY id",
                    (since,),
                )
            return [_silence_row(r) for r in rows]

    def holds_of(self, incident_id: str) -> list[HoldRow]:
        with self._tx(write=False) as conn:
            rows = conn.execute(f"{_HOLDS} WHERE incident = ? ORDER BY id", (incident_id,))
            return [_hold_row(r) for r in rows]

    def next_steps(self) -> dict[str, tuple[float, dict[str, Any]]]:
        """Open incident -> (when the daemon computed it, its next step as ``next_dict``)."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                "SELECT n.incident, n.computed_at, n.data FROM next_steps AS n"
                " JOIN incidents AS i ON i.id = n.incident WHERE i.resolved_at IS NULL"
            )
            return {str(r[0]): (float(r[1]), json.loads(r[2])) for r in rows}

    # -- read and written by the daemon -------------------------------------------------------

    def controls(self, now: float) -> Controls:
        """What the on-call commands have said that applies now, in one read."""
        with self._tx(write=False) as conn:
            acked: set[str] = set()
            aborts: dict[str, str] = {}
            for incident, acked_at, abort_at, abort_by, abort_reason in conn.execute(
                "SELECT id, acked_at, abort_at, abort_by, abort_reason FROM incidents"
                " WHERE resolved_at IS NULL AND (acked_at IS NOT NULL OR abort_at IS NOT NULL)"
            ):
                if acked_at is not None:
                    acked.add(str(incident))
                if abort_at is not None:
                    why = f": {abort_reason}" if abort_reason else ""
                    aborts[str(incident)] = f"by {abort_by}{why}"
            holds = {
                row.incident: row
                for row in map(
                    _hold_row,
                    conn.execute(
                        "SELECT h.id, h.incident, h.created_at, h.until, h.by, h.reason,"
                        " h.released_at, h.released_by FROM holds AS h JOIN incidents AS i"
                        " ON i.id = h.incident WHERE h.released_at IS NULL"
                        " AND i.resolved_at IS NULL ORDER BY h.id"
                    ),
                )
            }
            silences = tuple(
                _silence_row(r)
                for r in conn.execute(
                    f"{_SILENCES} WHERE ended_at IS NULL AND ends_at > ? ORDER BY id", (now,)
                )
            )
        return Controls(frozenset(acked), holds, silences, aborts)

    def expire_holds(self, holds: Iterable[HoldRow], now: float) -> list[HoldRow]:
        """Close the holds among ``holds`` whose time has passed, each with a ``release``
        record (reason ``expired``); returns those closed."""
        due = [h for h in holds if h.until is not None and h.until <= now]
        if not due:
            return []
        with self._tx() as conn:
            for hold in due:
                conn.execute(
                    "UPDATE holds SET released_at = ?, released_by = 'expired' WHERE id = ?"
                    " AND released_at IS NULL",
                    (hold.until, hold.id),
                )
                where = _where(conn, hold.incident)
                assert hold.until is not None
                insert(conn, where, hold.until, now, "release", "expired", {"by": hold.by})
        return due

    def write_next(
        self, steps: Iterable[NextStep], now: float, *, keep: Iterable[str] = ()
    ) -> None:
        """Replace the next steps of the incidents in ``steps``; forget those of every other
        incident except ``keep`` (incidents whose next step is unchanged)."""
        rows = [(s.incident, now, dumps(next_dict(s))) for s in steps]
        known = {r[0] for r in rows} | set(keep)
        with self._tx() as conn:
            conn.executemany(
                "INSERT INTO next_steps (incident, computed_at, data) VALUES (?, ?, ?)"
                " ON CONFLICT (incident) DO UPDATE SET computed_at = excluded.computed_at,"
                " data = excluded.data",
                rows,
            )
            for (incident,) in list(conn.execute("SELECT incident FROM next_steps")):
                if incident not in known:
                    conn.execute("DELETE FROM next_steps WHERE incident = ?", (incident,))


def _where(conn: sqlite3.Connection, incident_id: str) -> tuple[str, str, str]:
    row = conn.execute("SELECT rule, scope FROM incidents WHERE id = ?", (incident_id,)).fetchone()
    return (incident_id, "", "") if row is None else (incident_id, str(row[0]), str(row[1]))


class NotOpen(LookupError):
    """The incident is unknown, or already resolved (``args[0]``: when, or None)."""


def _open_incident(conn: sqlite3.Connection, incident_id: str) -> tuple[str, str, str]:
    row = conn.execute(
        "SELECT rule, scope, resolved_at FROM incidents WHERE id = ?", (incident_id,)
    ).fetchone()
    if row is None:
        raise NotOpen(None)
    if row[2] is not None:
        raise NotOpen(float(row[2]))
    return (incident_id, str(row[0]), str(row[1]))
