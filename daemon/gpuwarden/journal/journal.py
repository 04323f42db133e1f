"""The decision journal: what the daemon saw, decided and did, in ``<state_dir>/journal.db``.

Every rule change and every step is recorded; a step's intent is written *before* an executor
acts and its outcome *after*, so a daemon killed with SIGKILL and restarted knows which steps
were in flight (``interrupted``), which steps and targets each open incident already had
(``open_incidents``: never repeat a step), and what it must still put back (``pending_undos``:
never forget a suspended job). Rate limits and the circuit breaker count from here too.

SQLite in WAL mode with ``synchronous=FULL``: a write is on disk when the call returns. Each
call is one transaction (``record_all`` writes one tick's records in one). The daemon has one
connection of this kind, opened with ``Access.OWN`` while it holds the state directory's lock
(``journal.lock``); the commands open it with ``Access.READ`` (the views) or ``Access.WRITE``
(``ack``, ``reset-breaker``), which never create, migrate or change the file's mode. The run
loop serialises the daemon's writes (executors in worker threads hand their outcomes back to
it); a lock guards the connection should a call come from another thread.
A write that fails raises ``JournalError``: the daemon stops rather than act without a record.

The file format is in ``journal.schema``, what is written (and redacted) in
``journal.records``, the rows read back in ``journal.rows``.
"""

from __future__ import annotations

import functools
import sqlite3
import uuid
from collections.abc import Iterable

from gpuwarden.errors import UsageError
from gpuwarden.journal.control import ControlStore
from gpuwarden.journal.records import (
    IncidentFacts,
    insert,
    redact_text,
    write_change,
    write_intent,
    write_outcome,
)
from gpuwarden.journal.rows import (
    BreakerState,
    IncidentRow,
    IntentRow,
    OpenIncident,
    TimelineRow,
    UndoRow,
    ids_starting,
    read_incident,
    read_incidents,
    read_intents,
    read_open,
    read_timeline,
    read_undos,
)
from gpuwarden.journal.samples import (
    GpuSample,
    ProcFacts,
    RuleFacts,
    SampleBatch,
    read_procs,
    read_rule,
    read_samples,
    write_batch,
)
from gpuwarden.journal.samples import prune as prune_samples
from gpuwarden.journal.schema import (
    JournalError,
)
from gpuwarden.journal.store import StoreFile
from gpuwarden.model import Intent, Outcome, RuleChange

__all__ = [
    "FILENAME",
    "BreakerState",
    "GpuSample",
    "IncidentFacts",
    "IncidentRow",
    "IntentRow",
    "Journal",
    "JournalError",
    "OpenIncident",
    "ProcFacts",
    "RuleFacts",
    "SampleBatch",
    "TimelineRow",
    "UndoRow",
]

FILENAME = "journal.db"


