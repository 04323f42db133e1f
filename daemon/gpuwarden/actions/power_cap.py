"""``power_cap``: lower a GPU's power limit, and put the old one back when the incident ends.

For ``intent.gpu``, through ``ctx.power``:

1. read the current limit (it is what ``undo`` restores);
2. compute the new one: ``watts``, or ``percent`` of the device's *default* limit;
3. clamp it to the device's [min, max] range (the detail says so);
4. never raise a limit: a limit already at or below the new one is left as it is (``already``);
5. dry-run stops here, at the last line before the call that changes the device;
6. set it, read it back, and return an ``Undo(kind="power_limit", value=<old W>)`` unless the
   step says ``restore: false``.

The device's answers come through a :class:`~gpuwarden.actions.base.PowerControl` (NVML's is
:class:`gpuwarden.actions.nvml_power.NvmlPower`); what it cannot tell is ``None``, and what it
refuses is a :class:`PowerControlError`, which becomes the outcome. Nothing here raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwarden.actions.base import Context, PowerControl, log, log_action, safe
from gpuwarden.model import Intent, Outcome, TargetResult, Undo
from gpuwarden.playbook.schema import PowerCapParams

NO_POWER = "power control unavailable (no NVML)"
TOLERANCE_W = 0.5  # limits closer than this are the same limit (NVML counts in mW)


class PowerControlError(Exception):
    """The device refused or failed a power call; ``denied``: for lack of permission."""

    def __init__(self, message: str, *, denied: bool = False, recoverable: bool = False) -> None:
        super().__init__(message)
        self.denied = denied
        self.recoverable = recoverable


def _w(watts: float) -> str:
    return f"{watts:.0f} W" if abs(watts - round(watts)) < 0.05 else f"{watts:.1f} W"


@dataclass(frozen=True)
class Plan:
    """What ``power_cap`` would do to one GPU, decided from the device's answers."""

    gpu: int
    current_w: float
    new_w: float
    notes: tuple[str, ...] = ()

    @property
    def lowers(self) -> bool:
        return self.new_w < self.current_w - TOLERANCE_W


def plan(gpu: int, params: PowerCapParams, power: PowerControl) -> Plan | str:
    """The new limit for ``gpu``, or why there is none. May raise PowerControlError."""
    current = power.power_limit_w(gpu)
    if current is None:
        return f"GPU {gpu} cannot report its power limit"
    notes: list[str] = []
    if params.watts is not None:
        wanted = params.watts
    else:
        default = power.default_power_limit_w(gpu)
        if default is None:
            return f"GPU {gpu} cannot report its default power limit to take {params.percent:g}% of"
        assert params.percent is not None
        wanted = default * params.percent / 100.0
        notes.append(f"{params.percent:g}% of the default {_w(default)}")
    span = power.power_limit_range_w(gpu)
    new = wanted
    if span is None:
        notes.append("the device's range is unknown")
    else:
        low, high = span
        if wanted < low:
            new = low
            notes.append(f"{_w(wanted)} clamped to the device's minimum {_w(low)}")
        elif wanted > high:
            new = high
            notes.append(f"{_w(wanted)} clamped to the device's maximum {_w(high)}")
    return Plan(gpu=gpu, current_w=current, new_w=new, notes=tuple(notes))


def _failed(intent: Intent, ctx: Context, detail: str, *, recoverable: bool = False) -> Outcome:
    log_action(intent, ctx, gpu=intent.gpu, outcome="failed", why=detail)
    return Outcome(
        ok=False, recoverable=recoverable, detail=detail, dry_run=ctx.dry_run or intent.shadow
    )


