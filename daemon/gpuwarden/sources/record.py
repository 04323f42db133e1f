"""``gpuwarden record``: live telemetry written as a scenario (format v1) to replay later.

Every observed process becomes a job (``spawn: false``) carrying what attribution knew of it;
every sample becomes a keyframe. Only the environment variables gpuwarden itself reads are
recorded — a recording never carries the rest of a process's environment.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.model import EventKind, GpuProcess, GpuState, Snapshot

RECORDED_ENV = ("GPUWARDEN_PRIORITY", "GPUWARDEN_CHECKPOINT_SIGNAL", "SLURM_JOB_ID")


def _job_id(proc: GpuProcess) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", proc.info.name or "proc").strip("-.") or "proc"
    return f"{name}-{proc.pid}"


def _job(proc: GpuProcess, start: float) -> dict[str, Any]:
    info = proc.info
    job: dict[str, Any] = {"id": _job_id(proc)}
    job["cmdline"] = list(info.cmdline) if info.cmdline else [info.name or f"pid{proc.pid}"]
    if info.orphaned:
        job["orphaned"] = True
        return job
    for key in ("user", "uid", "nice", "container", "pod", "slurm_job"):
        value = getattr(info, key)
        if value is not None and value != 0:
            job[key] = value
    if info.groups:
        job["groups"] = list(info.groups)
    if info.exe:
        job["exe"] = info.exe
    if info.systemd_unit:
        job["unit"] = info.systemd_unit
    if info.cgroup and info.cgroup != "/":
        job["cgroup"] = info.cgroup  # where the unit lies says whether it may raise a class
    if info.status in ("zombie", "stopped", "disk-sleep", "sleeping"):
        job["status"] = info.status
    if info.rss_mib is not None:
        job["rss_mib"] = info.rss_mib
    env = {k: v for k, v in (info.env or {}).items() if k in RECORDED_ENV}
    if env:
        job["env"] = env
    if info.create_time is not None and info.create_time < start:
        job["started"] = f"{int(start - info.create_time)}s"
    return job


def _gpu_spec(gpu: GpuState) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "index": gpu.index,
        "name": gpu.name or "unknown",
        "memory_total_mib": gpu.memory.total_mib or 1,
    }
    if gpu.uuid:
        spec["uuid"] = gpu.uuid
    if gpu.pci_bus_id:
        spec["pci_bus_id"] = gpu.pci_bus_id
    if gpu.memory.reserved_mib is not None:
        spec["memory_reserved_mib"] = gpu.memory.reserved_mib
    if gpu.power_limit_w is not None:
        spec["power_limit_w"] = round(gpu.power_limit_w, 1)
    if gpu.mig_mode:
        spec["mig_mode"] = True
    unsupported = [
        name
        for name, value in (
            ("utilization_pct", gpu.utilization_pct),
            ("memory_utilization_pct", gpu.memory_utilization_pct),
            ("temperature_c", gpu.temperature_c),
            ("power_w", gpu.power_w),
            ("throttle", gpu.throttle),
            ("ecc", gpu.ecc),
            ("pstate", gpu.pstate),
        )
        if value is None
    ]
    if unsupported and not gpu.lost:
        spec["unsupported"] = unsupported
    return spec


def _frame(gpu: GpuState, procs: Iterable[GpuProcess]) -> dict[str, Any]:
    if gpu.lost:
        return {"lost": gpu.error or True}
    frame: dict[str, Any] = {}
    for key in ("utilization_pct", "memory_utilization_pct", "temperature_c", "pstate"):
        value = getattr(gpu, key)
        if value is not None:
            frame[key] = value
    if gpu.power_w is not None:
        frame["power_w"] = round(gpu.power_w, 1)
    if gpu.throttle:
        frame["throttle"] = list(gpu.throttle)
    if gpu.ecc is not None:
        frame["ecc"] = {k: v for k, v in dataclasses.asdict(gpu.ecc).items() if v is not None}
    jobs: dict[str, Any] = {}
    attributed = 0
    for proc in procs:
        mib = proc.gpu_memory_mib or 0
        attributed += mib
        jobs[_job_id(proc)] = (
            mib if proc.sm_util_pct is None else {"memory_mib": mib, "sm_pct": proc.sm_util_pct}
        )
    frame["jobs"] = jobs
    if gpu.memory.used_mib is not None:
        frame["other_mib"] = max(0, gpu.memory.used_mib - attributed)
    return frame


def to_scenario(snapshots: list[Snapshot], name: str) -> dict[str, Any]:
    """A scenario document (plain data, ready for YAML) from snapshots in time order."""
    if not snapshots:
        raise ValueError("nothing was recorded")
    first = snapshots[0]
    start = first.time
    jobs: dict[str, dict[str, Any]] = {}
    timeline: list[dict[str, Any]] = []
    for snap in snapshots:
        for proc in snap.processes:
            jobs.setdefault(_job_id(proc), _job(proc, start))
        frame: dict[str, Any] = {
            "at": f"{round(snap.time - start, 3):g}s",
            "gpus": {gpu.index: _frame(gpu, snap.processes_on(gpu.index)) for gpu in snap.gpus},
        }
        events = [
            {
                k: v
                for k, v in (
                    ("gpu", e.gpu),
                    ("kind", str(e.kind)),
                    ("xid", e.xid),
                    ("detail", e.detail),
                )
                if v not in (None, "")
            }
            for e in snap.events
            if e.kind is not EventKind.GPU_LOST  # replay derives it from ``lost``
        ]
        if events:
            frame["events"] = events
        timeline.append(frame)
    timeline[-1]["end"] = True
    return {
        "version": 1,
        "name": name,
        "description": f"Recorded from {first.source or 'a live source'} on {first.host}.",
        "host": first.host,
        "start": dt.datetime.fromtimestamp(start, dt.UTC).isoformat(timespec="seconds"),
        "gpus": [_gpu_spec(g) for g in first.gpus],
        "jobs": list(jobs.values()),
        "timeline": timeline,
    }


def write(document: dict[str, Any], out: Path) -> None:
    """Write atomically: a reader never sees half a recording."""
    text = "# Recorded by gpuwarden record; scenario format v1 (docs/scenarios.md).\n"
    text += yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
