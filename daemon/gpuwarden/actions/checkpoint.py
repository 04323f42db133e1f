"""checkpoint: ask jobs to save their state, then wait for each to say it has.

The signal is the one the job declared (``GPUWARDEN_CHECKPOINT_SIGNAL``, carried on the target):
a job that handles only SIGUSR2 would be terminated by a SIGUSR1 it does not catch. A job that
declared none gets the step's ``signal``, else SIGUSR1.

The job acknowledges by writing ``<ack_spool>/<uid>/<pid>.ack`` (``gpuwarden.job.acknowledge``)
into the directory of its user in gpuwarden's spool (``gpuwarden.actions.spool``), which is
created, owned by that user and mode 0700, before the job is asked. Where the job itself says
its acknowledgements go (its ``GPUWARDEN_ACK_DIR``) is never read: it only explains a timeout.
An old answer is removed before the signal. Every target is signalled first, then all are
waited for together, up to the step's ``wait``: each ends ``acknowledged``, ``rejected`` (an
answer that is forged, a link, too big or nested too deep: the reason says which),
``timed_out``, ``gone`` (exited without acknowledging) or ``cancelled`` (the daemon is
stopping). A target whose user's directory cannot be trusted is not signalled (``refused``).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpuwarden import job
from gpuwarden.actions import spool
from gpuwarden.actions.base import Context, log_action, summarise
from gpuwarden.actions.each import result as _result
from gpuwarden.actions.pin import PinError, Pinned, pin
from gpuwarden.actions.slurm_route import Router, joined, with_note
from gpuwarden.model import Intent, Outcome, Target, TargetResult
from gpuwarden.playbook.schema import CheckpointParams

POLL_S = 0.05
STOPPED_WAITING = "stopped waiting: the daemon is stopping or the incident was aborted"


@dataclass
class _Waiting:
    index: int
    target: Target
    pinned: Pinned
    ack: _Ack
    stopped: bool  # suspended: the signal waits, unhandled, until the job is resumed


@dataclass(frozen=True)
class _Ack:
    """Where one target answers: a descriptor of its user's directory, and the file's name."""

    dir_fd: int
    shown: str  # the directory's path, for messages
    name: str
    uid: int
    pid: int  # as the job sees itself (in a container, its own PID namespace's number)

    def read(self) -> spool.Answer:
        """The answer so far; whatever goes wrong reading it fails this target alone."""
        try:
            return spool.read(self.dir_fd, self.shown, self.name, self.uid, self.pid)
        except Exception as exc:
            return spool.Answer("rejected", f"could not be read ({type(exc).__name__}: {exc})")


def choose_signal(target: Target, params: CheckpointParams) -> str:
    """The signal's name: the job's declared one, else the step's, else SIGUSR1.
    ValueError for a name that is not a signal."""
    declared = target.checkpoint_signal or params.signal
    try:
        return job.signal_from_name(declared).name
    except (KeyError, ValueError):
        raise ValueError(f"not a signal: {declared!r}") from None


def spool_root(ctx: Context) -> Path:
    return ctx.ack_spool or job.DEFAULT_ACK_DIR


def _locate(target: Target, pinned: Pinned, root: Path, root_fd: int, stack: ExitStack) -> _Ack:
    """The target's answer file; its user's directory is prepared. Raises SpoolError."""
    uid = target.uid if target.uid is not None else pinned.uid()
    inner, namespace = pinned.own_pid()
    dir_fd = spool.user_dir(root_fd, root, uid)
    stack.callback(os.close, dir_fd)
    name = job.ack_name(inner, namespace)
    return _Ack(dir_fd, str(root / str(uid)), name, uid, inner)


def _elsewhere(target: Target, root: Path) -> str:
    """A note for a timeout when the job said it writes somewhere else."""
    declared = target.ack_dir
    if declared and Path(declared) != root:
        return (
            f"; the job's GPUWARDEN_ACK_DIR is {declared}, but gpuwarden reads only its "
            f"spool {root}"
        )
    return ""


def _params(intent: Intent) -> CheckpointParams | None:
    if intent.params is None:
        return CheckpointParams()
    return intent.params if isinstance(intent.params, CheckpointParams) else None


def _wait(
    waiting: list[_Waiting], seconds: float, ctx: Context, root: Path
) -> dict[int, TargetResult]:
    results: dict[int, TargetResult] = {}
    start = ctx.clock.monotonic()
    deadline = start + seconds
    pending = list(waiting)
    while pending:
        for item in list(pending):
            answer = item.ack.read()
            if answer.state == "none" and not item.pinned.alive():
                answer = item.ack.read()  # it may acknowledge, then exit
                if answer.state == "none":
                    results[item.index] = _result(
                        item.target, False, "gone", "exited before acknowledging"
                    )
                    pending.remove(item)
                    continue
            if answer.state == "rejected":
                note = f"acknowledgement rejected: {answer.detail}"
                results[item.index] = _result(item.target, False, "rejected", note)
                pending.remove(item)
            elif answer.state == "ok":
                took = ctx.clock.monotonic() - start
                said = answer.detail
                note = f"acknowledged after {took:.2f}s" + (f": {said}" if said else "")
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
                note += _elsewhere(item.target, root)
                results[item.index] = _result(item.target, False, "timed_out", note)
            break
        if not ctx.wait(min(POLL_S, left)):
            for item in pending:
                results[item.index] = _result(
                    item.target,
                    False,
                    "cancelled",
                    STOPPED_WAITING,
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
    root = spool_root(ctx)
    notes: dict[int, str] = {}  # how the signal went (through Slurm, or why not)
    router = Router(ctx, params.via, "checkpoint")
    with ExitStack() as stack:
        waiting: list[_Waiting] = []
        root_fd: int | None = None
        unusable = ""
        try:
            root_fd = spool.open_root(root)
            stack.callback(os.close, root_fd)
        except spool.SpoolError as err:
            unusable = str(err)
        for index, target in enumerate(intent.targets):
            try:
                name = choose_signal(target, params)
            except ValueError as err:
                results[index] = _result(target, False, "invalid_signal", str(err))
                continue
            signals[index] = name
            try:
                pinned = stack.enter_context(pin(target))
                if root_fd is None:
                    raise spool.SpoolError(unusable)
                ack = _locate(target, pinned, root, root_fd, stack)
                route = router.route(target, pinned)
                if dry:
                    how = joined(f"send {name}", router.would_signal(route, name))
                    plan = f"{how}, wait up to {params.wait:g}s for {ack.shown}/{ack.name}"
                    results[index] = _result(target, True, "would", plan)
                    continue
                spool.clear(ack.dir_fd, ack.name)
                stopped = pinned.status() == psutil.STATUS_STOPPED
                notes[index] = router.send_signal(route, pinned, name)
            except PinError as err:
                results[index] = err.result(target)
                continue
            except spool.SpoolError as err:
                results[index] = _result(target, False, "refused", f"not signalled: {err}")
                continue
            except (OSError, psutil.Error) as err:
                results[index] = _result(target, False, "error", str(err))
                continue
            waiting.append(_Waiting(index, target, pinned, ack, stopped))
        results.update(_wait(waiting, params.wait, ctx, root))
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