def execute(intent: Intent, ctx: Context) -> Outcome:
    params = intent.params
    dry_run = ctx.dry_run or intent.shadow
    if not isinstance(params, PowerCapParams):
        return _failed(intent, ctx, "power_cap: the step has no watts or percent")
    if ctx.power is None:
        return _failed(intent, ctx, NO_POWER)
    gpu = intent.gpu
    if gpu is None:
        return _failed(
            intent, ctx, f"power_cap needs a GPU; {intent.where or 'this scope'} has none"
        )
    try:
        decided = plan(gpu, params, ctx.power)
    except PowerControlError as exc:
        return _failed(intent, ctx, str(exc), recoverable=exc.recoverable)
    except Exception as exc:  # a device call that blew up is an outcome, never a crash
        return _failed(intent, ctx, f"GPU {gpu}: reading the power limits failed: {exc!r}")
    if isinstance(decided, str):
        return _failed(intent, ctx, decided)
    notes = "".join(f"; {note}" for note in decided.notes)
    fields: dict[str, Any] = {
        "gpu": gpu,
        "from_w": round(decided.current_w),
        "to_w": round(decided.new_w),
    }
    if not decided.lowers:
        log_action(intent, ctx, **fields, outcome="already")
        return Outcome(
            ok=True,
            detail=f"already: GPU {gpu} limit {_w(decided.current_w)} is at or below "
            f"{_w(decided.new_w)}; left as it is{notes}",
            dry_run=dry_run,
        )
    change = f"GPU {gpu} power limit {_w(decided.current_w)} → {_w(decided.new_w)}"
    if dry_run:
        log_action(intent, ctx, **fields, outcome="would")
        return Outcome(ok=True, detail=f"would set {change}{notes}", dry_run=True)
    try:
        ctx.power.set_power_limit_w(gpu, decided.new_w)
        after = ctx.power.power_limit_w(gpu)
    except PowerControlError as exc:
        return _failed(intent, ctx, f"{exc}{notes}", recoverable=exc.recoverable)
    except Exception as exc:
        return _failed(intent, ctx, f"GPU {gpu}: setting the power limit failed: {exc!r}")
    undo = (Undo(kind="power_limit", gpu=gpu, value=decided.current_w),) if params.restore else ()
    kept = "" if params.restore else "; kept after the incident (restore: false)"
    if after is not None and after > decided.new_w + TOLERANCE_W:
        log_action(intent, ctx, **fields, outcome="not_applied", reads_w=round(after))
        return Outcome(
            ok=False,
            recoverable=True,
            detail=f"set {change}, but the device still reports {_w(after)}{notes}",
            undo=undo,
        )
    log_action(intent, ctx, **fields, outcome="set")
    return Outcome(ok=True, detail=f"set {change}{notes}{kept}", undo=undo)


def undo(u: Undo, ctx: Context) -> TargetResult:
    """Put back the limit ``execute`` replaced. A GPU is not a process: ``pid`` is ``u.pid``
    (``None`` in the Undo) reported as 0, and ``create_time`` as ``None``."""
    pid = u.pid or 0
    gpu, value = u.gpu, u.value

    def result(ok: bool, state: str, detail: str) -> TargetResult:
        log.info(
            "action=power_cap_undo gpu=%s result=%s dry_run=%s detail=%s",
            gpu,
            state,
            str(ctx.dry_run).lower(),
            safe(detail),
        )
        return TargetResult(pid=pid, create_time=None, ok=ok, state=state, detail=detail)

    if u.kind != "power_limit" or gpu is None or value is None:
        return result(False, "failed", f"not a power limit to restore: {u}")
    if ctx.power is None:
        return result(False, "failed", NO_POWER)
    old = float(value)
    try:
        current = ctx.power.power_limit_w(gpu)
        if current is not None and abs(current - old) < TOLERANCE_W:
            return result(True, "already", f"GPU {gpu} power limit is {_w(current)} already")
        shown = "?" if current is None else _w(current)
        if ctx.dry_run:
            return result(True, "would", f"would restore GPU {gpu} power limit {shown} → {_w(old)}")
        ctx.power.set_power_limit_w(gpu, old)
    except PowerControlError as exc:
        return result(False, "denied" if exc.denied else "failed", str(exc))
    except Exception as exc:
        return result(False, "failed", f"GPU {gpu}: restoring the power limit failed: {exc!r}")
    return result(True, "restored", f"restored GPU {gpu} power limit {shown} → {_w(old)}")
