"""The outbox: every message is written here, in the journal file, before anyone sends it.

One row per (message id, target). ``put`` of a message already there is a no-op, so a message
that the run loop makes again after a restart is not queued twice. The sender takes due rows,
marks each ``sending`` (``claim``), delivers it and marks it ``sent``, ``pending`` again with a
later ``next_attempt_at`` (``mark_retry``), ``failed`` once its retry budget is spent, or
``dropped`` when it can never be sent (its target is gone from the config).

What is promised: in normal operation each message reaches each target once. A daemon that
dies while a message is ``sending`` cannot know whether the target got it; ``recover`` at the
next start puts such rows back to ``pending`` and they are sent again, so across a crash the
promise is *at least once* (a duplicate is possible only for the messages in flight at the
moment of the crash; none is lost).

The outbox has its own connection to the journal file (WAL: the journal's writer and this one
do not block each other for longer than one short transaction) and its own lock, so the run
loop (``put``) and the sender thread (everything else) may call it at the same time. The
daemon opens it with ``Access.WRITE`` (its journal created the file), ``gpuwarden outbox``
with ``Access.READ`` (``Outbox.open_readonly``). Stored errors pass through ``redact_text``;
URLs are never stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gpuwarden.journal.records import cap, redact_text
from gpuwarden.journal.schema import (
    JournalError,
)
from gpuwarden.journal.store import StoreFile

Status = Literal["pending", "sending", "sent", "failed", "dropped"]
STATUSES: tuple[Status, ...] = ("pending", "sending", "sent", "failed", "dropped")
MAX_ERROR = 1024  # characters kept of one delivery error


class OutgoingMessage(Protocol):
    """What the outbox reads from a message (``gpuwarden.notify.messages.Message``)."""

    @property
    def id(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def body(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def created(self) -> float: ...
    @property
    def body_format(self) -> str: ...
    @property
    def incidents(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class OutboxRow:
    """One message for one target, as stored."""

    message_id: str
    target: str
    title: str
    body: str
    body_format: str
    severity: str
    kind: str
    incidents: tuple[str, ...]
    created: float
    queued_at: float
    status: Status
    attempts: int
    next_attempt_at: float
    last_error: str | None
    sent_at: float | None
    fallback_of: str | None

    @property
    def key(self) -> tuple[str, str]:
        return (self.message_id, self.target)


# Statements below interpolate only these constants and "?" placeholders; values are bound.
_COLUMNS = (
    "message_id, target, title, body, body_format, severity, kind, incident, created,"
    " queued_at, status, attempts, next_attempt_at, last_error, sent_at, fallback_of"
)


def _row(r: Sequence[object]) -> OutboxRow:
    incident = str(r[7] or "")
    return OutboxRow(
        message_id=str(r[0]),
        target=str(r[1]),
        title=str(r[2]),
        body=str(r[3]),
        body_format=str(r[4]),
        severity=str(r[5]),
        kind=str(r[6]),
        incidents=tuple(i for i in incident.split(",") if i),
        created=float(r[8]),  # type: ignore[arg-type]
        queued_at=float(r[9]),  # type: ignore[arg-type]
        status=str(r[10]),  # type: ignore[arg-type]
        attempts=int(r[11]),  # type: ignore[call-overload]
        next_attempt_at=float(r[12]),  # type: ignore[arg-type]
        last_error=None if r[13] is None else str(r[13]),
        sent_at=None if r[14] is None else float(r[14]),  # type: ignore[arg-type]
        fallback_of=None if r[15] is None else str(r[15]),
    )


def clean_error(text: str) -> str:
    """An error as it may be stored: credentials masked, one line, bounded."""
    return redact_text(cap(" ".join(text.split()), MAX_ERROR))


class Outbox(StoreFile):
    """The outbox table of the journal at ``path``: created and migrated when needed
    (``Access.OWN``, a drill's scratch file), an existing journal (``Access.WRITE``), or read
    only (``Outbox.open_readonly``: every write is refused)."""

    # -- the run loop -----------------------------------------------------------------------

    def put(
        self,
        message: OutgoingMessage,
        now: float | None = None,
        *,
        target: str | None = None,
        fallback_of: str | None = None,
    ) -> bool:
        """Queue ``message`` for its target (or ``target``); due at once. False when this
        message id is already queued (or was sent) for that target: nothing is queued twice."""
        queued = message.created if now is None else now
        with self._tx() as conn:
            cursor = conn.execute(
                f"INSERT OR IGNORE INTO outbox ({_COLUMNS}) VALUES"  # noqa: S608
                " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?, NULL, NULL, ?)",
                (
                    message.id,
                    message.target if target is None else target,
                    message.title,
                    message.body,
                    message.body_format or "text",
                    message.severity,
                    message.kind,
                    ",".join(message.incidents) or None,
                    message.created,
                    queued,
                    queued,
                    fallback_of,
                ),
            )
            return cursor.rowcount > 0

    # -- the sender -------------------------------------------------------------------------

    def recover(self) -> int:
        """Put rows left ``sending`` by a daemon that stopped back to ``pending`` (call once at
        start, before the sender runs). Returns how many."""
        with self._tx() as conn:
            return conn.execute(
                "UPDATE outbox SET status = 'pending' WHERE status = 'sending'"
            ).rowcount

    def due(self, now: float, limit: int = 100) -> list[OutboxRow]:
        """Pending rows whose next attempt is due, oldest first."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM outbox WHERE status = 'pending' AND next_attempt_at <= ?"  # noqa: S608
                " ORDER BY next_attempt_at, id LIMIT ?",
                (now, limit),
            ).fetchall()
        return [_row(r) for r in rows]

    def next_due(self) -> float | None:
        """When the earliest pending row is due; None when nothing is pending."""
        with self._tx(write=False) as conn:
            value = conn.execute(
                "SELECT min(next_attempt_at) FROM outbox WHERE status = 'pending'"
            ).fetchone()[0]
        return None if value is None else float(value)

    def claim(self, key: tuple[str, str]) -> bool:
        """Mark a pending row ``sending`` (one attempt starts); False when it is not pending."""
        with self._tx() as conn:
            return (
                conn.execute(
                    "UPDATE outbox SET status = 'sending', attempts = attempts + 1"
                    " WHERE message_id = ? AND target = ? AND status = 'pending'",
                    key,
                ).rowcount
                > 0
            )

    def mark_sent(self, key: tuple[str, str], now: float) -> None:
        self._finish(key, "sent", "sent_at = ?, last_error = NULL", (now,))

    def mark_retry(self, key: tuple[str, str], error: str, next_at: float) -> None:
        """The attempt failed; try again at ``next_at``."""
        self._finish(
            key, "pending", "next_attempt_at = ?, last_error = ?", (next_at, clean_error(error))
        )

    def mark_failed(self, key: tuple[str, str], error: str) -> None:
        """The retry budget is spent: the row stays, ``failed``, for ``gpuwarden outbox``."""
        self._finish(key, "failed", "last_error = ?", (clean_error(error),))

    def mark_dropped(self, key: tuple[str, str], reason: str) -> None:
        """The row can never be sent (its target is not in the config any more)."""
        self._finish(key, "dropped", "last_error = ?", (clean_error(reason),))

    def _finish(
        self, key: tuple[str, str], status: Status, sets: str, args: tuple[object, ...]
    ) -> None:
        with self._tx() as conn:
            done = conn.execute(
                f"UPDATE outbox SET status = ?, {sets} WHERE message_id = ? AND target = ?",  # noqa: S608
                (status, *args, *key),
            ).rowcount
        if not done:
            raise JournalError(f"{self.path}: no outbox message {key[0]!r} for {key[1]!r}")

    # -- reading ----------------------------------------------------------------------------

    def get(self, key: tuple[str, str]) -> OutboxRow | None:
        with self._tx(write=False) as conn:
            r = conn.execute(
                f"SELECT {_COLUMNS} FROM outbox WHERE message_id = ? AND target = ?",  # noqa: S608
                key,
            ).fetchone()
        return None if r is None else _row(r)

    def newer(self, row: OutboxRow) -> bool:
        """Does the outbox hold a later message for the same target and incidents? (A newer
        state of an Alertmanager alert: the older one need not be sent.)"""
        with self._tx(write=False) as conn:
            found = conn.execute(
                "SELECT 1 FROM outbox WHERE target = ? AND incident = ? AND created > ? LIMIT 1",
                (row.target, ",".join(row.incidents), row.created),
            ).fetchone()
        return found is not None

    def rows(self, *statuses: Status) -> list[OutboxRow]:
        """Rows with one of ``statuses`` (all rows when none is given), oldest first."""
        query = f"SELECT {_COLUMNS} FROM outbox"  # noqa: S608
        if statuses:
            query += f" WHERE status IN ({', '.join('?' * len(statuses))})"
        with self._tx(write=False) as conn:
            return [_row(r) for r in conn.execute(query + " ORDER BY id", statuses)]

    def about(self, incident: str) -> list[OutboxRow]:
        """Every row about ``incident`` (alone or grouped with others), oldest first."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM outbox"  # noqa: S608
                " WHERE instr(',' || incident || ',', ',' || ? || ',') > 0 ORDER BY id",
                (incident,),
            ).fetchall()
        return [_row(r) for r in rows]

    def pending(self) -> list[OutboxRow]:
        """Rows still to deliver (``pending`` or ``sending``)."""
        return self.rows("pending", "sending")

    def failed(self) -> list[OutboxRow]:
        return self.rows("failed")

    def counts(self) -> dict[str, int]:
        """How many rows have each status (every status, zero included)."""
        with self._tx(write=False) as conn:
            found = dict(conn.execute("SELECT status, count(*) FROM outbox GROUP BY status"))
        return {s: int(found.get(s, 0)) for s in STATUSES}

    def prune(self, before: float) -> int:
        """Forget sent and dropped rows queued before ``before``; failed rows stay until a
        person has seen them (``gpuwarden outbox``). Returns how many went."""
        with self._tx() as conn:
            return conn.execute(
                "DELETE FROM outbox WHERE status IN ('sent', 'dropped') AND queued_at < ?",
                (before,),
            ).rowcount
