"""Opt a training job in to gpuwarden's checkpoint requests. Standard library only.

A job that can save its state declares so in its environment *at launch* (gpuwarden reads the
environment the process started with) and acknowledges each request. The short way::

    # launch with: GPUWARDEN_CHECKPOINT_SIGNAL=SIGUSR1 GPUWARDEN_PRIORITY=low python train.py
    from gpuwarden import job

    @job.on_checkpoint                 # installs the signal handler; the handler only sets a flag
    def save() -> None:
        write_checkpoint()             # return a string to put it in the ack's "detail"

    for step in range(steps):
        train_one_step()
        job.maybe_checkpoint()         # at a safe point: if requested, save() and acknowledge

The long way, with the same effect::

    job.install()                      # handles GPUWARDEN_CHECKPOINT_SIGNAL (default SIGUSR1)
    for step in range(steps):
        train_one_step()
        if job.checkpoint_requested():
            save_checkpoint()
            job.acknowledge()          # tells gpuwarden the checkpoint is safely written

The signal handler only sets a flag: the job saves at a safe point of its own loop, then
acknowledges, which writes ``<spool>/<uid>/<pid>.ack`` (JSON: ``pid``, ``signal``, ``time``,
``detail``). The spool is gpuwarden's (``/run/gpuwarden/ack``, or ``GPUWARDEN_ACK_DIR``); the
daemon creates the directory of each user in it, owned by that user and mode 0700, before it
asks. The job writes only into a directory it owns that nobody else can write to, with
``O_CREAT|O_EXCL|O_NOFOLLOW`` under a temporary name that it then renames: it never follows a
link somebody planted, and gpuwarden never reads half a file. docs/jobs.md has the protocol.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TypeVar

DEFAULT_ACK_DIR = Path("/run/gpuwarden/ack")  # the daemon's ack_spool unless configured
DEFAULT_SIGNAL = "SIGUSR1"
# The inode of the host's PID namespace (the kernel's PROC_PID_INIT_INO): a process in another
# one (a container's) names its acknowledgement with its namespace too, since PIDs repeat there.
INIT_PID_NAMESPACE = 0xEFFFFFFC

_requested = threading.Event()
_last: dict[str, str] = {}  # the name of the last checkpoint signal received
_registered: list[Callable[[], object]] = []  # the on_checkpoint function, when there is one
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

logger = logging.getLogger(__name__)

SaveFunction = TypeVar("SaveFunction", bound=Callable[[], object])


class UnsafeAckDir(PermissionError):
    """The acknowledgement directory is not this job's own: nothing is written there."""


def signal_from_name(value: str | int | None, default: str = DEFAULT_SIGNAL) -> signal.Signals:
    """``"SIGUSR1"``, ``"USR1"``, ``"10"`` or ``10`` → ``signal.SIGUSR1``; ``None``: the default."""
    if value is None or value == "":
        value = default
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        return signal.Signals(int(value))
    name = value.strip().upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    return signal.Signals[name]


def ack_dir() -> Path:
    """The spool: ``GPUWARDEN_ACK_DIR``, else ``DEFAULT_ACK_DIR``."""
    return Path(os.environ.get("GPUWARDEN_ACK_DIR") or DEFAULT_ACK_DIR)


def user_ack_dir(spool: Path | None = None, uid: int | None = None) -> Path:
    """The directory of one user (default: this process's) in the spool."""
    return (spool or ack_dir()) / str(os.getuid() if uid is None else uid)


def pid_namespace() -> int | None:
    """This process's PID namespace (its inode), None for the host's or when unknown."""
    try:
        inode = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return None if inode == INIT_PID_NAMESPACE else inode


def ack_name(pid: int, namespace: int | None = None) -> str:
    """``<pid>.ack``; ``<pid>-pidns<inode>.ack`` for a PID of another PID namespace."""
    if namespace is None or namespace == INIT_PID_NAMESPACE:
        return f"{pid}.ack"
    return f"{pid}-pidns{namespace}.ack"


def ack_path(pid: int | None = None, spool: Path | None = None) -> Path:
    """Where this process (or the process ``pid`` of this user and PID namespace) writes its
    acknowledgement."""
    return user_ack_dir(spool) / ack_name(os.getpid() if pid is None else pid, pid_namespace())


def _handler(signum: int, _frame: FrameType | None) -> None:
    _last["signal"] = signal.Signals(signum).name
    _requested.set()


def install(
    sig: str | int | None = None, callback: Callable[[], None] | None = None
) -> signal.Signals:
    """Handle the checkpoint signal: ``sig``, else ``GPUWARDEN_CHECKPOINT_SIGNAL``, else SIGUSR1.

    With ``callback`` the handler calls it (it runs in the main thread between bytecodes: keep it
    short, e.g. set your own flag). Returns the signal handled.
    """
    chosen = signal_from_name(
        sig if sig is not None else os.environ.get("GPUWARDEN_CHECKPOINT_SIGNAL")
    )

    def handle(signum: int, frame: FrameType | None) -> None:
        _handler(signum, frame)
        if callback is not None:
            callback()

    signal.signal(chosen, handle)
    return chosen


