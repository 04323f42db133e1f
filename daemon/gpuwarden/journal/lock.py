"""One daemon per state directory: an exclusive ``flock`` on ``<state_dir>/journal.lock``.

``gpuwarden run`` takes the lock before it opens the journal or starts its source, and holds it
for its whole life; a second daemon on the same directory (a ``run --once`` typed by hand next
to the unit, a second unit with the same ``state_dir``) is refused with ``StateLocked``
(exit code ``LOCKED``) before it touches anything. The kernel drops the lock when the holder
exits, however it exits (SIGKILL included), so a stale lock file never blocks a restart.

Commands that write the journal beside a running daemon (``ack``, ``reset-breaker``,
``cloud reap``) do not take this lock: the daemon holds it for its life, so they could never
run when they are needed. They rely on SQLite's own locking instead: short ``BEGIN
IMMEDIATE`` transactions that wait for the daemon's (``journal.schema``, ``Access.WRITE``).

``flock`` locks belong to the open file description, not to the process (unlike SQLite's
POSIX locks), so nothing the daemon does with other descriptors can drop this one; the
descriptor is close-on-exec, so commands the daemon starts do not hold it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from gpuwarden.errors import ExitCode, HintedError

LOCK_NAME = "journal.lock"  # next to the journal in the state directory


class StateLocked(HintedError):
    """Another gpuwarden daemon holds the state directory."""

    exit_code = ExitCode.LOCKED


class StateLock:
    """The state directory's lock, held from ``acquire`` until ``release`` (or exit)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> StateLock:
        """Take the lock or raise ``StateLocked`` at once (never wait: a second daemon that
        waited would start acting the moment the first one stopped, unannounced)."""
        if self._fd is not None:
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise StateLocked(
                f"cannot open the lock file {self.path}: {exc.strerror}",
                hint=f"the daemon needs to write to {self.path.parent} (state_dir in the config)",
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise StateLocked(
                f"{self.path.parent} is locked: another gpuwarden daemon ({who}) uses this "
                "state_dir",
                hint="stop it first (systemctl stop gpuwarden), or give this one its own "
                "--state-dir; the other commands (incidents, ack, outbox, ...) work beside it",
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StateLocked(f"cannot lock {self.path}: {exc.strerror}") from None
        with contextlib.suppress(OSError):  # who holds it, for the next one's message
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

    def __enter__(self) -> StateLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(state_dir: Path, locks: Path = Path("/proc/locks")) -> int | None:
    """The PID holding ``state_dir``'s lock as the kernel reports it (``/proc/locks``), without
    taking it: asking never gets in the way of a daemon starting. None when no process holds
    it, or the lock file or the kernel's table cannot be read."""
    try:
        st = (Path(state_dir) / LOCK_NAME).stat()
        table = locks.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 4242 00:1f:123456 0 EOF" (a waiter's line has "->")
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and "->" not in fields[:2]:
            pid, where = fields[4], fields[5]
            if where.lower() == wanted and pid.isdigit():
                return int(pid)
    return None


def _holder(fd: int) -> int | None:
    """The PID the holder wrote into the lock file, when it reads as one."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
