"""The cloud instances gpuwarden launched or adopted, kept in the journal file.

One row per instance id (table ``instances``, journal schema version 3). A launch is written
here as soon as EC2 returns its ids, before anything else happens, so a daemon that restarts in
the middle of a step finds what that step launched (``for_step``) and launches nothing twice;
the reaper reads the live rows (``live``) and when their incidents resolved (``resolved_at``).

The store has its own connection to the journal file (WAL) and its own lock, like the outbox:
the provision executor writes from worker threads while the run loop writes the journal, and
``gpuwarden cloud`` reads from another process (``InstanceStore.open_readonly``) and ``cloud
reap`` writes from one (``InstanceStore.open_writer``: an existing journal, never migrated).
Whatever goes wrong with the file becomes a ``JournalError`` that names it and says what to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from gpuwarden.cloud.instance import ENDED_STATES, GONE, LIVE_STATES, Managed
from gpuwarden.journal.schema import (
    JournalError,
)
from gpuwarden.journal.store import StoreFile

KNOWN_STATES: frozenset[str] = frozenset((*LIVE_STATES, *ENDED_STATES, GONE))
_ENDINGS: frozenset[str] = frozenset((*ENDED_STATES, GONE))
_CHUNK = 500  # ids per IN (...) list: far below SQLite's limit on bound values

# Statements below interpolate only these constants and "?" placeholders; values are bound.
_COLUMNS = (
    "instance_id, profile, region, instance_type, market, state, launched_at, expires_at,"
    " host, incident, rule, step, intent, subnet, hourly_usd, terminated_at, end_reason, adopted"
)
_SELECT = f"SELECT {_COLUMNS} FROM instances"  # noqa: S608
_INSERT = (
    f"INSERT OR IGNORE INTO instances ({_COLUMNS}, state_at)"  # noqa: S608
    f" VALUES ({', '.join('?' * (_COLUMNS.count(',') + 2))})"
)
_LIVE = f"state IN ({', '.join('?' * len(LIVE_STATES))})"
_OLDEST_FIRST = " ORDER BY launched_at, rowid"


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _row(r: Sequence[object]) -> Managed:
    return Managed(
        instance_id=str(r[0]),
        profile=str(r[1]),
        region=str(r[2]),
        instance_type=str(r[3]),
        market=str(r[4]),
        state=str(r[5]),
        launched_at=float(r[6]),  # type: ignore[arg-type]
        expires_at=float(r[7]),  # type: ignore[arg-type]
        host=str(r[8]),
        incident=None if r[9] is None else str(r[9]),
        rule=None if r[10] is None else str(r[10]),
        step=None if r[11] is None else int(r[11]),  # type: ignore[call-overload]
        intent=None if r[12] is None else str(r[12]),
        subnet=None if r[13] is None else str(r[13]),
        hourly_usd=_optional_float(r[14]),
        terminated_at=_optional_float(r[15]),
        end_reason=None if r[16] is None else str(r[16]),
        adopted=bool(r[17]),
    )


def _values(m: Managed) -> tuple[object, ...]:
    return (
        m.instance_id,
        m.profile,
        m.region,
        m.instance_type,
        m.market,
        m.state,
        m.launched_at,
        m.expires_at,
        m.host,
        m.incident,
        m.rule,
        m.step,
        m.intent,
        m.subnet,
        m.hourly_usd,
        m.terminated_at,
        m.end_reason,
        int(m.adopted),
    )


class InstanceStore(StoreFile):
    """The ``instances`` table of the journal at ``path``. ``InstanceStore.open(path)`` creates
    (mode 0600) and migrates the file; ``InstanceStore.open_writer(path)`` writes an existing
    journal (the daemon's store, ``cloud reap``); ``InstanceStore.open_readonly(path)``
    changes nothing and refuses every write. ``timeout`` is how long a call waits for another
    process's lock."""

    @classmethod
    def open(cls, path: Path, *, timeout: float = 5.0) -> InstanceStore:
        return cls(path, timeout=timeout)

    # -- writing ----------------------------------------------------------------------------

    def add(self, instance: Managed, now: float) -> bool:
        """Remember an instance (its state written at ``now``). False when its id is already
        known: the row stays as it was (``set_state`` and ``ended`` change it)."""
        if instance.state not in KNOWN_STATES:
            raise ValueError(f"unknown instance state {instance.state!r}")
        with self._tx() as conn:
            return conn.execute(_INSERT, (*_values(instance), now)).rowcount > 0

    def set_state(self, instance_id: str, state: str, now: float) -> None:
        """The instance's state as EC2 last reported it (or ``gone``)."""
        if state not in KNOWN_STATES:
            raise ValueError(f"unknown instance state {state!r}")
        self._update(
            instance_id, "state = ?, state_at = ?", (state, now), f"set the state of {instance_id}"
        )

    def ended(self, instance_id: str, state: str, now: float, reason: str) -> None:
        """The instance was terminated (``shutting-down``, ``terminated``) or is ``gone``.
        The first end is kept: a later call updates the state, never ``terminated_at`` or
        ``end_reason`` (the reaper's ``linger`` stays when the instance later reads ``gone``)."""
        if state not in _ENDINGS:
            raise ValueError(f"{state!r} is not an ended state ({', '.join(sorted(_ENDINGS))})")
        self._update(
            instance_id,
            "state = ?, state_at = ?, terminated_at = coalesce(terminated_at, ?),"
            " end_reason = coalesce(end_reason, ?)",
            (state, now, now, reason),
            f"end {instance_id}",
        )

    def _update(self, instance_id: str, sets: str, args: tuple[object, ...], doing: str) -> None:
        with self._tx() as conn:
            done = conn.execute(
                f"UPDATE instances SET {sets} WHERE instance_id = ?",  # noqa: S608
                (*args, instance_id),
            ).rowcount
        if not done:
            raise JournalError(f"{self.path}: cannot {doing}: no instance {instance_id!r}")

    # -- reading ----------------------------------------------------------------------------

    def get(self, instance_id: str) -> Managed | None:
        with self._tx(write=False) as conn:
            r = conn.execute(_SELECT + " WHERE instance_id = ?", (instance_id,)).fetchone()
        return None if r is None else _row(r)

    def live(self, profile: str | None = None) -> list[Managed]:
        """Instances in a live state (all of them, or one profile's), oldest launch first."""
        query = _SELECT + " WHERE " + _LIVE
        args: list[object] = [*LIVE_STATES]
        if profile is not None:
            query += " AND profile = ?"
            args.append(profile)
        with self._tx(write=False) as conn:
            return [_row(r) for r in conn.execute(query + _OLDEST_FIRST, args)]

    def for_step(self, incident: str, step: int) -> list[Managed]:
        """What one step of one incident launched, in any state, oldest launch first."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                _SELECT + " WHERE incident = ? AND step = ?" + _OLDEST_FIRST, (incident, step)
            )
            return [_row(r) for r in rows]

    def for_incident(self, incident: str) -> list[Managed]:
        """Every instance an incident launched (or that carried its tag), oldest launch first."""
        with self._tx(write=False) as conn:
            rows = conn.execute(_SELECT + " WHERE incident = ?" + _OLDEST_FIRST, (incident,))
            return [_row(r) for r in rows]

    def all(self) -> list[Managed]:
        """Every instance the journal knows, newest launch first."""
        with self._tx(write=False) as conn:
            return [
                _row(r) for r in conn.execute(_SELECT + " ORDER BY launched_at DESC, rowid DESC")
            ]

    def resolved_at(self, incidents: Iterable[str]) -> dict[str, float]:
        """When each of ``incidents`` resolved, from the journal's incidents table. Incidents
        still open, and ids the journal does not know (pruned, or never seen), are left out."""
        ids = sorted(set(incidents))
        found: dict[str, float] = {}
        with self._tx(write=False) as conn:
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                rows = conn.execute(
                    "SELECT id, resolved_at FROM incidents WHERE resolved_at IS NOT NULL"  # noqa: S608
                    f" AND id IN ({', '.join('?' * len(chunk))})",
                    chunk,
                )
                found.update((str(r[0]), float(r[1])) for r in rows)
        return found