class Journal(StoreFile, ControlStore):
    """The journal file. ``Journal(path)`` opens it for the daemon, creating (mode 0600),
    checking and migrating it; ``Journal.open_readonly(path)`` opens it for the views and
    changes nothing; ``Journal.open_writer(path)`` opens an existing journal for a command
    that writes beside a running daemon. ``timeout`` is how long a call waits for another
    process's lock."""

    integrity_on_open = True

    @functools.cached_property
    def run(self) -> str:
        """Tells this opening's intents from an earlier run's (one value per opening)."""
        return uuid.uuid4().hex

    # -- what happens -----------------------------------------------------------------------

    def record(
        self, item: RuleChange | Intent, now: float, incident: IncidentFacts | None = None
    ) -> bool:
        """Record one rule change or intent (see ``record_all``); False for a refused intent."""
        return bool(self.record_all([item], now, () if incident is None else (incident,)))

    def record_all(
        self,
        items: Iterable[RuleChange | Intent],
        now: float,
        incidents: Iterable[IncidentFacts] = (),
    ) -> list[RuleChange | Intent]:
        """Record one tick's records in order, in one transaction; return those written.

        A firing opens an incident row (severity, shadow mode and GPU come from ``incidents``,
        the engine's open incidents, or else from the incident's first step) and the pending
        record before it joins the incident; a resolved change closes it. An intent is written
        with status ``planned``, a ``step`` record and one ``skip`` record per skipped
        candidate. An intent whose id is already in the journal (a step the engine would
        repeat) is recorded as ``refused`` and left out of the result: the run loop acts only
        on the intents this returns.
        """
        todo = list(items)
        if not todo:
            return []
        facts = {i.id: i for i in incidents}
        written: list[RuleChange | Intent] = []
        with self._tx() as conn:
            for item in todo:
                if isinstance(item, Intent):
                    if write_intent(conn, item, now, self.run):
                        written.append(item)
                else:
                    write_change(conn, item, now, facts.get(item.incident or ""))
                    written.append(item)
        return written

    def finish(self, intent_id: str, outcome: Outcome, now: float) -> str:
        """Record an executor's outcome; returns the intent's status, ``done`` (``outcome.ok``)
        or ``failed``. Adds a ``finished`` record, one ``outcome`` record per target and one
        undo row per thing to put back (none for a dry run: it changed nothing)."""
        with self._tx() as conn:
            try:
                return write_outcome(conn, intent_id, outcome, now)
            except LookupError:
                raise JournalError(f"{self.path}: no intent {intent_id!r} to finish") from None
            except ValueError as exc:
                raise JournalError(f"{self.path}: intent {intent_id!r} is already {exc}") from None

    def record_samples(self, batch: SampleBatch) -> None:
        """Readings around incidents, for reports (``journal.samples``): one transaction."""
        if not batch:
            return
        with self._tx() as conn:
            write_batch(conn, batch)

    # -- restart ----------------------------------------------------------------------------

    def interrupted(self) -> list[IntentRow]:
        """Intents an earlier run planned and never finished: in flight when it stopped. Their
        step may or may not have acted (an interrupted ``suspend`` may have stopped its
        targets): ``mark_interrupted`` each, so that none runs again."""
        with self._tx(write=False) as conn:
            return read_intents(conn, "planned", other_than_run=self.run)

    def mark_interrupted(self, intent_id: str, now: float) -> bool:
        """Mark a planned intent interrupted; False when it is not (or no longer) planned."""
        with self._tx() as conn:
            row = conn.execute(
                "SELECT incident, rule, scope, step_index, kind, label FROM intents"
                " WHERE id = ? AND status = 'planned'",
                (intent_id,),
            ).fetchone()
            if row is None:
                return False
            conn.execute(
                "UPDATE intents SET status = 'interrupted', finished_at = ? WHERE id = ?",
                (now, intent_id),
            )
            data = {"label": row[5], "step_kind": row[4]}
            where = (row[0], row[1], row[2])
            insert(conn, where, now, now, "interrupted", "daemon_stopped", data, row[3], intent_id)
            return True

    def open_incidents(self) -> list[OpenIncident]:
        """Incidents not resolved, each with the steps it already planned (index → status)
        and the ``(step kind, pid, create_time)`` of every process its steps chose."""
        with self._tx(write=False) as conn:
            return read_open(conn)

    def pending_undos(self, incident: str | None = None) -> list[UndoRow]:
        """What is still to put back (all of it, or one incident's), oldest first."""
        with self._tx(write=False) as conn:
            return read_undos(conn, incident)

    def undo_done(self, undo_id: int, now: float, result: str = "done") -> None:
        """An undo was carried out, or cannot be (``result`` says why: ``gone``, ...)."""
        with self._tx() as conn:
            row = conn.execute(
                "SELECT u.incident, coalesce(i.rule, ''), coalesce(i.scope, ''), u.kind, u.pid,"
                " u.intent, i.step_index, i.label FROM undos AS u LEFT JOIN intents AS i"
                " ON i.id = u.intent WHERE u.id = ? AND u.done_at IS NULL",
                (undo_id,),
            ).fetchone()
            if row is None:
                raise JournalError(f"{self.path}: no pending undo {undo_id}")
            result = redact_text(result)
            conn.execute(
                "UPDATE undos SET done_at = ?, result = ? WHERE id = ?", (now, result, undo_id)
            )
            data = {"undo_id": undo_id, "undo": row[3], "pid": row[4], "label": row[7]}
            insert(conn, (row[0], row[1], row[2]), now, now, "undone", result, data, row[6], row[5])

    # -- safety rails -----------------------------------------------------------------------

    def note_action(self, rule: str, kind: str, pid: int | None, now: float) -> None:
        """A destructive action happened (rate limits and the circuit breaker count these)."""
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO actions (time, rule, kind, pid) VALUES (?, ?, ?, ?)",
                (now, rule, kind, pid),
            )

    def actions_since(
        self, since: float, rule: str | None = None, kinds: Iterable[str] | None = None
    ) -> int:
        """How many actions were noted at or after ``since`` (of one rule, of some kinds)."""
        query = "SELECT count(*) FROM actions WHERE time >= ?"
        args: list[object] = [since]
        if rule is not None:
            query += " AND rule = ?"
            args.append(rule)
        if kinds is not None:
            names = list(kinds)
            query += f" AND kind IN ({', '.join('?' * len(names))})" if names else " AND 0"
            args.extend(names)
        with self._tx(write=False) as conn:
            return int(conn.execute(query, args).fetchone()[0])

    def breaker(self) -> BreakerState | None:
        """The circuit breaker: ``None`` when it is not tripped."""
        with self._tx(write=False) as conn:
            return self._tripped(conn)

    def _tripped(self, conn: sqlite3.Connection) -> BreakerState | None:
        row = conn.execute(
            "SELECT tripped_at, reason FROM breaker WHERE reset_at IS NULL ORDER BY id LIMIT 1"
        ).fetchone()
        return None if row is None else BreakerState(float(row[0]), str(row[1]))

    def trip_breaker(self, reason: str, now: float) -> BreakerState:
        """Trip the breaker; one already tripped keeps its first time and reason."""
        with self._tx() as conn:
            state = self._tripped(conn)
            if state is None:
                state = BreakerState(now, redact_text(reason))
                conn.execute(
                    "INSERT INTO breaker (tripped_at, reason) VALUES (?, ?)",
                    (state.tripped_at, state.reason),
                )
            return state

    def reset_breaker(self, now: float) -> bool:
        """Reset the breaker; False when it was not tripped."""
        with self._tx() as conn:
            cursor = conn.execute("UPDATE breaker SET reset_at = ? WHERE reset_at IS NULL", (now,))
            return cursor.rowcount > 0

    # -- reading ----------------------------------------------------------------------------

    def incidents(
        self, *, since: float | None = None, open_only: bool = False
    ) -> list[IncidentRow]:
        """Incidents in the order they fired. ``since``: those open at any time since then
        (fired since, resolved since, or still open); ``open_only``: those not resolved."""
        with self._tx(write=False) as conn:
            return read_incidents(conn, since, open_only)

    def incident(self, incident_id: str) -> IncidentRow | None:
        with self._tx(write=False) as conn:
            return read_incident(conn, incident_id)

    def find_incident(self, text: str) -> IncidentRow:
        """The incident with id ``text``, or else the one incident whose id starts with it;
        ``UsageError`` when there is none, or more than one."""
        with self._tx(write=False) as conn:
            found = read_incident(conn, text)
            ids = [] if found is not None else ids_starting(conn, text, limit=6)
            if found is None and len(ids) == 1:
                found = read_incident(conn, ids[0])
        if found is not None:
            return found
        if not ids:
            raise UsageError(
                f"no incident {text!r} in {self.path}", hint="`gpuwarden incidents` lists them"
            )
        many = str(len(ids)) if len(ids) < 6 else "more than 5"
        raise UsageError(
            f"{many} incidents start with {text!r}: {', '.join(ids[:5])}",
            hint="give more of the id (`gpuwarden incidents` lists them)",
        )

    def timeline(self, incident_id: str) -> list[TimelineRow]:
        """Everything recorded for one incident, in the order it was recorded."""
        with self._tx(write=False) as conn:
            return read_timeline(conn, incident_id)

    def samples(
        self, start: float, end: float, gpu: int | None = None
    ) -> tuple[list[GpuSample], list[ProcFacts]]:
        """The readings kept between ``start`` and ``end`` (of one GPU, or all), oldest
        first, and who the processes in them were (latest first)."""
        with self._tx(write=False) as conn:
            return read_samples(conn, start, end, gpu), read_procs(conn, end)

    def rule_facts(self, incident_id: str) -> RuleFacts | None:
        """The incident's rule (``when``, ``until``, ``for``) as it stood when it opened;
        None for an incident recorded before journals kept it."""
        with self._tx(write=False) as conn:
            return read_rule(conn, incident_id)

    # -- upkeep -----------------------------------------------------------------------------

    def prune(self, before: float) -> int:
        """Forget incidents resolved before ``before`` (their records, intents and undos),
        records outside incidents, samples, actions and reset breaker trips older than that. An
        incident with an undo not yet done is kept. Returns how many incidents went."""
        with self._tx() as conn:
            gone = [
                str(r[0])
                for r in conn.execute(
                    "SELECT id FROM incidents WHERE resolved_at < ? AND NOT EXISTS"
                    " (SELECT 1 FROM undos WHERE incident = incidents.id AND done_at IS NULL)",
                    (before,),
                )
            ]
            for incident in gone:
                conn.execute("DELETE FROM records WHERE incident = ?", (incident,))
                conn.execute("DELETE FROM intents WHERE incident = ?", (incident,))
                conn.execute("DELETE FROM undos WHERE incident = ?", (incident,))
                conn.execute("DELETE FROM incidents WHERE id = ?", (incident,))
            conn.execute("DELETE FROM records WHERE incident IS NULL AND time < ?", (before,))
            prune_samples(conn, before, gone)
            conn.execute("DELETE FROM actions WHERE time < ?", (before,))
            conn.execute("DELETE FROM breaker WHERE reset_at < ?", (before,))
            return len(gone)
