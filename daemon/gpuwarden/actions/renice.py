"""renice: lower a job's CPU priority (nice) and, where the kernel supports it, its I/O priority.

On Linux a nice value belongs to each thread, so every thread of the process is reniced (a
training job's work runs in many threads). Priorities are only ever lowered: a thread already
at least as nice as asked is left alone, and a job whose every setting is already as low as
asked reports ``already``. With ``restore`` (the default) the result carries an
``Undo(kind="renice")`` with the old nice value and I/O class, applied by ``undo`` when the
incident resolves or the daemon stops, on the same process only (it is pinned again).

There is no pidfd form of setpriority: the identity is re-verified before each call (see
``gpuwarden.actions.pin`` for the window that remains).
"""

from __future__ import annotations

import psutil

from gpuwarden.actions.base import Context
from gpuwarden.actions.each import act_on_each, wrong_params
from gpuwarden.actions.each import result as _result
from gpuwarden.actions.pin import IONICE_LEVEL_LOWEST, Denied, PinError, Pinned, ionice_rank, pin
from gpuwarden.actions.resume import log_undo, undo_target
from gpuwarden.model import Intent, Outcome, Target, TargetResult, Undo
from gpuwarden.playbook.schema import ReniceParams

IONICE_SETTINGS = {"idle": "idle", "best-effort": f"best-effort:{IONICE_LEVEL_LOWEST}"}


def _wanted_ionice(pinned: Pinned, setting: str) -> tuple[str | None, str | None]:
    """(current class, class to set or None when it is already as low or cannot be set)."""
    wanted = IONICE_SETTINGS.get(setting)
    if wanted is None:
        return None, None
    try:
        current = pinned.ionice()
    except Denied:
        return None, None
    if current is None or ionice_rank(current) >= ionice_rank(wanted):
        return current, None
    return current, wanted


def _renice(target: Target, params: ReniceParams, dry: bool) -> tuple[TargetResult, Undo | None]:
    with pin(target) as pinned:
        old_nice = pinned.nice()
        old_io, new_io = _wanted_ionice(pinned, params.ionice)
        change_nice = old_nice < params.nice
        if not change_nice and new_io is None:
            detail = f"nice {old_nice} already at or above {params.nice}"
            if old_io is not None and params.ionice != "unchanged":
                detail += f", ionice {old_io}"
            return _result(target, True, "already", detail), None
        plan = []
        if change_nice:
            plan.append(f"nice {old_nice} -> {params.nice}")
        if new_io is not None:
            plan.append(f"ionice {old_io} -> {new_io}")
        if dry:
            return _result(target, True, "would", ", ".join(plan)), None
        threads = pinned.renice(params.nice, lower_only=True) if change_nice else 0
        io_note = ""
        if new_io is not None:
            try:
                pinned.set_ionice(new_io)
            except Denied as err:
                new_io, io_note = None, f"; ionice not set: {err.detail}"
            except OSError as err:
                new_io, io_note = None, f"; ionice not set: {err}"
    undo = None
    if params.restore and (change_nice or new_io is not None):
        undo = Undo(
            kind="renice",
            pid=target.pid,
            create_time=pinned.create_time,
            value=old_nice if change_nice else None,
            ionice=old_io if new_io is not None else None,
        )
    detail = ", ".join(plan) + (f" ({threads} threads)" if change_nice else "") + io_note
    return _result(target, True, "reniced", detail), undo


def execute(intent: Intent, ctx: Context) -> Outcome:
    """Lower each target's nice value (every thread) and I/O class; Undo restores them."""
    dry = ctx.dry_run or intent.shadow
    params = ReniceParams() if intent.params is None else intent.params
    if not isinstance(params, ReniceParams):
        return wrong_params(intent, ctx, "renice", ReniceParams)
    return act_on_each(
        intent,
        ctx,
        "renice",
        lambda target: _renice(target, params, dry),
        lambda target: {
            "nice": params.nice,
            "ionice": params.ionice,
            "user": target.user or "-",
            "cmd": target.command,
        },
    )


def _restore(target: Target, u: Undo, dry: bool) -> TargetResult:
    with pin(target) as pinned:
        plan = []
        if u.value is not None:
            plan.append(f"nice {pinned.nice()} -> {int(u.value)}")
        if u.ionice is not None:
            plan.append(f"ionice {pinned.ionice()} -> {u.ionice}")
        if dry:
            return _result(target, True, "would", ", ".join(plan))
        if u.value is not None:
            pinned.renice(int(u.value), raise_only=True)
        if u.ionice is not None:
            try:
                pinned.set_ionice(u.ionice)
            except ValueError as err:
                return _result(target, False, "invalid", f"{', '.join(plan)}: {err}")
    return _result(target, True, "restored", ", ".join(plan))


def undo(u: Undo, ctx: Context) -> TargetResult:
    """Restore the nice value and I/O class a ``renice`` recorded (``Undo(kind="renice")``)."""
    target = undo_target(u)
    if u.kind != "renice" or target is None:
        result = TargetResult(
            u.pid or 0, u.create_time, ok=False, state="invalid", detail=f"not a renice: {u}"
        )
    else:
        try:
            result = _restore(target, u, ctx.dry_run)
        except PinError as err:
            result = err.result(target)
        except (OSError, psutil.Error) as err:
            result = _result(target, False, "error", str(err))
    log_undo(u, ctx, result)
    return result
