"""kill: end processes, politely first: SIGTERM (or the step's signal), ``grace`` seconds to exit,
then SIGKILL, then verify the process is gone.

Targets are taken in the planner's order. After each one that no longer runs, the executor
waits ``settle`` seconds (a GPU driver frees memory some time after the process exits) and asks
``ctx.still_needed()``, which re-reads the machine: once enough is free the remaining targets are
left alone (``not_needed``): it never kills more than the situation needs.

A stopped process (suspended by an earlier step) is sent SIGCONT right after its SIGTERM, as
systemd does: otherwise the SIGTERM would wait, unhandled, until the SIGKILL.

``process_group: true`` takes the target's process group (its workers and data loaders), but
only when the target leads its group and the group is not gpuwarden's own: killing the group
of a process that merely belongs to a shell's group would take the shell. Otherwise only the
process itself is signalled, and the result says so. The group is never signalled as a whole
(no ``killpg``): each member is pinned by its own pidfd and signalled only if it runs as the
target's user and is not protected (``ctx.protection``, the config's protected list), so a
root-owned helper in the group, or a protected process, is left alone and named in the result.
A member that joins the group after a round is taken in the next round (the SIGKILL).

States: ``terminated`` (exited after the first signal), ``killed`` (needed SIGKILL), ``gone``
(exited before anything was sent), ``survived`` (still there after SIGKILL, e.g. stuck in the
driver), ``not_needed``, ``cancelled``, ``would`` (dry-run) and the pinning refusals.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpuwarden import job
from gpuwarden.actions.base import Context, log_action, summarise
from gpuwarden.actions.each import result as _result
from gpuwarden.actions.pin import Gone, PinError, Pinned, pin, pin_pid
from gpuwarden.actions.slurm_route import Router
from gpuwarden.model import Intent, Outcome, Target, TargetResult
from gpuwarden.playbook.schema import KillParams

POLL_S = 0.05
CONFIRM_POLL_S = 0.01
KILL_CONFIRM_S = 5.0  # SIGKILL is not instant for a process in uninterruptible sleep
PROC = Path("/proc")
ENDED = ("terminated", "killed", "gone")
CANCELLED = "not acted on: the daemon is stopping or the incident was aborted"


@dataclass
class _Victim:
    """A pinned target and, when its group is taken, the group id. The other members of the
    group are signalled one by one, each pinned by its own pidfd, and only if it runs as the
    target's user (real, effective and saved uid) and is not protected: a root-owned helper or
    a protected process in the same group is never reached. ``spared`` says who was left."""

    pinned: Pinned
    pgid: int | None
    uid: int | None = None
    protection: Callable[[int], str | None] | None = None
    spared: dict[int, str] = field(default_factory=dict)

    def _member(self, pid: int) -> Pinned | None:
        """The member ``pid`` pinned, if it may be signalled (noting in ``spared`` why not)."""
        try:
            pinned = pin_pid(pid)
        except PinError:
            return None
        try:
            if os.getpgid(pid) != self.pgid or pinned.exited():
                pinned.close()
                return None
            why = None
            uids = pinned.uids()
            if self.uid is not None and any(u != self.uid for u in uids):
                why = f"runs as uid {uids[1]}, not the target's uid {self.uid}"
            elif self.protection is not None:
                protected = self.protection(pid)
                why = None if protected is None else f"protected: {protected}"
        except (PinError, OSError):
            pinned.close()
            return None
        if why is not None:
            self.spared[pid] = why
            pinned.close()
            return None
        return pinned

    def others(self) -> list[int]:
        """The members besides the leader that have not been left alone."""
        if self.pgid is None:
            return []
        return [
            pid
            for pid in group_members(self.pgid)
            if pid != self.pinned.pid and pid not in self.spared
        ]

    def running(self) -> bool:
        return self.pinned.alive() or bool(self.others())

    def send(self, sig: int) -> None:
        """Signal the target, and the members of its group that may be signalled. Raises
        Gone when nothing at all was left to signal."""
        if self.pgid is None:
            self.pinned.send(sig)
            return
        sent = False
        with contextlib.suppress(Gone):
            self.pinned.send(sig)
            sent = True
        for pid in self.others():
            member = self._member(pid)
            if member is None:
                continue
            with member, contextlib.suppress(PinError):
                member.send(sig)
                sent = True
        if not sent:
            raise Gone(self.pinned.pid, "the process and its group have exited")

    def survey(self) -> int:
        """For a dry run: how many members would be signalled (``spared``: who would not)."""
        would = 0
        for pid in self.others():
            member = self._member(pid)
            if member is not None:
                member.close()
                would += 1
        return would

    def note(self) -> str:
        if not self.spared:
            return ""
        shown = ", ".join(f"pid {pid} {why}" for pid, why in sorted(self.spared.items()))
        return f"left alone in its group: {shown}"


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` fields after the command name: [state, ppid, pgrp, ...]."""
    try:
        text = (PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    _, _, rest = text.rpartition(")")
    fields = rest.split()
    return fields if len(fields) >= 3 else None


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (not zombie) processes in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)  # cheap: no member at all (not even a zombie) ends the search here
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    members = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or fields[0] in ("Z", "X", "x"):
            continue
        if fields[2] == str(pgid):
            members.append(int(entry.name))
    return sorted(members)


def _group_of(pinned: Pinned) -> tuple[int | None, str]:
    """The group to take (or None) and a note on why not."""
    if not pinned.is_group_leader():
        return None, "not a process-group leader: the process alone"
    if pinned.pid == os.getpgid(0):
        return None, "its group is gpuwarden's own: the process alone"
    return pinned.pid, ""


