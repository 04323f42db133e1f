"""The data every part of gpuwarden shares: one Snapshot of the machine per tick.

All types are frozen dataclasses. A field the device (or the operating system) cannot tell us
is ``None``, never ``0``: a rule that compares ``None`` must be able to tell "unknown" from "zero".
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

MIB = 1024 * 1024
_T = TypeVar("_T")

# NVML clock-event ("throttle") reasons, bit -> the name gpuwarden uses everywhere
# (status output, JSON, scenarios, playbook expressions such as
# ``"hw_thermal_slowdown" in gpu.throttle``).
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


def throttle_names(mask: int) -> tuple[str, ...]:
    """The reason names set in an NVML clock-event bitmask, lowest bit first."""
    return tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit)


def bytes_to_mib(value: int | None) -> int | None:
    """Whole MiB, rounded down, keeping ``None`` as ``None``."""
    return None if value is None else int(value) // MIB


def positional_maker(cls: type[_T]) -> Callable[..., _T]:
    """A function that makes a ``cls`` (one of the frozen, slotted dataclasses here) from the
    value of every field, in field order, without the dataclass's ``__init__``: that one sets
    each field through ``object.__setattr__`` (frozen), about 0.2 µs a field, which is most of
    the cost of a snapshot's objects where a source builds thousands a second (scenario
    playback). The maker fills an instance of a plain class with the same slots, then gives it
    ``cls`` as its class (Python checks the two layouts are the same): what comes out is a
    ``cls`` like any other (equality, hash, repr, pickling, frozen). Not for a class whose
    ``__init__`` does more than store its arguments (``__post_init__``, ``init=False``)."""
    names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    if (
        getattr(cls, "__slots__", None) != names
        or hasattr(cls, "__post_init__")
        or any(not f.init for f in fields(cls))  # type: ignore[arg-type]
    ):
        raise TypeError(f"{cls.__name__}: not a slotted dataclass whose __init__ only stores")
    draft = type(f"_{cls.__name__}Draft", (), {"__slots__": names})
    params = ", ".join(names)
    stores = "".join(f"    made.{name} = {name}\n" for name in names)
    code = (
        f"def make({params}):\n    made = new(draft)\n{stores}    made.__class__ = cls\n"
        "    return made\n"
    )
    scope: dict[str, Any] = {"new": object.__new__, "draft": draft, "cls": cls}
    exec(code, scope)  # noqa: S102 - the code is built from the class's own field names
    make: Callable[..., _T] = scope["make"]
    make.__qualname__ = make.__name__ = f"make_{cls.__name__}"
    make.__doc__ = f"A {cls.__name__} from every field's value, in order ({params})."
    return make


@dataclass(frozen=True, slots=True)
class Memory:
    """Framebuffer memory of one GPU, in MiB."""

    total_mib: int | None = None
    used_mib: int | None = None
    free_mib: int | None = None
    reserved_mib: int | None = None

    @property
    def used_pct(self) -> float | None:
        if self.total_mib is None or self.used_mib is None or self.total_mib <= 0:
            return None
        return 100.0 * self.used_mib / self.total_mib

    @property
    def free_pct(self) -> float | None:
        used = self.used_pct
        return None if used is None else 100.0 - used


@dataclass(frozen=True, slots=True)
class Ecc:
    """ECC error counters; each is ``None`` where the device does not count it."""

    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """Row remapping (Ampere and later)."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True, slots=True)
