"""What every executor shares: its context, its signature, and its one log line per action.

An executor is a module named after its step kind with one function::

    def execute(intent: Intent, ctx: Context) -> Outcome

It re-reads each target just before acting, runs its pre-flight checks (identity, permission
probe with signal 0) even in dry-run, and checks ``ctx.dry_run`` at the last line before the
system call. It never raises for a target: what went wrong is a ``TargetResult``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpuwarden.actions.slurm import Slurm
from gpuwarden.clock import Clock
from gpuwarden.model import Intent, Outcome, TargetResult

log = logging.getLogger("gpuwarden.action")


class PowerControl(Protocol):
    """The NVML calls ``power_cap`` needs (real: sources.nvml; tests: a fake)."""

    def power_limit_w(self, gpu: int) -> float | None: ...

    def power_limit_range_w(self, gpu: int) -> tuple[float, float] | None: ...

    def default_power_limit_w(self, gpu: int) -> float | None: ...

    def set_power_limit_w(self, gpu: int, watts: float) -> None: ...


class Waiter(Protocol):
    def wait(self, seconds: float) -> bool: ...


class CloudProvisioner(Protocol):
    """What ``provision`` needs (real: ``gpuwarden.cloud.service.CloudService``)."""

    def provision(
        self,
        intent: Intent,
        profile_name: str,
        count: int | None,
        *,
        dry_run: bool,
        now: float,
        waiter: Waiter,
    ) -> Outcome: ...


@dataclass
class Context:
    """What an executor may use. ``dry_run`` is the global switch or the rule's shadow mode."""

    dry_run: bool
    clock: Clock
    host: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)
    power: PowerControl | None = None
    # Re-reads the machine and answers whether the step still needs to free more memory
    # (a kill checks it after each victim, so it never kills more than needed).
    still_needed: Callable[[], bool] | None = None
    facts: dict[str, str] = field(default_factory=dict)  # incident facts for exec's environment
    cloud: CloudProvisioner | None = None
    ack_spool: Path | None = None  # the config's ack_spool (None: job.DEFAULT_ACK_DIR)
    # Why a process is protected (the config's protected list), None when it is not: a kill
    # of a process group leaves such members alone.
    protection: Callable[[int], str | None] | None = None
    # The user (and group) exec steps run as, without capabilities, unless a step says
    # as_root: true. None: as the daemon itself (drills, and tests of the executor alone).
    exec_user: str | None = None
    exec_group: str | None = None
    slurm: Slurm | None = None  # Slurm's commands (the config's ``slurm``), None when turned off

    def wait(self, seconds: float) -> bool:
        """Sleep on the context's clock; False when cancelled (a stop, or an abort)."""
        if self.cancel.is_set():
            return False
        self.clock.sleep(seconds)
        return not self.cancel.is_set()


class Executor(Protocol):
    def __call__(self, intent: Intent, ctx: Context) -> Outcome: ...


def safe(value: object, limit: int = 200) -> str:
    """A value for one log line: no newlines or control characters, bounded, quoted if needed."""
    text = "".join(ch if ch.isprintable() else "?" for ch in str(value))[:limit]
    if " " in text or '"' in text or "=" in text or "\\" in text or not text:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def log_action(
    intent: Intent, ctx: Context, result: TargetResult | None = None, **extra: Any
) -> None:
    """One greppable line per action: ``action=kill pid=123 rule=… incident=… dry_run=…``."""
    parts = [f"action={intent.kind}"]
    if result is not None:
        parts += [f"pid={result.pid}", f"result={safe(result.state)}"]
    parts += [
        f"rule={safe(intent.rule)}",
        f"incident={safe(intent.incident)}",
        f"dry_run={str(ctx.dry_run or intent.shadow).lower()}",
    ]
    parts += [f"{k}={safe(v)}" for k, v in extra.items()]
    if result is not None and result.detail:
        parts.append(f"detail={safe(result.detail)}")
    log.info(" ".join(parts))


def summarise(results: list[TargetResult], *, dry_run: bool, what: str) -> Outcome:
    """An Outcome from per-target results: ok when every target ended as intended."""
    if not results:
        return Outcome(ok=True, detail=f"{what}: no targets", dry_run=dry_run)
    failed = [r for r in results if not r.ok]
    detail = ", ".join(f"{r.pid} {r.state}" for r in results)
    return Outcome(
        ok=not failed,
        recoverable=any(r.state == "denied" for r in failed),
        detail=f"{what}: {detail}",
        dry_run=dry_run,
        targets=tuple(results),
    )