def checkpoint_requested() -> bool:
    """True once a checkpoint signal has arrived and has not yet been acknowledged."""
    return _requested.is_set()


def wait_for_request(timeout: float | None = None) -> bool:
    """Block until a checkpoint is requested (or ``timeout`` seconds pass)."""
    return _requested.wait(timeout)


def _open_own_dir(directory: Path) -> int:
    """A descriptor of ``directory`` if it is this job's own: a real directory (not a link),
    owned by this user, writable by nobody else. Raises UnsafeAckDir or OSError."""
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except FileNotFoundError:
        raise FileNotFoundError(
            errno.ENOENT,
            f"no acknowledgement directory {directory}: gpuwarden creates it when it asks "
            "for a checkpoint (is GPUWARDEN_ACK_DIR the daemon's ack_spool?)",
        ) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeAckDir(
                f"{directory} is a symbolic link or not a directory: refusing to write there"
            ) from None
        raise
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = f"owned by uid {st.st_uid}, not by this job's uid {os.geteuid()}"
    elif st.st_mode & 0o022:
        problem = f"writable by group or others (mode {stat.filemode(st.st_mode)})"
    if problem is not None:
        os.close(fd)
        raise UnsafeAckDir(f"{directory} is {problem}: refusing to write there")
    return fd


def _create(directory: int, name: str, data: bytes) -> None:
    """Write a new file ``name`` in ``directory``: never through a link, never into a file
    that was already there."""
    try:
        fd = os.open(name, _NEW_FILE, 0o600, dir_fd=directory)
    except FileExistsError:
        # A leftover of an earlier attempt in this job's own directory. Removing a link
        # removes the link itself, never what it points to.
        os.unlink(name, dir_fd=directory)
        fd = os.open(name, _NEW_FILE, 0o600, dir_fd=directory)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _write_ack(detail: str, spool: Path | None, signal_name: str | None) -> Path:
    directory = user_ack_dir(spool)
    name = ack_name(os.getpid(), pid_namespace())
    record = {
        "pid": os.getpid(),
        "signal": signal_name or _last.get("signal"),
        "time": time.time(),
        "detail": detail,
    }
    fd = _open_own_dir(directory)
    try:
        tmp = f".{name}.{os.getpid()}.tmp"
        _create(fd, tmp, (json.dumps(record) + "\n").encode("utf-8"))
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)
    return directory / name


def acknowledge(
    detail: str = "", spool: Path | None = None, signal_name: str | None = None
) -> Path:
    """Record that the requested checkpoint is written; returns the ack file's path.

    ``spool`` defaults to ``GPUWARDEN_ACK_DIR``, else ``DEFAULT_ACK_DIR``. Raises
    ``UnsafeAckDir`` (a PermissionError) when this user's directory there is not the job's
    own (another owner, writable by others, a link), ``FileNotFoundError`` when it does not
    exist yet. The file is written to a temporary name and renamed, so gpuwarden never reads
    half of it.
    """
    target = _write_ack(detail, spool, signal_name)
    _requested.clear()
    return target


def on_checkpoint(fn: SaveFunction, *, sig: str | int | None = None) -> SaveFunction:
    """Make ``fn`` the job's checkpoint function (usable as a decorator) and install the
    handler for ``sig`` (else ``GPUWARDEN_CHECKPOINT_SIGNAL``, else SIGUSR1; see ``install``).

    The handler only sets a flag; ``fn`` runs when the loop calls :func:`maybe_checkpoint`.
    Call it from the main thread (Python installs signal handlers only there). Registering
    another function replaces the first.
    """
    install(sig)
    _registered[:] = [fn]
    return fn


def maybe_checkpoint(fn: Callable[[], object] | None = None) -> bool:
    """Call at a safe point of the loop. If a checkpoint was requested, run the checkpoint
    function (``fn``, else the one given to :func:`on_checkpoint`), then acknowledge; True if
    it did. A string the function returns becomes the ack's ``detail``.

    A request arriving while the function runs is kept for the next safe point. If the
    function raises, nothing is acknowledged, the request stays pending and the exception
    propagates. If the ack file cannot be written (no directory, or one that is not the
    job's own), that is logged and the job goes on: gpuwarden will count the request as
    timed out.
    """
    if not _requested.is_set():
        return False
    save = fn if fn is not None else (_registered[0] if _registered else None)
    if save is None:
        raise RuntimeError(
            "no checkpoint function: decorate one with @job.on_checkpoint or pass it here"
        )
    _requested.clear()
    signal_name = _last.get("signal")
    try:
        result = save()
    except BaseException:
        _requested.set()
        raise
    detail = result if isinstance(result, str) else ""
    try:
        _write_ack(detail, None, signal_name)
    except OSError as exc:
        logger.warning(
            "gpuwarden: checkpoint saved but the acknowledgement could not be written (%s); "
            "GPUWARDEN_ACK_DIR must name gpuwarden's spool (its ack_spool)",
            exc,
        )
    return True
