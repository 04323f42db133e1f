"""Opt a training job in to gpuwarden's checkpoint requests. Standard library only.

A job that can save its state declares so in its environment and acknowledges each request::

    # launch with: GPUWARDEN_CHECKPOINT_SIGNAL=SIGUSR1 GPUWARDEN_PRIORITY=high python train.py
    from gpuwarden import job

    job.install()                      # handles GPUWARDEN_CHECKPOINT_SIGNAL (default SIGUSR1)
    for step in range(steps):
        train_one_step()
        if job.checkpoint_requested():
            save_checkpoint()
            job.acknowledge()          # tells gpuwarden the checkpoint is safely written

The signal handler only sets a flag: the job saves at a safe point of its own loop, then calls
``acknowledge()``, which writes ``<ack dir>/<pid>.ack`` (JSON). The ack directory comes from
``GPUWARDEN_ACK_DIR``, else ``DEFAULT_ACK_DIR``. gpuwarden waits for that file after signalling.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

DEFAULT_ACK_DIR = Path(tempfile.gettempdir()) / "gpuwarden-ack"
DEFAULT_SIGNAL = "SIGUSR1"

_requested = threading.Event()
_last: dict[str, str] = {}  # the name of the last checkpoint signal received


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


def acknowledge(
    detail: str = "", directory: Path | None = None, signal_name: str | None = None
) -> Path:
    """Record that the requested checkpoint is written; returns the ack file's path.

    The file is written to a temporary name and renamed, so gpuwarden never reads half of it.
    """
    target = ack_path(os.getpid(), directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": os.getpid(),
        "signal": signal_name or _last.get("signal"),
        "time": time.time(),
        "detail": detail,
    }
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
    tmp.replace(target)
    _requested.clear()
    return target
