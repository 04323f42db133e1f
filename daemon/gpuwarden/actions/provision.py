"""``provision``: a placeholder until cloud provisioning is built. It launches nothing and says
so in a failed, non-recoverable outcome, so that a ladder never believes capacity is coming."""

from __future__ import annotations

from gpuwarden.actions.base import Context, log_action
from gpuwarden.model import Intent, Outcome
from gpuwarden.playbook.schema import ProvisionParams


def execute(intent: Intent, ctx: Context) -> Outcome:
    params = intent.params
    profile = params.profile if isinstance(params, ProvisionParams) else "?"
    log_action(intent, ctx, profile=profile, outcome="not_built")
    return Outcome(
        ok=False,
        recoverable=False,
        detail=f"cloud provisioning is not built yet: profile {profile} was not launched",
        dry_run=ctx.dry_run or intent.shadow,
    )
