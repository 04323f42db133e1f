"""The journal's file format: its tables, how they migrate, and what may be written into them.

Schema history lives in ``MIGRATIONS``, one entry per version; ``PRAGMA user_version`` says
which version a file has, ``PRAGMA application_id`` that it is a gpuwarden journal at all.
To change the schema, append a migration and never edit one that has shipped::

    Migration(5, "incidents remember their ticket",
              ddl("ALTER TABLE incidents ADD COLUMN ticket TEXT")),

Opening a journal applies every migration above the file's version in one transaction; a file
written by a newer gpuwarden is refused, never downgraded. Whatever goes wrong with the file
(not a database, corrupt, locked, unwritable, disk full) becomes one ``JournalError`` that
names the file and says what to do.

Every connection to the file is opened by ``connect`` with one of three ``Access`` modes, so
that no command can break the daemon's write-ahead log:

- ``READ`` (``incidents``, ``incident``, ``outbox``, ``cloud``): ``mode=ro`` and
  ``query_only``; the file must exist at exactly this version. Never changes the journal mode,
  never checkpoints, never deletes ``-wal``/``-shm``.
- ``WRITE`` (``ack``, ``hold``, ``release``, ``abort``, ``silence``, ``reset-breaker``,
  ``cloud reap``, the daemon's own outbox and instance connections, and its control socket):
  the file must exist at exactly this version; it is written in short
  ``BEGIN IMMEDIATE`` transactions with ``synchronous=FULL``, waiting up to ``timeout`` for the
  daemon's lock (SQLite's busy handler). It never creates, migrates or changes the journal mode.
- ``OWN`` (the daemon, which holds the state directory's lock, and a drill's scratch file):
  creates the file (0600), switches it to WAL, checks and migrates it.

Why this matters: SQLite's locks are POSIX advisory locks, which belong to a *process*, and
closing *any* descriptor of the file drops every lock that process holds on it. A daemon that
opens the file behind SQLite's back (``os.open``/``os.close``) while its own connection is
open loses its shared lock without knowing; the next process to close its last connection
then believes it is alone, checkpoints and unlinks the WAL the daemon is still writing to,
and every later write of the daemon goes to a deleted file. So nothing here opens an existing
journal outside SQLite: the file is created with ``O_EXCL`` or not touched at all.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.errors import HintedError

APPLICATION_ID = 0x67707764  # "gpwd": tells a gpuwarden journal from any other SQLite file
JOURNAL_NAME = "journal.db"  # the journal's file in the state directory


class JournalError(HintedError):
    """The journal cannot be opened, read or written: what is wrong with which file, and what
    to do. The daemon stops rather than act without a record (exit code FAILURE)."""


class Access(enum.Enum):
    """How a connection may use the journal file (see the module's docstring)."""

    READ = "read"  # mode=ro, query_only: the views
    WRITE = "write"  # an existing journal, short transactions: writing commands, the daemon's
    # outbox and instance store
    OWN = "own"  # create, WAL, migrate: the daemon (holding the state lock), a drill's scratch


# -- schema ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Migration:
    version: int
    summary: str
    apply: Callable[[sqlite3.Connection], None]


def ddl(*statements: str) -> Callable[[sqlite3.Connection], None]:
    """A migration made of plain statements (run in order, inside the migration's transaction)."""

    def apply(conn: sqlite3.Connection) -> None:
        for statement in statements:
            conn.execute(statement)

    return apply


_V1 = ddl(
    """CREATE TABLE incidents (
        id TEXT PRIMARY KEY,
        rule TEXT NOT NULL,
        scope TEXT NOT NULL,
        label TEXT NOT NULL,
        severity TEXT,              -- NULL until known (from the engine's incident or a step)
        shadow INTEGER,
        gpu INTEGER,
        pending_at REAL,
        opened_at REAL NOT NULL,
        resolved_at REAL,
        resolve_reason TEXT,
        acked_at REAL
    )""",
    "CREATE INDEX incidents_opened ON incidents (opened_at)",
    "CREATE INDEX incidents_open ON incidents (resolved_at)",
    """CREATE TABLE records (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        time REAL NOT NULL,
        recorded_at REAL NOT NULL,
        incident TEXT,              -- NULL for changes outside an incident (pending, cooldown)
        rule TEXT NOT NULL,
        scope TEXT NOT NULL,
        kind TEXT NOT NULL,         -- a Transition, or step | skip | outcome | finished | ...
        reason TEXT NOT NULL,
        step INTEGER,
        intent TEXT,
        data TEXT NOT NULL DEFAULT '{}'  -- JSON object
    )""",
    "CREATE INDEX records_incident ON records (incident, seq)",
    "CREATE INDEX records_scope ON records (rule, scope, seq)",
    "CREATE INDEX records_time ON records (time)",
    """CREATE TABLE intents (
        id TEXT PRIMARY KEY,
        incident TEXT NOT NULL,
        rule TEXT NOT NULL,
        scope TEXT NOT NULL,
        step_index INTEGER NOT NULL,
        kind TEXT NOT NULL,
        label TEXT NOT NULL,
        time REAL NOT NULL,
        reason TEXT NOT NULL,
        shadow INTEGER NOT NULL,
        targets TEXT NOT NULL,      -- JSON list of targets
        params TEXT,                -- JSON, redacted
        status TEXT NOT NULL CHECK (status IN ('planned', 'done', 'failed', 'interrupted')),
        run TEXT NOT NULL,          -- which opening of the journal planned it
        outcome TEXT,               -- JSON
        finished_at REAL
    )""",
    "CREATE INDEX intents_incident ON intents (incident, step_index)",
    "CREATE INDEX intents_status ON intents (status)",
    """CREATE TABLE undos (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        incident TEXT NOT NULL,
        intent TEXT NOT NULL,
        kind TEXT NOT NULL,
        pid INTEGER,
        create_time REAL,
        gpu INTEGER,
        value,                      -- no type: a nice value stays an integer, watts a float
        ionice TEXT,
        created_at REAL NOT NULL,
        done_at REAL,
        result TEXT
    )""",
    "CREATE INDEX undos_pending ON undos (done_at, incident)",
    """CREATE TABLE actions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time REAL NOT NULL,
        rule TEXT NOT NULL,
        kind TEXT NOT NULL,
        pid INTEGER
    )""",
    "CREATE INDEX actions_time ON actions (time)",
    """CREATE TABLE breaker (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        tripped_at REAL NOT NULL,
        reason TEXT NOT NULL,
        reset_at REAL
    )""",
)

_V2 = ddl(
    """CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        message_id TEXT NOT NULL,
        target TEXT NOT NULL,
        title TEXT NOT NULL,
        body TEXT NOT NULL,
        body_format TEXT NOT NULL DEFAULT 'text',
        severity TEXT NOT NULL,
        kind TEXT NOT NULL,
        incident TEXT,              -- the incident ids the message is about, comma-separated
        created REAL NOT NULL,      -- when the message was made
        queued_at REAL NOT NULL,    -- when it was queued (the retry budget counts from here)
        status TEXT NOT NULL CHECK (status IN ('pending', 'sending', 'sent', 'failed', 'dropped')),
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL NOT NULL,
        last_error TEXT,            -- redacted
        sent_at REAL,
        fallback_of TEXT,           -- the target whose budget ran out, for a fallback copy
        UNIQUE (message_id, target)
    )""",
    "CREATE INDEX outbox_due ON outbox (status, next_attempt_at)",
)

_V3 = ddl(
    """CREATE TABLE instances (
        instance_id TEXT PRIMARY KEY,
        profile TEXT NOT NULL,
        region TEXT NOT NULL,
        instance_type TEXT NOT NULL,
        market TEXT NOT NULL,       -- on-demand | spot
        state TEXT NOT NULL,        -- an EC2 state, or 'gone' (EC2 no longer reports it)
        state_at REAL NOT NULL,     -- when the state was last written
        launched_at REAL NOT NULL,  -- the daemon's clock, not EC2's LaunchTime
        expires_at REAL NOT NULL,   -- launched_at + the profile's ttl
        host TEXT NOT NULL,
        incident TEXT,              -- NULL: adopted without an incident tag
        rule TEXT,
        step INTEGER,
        intent TEXT,
        subnet TEXT,
        hourly_usd REAL,            -- NULL: the type has no price in the profile
        terminated_at REAL,
        end_reason TEXT,            -- linger | ttl | orphan | manual | gone | external
        adopted INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX instances_state ON instances (state)",
    "CREATE INDEX instances_incident ON instances (incident, step)",
)

_V4 = ddl(
    """CREATE TABLE samples (
        time REAL NOT NULL,
        gpu INTEGER NOT NULL,
        used_mib INTEGER,           -- NULL: unknown (as in the snapshot)
        total_mib INTEGER,
        temperature_c INTEGER,
        power_w REAL,
        power_limit_w REAL,
        utilization_pct INTEGER,
        memory_utilization_pct INTEGER,
        lost INTEGER NOT NULL DEFAULT 0,
        procs TEXT NOT NULL DEFAULT '[]',  -- JSON [[pid, GPU memory MiB or null], ...]
        UNIQUE (gpu, time)
    )""",
    "CREATE INDEX samples_time ON samples (time)",
    """CREATE TABLE sample_procs (
        gpu INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        create_time REAL,
        user TEXT,
        priority TEXT NOT NULL,
        command TEXT NOT NULL,      -- redacted, cut
        seen_at REAL NOT NULL
    )""",
    "CREATE INDEX sample_procs_seen ON sample_procs (seen_at)",
    """CREATE TABLE incident_rules (
        incident TEXT PRIMARY KEY,
        rule TEXT NOT NULL,
        when_text TEXT NOT NULL,
        until_text TEXT,
        for_s REAL NOT NULL,
        description TEXT
    )""",
)

_V5 = ddl(
    "ALTER TABLE incidents ADD COLUMN acked_by TEXT",
    "ALTER TABLE incidents ADD COLUMN ack_comment TEXT",
    "ALTER TABLE incidents ADD COLUMN abort_at REAL",  # when `gpuwarden abort` asked
    "ALTER TABLE incidents ADD COLUMN abort_by TEXT",
    "ALTER TABLE incidents ADD COLUMN abort_reason TEXT",
    """CREATE TABLE holds (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        incident TEXT NOT NULL,
        created_at REAL NOT NULL,
        until REAL,                 -- NULL: until released
        by TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        released_at REAL,
        released_by TEXT            -- a person, or 'expired' (until passed)
    )""",
    "CREATE INDEX holds_open ON holds (released_at, incident)",
    """CREATE TABLE silences (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        rule TEXT,                  -- NULL: any rule
        gpu INTEGER,                -- NULL: any GPU
        host INTEGER NOT NULL DEFAULT 0,  -- 1: everything on this host
        created_at REAL NOT NULL,
        starts_at REAL NOT NULL,
        ends_at REAL NOT NULL,
        by TEXT NOT NULL,
        reason TEXT NOT NULL,
        ended_at REAL,              -- `silence --end` before ends_at
        ended_by TEXT
    )""",
    "CREATE INDEX silences_ends ON silences (ends_at)",
    """CREATE TABLE next_steps (
        incident TEXT PRIMARY KEY,  -- an open incident
        computed_at REAL NOT NULL,
        data TEXT NOT NULL          -- JSON: the step, its due time, its would-be targets
    )""",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "incidents, records, intents, undos, actions, breaker", _V1),
    Migration(2, "the notification outbox", _V2),
    Migration(3, "cloud instances gpuwarden launched or adopted", _V3),
    Migration(4, "GPU samples around incidents and the rules they fired on, for reports", _V4),
    Migration(5, "on call: who acked, holds, aborts, silences, each incident's next step", _V5),
)


def _pragma(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute(f"PRAGMA {name}").fetchone()
    return int(row[0])


def newer_schema(path: Path, found: int, known: int) -> JournalError:
    return JournalError(
        f"{path} was written by a newer gpuwarden (journal schema version {found}; "
        f"this gpuwarden knows up to {known})",
        hint="upgrade gpuwarden on this host; the journal is left as it is",
    )


def not_a_journal(path: Path, why: str) -> JournalError:
    return JournalError(
        f"{path} is not a gpuwarden journal ({why}) — move it aside and restart",
        hint=f"`mv {path} {path}.bad` keeps it for inspection; the daemon then starts a new, "
        "empty journal",
    )


def check_identity(conn: sqlite3.Connection, path: Path) -> int:
    """The file's schema version; 0 for a new, empty file. Raises for a foreign database."""
    app = _pragma(conn, "application_id")
    version = _pragma(conn, "user_version")
    if app == APPLICATION_ID:
        return version
    tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if app == 0 and version == 0 and tables == 0:
        return 0
    raise not_a_journal(path, "a SQLite database of another program")


def check_readable(conn: sqlite3.Connection, path: Path, known: int) -> None:
    """A reading or writing open needs a journal at exactly the version this gpuwarden knows."""
    version = check_identity(conn, path)
    if version == 0:
        raise not_a_journal(path, "an empty file")
    if version > known:
        raise newer_schema(path, version, known)
    if version < known:
        raise JournalError(
            f"{path} has journal schema version {version}; this gpuwarden reads version {known}",
            hint="start the daemon once: it migrates the journal when it opens it",
        )


def migrate(
    conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration] = MIGRATIONS
) -> int:
    """Bring the file up to the newest version in ``migrations``; returns that version.

    ``conn`` is in autocommit mode; everything happens in one IMMEDIATE transaction, so a
    failed migration leaves the file as it was.
    """
    for number, migration in enumerate(migrations, start=1):
        if migration.version != number:
            raise ValueError(f"migration {migration.version} out of order (expected {number})")
    known = len(migrations)
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = check_identity(conn, path)
        if current > known:
            raise newer_schema(path, current, known)
        for migration in migrations[current:]:
            migration.apply(conn)
            conn.execute(f"PRAGMA user_version = {migration.version:d}")
        if current < known:
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID:d}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return known


