"""The live kernel log, read for the driver's reports while the daemon runs.

Two ways in, for ``--events`` (``sources/kernel_events.py`` turns what they read into events):

- ``KmsgFeed`` reads ``/dev/kmsg`` (or a FIFO carrying the same records) without blocking,
  every time a snapshot is taken, so a record the kernel wrote before a tick's snapshot reaches
  that tick's rules. It starts at the end of the ring buffer: what the kernel said before the
  daemon started is not acted on again. Reading it needs CAP_SYSLOG where
  ``kernel.dmesg_restrict`` is 1, and no ``ProtectKernelLogs=`` under systemd.
- ``JournalFeed`` runs ``journalctl -k -f -o json -n 0`` (the kernel's messages only, from now
  on) and reads its entries on a thread, for hosts where the journal is how the kernel log is
  kept (a container without ``/dev/kmsg``, a unit with ``ProtectKernelLogs=yes``).

Each is stamped with the ``now`` of the snapshot that takes it. Nothing here may crash the
daemon: a record that cannot be read is skipped, a failure is logged once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
from collections import deque
from collections.abc import Sequence

from gpuwarden.errors import SourceUnavailable
from gpuwarden.sources.kernel_log import NotNvrm, Report, Uuid, read_line, read_message

logger = logging.getLogger(__name__)

DEV_KMSG = "/dev/kmsg"
JOURNALCTL = ("journalctl", "-k", "-f", "-o", "json", "-n", "0", "--no-pager")
MAX_PENDING = 10_000
_READ_SIZE = 8192  # /dev/kmsg returns one record per read; a record is at most ~1 KiB
_MAX_LINE = 64 * 1024

Said = Report | Uuid


def _said(line: str, source: str) -> Said | None:
    read = read_line(line)
    if read is None:
        return None
    try:
        return read_message(read[1].strip())
    except NotNvrm as exc:
        logger.warning("%s: skipped a driver line: %s: %.200r", source, exc, read[1])
        return None


class KmsgFeed:
    """``/dev/kmsg`` (or a FIFO or character device carrying its records), read on demand."""

    def __init__(self, path: str = DEV_KMSG) -> None:
        self.name = "kmsg" if path == DEV_KMSG else f"kmsg:{path}"
        self.path = path
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise SourceUnavailable(
                f"cannot read the kernel log {path}: {exc.strerror}",
                "run as root (CAP_SYSLOG where kernel.dmesg_restrict=1; under systemd also "
                "ProtectKernelLogs=no), or read the journal instead: --events kmsg:journal",
            ) from None
        with contextlib.suppress(OSError):  # a FIFO cannot seek; the ring buffer can
            os.lseek(self._fd, 0, os.SEEK_END)
        self._partial = b""
        self._failed = False

    def bind(self, origin: float | None) -> None:
        """Live: nothing to place in time."""

    def take(self, now: float) -> list[tuple[float, Said]]:
        """Every report written since the last call, stamped ``now``."""
        if self._fd is None:
            return []
        chunks: list[bytes] = []
        for _ in range(MAX_PENDING):
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                break
            except BrokenPipeError:  # the ring buffer overwrote records before they were read
                logger.warning("%s: records were overwritten before they were read", self.name)
                continue
            except OSError as exc:
                if not self._failed:
                    logger.error("%s: reading failed: %s", self.name, exc.strerror)
                    self._failed = True
                break
            if not data:
                break
            chunks.append(data)
        self._failed = self._failed and not chunks
        if not chunks:
            return []
        text = self._partial + b"".join(chunks)
        *lines, self._partial = text.split(b"\n")
        if len(self._partial) > _MAX_LINE:
            self._partial = b""
        out: list[tuple[float, Said]] = []
        for raw in lines:
            if raw.startswith(b" "):  # a record's dictionary (SUBSYSTEM=..., DEVICE=...)
                continue
            said = _said(raw.decode("utf-8", errors="replace"), self.name)
            if said is not None:
                out.append((now, said))
        return out

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class JournalFeed:
    """The kernel's journal entries from ``journalctl -k -f -o json``, read on a thread."""

    def __init__(self, argv: Sequence[str] = JOURNALCTL, *, max_pending: int = MAX_PENDING) -> None:
        self.name = "kmsg:journal"
        program = shutil.which(argv[0])
        if program is None:
            raise SourceUnavailable(
                f"cannot read the journal: {argv[0]} is not installed",
                "read the kernel's ring buffer instead: --events kmsg",
            )
        self._pending: deque[Said] = deque(maxlen=max_pending)
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [program, *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._thread = threading.Thread(target=self._read, name="kernel-journal", daemon=True)
        self._thread.start()

    def bind(self, origin: float | None) -> None:
        """Live: nothing to place in time."""

    def _read(self) -> None:
        process = self._process
        assert process.stdout is not None
        assert process.stderr is not None
        try:
            for raw in process.stdout:
                said = _said(raw.decode("utf-8", errors="replace"), self.name)
                if said is not None:
                    with self._lock:
                        self._pending.append(said)
        except (OSError, ValueError) as exc:
            logger.error("%s: reading failed: %s", self.name, exc)
        status = process.wait()
        if status not in (0, -15):
            why = process.stderr.read(500).decode("utf-8", errors="replace").strip()
            logger.error("%s: journalctl stopped (status %d): %s", self.name, status, why)

    def take(self, now: float) -> list[tuple[float, Said]]:
        with self._lock:
            said, self._pending = list(self._pending), deque(maxlen=self._pending.maxlen)
        return [(now, s) for s in said]

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
        self._thread.join(5)
        for stream in (self._process.stdout, self._process.stderr):
            if stream is not None:
                stream.close()
