"""``notify``: a placeholder until notification delivery (apprise routing, an outbox) is built.

It does not pretend to deliver: it records the step (one action line naming the targets) and
says in its outcome that nothing was sent. The first call in a process also logs a warning,
so an operator reading the log knows that no one is being paged.
"""

from __future__ import annotations

import logging
import threading

from gpuwarden.actions.base import Context, log_action
from gpuwarden.model import Intent, Outcome
from gpuwarden.playbook.schema import NotifyParams

logger = logging.getLogger(__name__)

NOT_BUILT = "recorded; notification delivery is not built yet"

# Set once the "not delivered" warning has been logged in this process.
WARNED = threading.Event()
_lock = threading.Lock()


def execute(intent: Intent, ctx: Context) -> Outcome:
    params = intent.params
    targets = params.targets if isinstance(params, NotifyParams) else ()
    log_action(intent, ctx, targets=",".join(targets), severity=intent.severity)
    with _lock:
        first = not WARNED.is_set()
        WARNED.set()
    if first:
        logger.warning(
            "notification delivery is not built yet: notify steps are recorded, nobody is told"
        )
    return Outcome(ok=True, detail=NOT_BUILT, dry_run=ctx.dry_run or intent.shadow)
