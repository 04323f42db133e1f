"""``provision``: burst to cloud GPUs through the daemon's cloud service.

The executor is a thin door: the service (``gpuwarden.cloud.service``) checks the caps, looks
for what the step launched already, launches with a deterministic ClientToken, and records the
instances. In dry-run and drills the launch is an EC2 ``DryRun`` call: it proves the credentials
and permissions and spends nothing.
"""

from __future__ import annotations

from gpuwarden.actions.base import Context, log_action
from gpuwarden.actions.each import wrong_params
from gpuwarden.model import Intent, Outcome
from gpuwarden.playbook.schema import ProvisionParams


def execute(intent: Intent, ctx: Context) -> Outcome:
    params = intent.params
    if not isinstance(params, ProvisionParams):
        return wrong_params(intent, ctx, "provision", ProvisionParams)
    dry_run = ctx.dry_run or intent.shadow
    if ctx.cloud is None:
        outcome = Outcome(
            ok=False,
            detail=f"profile {params.profile} was not launched: the daemon has no cloud "
            "service (no cloud profiles, or the journal could not hold instances)",
            dry_run=dry_run,
        )
    else:
        outcome = ctx.cloud.provision(
            intent,
            params.profile,
            params.count,
            dry_run=dry_run,
            now=ctx.clock.now(),
            waiter=ctx,
        )
    log_action(intent, ctx, profile=params.profile, ok=outcome.ok, detail=outcome.detail)
    return outcome
