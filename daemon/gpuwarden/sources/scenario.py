"""Play a scenario back as Snapshots, on a simulated clock or in real time.

Keyframes are applied in order; a field a keyframe does not mention keeps its value. A keyframe
with ``ramp: true`` is reached linearly from the one before it. A GPU's used memory is the sum of
its jobs' memory plus ``other_mib``, unless the keyframe gives ``memory_used_mib``. A spawned job
is a real process: once it has exited, its memory leaves every later snapshot, so a drill sees
the effect of a kill. Events are reported once, by the first snapshot at or after their time.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

from gpuwarden import yamlfile
from gpuwarden.config import Priorities
from gpuwarden.errors import InputError, UsageError
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
    positional_maker,
)
from gpuwarden.sources import attach, scenario_format
from gpuwarden.sources.attach import Attached
from gpuwarden.sources.cgroups import parse_cgroup
from gpuwarden.sources.priority import PriorityResolver, normalise_signal
from gpuwarden.sources.procs import Attributor as ProcessAttributor
from gpuwarden.sources.scenario_format import GpuSpec, JobSpec, Scenario
from gpuwarden.sources.spawn import Standin, spawn

# Linux PIDs are below PID_MAX_LIMIT (2**22); synthetic ones start above it and never collide.
SYNTHETIC_PID_BASE = 2**22 + 1000


class Attributor(Protocol):
    def describe(self, pids: Iterable[int], now: float) -> dict[int, ProcessInfo]: ...


@dataclass
class _GpuValues:
    """The accumulated state of one GPU after a keyframe."""

    values: dict[str, Any] = field(default_factory=dict)
    jobs: dict[str, tuple[float, float | None]] = field(default_factory=dict)

    def copy(self) -> _GpuValues:
        return _GpuValues(dict(self.values), dict(self.jobs))


def _accumulate(scenario: Scenario) -> list[dict[int, _GpuValues]]:
    """The full state of every GPU right at each keyframe."""
    states: list[dict[int, _GpuValues]] = []
    current = {gpu.index: _GpuValues(values={"other_mib": 0}) for gpu in scenario.gpus}
    for frame in scenario.timeline:
        current = {index: values.copy() for index, values in current.items()}
        for index, change in frame.gpus.items():
            target = current[index]
            for name in change.model_fields_set - {"jobs"}:
                target.values[name] = getattr(change, name)
            if change.jobs is not None:
                target.jobs = {
                    job_id: (float(use), None)
                    if isinstance(use, int)
                    else (float(use.memory_mib), use.sm_pct)
                    for job_id, use in change.jobs.items()
                }
        states.append(current)
    return states


def _round(value: float | None) -> int | None:
    return None if value is None else round(value)


_ZERO_ECC = {
    "volatile_corrected": 0,
    "volatile_uncorrected": 0,
    "aggregate_corrected": 0,
    "aggregate_uncorrected": 0,
}
_ZERO_ROWS = {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
# The GPU fields that ramp (rounded to whole numbers or not), and where each stands among
# GpuState's fields: playback builds a state from a list of its fields in their order.
_RAMPED = (
    ("utilization_pct", True),
    ("memory_utilization_pct", True),
    ("temperature_c", True),
    ("power_w", False),
)
_GPU_FIELDS = tuple(f.name for f in fields(GpuState))
_MEMORY_AT = _GPU_FIELDS.index("memory")
# Playback makes thousands of these a second: each from every field's value, in order.
_make_gpu = positional_maker(GpuState)
_make_memory = positional_maker(Memory)
_make_process = positional_maker(GpuProcess)
_make_snapshot = positional_maker(Snapshot)

# A job's place in a segment, as playback reads it per snapshot: its id; MiB at the
# segment's start and its change over the segment; SM % as shown (rounded, None where not
# told) and, where it ramps, SM % at the start and its change (else None); its synthetic
# attribution (None: a real process's, asked per snapshot); the process last shown for it.
_Job = list[Any]
_SHOWN = 7


class _GpuPlay:
    """How one GPU plays between two keyframes, worked out once for the segment: everything
    that cannot change inside it (identity, ECC and row counters, throttle reasons, P-state,
    the jobs it holds and which of them ramp) is built when playback enters the segment, and
    only what ramps is computed per snapshot. A ``GpuState``, ``Memory`` or ``GpuProcess``
    equal to the previous snapshot's is that same object again: between keyframes that do
    not ramp every snapshot shows the same objects.

    A numeric field given at both keyframes ramps linearly (its value at ``f`` is
    ``a + (b - a) * f``, a float); anything else keeps the earlier keyframe's value until the
    next keyframe. A job the later keyframe drops ramps down to 0 MiB keeping its SM %; one it
    adds ramps up from 0 MiB, without an SM %, from just after the earlier keyframe."""

    __slots__ = (
        "args",
        "built",
        "index",
        "jobs_at_start",
        "jobs_inside",
        "jobs_late",
        "lost",
        "memory",
        "other_mib",
        "process_memory",
        "ramping",
        "ramps",
        "reserved",
        "seen_f",
        "seen_gone",
        "seen_processes",
        "total",
        "used_given",
        "uuid",
    )

    def __init__(
        self,
        spec: GpuSpec,
        identity: tuple[str, str],
        before: _GpuValues,
        after: _GpuValues | None,
        info: Callable[[str], ProcessInfo | None],
    ) -> None:
        self.index = spec.index
        v = before.values
        unsupported = set(spec.unsupported)
        uuid, bus = identity
        self.uuid = uuid
        self.lost: GpuState | None = None
        lost = v.get("lost")
        if lost:
            reason = lost if isinstance(lost, str) else "GPU is lost"
            self.lost = GpuState(
                index=spec.index, name=spec.name, uuid=uuid, pci_bus_id=bus, lost=True, error=reason
            )

        def get(name: str) -> Any:
            return None if name in unsupported else v.get(name)

        ecc, remapped, retired, throttle = (
            get(n) for n in ("ecc", "remapped_rows", "retired_pages", "throttle")
        )
        self.total: int = spec.memory_total_mib
        self.reserved = None if "memory_reserved_mib" in unsupported else spec.memory_reserved_mib
        template = GpuState(
            index=spec.index,
            name=spec.name,
            uuid=uuid,
            pci_bus_id=bus,
            power_limit_w=None if "power_limit_w" in unsupported else spec.power_limit_w,
            throttle=None if "throttle" in unsupported else tuple(throttle or ()),
            ecc=None if "ecc" in unsupported else Ecc(**(ecc.model_dump() if ecc else _ZERO_ECC)),
            remapped_rows=None
            if "remapped_rows" in unsupported or retired is not None
            else RemappedRows(**(remapped.model_dump() if remapped else _ZERO_ROWS)),
            retired_pages=RetiredPages(**retired.model_dump()) if retired else None,
            pstate=None if "pstate" in unsupported else (v.get("pstate") or 0),
            mig_mode=None if "mig_mode" in unsupported else spec.mig_mode,
        )
        self.args: list[Any] = [getattr(template, name) for name in _GPU_FIELDS]
        # A numeric field ramps where both keyframes give it; otherwise it keeps the earlier
        # keyframe's value (None where that has none) throughout.
        self.ramps = after is not None
        nxt = after.values if after is not None else {}
        self.ramping: list[tuple[int, Any, Any, bool]] = []
        for name, rounded in _RAMPED:
            at = _GPU_FIELDS.index(name)
            a, b = (None, None) if name in unsupported else (v.get(name), nxt.get(name))
            if a is not None and b is not None:
                self.ramping.append((at, a, b - a, rounded))
            else:
                self.args[at] = _round(a) if rounded else a

        def ends(name: str) -> tuple[Any, Any]:
            a, b = v.get(name), nxt.get(name)
            return (a, None) if a is None or b is None else (a, b - a)

        self.used_given = ends("memory_used_mib")
        self.other_mib = ends("other_mib")
        self.process_memory = "process_memory" not in unsupported
        sm_util = "sm_util" not in unsupported

        def job(job_id: str, mib_a: float, mib_b: float, sm: Any, sm_b: Any = None) -> _Job:
            """``sm_b``: the SM % the job ramps to (None: it keeps ``sm``)."""
            if not sm_util:
                sm = sm_b = None
            ramp = sm is not None and sm_b is not None
            shown = None if ramp else _round(sm)
            return [
                job_id,
                mib_a,
                mib_b - mib_a,
                shown,
                sm,
                sm_b - sm if ramp else None,
                info(job_id),
                None,
            ]

        # The jobs at the segment's first instant, inside it, and at its end (reached only
        # where the clock lands on a ramp's end through rounding): a job ramping in is not
        # there at the first, and one with no SM % at the start shows the end's at the end.
        if after is None:
            self.jobs_at_start = [job(i, mib, mib, sm) for i, (mib, sm) in before.jobs.items()]
            self.jobs_inside = self.jobs_late = self.jobs_at_start
        else:
            # In the order the keyframes list them (a set's order would change from run to
            # run, and with it the order of a GPU's processes and of the steps over them).
            self.jobs_at_start, self.jobs_inside, self.jobs_late = [], [], []
            for job_id in dict.fromkeys([*before.jobs, *after.jobs]):
                mib_a, sm_a = before.jobs.get(job_id, (0.0, None))
                mib_b, sm_b = after.jobs.get(job_id, (0.0, None))
                kept = job_id not in after.jobs  # ramping out: it keeps its SM %
                inside = job(job_id, mib_a, mib_b, sm_a, None if kept else sm_b)
                self.jobs_inside.append(inside)
                if job_id in before.jobs:
                    self.jobs_at_start.append(inside)
                late = sm_b if sm_a is None and not kept else sm_a
                ramp_to = None if kept or sm_a is None else sm_b
                self.jobs_late.append(job(job_id, mib_a, mib_b, late, ramp_to))
        self.built: GpuState | None = None
        self.memory: Memory | None = None
        # The last instant played without real processes (its f, and how many jobs had
        # vanished by then), and the processes it showed.
        self.seen_f: float | None = None
        self.seen_gone = 0
        self.seen_processes: list[GpuProcess] = []

    def state(
        self,
        f: float,
        gone: set[str],
        real: Callable[[str], ProcessInfo] | None,
        processes: list[GpuProcess],
    ) -> GpuState:
        """The GPU at ``f`` (0 <= f < 1) of the segment's ramp without the jobs in ``gone``;
        its processes are appended to ``processes``. ``real`` tells a real process's facts;
        without one (no stand-ins, no attached jobs) ``gone`` may only grow from call to
        call, and the GPU at an instant played before is what it was then."""
        if self.lost is not None:
            return self.lost
        if real is None:
            vanished = len(gone)
            if f == self.seen_f and vanished == self.seen_gone and self.built is not None:
                processes += self.seen_processes
                return self.built
            self.seen_f, self.seen_gone = f, vanished
        jobs = self.jobs_inside if f > 0 else self.jobs_at_start
        if f >= 1:
            jobs = self.jobs_late
        shown: list[GpuProcess] = []
        mibs: list[float] = []
        index, uuid, process_memory = self.index, self.uuid, self.process_memory
        for job in jobs:
            job_id, mib, mib_d, sm_util, sm_a, sm_d, info, known = job
            if gone and job_id in gone:
                continue
            mib = mib + mib_d * f or 0.0
            mibs.append(mib)
            memory_mib = round(mib) if process_memory else None
            if sm_d is not None:
                sm_util = round(sm_a + sm_d * f)
            if info is None:
                assert real is not None
                info = real(job_id)
            if (
                known is None
                or known.gpu_memory_mib != memory_mib
                or known.sm_util_pct != sm_util
                or known.info is not info
            ):
                known = job[_SHOWN] = _make_process(
                    info.pid, index, memory_mib, info, sm_util, uuid, "compute"
                )
            shown.append(known)
        processes += shown
        if real is None:
            self.seen_processes = shown
        a, d = self.used_given
        used = a if d is None else a + d * f
        if used is None:
            a, d = self.other_mib
            other = a if d is None else a + d * f
            used = sum(mibs) + (other or 0)
        used_mib = round(used)
        total = self.total
        if used_mib > total:  # noqa: PLR1730 - min() costs a call per GPU and snapshot
            used_mib = total
        args = self.args
        gpu = self.built
        memory = self.memory
        if memory is None or memory.used_mib != used_mib:
            memory = self.memory = _make_memory(total, used_mib, total - used_mib, self.reserved)
            args[_MEMORY_AT] = memory
            gpu = None
        for at, x, dx, rounded in self.ramping:
            value = round(x + dx * f) if rounded else x + dx * f
            if value != args[at]:
                args[at] = value
                gpu = None
        if gpu is None:
            gpu = self.built = _make_gpu(*args)
        return gpu


class ScenarioSource:
    """A scenario as a ``ReplaySource``. Spawned jobs start when the source opens and are
    killed by ``close()``; use it as a context manager.

    With ``spawn=False`` (drills) no process is started: every job gets a synthetic PID and
    the scenario's attribution, and ``vanish(pid)`` makes a job leave later snapshots as if it
    had exited — how a drill shows the effect of a kill without touching anything."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        path: str = "",
        priorities: Priorities | None = None,
        attributor: Attributor | None = None,
        start_time: float | None = None,
        workdir: Path | None = None,
        spawn: bool = True,
        ack_spool: Path | None = None,
        located: yamlfile.Located | None = None,
        file_facts: os.stat_result | None = None,
    ) -> None:
        self.scenario = scenario
        self.ack_spool = ack_spool  # where stand-ins acknowledge (the daemon's spool)
        self.name = f"scenario:{path}" if path else f"scenario:{scenario.name}"
        self._path = path or scenario.name
        self.duration = scenario.duration
        if start_time is None:
            start = scenario.start or dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
            start_time = start.timestamp()
        self.start_time = start_time
        self._resolver = PriorityResolver(priorities or Priorities())
        self._attributor = attributor
        self._states = _accumulate(scenario)
        self._times = [frame.at for frame in scenario.timeline]  # in order (validated)
        self._ids: dict[int, tuple[str, str]] = {}  # GPU index -> (uuid, bus id)
        self._gpus = {gpu.index: gpu for gpu in scenario.gpus}
        self._jobs = {job.id: job for job in scenario.jobs}
        self._pids = {job.id: SYNTHETIC_PID_BASE + i for i, job in enumerate(scenario.jobs)}
        self._spawning = spawn
        self._vanished: set[str] = set()
        self._infos: dict[str, ProcessInfo] = {}
        # Playback's place: the keyframes due (and the offsets with as many due), the keyframe
        # segment being played (its plans, the GPUs lost in it, where its ramp starts and
        # how long it is), and what the last consuming snapshot saw (None: none yet).
        self._due = 0
        self._due_from, self._due_until = math.inf, -math.inf
        self._segment_key: tuple[int, bool] | None = None
        self._segment: list[_GpuPlay] = []
        self._segment_lost: list[GpuState] = []
        self._segment_lost_indexes: frozenset[int] = frozenset()
        self._ramps = False
        self._from_at = self._span = 0.0
        self._reported: int | None = None  # keyframes due then: their events are reported
        self._lost: frozenset[int] = frozenset()  # GPUs lost then
        self._owns_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="gpuwarden-scenario-"))
        self.standins: dict[str, Standin] = {}
        self.attached: dict[str, Attached] = {}
        try:
            self._attach(path, located, file_facts)
            if self.attached and self._attributor is None:
                self._attributor = ProcessAttributor(priorities or Priorities())
            for job in scenario.jobs:
                if job.spawn and spawn:
                    self.standins[job.id] = self._spawn(job)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, path: str | Path, **kwargs: Any) -> ScenarioSource:
        scenario, located, facts = scenario_format.load_checked(path)
        return cls(scenario, path=str(path), located=located, file_facts=facts, **kwargs)

    def _attach(
        self, path: str, located: yamlfile.Located | None, facts: os.stat_result | None
    ) -> None:
        """Find the live process of every ``attach`` job (read only: nothing is signalled)."""
        jobs = [(i, job) for i, job in enumerate(self.scenario.jobs) if job.attach is not None]
        if not jobs:
            return
        file = path or f"scenario {self.scenario.name}"
        try:
            trusted = attach.trusted_uid(path or None, facts)
        except attach.AttachError as exc:
            raise InputError.at(file, None, None, exc.message, exc.expected, exc.hint) from None
        for i, job in jobs:
            assert job.attach is not None
            try:
                self.attached[job.id] = attach.attach(job.id, job.attach, trusted, file)
            except attach.AttachError as exc:
                where = ("jobs", i, "attach")
                if located is not None:
                    message = f"job {job.id!r}: {exc.message}"
                    raise located.error(where, message, exc.expected, exc.hint) from None
                raise InputError.at(file, None, None, exc.message, exc.expected, exc.hint) from None

    def __enter__(self) -> ScenarioSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, job: JobSpec) -> Standin:
        ack = (
            job.ack
            if isinstance(job.ack, str) and job.ack == "never"
            else ("0" if job.ack == "immediate" else f"{job.ack}")
        )
        try:
            return self._start(job, ack)
        except ValueError as exc:  # run_as: no such user, or not root
            raise InputError.at(self._path, None, None, f"job {job.id!r}: {exc}") from None

    def _start(self, job: JobSpec, ack: str) -> Standin:
        return spawn(
            job.id,
            job.cmdline,
            dict(job.env),
            self.workdir / job.id,
            on_term=job.on_term,
            ack=ack,
            ack_spool=self.ack_spool,
            run_as=job.run_as,
        )

    @property
    def host(self) -> str:
        return self.scenario.host

    def sample_offset(self, number: int) -> float:
        """Seconds from the scenario's start to its ``number``th keyframe (1 is the first)."""
        frames = self.scenario.timeline
        if not 1 <= number <= len(frames):
            raise UsageError(
                f"{self.name}: there is no keyframe {number}: the scenario has {len(frames)}",
                f"pick one from 1 to {len(frames)}",
            )
        return frames[number - 1].at

    def position(self, now: float) -> str | None:
        """Scenarios say nothing more than their time."""
        del now
        return None

    def pid_of(self, job_id: str) -> int:
        """The PID a job has in snapshots: the stand-in's or the attached process's real PID,
        or its synthetic one."""
        standin = self.standins.get(job_id)
        if standin is not None:
            return standin.pid
        attached = self.attached.get(job_id)
        return attached.pid if attached is not None else self._pids[job_id]

    def job_of(self, pid: int) -> str | None:
        """The job id behind a PID in this scenario's snapshots."""
        for job_id in self._jobs:
            if self.pid_of(job_id) == pid:
                return job_id
        return None

    def vanish(self, pid: int) -> bool:
        """Drills: the job with ``pid`` is gone from later snapshots (as if it had exited)."""
        job_id = self.job_of(pid)
        if job_id is None or job_id in self.standins:
            return False
        self._vanished.add(job_id)
        return True

    def close(self) -> None:
        """Stop the stand-ins; attached processes belong to their harness and are left be."""
        for standin in self.standins.values():
            standin.stop()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- playback ---------------------------------------------------------------------------

    def _info(self, job: JobSpec) -> ProcessInfo:
        """A synthetic job's attribution: fixed for the scenario, so made once."""
        known = self._infos.get(job.id)
        if known is None:
            known = self._infos[job.id] = self._describe(job)
        return known

    def _describe(self, job: JobSpec) -> ProcessInfo:
        pid = self._pids[job.id]
        if job.orphaned:
            return ProcessInfo(pid=pid, orphaned=True)
        env = dict(job.env)
        # A unit alone is a system unit (root-owned); a cgroup path says where it lies, and one
        # under user@UID.service is the job owner's own making.
        cgroup = parse_cgroup(f"0::{job.cgroup}") if job.cgroup is not None else None
        info = ProcessInfo(
            pid=pid,
            name=Path(job.cmdline[0]).name[:15],
            cmdline=job.cmdline,
            exe=job.exe,
            user=job.user,
            uid=job.uid,
            groups=job.groups,
            create_time=self.start_time - job.started,
            status=job.status,
            nice=job.nice,
            cpu_pct=job.cpu_pct,
            rss_mib=job.rss_mib,
            container=job.container,
            pod=job.pod,
            slurm_job=job.slurm_job or env.get("SLURM_JOB_ID"),
            systemd_unit=job.unit or (cgroup.systemd_unit if cgroup is not None else None),
            cgroup=job.cgroup,
            slurm_partition=job.slurm_partition,
            slurm_qos=job.slurm_qos,
            cgroup_trusted=not cgroup.delegated if cgroup is not None else job.unit is not None,
            env=env,
            declared_priority=env.get("GPUWARDEN_PRIORITY"),
            checkpoint_signal=normalise_signal(env.get("GPUWARDEN_CHECKPOINT_SIGNAL")),
        )
        return replace(info, priority=self._resolver.resolve(info))

    def _identity(self, spec: GpuSpec) -> tuple[str, str]:
        """A GPU's UUID and PCI bus id: fixed for the scenario, so derived once."""
        known = self._ids.get(spec.index)
        if known is None:
            known = self._ids[spec.index] = (self._uuid(spec), self._bus_id(spec))
        return known

    def _uuid(self, spec: GpuSpec) -> str:
        if spec.uuid:
            return spec.uuid
        seed = sum(ord(c) for c in self.scenario.host) % 0xFFFF
        return f"GPU-5ce7a210-{seed:04x}-4000-8000-{spec.index:012x}"

    @staticmethod
    def _bus_id(spec: GpuSpec) -> str:
        return spec.pci_bus_id or f"00000000:{0x18 + spec.index * 0x10:02X}:00.0"

    def snapshot(self, now: float) -> Snapshot:
        return self._snapshot(now, consume=True)

    def peek(self, now: float) -> Snapshot:
        """``snapshot`` without events, leaving them to the next one (see ``Source``)."""
        return self._snapshot(now, consume=False)

    def _snapshot(self, now: float, *, consume: bool) -> Snapshot:
        offset = now - self.start_time
        if not offset > 0.0:
            offset = 0.0  # before the start: its first instant
        if not self._due_from <= offset < self._due_until:
            self._enter(offset)
        f = 0.0
        if self._ramps:
            span = self._span
            f = (offset - self._from_at) / span if span > 0 else 1.0
        gone = self._vanished
        real: Callable[[str], ProcessInfo] | None = None
        if self.standins or self.attached:
            gone, real = self._real(now)
        gpus: list[GpuState] = []
        processes: list[GpuProcess] = []
        for play in self._segment:
            gpus.append(play.state(f, gone, real, processes))
        events: list[Event] = []
        if consume:
            lost = self._segment_lost
            if lost and self._reported is not None:
                for gpu in lost:
                    if gpu.index not in self._lost:
                        error = gpu.error or "GPU is lost"
                        events.append(Event(EventKind.GPU_LOST, now, gpu.index, None, error))
            self._lost = self._segment_lost_indexes
            first, due = self._reported or 0, self._due
            if due > first:
                for frame in self.scenario.timeline[first:due]:
                    when = self.start_time + frame.at
                    for e in frame.events:
                        events.append(Event(e.kind, when, e.gpu, e.xid, e.detail))
            self._reported = due
        if len(events) > 1:
            events.sort(key=lambda e: e.time)
        return _make_snapshot(
            self.scenario.host,
            now,
            tuple(gpus),
            tuple(processes),
            tuple(events),
            self.name,
            True,
        )

    def _real(self, now: float) -> tuple[set[str], Callable[[str], ProcessInfo]]:
        """The jobs gone at ``now`` (vanished, or stand-ins and attached processes that have
        exited), and what tells a live one's process, as attributed for this snapshot."""
        alive = {job_id for job_id, s in self.standins.items() if s.alive()}
        alive |= {job_id for job_id, a in self.attached.items() if a.alive()}
        real_info: dict[int, ProcessInfo] = {}
        if self._attributor is not None and alive:
            real_info = self._attributor.describe([self.pid_of(j) for j in alive], now)
        gone = self._vanished | (self.standins.keys() | self.attached.keys()) - alive
        infos: dict[str, ProcessInfo] = {}

        def real(job_id: str) -> ProcessInfo:
            info = infos.get(job_id)
            if info is None:
                pid = self.pid_of(job_id)
                info = infos[job_id] = real_info.get(pid) or ProcessInfo(pid=pid)
            return info

        return gone, real

    def stretch(self, now: float) -> tuple[int, bool] | None:
        """Which stretch of playback ``now`` falls in, for a drill that decides rules for a
        stretch at once (engine/quiet.py): snapshots at instants with the same stretch show
        the same GPUs and processes (unless a drill makes a job vanish), and each of their
        numeric fields moves one way or stays put from instant to instant, so it lies between
        its values at the first and the last of them; everything else does not change. The
        stretch is the keyframe segment, less its first instant where it ramps (a job ramping
        in is not there yet). None where nothing is promised: at that first instant, and in a
        scenario with stand-ins or attached processes (they can exit at any time). A stretch's
        instants follow one another: once later instants fall in another, none falls in it
        again (a drill finds a stretch's end by bisection)."""
        if self.standins or self.attached:
            return None
        offset = max(0.0, now - self.start_time)
        frames = self.scenario.timeline
        index, ramps = self._segment_key_at(offset)
        if ramps and offset <= frames[index].at:
            return None
        return index, ramps

    def _segment_key_at(self, offset: float) -> tuple[int, bool]:
        frames = self.scenario.timeline
        index = max(0, bisect.bisect_right(self._times, offset) - 1)  # the last one due
        ramps = index + 1 < len(frames) and frames[index + 1].ramp and offset >= frames[0].at
        return index, ramps

    def _enter(self, offset: float) -> None:
        """Find the keyframes due at ``offset``, the instants with as many due, and the
        playback plans of the keyframe segment it falls in (made anew when that changes)."""
        times = self._times
        due = self._due = bisect.bisect_right(times, offset)
        self._due_from = times[due - 1] if due else -math.inf
        self._due_until = times[due] if due < len(times) else math.inf
        key = index, ramps = self._segment_key_at(offset)
        if self._segment_key != key:
            self._segment_key = key
            self._segment = self._plan(index, ramps)
            self._segment_lost = [play.lost for play in self._segment if play.lost is not None]
            self._segment_lost_indexes = frozenset(gpu.index for gpu in self._segment_lost)
        self._ramps = ramps
        if ramps:
            frames = self.scenario.timeline
            self._from_at = frames[index].at
            self._span = frames[index + 1].at - frames[index].at

    def _plan(self, index: int, ramps: bool) -> list[_GpuPlay]:
        before = self._states[index]
        after = self._states[index + 1] if ramps else None
        return [
            _GpuPlay(
                spec,
                self._identity(spec),
                before[spec.index],
                None if after is None else after[spec.index],
                self._synthetic_info,
            )
            for spec in self.scenario.gpus
        ]

    def _synthetic_info(self, job_id: str) -> ProcessInfo | None:
        """A job's attribution when the scenario makes it up; None for a real process."""
        if job_id in self.standins or job_id in self.attached:
            return None
        return self._info(self._jobs[job_id])
