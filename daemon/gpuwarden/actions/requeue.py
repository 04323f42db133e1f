"""requeue: put a Slurm job back in the queue, keeping its place, instead of killing it.

``scontrol requeue JOB`` ends the job's processes (Slurm sends SIGTERM, then SIGKILL after its
KillWait) and makes the job pending again, to start afresh later with its priority and its
submission time kept; ``hold: true`` runs ``scontrol requeuehold JOB``, so it stays pending
until someone releases it (``scontrol release JOB``). Each process is then watched through its
pidfd until it has exited: SIGKILL after ``grace`` if it is still there.

Only a process in a Slurm job can be requeued (found from its cgroup, else asked of slurmd,
never from its environment): any other target ends ``not_slurm_job``, and the planner already
skips candidates that were in no job. Several targets in one job share one command. States:
``requeued``, ``not_slurm_job``, ``slurm_unreachable`` (slurmctld did not answer: requeue has no
signal to fall back to), ``slurm_failed`` (Slurm refused: the detail has its stderr),
``survived``, ``cancelled``, ``would`` and the pinning refusals.
"""

from __future__ import annotations

from gpuwarden.actions.base import Context
from gpuwarden.actions.each import act_on_each, wrong_params
from gpuwarden.actions.slurm_route import Router
from gpuwarden.model import Intent, Outcome, Target, TargetResult, Undo
from gpuwarden.playbook.schema import RequeueParams


def _requeue(
    router: Router, target: Target, params: RequeueParams, dry: bool
) -> tuple[TargetResult, Undo | None]:
    done = router.end(target, grace=params.grace, hold=params.hold, dry=dry)
    assert done is not None  # a requeue never falls back to signals: the router raises
    return done, None


def execute(intent: Intent, ctx: Context) -> Outcome:
    """Requeue the Slurm job of each target (once per job) and see its processes go."""
    dry = ctx.dry_run or intent.shadow
    params = RequeueParams() if intent.params is None else intent.params
    if not isinstance(params, RequeueParams):
        return wrong_params(intent, ctx, "requeue", RequeueParams)
    router = Router(ctx, params.via, "requeue")
    return act_on_each(
        intent,
        ctx,
        "requeue",
        lambda target: _requeue(router, target, params, dry),
        lambda target: {
            "hold": str(params.hold).lower(),
            "user": target.user or "-",
            "cmd": target.command,
        },
    )