class RetiredPages:
    """Page retirement (before Ampere)."""

    single_bit: int
    double_bit: int
    pending: bool


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU at one instant. ``lost=True``: it could not be read at all (``error`` says why)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    lost: bool = False
    error: str | None = None
    memory: Memory = field(default_factory=Memory)
    utilization_pct: int | None = None
    memory_utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle: tuple[str, ...] | None = None
    ecc: Ecc | None = None
    remapped_rows: RemappedRows | None = None
    retired_pages: RetiredPages | None = None
    pstate: int | None = None
    mig_mode: bool | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    energy_mj: int | None = None  # energy used since the driver loaded, millijoules

    @property
    def device(self) -> str:
        """The device node name dcgm-exporter uses as a label (``nvidia0``)."""
        return f"nvidia{self.index}"


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """What the operating system tells about one PID: who owns it and how much it matters.

    Every field but ``pid`` may be ``None`` when it could not be read (the process is gone,
    or reading it was denied). ``orphaned`` means NVML reports the PID but /proc has no such
    process: its memory is held by something gpuwarden cannot see or signal.

    Some facts the process's owner chooses (``name``, ``cmdline``, ``env``, and the cgroup when
    it lies in a subtree delegated to them); others the kernel enforces (``uid``, ``groups``,
    ``exe``, a cgroup owned by root). ``cgroup_trusted`` is true only when every directory of
    the cgroup is owned by root and none is a ``user@UID.service``: only then may
    ``systemd_unit`` and ``cgroup`` raise a priority or protect. ``slurm_partition`` and
    ``slurm_qos`` are what Slurm itself reports for the job, never the environment's claim.
    """

    pid: int
    name: str | None = None
    cmdline: tuple[str, ...] | None = None
    exe: str | None = None
    user: str | None = None
    uid: int | None = None
    groups: tuple[str, ...] = ()
    create_time: float | None = None
    status: str | None = None
    nice: int | None = None
    cpu_pct: float | None = None
    rss_mib: int | None = None
    container: str | None = None
    pod: str | None = None
    slurm_job: str | None = None
    systemd_unit: str | None = None
    cgroup: str | None = None
    cgroup_trusted: bool = False
    slurm_partition: str | None = None
    slurm_qos: str | None = None
    env: dict[str, str] | None = None
    declared_priority: str | None = None
    checkpoint_signal: str | None = None
    priority: str = "normal"
    orphaned: bool = False
    access_denied: tuple[str, ...] = ()

    @property
    def zombie(self) -> bool:
        return self.status == "zombie"

    @property
    def checkpointable(self) -> bool:
        """The job declared a checkpoint signal (it asked to be told before it is stopped)."""
        return self.checkpoint_signal is not None

    @property
    def job(self) -> str | None:
        """The job this process belongs to, as people name it: its Slurm job id, else its
        Kubernetes pod, else its container (12 characters), else its systemd unit."""
        if self.slurm_job:
            return self.slurm_job
        if self.pod:
            return self.pod
        if self.container:
            return self.container[:12]
        return self.systemd_unit or None

    @property
    def command(self) -> str:
        """The command line as one string, for display only (never for a shell)."""
        if self.cmdline:
            return " ".join(self.cmdline)
        return self.name or ""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process on one GPU: NVML's facts joined with the process's attribution.

    A process using two GPUs appears twice, once per GPU, sharing one ``ProcessInfo``.
    ``sm_util_pct`` is ``0`` when NVML has no samples for the PID (it is idle) and ``None``
    when it was not queried or the device cannot tell.
    """

    pid: int
    gpu: int
    gpu_memory_mib: int | None
    info: ProcessInfo
    sm_util_pct: int | None = None
    gpu_uuid: str | None = None
    kind: str = "compute"

    def age_s(self, now: float) -> float | None:
        """Seconds since the process started; ``None`` when unknown, or when it started after
        ``now`` (a real process seen from a simulated clock set in the past)."""
        created = self.info.create_time
        if created is None or created > now + 1.0:
            return None
        return max(0.0, now - created)


class EventKind(enum.StrEnum):
    XID = "xid"
    ECC_SINGLE_BIT = "ecc_single_bit"
    ECC_DOUBLE_BIT = "ecc_double_bit"
    GPU_LOST = "gpu_lost"
    PSTATE = "pstate"
    CLOCK = "clock"


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened between two snapshots (an XID, an ECC error, a GPU falling off)."""

    kind: EventKind
    time: float
    gpu: int | None = None
    xid: int | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The whole machine at one instant, as one source saw it."""

    host: str
    time: float
    gpus: tuple[GpuState, ...]
    processes: tuple[GpuProcess, ...] = ()
    events: tuple[Event, ...] = ()
    source: str = ""
    # False when the source cannot see processes at all (an nvidia-smi --query-gpu log):
    # an empty ``processes`` then means "unknown", not "none".
    processes_visible: bool = True

    def gpu(self, index: int) -> GpuState | None:
        for state in self.gpus:
            if state.index == index:
                return state
        return None

    def processes_on(self, index: int) -> tuple[GpuProcess, ...]:
        return tuple(p for p in self.processes if p.gpu == index)


# -- what the engine decides -------------------------------------------------------------------


class Reason(enum.StrEnum):
    """Why the engine did, or did not do, something. Every record carries one."""

    CONDITION_MET = "condition_met"  # `when` became true: pending
    FOR_ELAPSED = "for_elapsed"  # `when` held for `for`: firing
    EVENT = "event"  # an event rule matched an event: firing
    SCHEDULED = "scheduled"  # a scheduled rule's time came and `when` held: firing
    CONDITION_CLEARED = "condition_cleared"  # `when` became false before `for` elapsed
    RESOLVED = "resolved"  # `when` false (or `until` true): the incident closed
    UNTIL_MET = "until_met"  # `until` became true: the incident closed
    LADDER_DONE = "ladder_done"  # an event incident ran its last step
    SCOPE_GONE = "scope_gone"  # the GPU or process the incident was about disappeared
    RULE_REMOVED = "rule_removed"  # a reload removed the rule
    COOLDOWN = "cooldown"  # would fire, but the rule is cooling down for this scope
    INACTIVE_WINDOW = "inactive_window"  # outside the rule's `active` time window
    STEP_DUE = "step_due"  # a ladder step's time came
    CONDITION_NOT_HOLDING = "condition_not_holding"  # a due step waits: `when` is false now
    ACKNOWLEDGED = "acknowledged"  # a due step waits: a person took over (pause_on_ack)
    SHADOW = "shadow"  # the rule is in shadow mode: recorded, never acted on
    PROTECTED = "protected"  # a candidate is protected by the config
    ALREADY_TARGETED = "already_targeted"  # a candidate was already targeted by such a step
    ORPHANED = "orphaned"  # a candidate's PID does not exist: nothing to signal
    ZOMBIE = "zombie"  # a candidate has exited and waits to be reaped
    NOT_SELECTED = "not_selected"  # `select` is false for the candidate
    LIMIT_REACHED = "limit_reached"  # `limit` processes were already chosen
    FREE_UNTIL_MET = "free_until_met"  # the projected state already satisfies `free_until`
    NO_CANDIDATES = "no_candidates"  # the step found nothing to act on
    NOT_CHECKPOINTABLE = "not_checkpointable"  # the job did not opt in to checkpoints
    NOT_SLURM_JOB = "not_slurm_job"  # a step that acts only through Slurm; no job to act on
    HELD = "held"  # a due step waits: a person put the incident on hold (`gpuwarden hold`)
    SILENCED = "silenced"  # a step came due under a silence: recorded, not acted on or told
    ABORTED = "aborted"  # a person ended the incident (`gpuwarden abort`)


@dataclass(frozen=True, slots=True)
class Target:
    """A process a step acts on, pinned by (pid, create_time) so a reused PID is never hit."""

    pid: int
    create_time: float | None
    gpu: int | None
    user: str | None
    priority: str
    gpu_memory_mib: int | None
    command: str = ""
    checkpoint_signal: str | None = None
    uid: int | None = None  # the owner when planned: a process that changed owner is skipped
    # The job's GPUWARDEN_ACK_DIR: never read from (acks are read in the daemon's spool only),
    # it explains a checkpoint that timed out.
    ack_dir: str | None = None
    slurm_job: str | None = None  # the Slurm job it was seen in when planned (executors re-read)
    job: str | None = None  # its Slurm job, pod, container or unit (``ProcessInfo.job``)


@dataclass(frozen=True, slots=True)
class Skipped:
    target: Target
    reason: Reason


@dataclass(frozen=True, slots=True)
class Intent:
    """What the engine wants done: one step of one incident, with its targets and why.

    Written to the journal before an executor acts; the executor's Outcome after.
    """

    id: str
    incident: str
    rule: str
    scope: str
    step: int
    kind: str
    label: str
    time: float
    reason: Reason
    severity: str
    shadow: bool = False
    targets: tuple[Target, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    gpu: int | None = None
    params: object = None
    where: str = ""
    # The silence the step came due under ("#3 by alice until ...: reason"); such a step is
    # recorded like a shadow step (``shadow`` is set too): never acted on, never announced.
    silenced: str = ""


@dataclass(frozen=True, slots=True)
class TargetResult:
    """What happened to one target of a step.

    ``state`` is a short word for logs and the journal: ``signalled``, ``acknowledged``,
    ``timed_out``, ``killed``, ``terminated``, ``suspended``, ``resumed``, ``reniced``,
    ``gone`` (exited before we acted), ``reused`` (the PID now belongs to another process),
    ``owner_changed``, ``denied``, ``not_needed`` (enough was freed already), ``would``
    (dry-run: what would have been done), ``already`` (nothing to do: already stopped or as
    nice as asked), ``unconfirmed`` (the effect did not show in time), ``survived`` (alive
    after SIGKILL), ``not_rechecked``, ``cancelled``, ``invalid_signal``, ``unverifiable`` (no
    start time to check identity), ``refused`` (gpuwarden itself, PID 1), ``error``,
    ``restored`` (an undo).
    """

    pid: int
    create_time: float | None
    ok: bool
    state: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Undo:
    """Something to put back when the incident resolves or the daemon stops: resume a
    suspended job (a process with SIGCONT, or a Slurm job with ``scontrol resume``), restore a
    nice value, restore a power limit. Kept in the journal."""

    kind: str  # "resume" | "slurm_resume" | "renice" | "power_limit"
    pid: int | None = None
    create_time: float | None = None
    gpu: int | None = None
    value: float | int | None = None  # the nice value, the power limit (W), the Slurm job id
    ionice: str | None = None  # the I/O class to restore ("best-effort:4", "idle", ...)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an executor reports: ``recoverable`` says whether trying again may help."""

    ok: bool
    recoverable: bool = False
    detail: str = ""
    dry_run: bool = False
    targets: tuple[TargetResult, ...] = ()
    undo: tuple[Undo, ...] = ()


