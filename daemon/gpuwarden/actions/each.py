"""Acting on each target of a step in turn: the loop the signal executors share.

A target's trouble (it exited, its PID was reused, permission was denied, the OS said no) is
that target's result, never an exception: the other targets are still acted on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psutil

from gpuwarden.actions.base import Context, log_action, summarise
from gpuwarden.actions.pin import PinError
from gpuwarden.model import Intent, Outcome, Target, TargetResult, Undo


def result(target: Target, ok: bool, state: str, detail: str = "") -> TargetResult:
    return TargetResult(target.pid, target.create_time, ok=ok, state=state, detail=detail)


def wrong_params(intent: Intent, ctx: Context, what: str, expected: type) -> Outcome:
    """The outcome of a step whose parameters are not the kind its executor takes."""
    detail = f"{what}: parameters are {type(intent.params).__name__}, not {expected.__name__}"
    log_action(intent, ctx, error=detail)
    return Outcome(ok=False, detail=detail, dry_run=ctx.dry_run or intent.shadow)


def act_on_each(
    intent: Intent,
    ctx: Context,
    what: str,
    act: Callable[[Target], tuple[TargetResult, Undo | None]],
    log_fields: Callable[[Target], dict[str, Any]],
) -> Outcome:
    """Run ``act`` for every target, log one line each, and sum up with the undos."""
    results: list[TargetResult] = []
    undos: list[Undo] = []
    for target in intent.targets:
        try:
            outcome, undo = act(target)
        except PinError as err:
            outcome, undo = err.result(target), None
        except (OSError, psutil.Error) as err:
            outcome, undo = result(target, False, "error", str(err)), None
        results.append(outcome)
        if undo is not None:
            undos.append(undo)
        log_action(intent, ctx, outcome, **log_fields(target))
    dry = ctx.dry_run or intent.shadow
    return replace(summarise(results, dry_run=dry, what=what), undo=tuple(undos))
