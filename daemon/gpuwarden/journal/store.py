"""What every table-owning class over the journal file shares: one connection opened with
the access it was asked for, its lock, the transaction and error helpers, and closing.

``Journal`` (journal.py), ``Outbox`` (notify/outbox.py) and ``InstanceStore``
(cloud/store.py) each open their own connection to the same file; this is the part of each
that is the same. ``StoreFile(path)`` opens for the daemon (creating and migrating the file),
``open_writer`` an existing journal beside a running daemon, ``open_readonly`` for views,
every write refused. ``timeout``: how long a call waits for another process's lock.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from gpuwarden.journal.schema import MIGRATIONS, Access, Migration, connect, errors, transaction


class StoreFile:
    # Whether opening for the daemon (``Access.OWN``) also runs SQLite's integrity check.
    integrity_on_open = False

    def __init__(
        self,
        path: Path,
        *,
        timeout: float = 5.0,
        migrations: Sequence[Migration] = MIGRATIONS,
        access: Access = Access.OWN,
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.access = access
        self._lock = threading.Lock()
        self._conn = connect(
            self.path,
            timeout=timeout,
            access=access,
            migrations=migrations,
            integrity=self.integrity_on_open and access is Access.OWN,
        )

    @classmethod
    def open_readonly(cls, path: Path, *, timeout: float = 5.0) -> Self:
        return cls(path, timeout=timeout, access=Access.READ)

    @classmethod
    def open_writer(cls, path: Path, *, timeout: float = 5.0) -> Self:
        return cls(path, timeout=timeout, access=Access.WRITE)

    @property
    def readonly(self) -> bool:
        return self.access is Access.READ

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _errors(self, doing: str) -> contextlib.AbstractContextManager[None]:
        return errors(self.path, doing, self.timeout)

    def _tx(self, *, write: bool = True) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self._conn, self._lock, self.path, self.timeout, write=write)