class Transition(enum.StrEnum):
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"
    CANCELLED = "cancelled"  # pending, then the condition cleared
    COOLDOWN = "cooldown"
    WAITING = "waiting"  # a due step waits for its condition


@dataclass(frozen=True, slots=True)
class RuleChange:
    """A rule's state changed for one scope (the drill timeline and the journal show these)."""

    kind: Transition
    rule: str
    scope: str
    time: float
    reason: Reason
    incident: str | None = None
    detail: str = ""
    where: str = ""  # the scope as people read it: "GPU 0", "pid 4242 on GPU 1"
    # What the condition read when it changed: (field, value) in the order the text names
    # them, such as (("gpu.memory.used_pct", 95.3),). ``detail`` says the same for people.
    values: tuple[tuple[str, object], ...] = ()


# -- what people on call say to the daemon ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hold:
    """``gpuwarden hold``: no further step of ``incident`` runs until it is released or
    ``until`` passes (``None``: until released). A step already running finishes."""

    incident: str
    until: float | None = None
    note: str = ""  # who and why, for the waiting record

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until


@dataclass(frozen=True, slots=True)
class Silence:
    """``gpuwarden silence``: between ``starts`` and ``ends``, a step of a matching incident
    is recorded as silenced instead of acted on or announced. It matches every incident of
    the host (``host``), or those of ``rule`` and/or on GPU ``gpu`` (both when both are
    given)."""

    id: int
    starts: float
    ends: float
    rule: str | None = None
    gpu: int | None = None
    host: bool = False
    by: str = ""
    reason: str = ""

    def active(self, now: float) -> bool:
        return self.starts <= now < self.ends

    def matches(self, rule: str, gpu: int | None) -> bool:
        if self.host:
            return True
        if self.rule is None and self.gpu is None:
            return False
        return (self.rule is None or self.rule == rule) and (self.gpu is None or self.gpu == gpu)

    @property
    def matcher(self) -> str:
        """What it silences, as people read it: ``host``, ``rule squeeze``, ``GPU 3``."""
        if self.host:
            return "host"
        parts = ([f"rule {self.rule}"] if self.rule is not None else []) + (
            [f"GPU {self.gpu}"] if self.gpu is not None else []
        )
        return " on ".join(parts)


@dataclass(frozen=True, slots=True)
class NextStep:
    """What an open incident's ladder does next, as the engine sees it now: the step, when it
    is due, what keeps it waiting, and (for a step that chooses processes) the targets the
    planner would choose now. Nothing is acted on to compute it."""

    incident: str
    rule: str
    step: int | None  # None: every step has run (the incident stays open until it clears)
    kind: str = ""
    label: str = ""
    due: float | None = None  # when the step's ``after`` is reached
    state: str = "scheduled"  # scheduled | due | after_previous | held | acknowledged |
    #                           condition_not_holding | silenced | done
    detail: str = ""  # the hold, the silence, the step still running
    targets: tuple[Target, ...] = ()
    skipped: int = 0  # candidates the planner left out now
    selects: bool = False  # the step chooses processes (targets are meaningful)
    pause_on_ack: bool = False  # an acknowledgement stops this rule's ladder
