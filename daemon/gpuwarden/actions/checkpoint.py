"""checkpoint: ask jobs to save their state, then wait for each to say it has.

The signal is the one the job declared (``GPUWARDEN_CHECKPOINT_SIGNAL``, carried on the target):
a job that handles only SIGUSR2 would be terminated by a SIGUSR1 it does not catch. A job that
declared none gets the step's ``signal``, else SIGUSR1.

The job acknowledges by writing ``<ack dir>/<pid>.ack`` (``gpuwarden.job.acknowledge``); the ack
directory is the job's ``GPUWARDEN_ACK_DIR`` (carried on the target) or ``job.DEFAULT_ACK_DIR``.
A stale ack for the PID is removed before the signal. Every target is signalled first, then all
are waited for together, up to the step's ``wait``: each ends ``acknowledged``, ``timed_out``,
``gone`` (exited without acknowledging) or ``cancelled`` (the daemon is stopping).

The ack directory comes from the job's environment, so the file is handled with care: a file
owned by someone other than the job is never removed, reads never follow a symlink, never block
on a FIFO and never read more than ``ACK_READ_LIMIT`` bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpuwarden import job
from gpuwarden.actions.base import Context, log_action, summarise
from gpuwarden.actions.each import result as _result
from gpuwarden.actions.pin import PinError, Pinned, pin
from gpuwarden.actions.slurm_route import Router, joined, with_note
from gpuwarden.model import Intent, Outcome, Target, TargetResult
from gpuwarden.playbook.schema import CheckpointParams

POLL_S = 0.05
ACK_READ_LIMIT = 64 * 1024
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class _Waiting:
    index: int
    target: Target
    pinned: Pinned
    ack: Path
    stale: tuple[int, int] | None  # (inode, mtime) of an old ack that could not be removed
    stopped: bool  # suspended: the signal waits, unhandled, until the job is resumed


def choose_signal(target: Target, params: CheckpointParams) -> str:
    """The signal's name: the job's declared one, else the step's, else SIGUSR1.
    ValueError for a name that is not a signal."""
    declared = target.checkpoint_signal or params.signal
    try:
        return job.signal_from_name(declared).name
    except (KeyError, ValueError):
        raise ValueError(f"not a signal: {declared!r}") from None


def ack_file(target: Target, pinned: Pinned | None = None) -> Path:
    """Where ``target`` writes its acknowledgement; a relative ack directory is the job's own,
    relative to its working directory."""
    directory = Path(target.ack_dir) if target.ack_dir else job.DEFAULT_ACK_DIR
    if not directory.is_absolute() and pinned is not None:
        cwd = pinned.cwd()
        if cwd is not None:
            directory = cwd / directory
    return job.ack_path(target.pid, directory)


def clear_stale(path: Path, owner: int | None) -> tuple[int, int] | None:
    """Remove an old ack for the PID. Returns the identity of one left in place (not ours to
    remove, or removal failed) so that it is never mistaken for a new acknowledgement."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if owner is None or st.st_uid == owner:
        with contextlib.suppress(OSError):
            path.unlink()
            return None
    return (st.st_ino, st.st_mtime_ns)


def read_ack(path: Path, pid: int, stale: tuple[int, int] | None) -> str | None:
    """The acknowledgement's detail ("" when it has none), or None when there is no new ack."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_ino, st.st_mtime_ns) == stale:
            return None
        data = os.read(fd, ACK_READ_LIMIT)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        record = json.loads(data.decode("utf-8", errors="replace"))
    except ValueError:
        return ""  # an acknowledgement in a format of its own: the file is what counts
    if not isinstance(record, dict):
        return ""
    if record.get("pid") not in (None, pid):
        return None  # written by another process: not this job's answer
    detail = record.get("detail")
    return str(detail) if detail else ""


def _params(intent: Intent) -> CheckpointParams | None:
    if intent.params is None:
        return CheckpointParams()
    return intent.params if isinstance(intent.params, CheckpointParams) else None


def _wait(waiting: list[_Waiting], seconds: float, ctx: Context) -> dict[int, TargetResult]:
    results: dict[int, TargetResult] = {}
    start = ctx.clock.monotonic()
    deadline = start + seconds
    pending = list(waiting)
    while pending:
        for item in list(pending):
            answer = read_ack(item.ack, item.target.pid, item.stale)
            if answer is None and not item.pinned.alive():
                answer = read_ack(item.ack, item.target.pid, item.stale)  # it may ack, then exit
                if answer is None:
                    results[item.index] = _result(
                        item.target, False, "gone", "exited before acknowledging"
                    )
                    pending.remove(item)
                    continue
            if answer is not None:
                took = ctx.clock.monotonic() - start
                note = f"acknowledged after {took:.2f}s" + (f": {answer}" if answer else "")
                results[item.index] = _result(item.target, True, "acknowledged", note)
                pending.remove(item)
        if not pending:
            break
        left = deadline - ctx.clock.monotonic()
        if left <= 0:
            for item in pending:
                note = f"no acknowledgement within {seconds:g}s"
                if item.stopped:
                    note += " (the process is stopped: it cannot answer until resumed)"
                results[item.index] = _result(item.target, False, "timed_out", note)
            break
        if not ctx.wait(min(POLL_S, left)):
            for item in pending:
                results[item.index] = _result(
                    item.target, False, "cancelled", "stopped waiting: the daemon is stopping"
                )
            break
    return results


def execute(intent: Intent, ctx: Context) -> Outcome:
    """Signal every target, then wait for their acknowledgements together."""
    dry = ctx.dry_run or intent.shadow
    params = _params(intent)
    if params is None:
        detail = f"checkpoint: parameters are {type(intent.params).__name__}, not CheckpointParams"
        log_action(intent, ctx, error=detail)
        return Outcome(ok=False, detail=detail, dry_run=dry)
    results: dict[int, TargetResult] = {}
    signals: dict[int, str] = {}
    notes: dict[int, str] = {}  # how the signal went (through Slurm, or why not)
    router = Router(ctx, params.via, "checkpoint")
    with ExitStack() as stack:
        waiting: list[_Waiting] = []
        for index, target in enumerate(intent.targets):
            try:
                name = choose_signal(target, params)
            except ValueError as err:
                results[index] = _result(target, False, "invalid_signal", str(err))
                continue
            signals[index] = name
            try:
                pinned = stack.enter_context(pin(target))
                ack = ack_file(target, pinned)
                route = router.route(target, pinned)
                if dry:
                    how = joined(f"send {name}", router.would_signal(route, name))
                    results[index] = _result(
                        target, True, "would", f"{how}, wait up to {params.wait:g}s"
                    )
                    continue
                stale = clear_stale(ack, target.uid)
                stopped = pinned.status() == psutil.STATUS_STOPPED
                notes[index] = router.send_signal(route, pinned, name)
            except PinError as err:
                results[index] = err.result(target)
                continue
            except (OSError, psutil.Error) as err:
                results[index] = _result(target, False, "error", str(err))
                continue
            waiting.append(_Waiting(index, target, pinned, ack, stale, stopped))
        results.update(_wait(waiting, params.wait, ctx))
    ordered = [with_note(results[i], notes.get(i, "")) for i in range(len(intent.targets))]
    for index, (target, result) in enumerate(zip(intent.targets, ordered, strict=True)):
        log_action(
            intent,
            ctx,
            result,
            signal=signals.get(index, "-"),
            user=target.user or "-",
            cmd=target.command,
        )
    return summarise(ordered, dry_run=dry, what="checkpoint")
