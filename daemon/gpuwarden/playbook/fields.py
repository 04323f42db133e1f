"""The documented fields playbook expressions can read: one catalogue for the compiler, the docs
and the JSON Schema.

An expression is evaluated against an *environment*: a dict whose names are the roots
``gpu`` (a ``model.GpuState``), ``process`` (a ``model.GpuProcess``), ``host`` (a ``HostView``),
``event`` (a ``model.Event``) and ``time`` (a ``TimeView``), plus three internal names the engine
fills in and expressions can never name themselves:

- ``_now``: the tick's time (seconds since the epoch), for ``process.age_s``;
- ``_gpu_procs``: GPU index -> number of processes on it, for ``gpu.process_count``;
- ``_h``: the history of the current scope (``HistoryView``), for avg/min/max/rate/predict/held_for.

``tick_env`` (in ``views``, with ``HostView`` and ``TimeView``; re-exported here) builds the
part that is the same for every scope of one tick; the engine copies it and adds the scope's
roots and ``_h``. Every field's ``accessor`` is a Python expression over those names and the
helpers in ``helper_globals``; a field the device or the OS cannot tell reads as ``None``, and
so does a field of a sub-object that is missing (``gpu.ecc`` on a GPU without ECC). Nothing here
does I/O: the clock and the time zone come in as arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuwarden.model import THROTTLE_REASONS, EventKind
from gpuwarden.playbook.views import (
    WEEKDAYS,
    HostView,
    TickEnvs,
    TimeView,
    gpu_process_counts,
    host_view,
    tick_env,
    time_view,
)

__all__ = [
    "FIELDS",
    "FUNCTIONS",
    "ROOTS",
    "Field",
    "Function",
    "HostView",
    "TickEnvs",
    "TimeView",
    "gpu_process_counts",
    "helper_globals",
    "host_view",
    "tick_env",
    "time_view",
]

ROOTS = ("gpu", "process", "host", "event", "time")
TYPES = ("number", "integer", "string", "boolean", "list[string]", "priority")
NUMERIC_TYPES = frozenset({"number", "integer"})
# Throttle reasons that say nothing is wrong: an idle GPU, or clocks an administrator pinned.
BENIGN_THROTTLE = frozenset({"gpu_idle", "applications_clocks_setting"})


@dataclass(frozen=True)
class Field:
    """One documented field. ``accessor`` is trusted Python (ours), never user text."""

    path: str
    accessor: str
    type: str
    nullable: bool
    doc: str
    numeric: bool = field(init=False)
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"unknown field type {self.type!r} for {self.path}")
        object.__setattr__(self, "numeric", self.type in NUMERIC_TYPES)

    @property
    def root(self) -> str:
        return self.path.split(".", 1)[0]


@dataclass(frozen=True)
class Function:
    """One documented expression function (for docs, schema and error hints)."""

    name: str
    signature: str
    doc: str


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        Function("avg", "avg(field, window)", "mean of the field's samples over the last window"),
        Function("min", "min(field, window)", "smallest sample over the last window"),
        Function("max", "max(field, window)", "largest sample over the last window"),
        Function(
            "rate",
            "rate(field, window)",
            "change per second over the window (last minus first sample over their time span)",
        ),
        Function(
            "predict",
            "predict(field, horizon[, window])",
            "least-squares line over the last window (default 5m) extrapolated horizon ahead",
        ),
        Function(
            "held_for",
            "held_for(condition)",
            "seconds the condition has been true without a break (0 when it is false now)",
        ),
        Function("abs", "abs(number)", "absolute value"),
    )
}


def _sub(parent: str, name: str) -> str:
    """Accessor for a field of an optional sub-object: ``None`` when the sub-object is."""
    return f"(None if {parent} is None else {parent}.{name})"


_THROTTLE_CHOICES = tuple(THROTTLE_REASONS.values())
_EVENT_KINDS = tuple(k.value for k in EventKind)

_CATALOGUE: tuple[Field, ...] = (
    # -- gpu ----------------------------------------------------------------------------------
    Field("gpu.index", "gpu.index", "integer", False, "NVML index of the GPU (0, 1, ...)"),
    Field("gpu.name", "gpu.name", "string", True, "product name, e.g. NVIDIA A100-SXM4-80GB"),
    Field("gpu.uuid", "gpu.uuid", "string", True, "GPU UUID (GPU-...)"),
    Field("gpu.pci_bus_id", "gpu.pci_bus_id", "string", True, "PCI bus id, e.g. 00000000:07:00.0"),
    Field("gpu.lost", "gpu.lost", "boolean", False, "the GPU could not be read at all"),
    Field("gpu.error", "gpu.error", "string", True, "why the GPU could not be read (when lost)"),
    Field("gpu.memory.used_mib", "gpu.memory.used_mib", "integer", True, "memory used, MiB"),
    Field("gpu.memory.total_mib", "gpu.memory.total_mib", "integer", True, "memory size, MiB"),
    Field("gpu.memory.free_mib", "gpu.memory.free_mib", "integer", True, "memory free, MiB"),
    Field(
        "gpu.memory.reserved_mib",
        "gpu.memory.reserved_mib",
        "integer",
        True,
        "memory reserved by the driver, MiB",
    ),
    Field("gpu.memory.used_pct", "gpu.memory.used_pct", "number", True, "memory used, percent"),
    Field("gpu.memory.free_pct", "gpu.memory.free_pct", "number", True, "memory free, percent"),
    Field(
        "gpu.utilization_pct",
        "gpu.utilization_pct",
        "integer",
        True,
        "percent of time a kernel was running (not reported in MIG mode)",
    ),
    Field(
        "gpu.memory_utilization_pct",
        "gpu.memory_utilization_pct",
        "integer",
        True,
        "percent of time memory was read or written",
    ),
    Field("gpu.temperature_c", "gpu.temperature_c", "integer", True, "core temperature, °C"),
    Field("gpu.power_w", "gpu.power_w", "number", True, "power draw, watts"),
    Field("gpu.power_limit_w", "gpu.power_limit_w", "number", True, "enforced power limit, watts"),
    Field(
        "gpu.power_pct",
        "(gpu.power_w * 100.0 / gpu.power_limit_w"
        " if gpu.power_w is not None and gpu.power_limit_w else None)",
        "number",
        True,
        "power draw as percent of the enforced limit",
    ),
    Field(
        "gpu.throttle",
        "gpu.throttle",
        "list[string]",
        True,
        'active clock-event (throttle) reasons, e.g. "hw_thermal_slowdown" in gpu.throttle',
        choices=_THROTTLE_CHOICES,
    ),
    Field(
        "gpu.throttled",
        "(None if gpu.throttle is None else not _benign_throttle.issuperset(gpu.throttle))",
        "boolean",
        True,
        "any throttle reason other than gpu_idle and applications_clocks_setting",
    ),
    Field(
        "gpu.ecc.volatile_corrected",
        _sub("gpu.ecc", "volatile_corrected"),
        "integer",
        True,
        "corrected ECC errors since the driver loaded",
    ),
    Field(
        "gpu.ecc.volatile_uncorrected",
        _sub("gpu.ecc", "volatile_uncorrected"),
        "integer",
        True,
        "uncorrected ECC errors since the driver loaded",
    ),
    Field(
        "gpu.ecc.aggregate_corrected",
        _sub("gpu.ecc", "aggregate_corrected"),
        "integer",
        True,
        "corrected ECC errors over the GPU's life",
    ),
    Field(
        "gpu.ecc.aggregate_uncorrected",
        _sub("gpu.ecc", "aggregate_uncorrected"),
        "integer",
        True,
        "uncorrected ECC errors over the GPU's life",
    ),
    Field(
        "gpu.remapped_rows.correctable",
        _sub("gpu.remapped_rows", "correctable"),
        "integer",
        True,
        "rows remapped for correctable errors (Ampere and later)",
    ),
    Field(
        "gpu.remapped_rows.uncorrectable",
        _sub("gpu.remapped_rows", "uncorrectable"),
        "integer",
        True,
        "rows remapped for uncorrectable errors (Ampere and later)",
    ),
    Field(
        "gpu.remapped_rows.pending",
        _sub("gpu.remapped_rows", "pending"),
        "boolean",
        True,
        "a row remap waits for a GPU reset",
    ),
    Field(
        "gpu.remapped_rows.failure",
        _sub("gpu.remapped_rows", "failure"),
        "boolean",
        True,
        "a row remap failed: the GPU should be replaced",
    ),
    Field(
        "gpu.retired_pages.single_bit",
        _sub("gpu.retired_pages", "single_bit"),
        "integer",
        True,
        "pages retired for single-bit errors (before Ampere)",
    ),
    Field(
        "gpu.retired_pages.double_bit",
        _sub("gpu.retired_pages", "double_bit"),
        "integer",
        True,
        "pages retired for double-bit errors (before Ampere)",
    ),
    Field(
        "gpu.retired_pages.pending",
        _sub("gpu.retired_pages", "pending"),
        "boolean",
        True,
        "a page retirement waits for a GPU reset",
    ),
    Field("gpu.pstate", "gpu.pstate", "integer", True, "performance state, 0 (fastest) to 15"),
    Field("gpu.mig_mode", "gpu.mig_mode", "boolean", True, "MIG mode is enabled"),
    Field(
        "gpu.process_count",
        "(None if gpu.lost else _gpu_procs.get(gpu.index, 0))",
        "integer",
        True,
        "processes using the GPU (unknown when the GPU is lost)",
    ),
    # -- process ------------------------------------------------------------------------------
    Field("process.pid", "process.pid", "integer", False, "process id (host PID namespace)"),
    Field("process.gpu", "process.gpu", "integer", False, "index of the GPU this entry is about"),
    Field(
        "process.gpu_memory_mib",
        "process.gpu_memory_mib",
        "integer",
        True,
        "GPU memory the process holds on this GPU, MiB",
    ),
    Field(
        "process.sm_util_pct",
        "process.sm_util_pct",
        "integer",
        True,
        "SM utilization of the process on this GPU, percent (0 when it ran no kernel)",
    ),
    Field(
        "process.idle",
        "(None if process.sm_util_pct is None else process.sm_util_pct == 0)",
        "boolean",
        True,
        "the process ran no kernel on this GPU in the last sample (sm_util_pct == 0)",
    ),
    Field("process.kind", "process.kind", "string", False, "compute or graphics"),
    Field("process.user", "process.info.user", "string", True, "user name of the owner"),
    Field("process.uid", "process.info.uid", "integer", True, "user id of the owner"),
    Field(
        "process.groups",
        "process.info.groups",
        "list[string]",
        False,
        'group names of the owner, e.g. "ml-research" in process.groups',
    ),
    Field("process.name", "process.info.name", "string", True, "process name, e.g. python3"),
    Field(
        "process.cmdline",
        '(None if process.info.cmdline is None else " ".join(process.info.cmdline))',
        "string",
        True,
        'command line joined with spaces, e.g. "train.py" in process.cmdline',
    ),
    Field(
        "process.priority",
        "_rank.get(process.info.priority)",
        "priority",
        False,
        "priority class from the config; compare with class names: process.priority <= normal",
    ),
    Field(
        "process.declared_priority",
        "_rank.get(process.info.declared_priority)",
        "priority",
        True,
        "priority class the job declared in GPUWARDEN_PRIORITY (before the config's cap)",
    ),
    Field(
        "process.checkpointable",
        "process.info.checkpointable",
        "boolean",
        False,
        "the job declared a checkpoint signal",
    ),
    Field(
        "process.checkpoint_signal",
        "process.info.checkpoint_signal",
        "string",
        True,
        "the signal the job asked for before it is stopped, e.g. SIGUSR1",
    ),
    Field(
        "process.status",
        "process.info.status",
        "string",
        True,
        "OS state as psutil names it: running, sleeping, disk-sleep, stopped, zombie, ...",
    ),
    Field(
        "process.zombie",
        '(None if process.info.status is None else process.info.status == "zombie")',
        "boolean",
        True,
        "the process has exited and waits to be reaped",
    ),
    Field(
        "process.orphaned",
        "process.info.orphaned",
        "boolean",
        False,
        "NVML reports the PID but no such process exists: memory held by a dead PID",
    ),
    Field("process.nice", "process.info.nice", "integer", True, "nice value (-20 to 19)"),
    Field("process.cpu_pct", "process.info.cpu_pct", "number", True, "CPU use, percent"),
    Field("process.rss_mib", "process.info.rss_mib", "integer", True, "resident memory, MiB"),
    Field("process.age_s", "process.age_s(_now)", "number", True, "seconds since it started"),
    Field("process.container", "process.info.container", "string", True, "container id"),
    Field("process.pod", "process.info.pod", "string", True, "Kubernetes pod UID"),
    Field("process.slurm_job", "process.info.slurm_job", "string", True, "Slurm job id"),
    Field("process.unit", "process.info.systemd_unit", "string", True, "systemd unit name"),
    # -- host ---------------------------------------------------------------------------------
    Field("host.name", "host.name", "string", False, "host name"),
    Field("host.gpu_count", "host.gpu_count", "integer", False, "GPUs in the snapshot"),
    Field("host.gpus_lost", "host.gpus_lost", "integer", False, "GPUs that could not be read"),
    Field(
        "host.memory_used_mib",
        "host.memory_used_mib",
        "integer",
        True,
        "GPU memory used over all GPUs that report it, MiB",
    ),
    Field(
        "host.memory_total_mib",
        "host.memory_total_mib",
        "integer",
        True,
        "GPU memory size over all GPUs that report it, MiB",
    ),
    Field(
        "host.memory_used_pct",
        "host.memory_used_pct",
        "number",
        True,
        "GPU memory used over all GPUs that report it, percent",
    ),
    Field(
        "host.process_count",
        "host.process_count",
        "integer",
        False,
        "distinct processes using any GPU",
    ),
    # -- event --------------------------------------------------------------------------------
    Field(
        "event.kind",
        "event.kind",
        "string",
        False,
        "what happened: " + ", ".join(_EVENT_KINDS),
        choices=_EVENT_KINDS,
    ),
    Field("event.gpu", "event.gpu", "integer", True, "index of the GPU it happened on"),
    Field("event.xid", "event.xid", "integer", True, "XID number (for kind xid)"),
    Field("event.detail", "event.detail", "string", False, "free text from the source"),
    Field("event.time", "event.time", "number", False, "when it happened, seconds since epoch"),
    # -- time ---------------------------------------------------------------------------------
    Field("time.epoch", "time.epoch", "number", False, "seconds since the epoch"),
    Field("time.year", "time.year", "integer", False, "year, in the configured time zone"),
    Field("time.month", "time.month", "integer", False, "month, 1-12"),
    Field("time.day", "time.day", "integer", False, "day of the month, 1-31"),
    Field("time.hour", "time.hour", "integer", False, "hour, 0-23"),
    Field("time.minute", "time.minute", "integer", False, "minute, 0-59"),
    Field("time.weekday", "time.weekday", "integer", False, "day of the week, 1 (Mon) to 7 (Sun)"),
    Field(
        "time.weekday_name",
        "time.weekday_name",
        "string",
        False,
        "day of the week: Mon, Tue, Wed, Thu, Fri, Sat, Sun",
        choices=WEEKDAYS,
    ),
    Field("time.is_weekend", "time.is_weekend", "boolean", False, "Saturday or Sunday"),
)

FIELDS: dict[str, Field] = {f.path: f for f in _CATALOGUE}


def helper_globals(priority_names: Sequence[str]) -> dict[str, object]:
    """The globals accessors need, with no builtins at all. One dict per compiler, because the
    rank table depends on the configured priority classes (``priority_names``: highest first;
    the lowest class has rank 0, as ``config.Priorities.rank``)."""
    count = len(priority_names)
    return {
        "__builtins__": {},
        "_rank": {name: count - 1 - i for i, name in enumerate(priority_names)},
        "_benign_throttle": BENIGN_THROTTLE,
    }
