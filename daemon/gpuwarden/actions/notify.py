"""``notify``: the step is the rule saying "tell these targets".

What is said, to whom and when is the notifier's job (``gpuwarden.notify``): the run loop hands
it every journaled record, it groups incidents and writes messages to the outbox, and the
sender delivers them with retries. This executor only records the step (one action line) and
finishes at once, so a ladder never waits for a chat service.
"""

from __future__ import annotations

from gpuwarden.actions.base import Context, log_action
from gpuwarden.model import Intent, Outcome
from gpuwarden.playbook.schema import NotifyParams

QUEUED = "handed to the notifier: grouped, written to the outbox, delivered with retries"


def execute(intent: Intent, ctx: Context) -> Outcome:
    params = intent.params
    targets = params.targets if isinstance(params, NotifyParams) else ()
    log_action(intent, ctx, targets=",".join(targets), severity=intent.severity)
    return Outcome(ok=True, detail=QUEUED, dry_run=ctx.dry_run or intent.shadow)