def _wait_gone(victim: _Victim, ctx: Context, seconds: float) -> bool | None:
    """True once the victim (and its group) has ended; False at the deadline; None if cancelled.
    Polls on the context's clock so that tests may run it on a fast one."""
    deadline = ctx.clock.monotonic() + seconds
    while victim.running():
        left = deadline - ctx.clock.monotonic()
        if left <= 0:
            return False
        if not ctx.wait(min(POLL_S, left)):
            return None if victim.running() else True
    return True


def _confirm_gone(victim: _Victim, ctx: Context) -> bool:
    """Wait for the SIGKILL to take effect. Each round also blocks on the pidfd for a moment, so
    the process really gets the time to die even on a simulated clock."""
    deadline = ctx.clock.monotonic() + KILL_CONFIRM_S
    while victim.running():
        if ctx.clock.monotonic() >= deadline:
            return False
        victim.pinned.exited(block_s=CONFIRM_POLL_S)
        ctx.clock.sleep(CONFIRM_POLL_S)
    return True


def _joined(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def _kill(
    target: Target, params: KillParams, sig: signal.Signals, ctx: Context, dry: bool
) -> TargetResult:
    with pin(target) as pinned:
        pgid, note = _group_of(pinned) if params.process_group else (None, "")
        uid = target.uid if target.uid is not None else pinned.uid()
        victim = _Victim(pinned, pgid, uid, ctx.protection)
        if dry:
            scope = "process"
            if pgid is not None:
                would = victim.survey()
                scope = f"process and {would} other member(s) of its process group {pgid}"
            plan = f"send {sig.name} to the {scope}"
            if sig != signal.SIGKILL:
                plan += f", SIGKILL after {params.grace:g}s"
            return _result(target, True, "would", _joined(plan, note, victim.note()))
        stopped = pinned.status() == psutil.STATUS_STOPPED
        victim.send(sig)
        if stopped and sig not in (signal.SIGKILL, signal.SIGCONT):
            with contextlib.suppress(Gone):  # it handles its SIGTERM only once continued
                victim.send(signal.SIGCONT)
            note = _joined("it was stopped: continued so that it can exit", note)
        if sig != signal.SIGKILL:
            ended = _wait_gone(victim, ctx, params.grace)
            if ended is None:
                return _result(target, False, "cancelled", f"{sig.name} sent; stopped waiting")
            if ended:
                done = _joined(f"exited on {sig.name}", note, victim.note())
                return _result(target, True, "terminated", done)
            try:
                victim.send(signal.SIGKILL)
            except Gone:
                done = _joined(f"exited on {sig.name}", note, victim.note())
                return _result(target, True, "terminated", done)
        if not _confirm_gone(victim, ctx):
            return _result(
                target, False, "survived", f"still running {KILL_CONFIRM_S:g}s after SIGKILL"
            )
        first = "" if sig == signal.SIGKILL else f"outlived {sig.name} by {params.grace:g}s, "
        return _result(target, True, "killed", _joined(f"{first}SIGKILL", note, victim.note()))


def _recheck(params: KillParams, ctx: Context) -> tuple[str, bool, str] | None:
    """After a target ended: wait ``settle``, then ask whether more must go. Returns the state
    for every remaining target, or None to go on."""
    if ctx.still_needed is None:
        return None
    if not ctx.wait(params.settle):
        return (
            "cancelled",
            False,
            CANCELLED,
        )
    try:
        needed = ctx.still_needed()
    except Exception as err:  # a failed re-read must not turn into more kills
        return ("not_rechecked", False, f"could not re-read the machine: {err}")
    if not needed:
        return ("not_needed", True, "enough was freed by the targets before it")
    return None


def execute(intent: Intent, ctx: Context) -> Outcome:
    """Kill the targets in order, re-checking after each whether more must go."""
    dry = ctx.dry_run or intent.shadow
    params = KillParams() if intent.params is None else intent.params
    error = ""
    if not isinstance(params, KillParams):
        error = f"kill: parameters are {type(params).__name__}, not KillParams"
    else:
        try:
            sig = job.signal_from_name(params.signal)
        except (KeyError, ValueError):
            error = f"kill: not a signal: {params.signal!r}"
    if error or not isinstance(params, KillParams):
        log_action(intent, ctx, error=error)
        return Outcome(ok=False, detail=error, dry_run=dry)
    results: list[TargetResult] = []
    rest: tuple[str, bool, str] | None = None
    last = len(intent.targets) - 1
    router = Router(ctx, params.via, "kill")  # a Slurm job's process: scancel (slurm_route)
    for index, target in enumerate(intent.targets):
        if rest is not None:
            result = _result(target, rest[1], rest[0], rest[2])
        else:
            try:
                via_slurm = router.kill(target, params, sig, dry)
                result = via_slurm or router.noted(target, _kill(target, params, sig, ctx, dry))
            except PinError as err:
                result = err.result(target)
            except (OSError, psutil.Error) as err:
                result = _result(target, False, "error", str(err))
            if result.state == "cancelled" or ctx.cancel.is_set():
                rest = (
                    "cancelled",
                    False,
                    CANCELLED,
                )
            elif not dry and result.state in ENDED and index < last:
                rest = _recheck(params, ctx)
        results.append(result)
        log_action(
            intent,
            ctx,
            result,
            signal=sig.name,
            group=str(params.process_group).lower(),
            user=target.user or "-",
            cmd=target.command,
        )
    return summarise(results, dry_run=dry, what="kill")
