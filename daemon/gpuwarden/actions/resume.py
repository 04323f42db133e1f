"""resume: continue a stopped job with SIGCONT, as a step or as the undo of a ``suspend``.

``undo`` is what the run loop calls when an incident resolves or the daemon stops: it pins the
process by the PID and start time the suspend recorded, so a PID reused since is never touched.
"""

from __future__ import annotations

import signal

import psutil

from gpuwarden.actions.base import Context, log, log_action, safe, summarise
from gpuwarden.actions.each import result as _result
from gpuwarden.actions.each import wrong_params
from gpuwarden.actions.pin import PinError, pin
from gpuwarden.actions.slurm_route import Router, undo_resume
from gpuwarden.actions.suspend import wait_for_status
from gpuwarden.model import Intent, Outcome, Target, TargetResult, Undo
from gpuwarden.playbook.schema import ResumeParams


def resume_target(target: Target, ctx: Context, dry: bool) -> TargetResult:
    """SIGCONT one pinned target and check it is no longer stopped. Never raises PinError."""
    try:
        with pin(target) as pinned:
            was = pinned.status()
            if dry:
                return _result(target, True, "would", f"send SIGCONT (now {was})")
            pinned.send(signal.SIGCONT)
            status = wait_for_status(pinned, ctx, stopped=False)
    except PinError as err:
        return err.result(target)
    except (OSError, psutil.Error) as err:
        return _result(target, False, "error", str(err))
    if status is None:
        return _result(target, False, "gone", "exited after SIGCONT")
    if status == psutil.STATUS_STOPPED:
        return _result(target, False, "unconfirmed", "SIGCONT sent but still stopped")
    note = "continued" if was == psutil.STATUS_STOPPED else f"was not stopped ({was})"
    return _result(target, True, "resumed", note)


def execute(intent: Intent, ctx: Context) -> Outcome:
    """SIGCONT each target (a Slurm job's: ``scontrol resume``, see ``slurm_route``)."""
    dry = ctx.dry_run or intent.shadow
    params = ResumeParams() if intent.params is None else intent.params
    if not isinstance(params, ResumeParams):
        return wrong_params(intent, ctx, "resume", ResumeParams)
    router = Router(ctx, params.via, "resume")
    results = []
    for target in intent.targets:
        try:
            via_slurm = router.resume(target, dry=dry)
            result = via_slurm or router.noted(target, resume_target(target, ctx, dry))
        except PinError as err:
            result = err.result(target)
        except (OSError, psutil.Error) as err:
            result = _result(target, False, "error", str(err))
        results.append(result)
        log_action(
            intent, ctx, result, signal="SIGCONT", user=target.user or "-", cmd=target.command
        )
    return summarise(results, dry_run=dry, what="resume")


def undo_target(u: Undo) -> Target | None:
    """The target an Undo names, or None when it names no process."""
    if u.pid is None:
        return None
    return Target(
        pid=u.pid,
        create_time=u.create_time,
        gpu=u.gpu,
        user=None,
        priority="",
        gpu_memory_mib=None,
    )


def log_undo(u: Undo, ctx: Context, result: TargetResult) -> None:
    """The undo's one line: ``action=resume undo=true pid=… result=… dry_run=…``."""
    parts = [
        f"action={u.kind}",
        "undo=true",
        f"pid={result.pid}",
        f"result={safe(result.state)}",
        f"dry_run={str(ctx.dry_run).lower()}",
    ]
    if result.detail:
        parts.append(f"detail={safe(result.detail)}")
    log.info(" ".join(parts))


def undo(u: Undo, ctx: Context) -> TargetResult:
    """Resume a job a ``suspend`` stopped: ``Undo(kind="resume")`` with SIGCONT,
    ``Undo(kind="slurm_resume")`` with ``scontrol resume``."""
    target = undo_target(u)
    if u.kind == "slurm_resume":
        result = undo_resume(u, ctx)
    elif u.kind != "resume" or target is None:
        result = TargetResult(
            u.pid or 0, u.create_time, ok=False, state="invalid", detail=f"not a resume: {u}"
        )
    else:
        result = resume_target(target, ctx, ctx.dry_run)
    log_undo(u, ctx, result)
    return result
