"""Real model objects and the environments expressions are evaluated in (shared by the
expression, field and history tests)."""

from __future__ import annotations

import datetime

from gpuwarden.model import (
    Ecc,
    Event,
    EventKind,
    GpuProcess,
    GpuState,
    Memory,
    ProcessInfo,
    RemappedRows,
    RetiredPages,
    Snapshot,
)
from gpuwarden.playbook.fields import tick_env

CLASSES = ("critical", "high", "normal", "low", "scavenger")
ALL_ROOTS = frozenset({"gpu", "process", "host", "event", "time"})
UTC = datetime.UTC
# Monday 5 January 2026, 10:30:00 UTC.
NOW = datetime.datetime(2026, 1, 5, 10, 30, tzinfo=UTC).timestamp()

HOT = GpuState(
    index=0,
    name="NVIDIA A100-SXM4-80GB",
    uuid="GPU-0000",
    pci_bus_id="00000000:07:00.0",
    memory=Memory(total_mib=80000, used_mib=78000, free_mib=2000, reserved_mib=0),
    utilization_pct=100,
    memory_utilization_pct=61,
    temperature_c=84,
    power_w=390.0,
    power_limit_w=400.0,
    throttle=("sw_power_cap", "hw_thermal_slowdown"),
    ecc=Ecc(
        volatile_corrected=3,
        volatile_uncorrected=0,
        aggregate_corrected=12,
        aggregate_uncorrected=1,
    ),
    remapped_rows=RemappedRows(correctable=1, uncorrectable=0, pending=True, failure=False),
    pstate=0,
    mig_mode=False,
)
# A GPU that tells nothing: every optional field None.
UNKNOWN = GpuState(index=1)
LOST = GpuState(index=2, lost=True, error="GPU is lost")
IDLE = GpuState(
    index=3,
    memory=Memory(total_mib=80000, used_mib=0, free_mib=80000),
    throttle=("gpu_idle", "applications_clocks_setting"),
    retired_pages=RetiredPages(single_bit=2, double_bit=0, pending=False),
    power_w=60.0,
    power_limit_w=0.0,
)
GPUS = {"hot": HOT, "unknown": UNKNOWN, "lost": LOST, "idle": IDLE}

TRAINER = GpuProcess(
    pid=4242,
    gpu=0,
    gpu_memory_mib=9000,
    sm_util_pct=0,
    info=ProcessInfo(
        pid=4242,
        name="python3",
        cmdline=("python3", "train.py", "--epochs", "90"),
        user="alice",
        uid=1001,
        groups=("alice", "ml"),
        create_time=NOW - 3 * 3600,
        status="sleeping",
        nice=0,
        cpu_pct=12.5,
        rss_mib=2048,
        container="abc123",
        slurm_job="77",
        declared_priority="normal",
        checkpoint_signal="SIGUSR1",
        priority="low",
    ),
)
# NVML reports the PID, /proc has no such process: nothing else is known.
GHOST = GpuProcess(pid=5150, gpu=1, gpu_memory_mib=None, info=ProcessInfo(pid=5150, orphaned=True))
PROCESSES = {"trainer": TRAINER, "ghost": GHOST}

XID79 = Event(EventKind.XID, time=NOW - 1, gpu=0, xid=79, detail="GPU has fallen off the bus")

SNAPSHOT = Snapshot(
    host="gpu-node-7",
    time=NOW,
    gpus=(HOT, UNKNOWN, LOST, IDLE),
    processes=(TRAINER, GHOST),
    events=(XID79,),
)


def env(
    gpu: str | None = "hot",
    process: str | None = None,
    *,
    event: Event | None = None,
    history: object = None,
) -> dict[str, object]:
    """The environment of one scope of a tick of ``SNAPSHOT`` at ``NOW``, UTC."""
    result = tick_env(SNAPSHOT, NOW, UTC)
    result["gpu"] = None if gpu is None else GPUS[gpu]
    result["process"] = None if process is None else PROCESSES[process]
    result["event"] = event
    result["_h"] = history
    return result