def corrupt(path: Path, why: str) -> JournalError:
    return JournalError(
        f"{path} is corrupt ({why}) — move it aside and restart",
        hint=f"`sqlite3 {path} .recover` may save its records; the daemon then starts a new, "
        "empty journal",
    )


def check_integrity(conn: sqlite3.Connection, path: Path) -> None:
    """Find a damaged file when the daemon starts, not in the middle of an incident."""
    problems = [str(row[0]) for row in conn.execute("PRAGMA quick_check(3)")]
    if problems != ["ok"]:
        raise corrupt(path, "; ".join(problems))


def failure(path: Path, exc: sqlite3.Error, doing: str, timeout: float) -> JournalError:
    """What an SQLite error on ``path`` means for the person who has to fix it."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return JournalError(
            f"{path} is locked by another process (waited {timeout:g}s to {doing} it)",
            hint="is another gpuwarden running with the same state_dir? stop it, or give "
            "each daemon its own state_dir",
        )
    if name.startswith("SQLITE_NOTADB"):
        return not_a_journal(path, str(exc))
    if name.startswith("SQLITE_CORRUPT"):
        return corrupt(path, str(exc))
    if name.startswith(("SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_READONLY", "SQLITE_AUTH")):
        return JournalError(
            f"cannot {doing} the journal {path}: {exc}",
            hint=f"check the permissions of {path} and {path.parent}; the views need read "
            "access, the daemon write access",
        )
    if name.startswith("SQLITE_FULL"):
        return JournalError(
            f"cannot {doing} the journal {path}: the disk is full",
            hint=f"free space on the file system of {path.parent}",
        )
    return JournalError(f"cannot {doing} the journal {path}: {exc} ({name or 'sqlite'})")


@contextlib.contextmanager
def errors(path: Path, doing: str, timeout: float) -> Iterator[None]:
    """Turn an SQLite error on ``path`` into a JournalError that says what to do."""
    try:
        yield
    except sqlite3.Error as exc:
        raise failure(path, exc, doing, timeout) from None


@contextlib.contextmanager
def transaction(
    conn: sqlite3.Connection,
    lock: threading.Lock | threading.RLock,
    path: Path,
    timeout: float,
    *,
    write: bool = True,
) -> Iterator[sqlite3.Connection]:
    """One transaction on ``conn`` under ``lock``: committed when the block ends, rolled back
    when it raises; an SQLite error becomes a JournalError (the journal and the outbox share
    this)."""
    with lock, errors(path, "write to" if write else "read", timeout):
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


def _missing(path: Path, access: Access) -> JournalError:
    who = "read" if access is Access.READ else "write to"
    return JournalError(
        f"no journal at {path}",
        hint=f"the daemon writes it in its state_dir ({path.parent}) once it has run; give "
        f"the daemon's --config or --state-dir to {who} its journal",
    )


def _create(path: Path) -> None:
    """Create an empty journal file (0600, its folder 0700) if there is none. An existing file
    is never opened here: closing a descriptor of it would drop this process's SQLite locks."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path.exists():
            return
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return  # created by someone else in the meantime: theirs to set up
    except OSError as exc:
        raise JournalError(
            f"cannot create the journal {path}: {exc.strerror}",
            hint=f"the daemon needs to write to {path.parent} (state_dir in the config)",
        ) from None
    os.close(fd)


