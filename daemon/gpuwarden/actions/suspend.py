"""suspend: stop a job with SIGSTOP, keeping its memory, so that it can be resumed later.

SIGSTOP cannot be caught: the job is frozen where it stands. Its GPU memory stays allocated,
so suspending relieves compute and host pressure, not GPU memory. Each stopped job gets an
``Undo(kind="resume")`` (unless the step says ``resume_on_resolve: false``) that the run loop
applies when the incident resolves and when the daemon shuts down.

A process that was already stopped (someone pressed Ctrl-Z, a debugger holds it) is left alone
and is not resumed later: gpuwarden only undoes what it did.

A process in a Slurm job is suspended with its whole job by ``scontrol suspend`` (see
``actions.slurm_route``), and the undo is ``Undo(kind="slurm_resume")``, one per job.
"""

from __future__ import annotations

import signal

import psutil

from gpuwarden.actions.base import Context
from gpuwarden.actions.each import act_on_each, wrong_params
from gpuwarden.actions.each import result as _result
from gpuwarden.actions.pin import Pinned, pin
from gpuwarden.actions.slurm_route import Router
from gpuwarden.model import Intent, Outcome, Target, TargetResult, Undo
from gpuwarden.playbook.schema import SuspendParams

CONFIRM_S = 1.0  # how long a stop may take to show in /proc
CONFIRM_POLL_S = 0.01


def wait_for_status(pinned: Pinned, ctx: Context, stopped: bool) -> str | None:
    """Poll until the process is (or is no longer) stopped, for at most ``CONFIRM_S``.
    Returns the last status seen, ``None`` once the process has exited."""
    deadline = ctx.clock.monotonic() + CONFIRM_S
    while True:
        status = pinned.status()
        if status is None or (status == psutil.STATUS_STOPPED) == stopped:
            return status
        if ctx.clock.monotonic() >= deadline:
            return status
        ctx.clock.sleep(CONFIRM_POLL_S)


def _suspend(
    target: Target, params: SuspendParams, ctx: Context, dry: bool
) -> tuple[TargetResult, Undo | None]:
    with pin(target) as pinned:
        if pinned.status() == psutil.STATUS_STOPPED:
            return _result(
                target, True, "already", "already stopped by someone else: left as it is"
            ), None
        if dry:
            return _result(target, True, "would", "send SIGSTOP"), None
        pinned.send(signal.SIGSTOP)
        undo = (
            Undo(kind="resume", pid=target.pid, create_time=pinned.create_time)
            if params.resume_on_resolve
            else None
        )
        status = wait_for_status(pinned, ctx, stopped=True)
    if status is None:
        return _result(target, False, "gone", "exited after SIGSTOP"), None
    if status != psutil.STATUS_STOPPED:
        detail = f"SIGSTOP sent but the process is {status} after {CONFIRM_S:g}s"
        return _result(target, False, "unconfirmed", detail), undo
    detail = "stopped" + ("; resumed when the incident resolves" if undo else "")
    return _result(target, True, "suspended", detail), undo


def _noted(
    router: Router, target: Target, done: tuple[TargetResult, Undo | None]
) -> tuple[TargetResult, Undo | None]:
    return router.noted(target, done[0]), done[1]


def execute(intent: Intent, ctx: Context) -> Outcome:
    """SIGSTOP each target and verify it stopped; an Undo resumes it later."""
    dry = ctx.dry_run or intent.shadow
    params = SuspendParams() if intent.params is None else intent.params
    if not isinstance(params, SuspendParams):
        return wrong_params(intent, ctx, "suspend", SuspendParams)
    router = Router(ctx, params.via, "suspend")  # a Slurm job: scontrol suspend (slurm_route)
    return act_on_each(
        intent,
        ctx,
        "suspend",
        lambda target: (
            router.suspend(target, resume_on_resolve=params.resume_on_resolve, dry=dry)
            or _noted(router, target, _suspend(target, params, ctx, dry))
        ),
        lambda target: {"signal": "SIGSTOP", "user": target.user or "-", "cmd": target.command},
    )
