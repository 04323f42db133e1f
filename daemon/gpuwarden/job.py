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
acknowledges, which writes ``<ack dir>/<pid>.ack`` (JSON: ``pid``, ``signal``, ``time``,
``detail``) by writing a temporary file and renaming it. The ack directory comes from
``GPUWARDEN_ACK_DIR``, else ``DEFAULT_ACK_DIR`` (created shared and sticky, like /tmp, so that
every user's jobs can write there). gpuwarden waits for that file after signalling.
docs/jobs.md has the whole protocol.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TypeVar

DEFAULT_ACK_DIR = Path(tempfile.gettempdir()) / "gpuwarden-ack"
DEFAULT_SIGNAL = "SIGUSR1"

_requested = threading.Event()
_last: dict[str, str] = {}  # the name of the last checkpoint signal received
_registered: list[Callable[[], object]] = []  # the on_checkpoint function, when there is one

logger = logging.getLogger(__name__)

SaveFunction = TypeVar("SaveFunction", bound=Callable[[], object])


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
    return Path(os.environ.get("GPUWARDEN_ACK_DIR") or DEFAULT_ACK_DIR)


def ack_path(pid: int, directory: Path | None = None) -> Path:
    """Where the job with ``pid`` writes its acknowledgement."""
    return (directory or ack_dir()) / f"{pid}.ack"


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


def _make_dir(directory: Path) -> None:
    if directory != DEFAULT_ACK_DIR:
        directory.mkdir(parents=True, exist_ok=True)
        return
    try:  # the shared default: every user's jobs write here, none may remove another's file
        directory.mkdir(mode=0o1777)
    except FileExistsError:
        return
    directory.chmod(0o1777)  # mkdir's mode passed through the umask


def _write_ack(detail: str, directory: Path | None, signal_name: str | None) -> Path:
    target = ack_path(os.getpid(), directory)
    _make_dir(target.parent)
    record = {
        "pid": os.getpid(),
        "signal": signal_name or _last.get("signal"),
        "time": time.time(),
        "detail": detail,
    }
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
    tmp.replace(target)
    return target


def acknowledge(
    detail: str = "", directory: Path | None = None, signal_name: str | None = None
) -> Path:
    """Record that the requested checkpoint is written; returns the ack file's path.

    The file is written to a temporary name and renamed, so gpuwarden never reads half of it.
    """
    target = _write_ack(detail, directory, signal_name)
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
    propagates. If the ack file cannot be written (the directory is not writable), that is
    logged and the job goes on: gpuwarden will count the request as timed out.
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
            "set GPUWARDEN_ACK_DIR to a directory this job can write",
            exc,
        )
    return True
