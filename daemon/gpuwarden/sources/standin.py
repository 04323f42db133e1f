"""The stand-in process a scenario spawns for a job with ``spawn: true``.

It does nothing but wait for signals, the way a training job that uses ``gpuwarden.job`` would
react to them, and writes one line per signal to ``GPUWARDEN_STANDIN_LOG`` so that tests and
drills can see exactly what it received:

    <unix time> ready pid=<pid>
    <unix time> signal SIGUSR1
    <unix time> ack SIGUSR1
    <unix time> exit SIGTERM

- The job's checkpoint signal (``GPUWARDEN_CHECKPOINT_SIGNAL``) is acknowledged through
  ``gpuwarden.job.acknowledge`` after ``GPUWARDEN_STANDIN_ACK`` seconds (``never``: not at all).
- SIGTERM and SIGINT end it (exit status 0) unless ``GPUWARDEN_STANDIN_ON_TERM=ignore``.
- SIGSTOP and SIGKILL cannot be caught; SIGCONT after a SIGSTOP is logged.

Standard library and ``gpuwarden.job`` only: it must start fast.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from types import FrameType

from gpuwarden import job

CAUGHT = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGTERM,
    signal.SIGCONT,
    signal.SIGALRM,
    signal.SIGWINCH,
)
PR_SET_PDEATHSIG = 1


def _log(line: str) -> None:
    path = os.environ.get("GPUWARDEN_STANDIN_LOG")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{time.time():.6f} {line}\n")
        out.flush()


def _die_with_parent() -> None:
    """Best effort: do not outlive whoever spawned us (a crashed test run, a killed drill)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        sys.exit(0)


def _become_user() -> None:
    """``GPUWARDEN_STANDIN_USER=uid:gid``: drop to that user for good (all three ids), before
    anything else happens; everything this process needs is imported already."""
    wanted = os.environ.get("GPUWARDEN_STANDIN_USER")
    if not wanted:
        return
    uid, gid = (int(part) for part in wanted.split(":"))
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def main() -> int:
    _become_user()
    _die_with_parent()  # after the drop: a change of user clears the parent-death signal
    checkpoint_sig = job.signal_from_name(os.environ.get("GPUWARDEN_CHECKPOINT_SIGNAL"))
    declared = bool(os.environ.get("GPUWARDEN_CHECKPOINT_SIGNAL"))
    ack_setting = os.environ.get("GPUWARDEN_STANDIN_ACK", "0")
    on_term = os.environ.get("GPUWARDEN_STANDIN_ON_TERM", "exit")
    done = threading.Event()

    def acknowledge(name: str) -> None:
        if ack_setting == "never":
            return
        delay = float(ack_setting)
        if delay > 0:
            time.sleep(delay)
        job.acknowledge(f"stand-in acknowledged {name}", signal_name=name)
        _log(f"ack {name}")

    def handle(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        _log(f"signal {name}")
        if declared and signum == checkpoint_sig:
            threading.Thread(target=acknowledge, args=(name,), daemon=True).start()
        elif signum in (signal.SIGTERM, signal.SIGINT) and on_term != "ignore":
            _log(f"exit {name}")
            done.set()

    for sig in CAUGHT:
        signal.signal(sig, handle)
    _log(f"ready pid={os.getpid()}")
    while not done.wait(0.5):
        if os.getppid() == 1:  # our parent went away without killing us
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