def _is_file(path: Path, access: Access) -> bool:
    try:
        return path.is_file()
    except PermissionError:
        who = "read" if access is Access.READ else "write to"
        raise JournalError(
            f"cannot {who} the journal {path}: permission denied",
            hint="the journal is root's, and readable by the config's operators.group when "
            "it is set: run as root, or ask to be added to that group (docs/operations.md, "
            '"On call")',
        ) from None


def check_wal(conn: sqlite3.Connection, path: Path) -> None:
    """A writer's journal must already be in WAL mode (the daemon set it when it created the
    file). Asked, never set: changing the mode needs the file to itself."""
    mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    if mode != "wal":
        raise JournalError(
            f"{path} is not in WAL mode (journal_mode={mode})",
            hint="start the daemon once: it sets the mode when nothing else has the file open",
        )


def connect(
    path: Path,
    *,
    timeout: float,
    access: Access = Access.OWN,
    migrations: Sequence[Migration] = MIGRATIONS,
    integrity: bool = False,
) -> sqlite3.Connection:
    """A connection to the journal at ``path`` in autocommit mode, usable from any thread
    (callers hold their own lock); ``access`` says what it may do (the module's docstring).
    ``READ`` and ``WRITE`` need the file at exactly the version this gpuwarden knows; ``OWN``
    creates it (0600, its folder 0700), switches it to WAL and migrates it, and ``integrity``
    also runs a quick check first (the daemon's journal)."""
    if access is Access.OWN:
        _create(path)
        target, uri = str(path), False
    elif not _is_file(path, access):
        raise _missing(path, access)
    else:
        mode = "ro" if access is Access.READ else "rw"  # rw: never creates the file
        target, uri = path.resolve().as_uri() + f"?mode={mode}", True
    with errors(path, "open", timeout):
        conn = sqlite3.connect(
            target, timeout=timeout, isolation_level=None, check_same_thread=False, uri=uri
        )
    try:
        with errors(path, "open", timeout):
            conn.execute("PRAGMA trusted_schema = OFF")
            if access is Access.READ:
                conn.execute("PRAGMA query_only = ON")
                check_readable(conn, path, len(migrations))
            elif access is Access.WRITE:
                conn.execute("PRAGMA synchronous = FULL")
                check_readable(conn, path, len(migrations))
                check_wal(conn, path)
            else:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")
                if integrity:
                    check_integrity(conn, path)
                migrate(conn, path, migrations)
    except BaseException:
        conn.close()
        raise
    return conn
