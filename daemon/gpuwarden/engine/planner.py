"""Victim planning: which processes a step acts on, in which order, and why the others not.

1. Candidates come from the incident's scope (the processes on its GPU, the process itself,
   or, for host and event rules, every process).
2. Each is dropped with a reason when ``select`` is false for it, or when it is orphaned,
   protected, a zombie, already targeted by such a step, (checkpoint) not opted in, or (requeue,
   and any step with ``via: slurm``) in no Slurm job.
3. The rest are ordered (default: lowest priority first, then most GPU memory, then youngest)
   and taken one by one until ``limit`` is reached or ``free_until`` holds on the projected
   state — the snapshot with the memory of the processes chosen so far freed, on the GPUs
   where they hold it.
4. With ``free_until``, once it holds, every chosen process it does not need is let go, the
   most important first (the reverse of the order): a process stays only if ``free_until``
   would fail without it. Then ``limit`` takes the first of those. Five small processes
   declared ``scavenger`` ahead of a 79 GB one free nothing that matters, so they are dropped
   and the 79 GB one is the plan: the step is as small as the situation allows, its targets
   are what frees the memory, and a limit (the step's, or the safety rails') cannot be used
   up by decoys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuwarden.engine.protect import ProtectedMatcher
from gpuwarden.engine.scopes import Scope
from gpuwarden.model import GpuProcess, GpuState, Memory, Reason, Skipped, Target
from gpuwarden.playbook.fields import HostView
from gpuwarden.playbook.loader import CompiledStep
from gpuwarden.playbook.schema import CheckpointParams, RequeueParams

Env = dict[str, Any]


def target_of(proc: GpuProcess, memory: int | None = None) -> Target:
    info = proc.info
    return Target(
        pid=proc.pid,
        create_time=info.create_time,
        gpu=proc.gpu,
        user=info.user,
        priority=info.priority,
        gpu_memory_mib=proc.gpu_memory_mib if memory is None else memory,
        command=info.command[:200],
        checkpoint_signal=info.checkpoint_signal,
        uid=info.uid,
        ack_dir=(info.env or {}).get("GPUWARDEN_ACK_DIR"),
        slurm_job=info.slurm_job,
        job=info.job,
    )


def identity(proc: GpuProcess) -> tuple[int, float | None]:
    return (proc.pid, proc.info.create_time)


def freed_gpu(gpu: GpuState, mib: int) -> GpuState:
    """``gpu`` as it would be with ``mib`` more memory free."""
    m = gpu.memory
    if m.used_mib is None:
        return gpu
    used = max(0, m.used_mib - mib)
    free = None if m.total_mib is None else m.total_mib - used
    return replace(gpu, memory=Memory(m.total_mib, used, free, m.reserved_mib))


def freed_host(host: HostView, mib: int) -> HostView:
    """``host`` as it would be with ``mib`` more GPU memory free."""
    if host.memory_used_mib is None or not host.memory_total_mib:
        return host
    used = max(0, host.memory_used_mib - mib)
    return replace(host, memory_used_mib=used, memory_used_pct=100.0 * used / host.memory_total_mib)


@dataclass(frozen=True)
class Plan:
    targets: tuple[Target, ...]
    skipped: tuple[Skipped, ...]
    reason: Reason


class Planner:
    def __init__(self, protected: ProtectedMatcher) -> None:
        self.protected = protected

    def plan(
        self,
        step: CompiledStep,
        candidates: Sequence[GpuProcess],
        env_for: Callable[[GpuProcess], Env],
        already: set[tuple[int, float | None]],
        projected: Callable[[Mapping[int, int]], Env] | None,
    ) -> Plan:
        """``projected(freed)`` is the env ``free_until`` is checked in; ``freed`` maps a GPU
        index to the MiB the processes chosen so far hold on it."""
        params = step.spec.params
        skipped: list[Skipped] = []
        eligible: list[tuple[GpuProcess, Env]] = []
        merged, spread = _merge_by_pid(candidates)
        for proc in merged:
            env = env_for(proc)
            if step.select is not None and not step.select.test(env):
                reason: Reason | None = Reason.NOT_SELECTED
            else:
                reason = self._excluded(step, proc, already)
            if reason is None:
                eligible.append((proc, env))
            else:
                skipped.append(Skipped(target_of(proc), reason))
        eligible.sort(key=lambda item: _sort_key(step, item[1]))
        limit = getattr(params, "limit", None)
        goal = step.free_until if projected is not None else None
        chosen: list[Target] = []
        freed: dict[int, int] = {}
        for proc, _env in eligible:
            if goal is not None and projected is not None and goal.test(projected(freed)):
                skipped.append(Skipped(target_of(proc), Reason.FREE_UNTIL_MET))
                continue
            if goal is None and limit is not None and len(chosen) >= limit:
                skipped.append(Skipped(target_of(proc), Reason.LIMIT_REACHED))
                continue
            chosen.append(target_of(proc))
            for index, mib in spread[identity(proc)].items():
                freed[index] = freed.get(index, 0) + mib
        if goal is not None and projected is not None:
            if len(chosen) > 1 and goal.test(projected(freed)):
                chosen = self._needed(chosen, spread, step, projected, skipped)
            if limit is not None:  # the limit takes the first of what is needed
                skipped += [Skipped(t, Reason.LIMIT_REACHED) for t in chosen[limit:]]
                chosen = chosen[:limit]
        if chosen:
            reason = Reason.STEP_DUE
        elif eligible and step.free_until is not None:
            reason = Reason.FREE_UNTIL_MET
        else:
            reason = Reason.NO_CANDIDATES
        return Plan(tuple(chosen), tuple(skipped), reason)

    @staticmethod
    def _needed(
        chosen: list[Target],
        spread: dict[Identity, dict[int, int]],
        step: CompiledStep,
        projected: Callable[[Mapping[int, int]], Env],
        skipped: list[Skipped],
    ) -> list[Target]:
        """``chosen`` without those ``free_until`` holds without, tried from the last (the
        most important) to the first; the order of the rest is kept."""
        assert step.free_until is not None
        kept = list(chosen)
        for target in reversed(chosen):
            rest = [t for t in kept if t is not target]
            freed: dict[int, int] = {}
            for other in rest:
                for index, mib in spread[(other.pid, other.create_time)].items():
                    freed[index] = freed.get(index, 0) + mib
            if step.free_until.test(projected(freed)):
                kept = rest
                skipped.append(Skipped(target, Reason.FREE_UNTIL_MET))
        return kept

    def _excluded(
        self, step: CompiledStep, proc: GpuProcess, already: set[tuple[int, float | None]]
    ) -> Reason | None:
        info = proc.info
        if info.orphaned:
            return Reason.ORPHANED
        if self.protected.why(info) is not None:
            return Reason.PROTECTED
        if info.zombie:
            return Reason.ZOMBIE
        if identity(proc) in already:
            return Reason.ALREADY_TARGETED
        params = step.spec.params
        if (
            isinstance(params, CheckpointParams)
            and params.signal is None
            and not info.checkpointable
        ):
            return Reason.NOT_CHECKPOINTABLE
        if info.slurm_job is None and (
            isinstance(params, RequeueParams) or getattr(params, "via", None) == "slurm"
        ):
            return Reason.NOT_SLURM_JOB
        return None


Identity = tuple[int, float | None]


def _merge_by_pid(
    candidates: Sequence[GpuProcess],
) -> tuple[list[GpuProcess], dict[Identity, dict[int, int]]]:
    """One entry per process; a process on several GPUs counts all its memory. Also, per
    process, the MiB it holds on each GPU (what choosing it frees where)."""
    merged: dict[Identity, GpuProcess] = {}
    spread: dict[Identity, dict[int, int]] = {}
    for proc in candidates:
        key = identity(proc)
        on = spread.setdefault(key, {})
        if proc.gpu_memory_mib is not None:
            on[proc.gpu] = on.get(proc.gpu, 0) + proc.gpu_memory_mib
        seen = merged.get(key)
        if seen is None:
            merged[key] = proc
        elif proc.gpu_memory_mib is not None:
            total = (seen.gpu_memory_mib or 0) + proc.gpu_memory_mib
            merged[key] = replace(seen, gpu_memory_mib=total)
    return list(merged.values()), spread


def _sort_key(step: CompiledStep, env: Env) -> tuple[Any, ...]:
    key: list[Any] = []
    for order in step.order:
        value = order.expr.evaluate(env)
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int | float):
            key.append((1, 0.0))  # unknown values sort last either way
            continue
        key.append((0, -value if order.descending else value))
    return tuple(key)


def candidates(for_each: str, scope: Scope, env: Env) -> list[GpuProcess]:
    """The processes a step of an incident may choose from (see the module docstring)."""
    snapshot_procs: Iterable[GpuProcess] = env["_snapshot"].processes
    if for_each == "process":
        return [scope.process] if scope.process is not None else []
    if for_each in ("host", "event"):
        # An event's harm reaches beyond its GPU (the other ranks of a job hang): every
        # process is a candidate, and `select` may narrow it with process.gpu == event.gpu.
        return list(snapshot_procs)
    gpu = (
        scope.gpu.index
        if scope.gpu is not None
        else (scope.event.gpu if scope.event is not None else None)
    )
    if gpu is None:
        return list(snapshot_procs)
    return [p for p in snapshot_procs if p.gpu == gpu]


def process_env(env: Env, proc: GpuProcess) -> Env:
    """``env`` seen from one candidate: its process and the GPU it is on."""
    penv = dict(env)
    penv["process"] = proc
    gpus = env["_gpus"]
    penv["gpu"] = gpus.get(proc.gpu, env["gpu"])
    return penv


def projector(env: Env) -> Callable[[Mapping[int, int]], Env]:
    """The environment ``free_until`` is checked in, with the memory the chosen processes
    hold freed on the GPUs where they hold it: the scope's GPU (``gpu.*``) and the host
    (``host.*``, over the GPUs it counts), whatever the rule's scope."""
    gpu: GpuState | None = env["gpu"]
    host: HostView = env["host"]
    gpus: dict[int, GpuState] = env["_gpus"]
    counted = {
        index
        for index, g in gpus.items()
        if g.memory.used_mib is not None and g.memory.total_mib is not None
    }

    def project(freed: Mapping[int, int]) -> Env:
        penv = dict(env)
        if gpu is not None:
            penv["gpu"] = freed_gpu(gpu, freed.get(gpu.index, 0))
        penv["host"] = freed_host(host, sum(m for i, m in freed.items() if i in counted))
        return penv

    return project
