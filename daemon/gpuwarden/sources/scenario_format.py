"""Scenario format v1: a machine with GPUs and jobs, and a timeline of what happens to it.

The reference is ``docs/scenarios.md``. This module validates a file into ``Scenario`` and
reports every problem as ``file:line:col``; ``sources/scenario.py`` plays it back.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from gpuwarden import yamlfile
from gpuwarden.errors import InputError, Problem
from gpuwarden.model import THROTTLE_REASONS, EventKind
from gpuwarden.units import parse_duration

Seconds = Annotated[float, BeforeValidator(parse_duration)]
Percent = Annotated[float, Field(ge=0, le=100)]
Mib = Annotated[int, Field(ge=0)]
THROTTLE_NAMES = frozenset(THROTTLE_REASONS.values())
# Fields a scenario may declare unsupported on a GPU: they read as None, as NVML would say.
UNSUPPORTABLE = frozenset(
    {
        "utilization_pct",
        "memory_utilization_pct",
        "temperature_c",
        "power_w",
        "power_limit_w",
        "throttle",
        "ecc",
        "remapped_rows",
        "retired_pages",
        "pstate",
        "mig_mode",
        "memory_reserved_mib",
        "sm_util",
        "process_memory",
    }
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(_Strict):
    """A GPU's fixed facts. What changes over time lives in the timeline."""

    index: int = Field(ge=0)
    name: str = "NVIDIA Simulated GPU"
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int = Field(gt=0)
    memory_reserved_mib: Mib | None = None
    power_limit_w: float | None = Field(default=None, gt=0)
    mig_mode: bool = False
    unsupported: tuple[str, ...] = ()

    @field_validator("unsupported")
    @classmethod
    def _known_fields(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - UNSUPPORTABLE)
        if unknown:
            raise ValueError(
                f"unknown field(s) {unknown}; these can be unsupported: {sorted(UNSUPPORTABLE)}"
            )
        return value


ATTACH_PATTERN_MAX = 200  # characters of an attach: {match: ...} pattern


class AttachSpec(_Strict):
    """A live process the job is, instead of a stand-in: by PID, or by a regex searched in
    its command line (see ``sources/attach.py``)."""

    pid: int | None = Field(default=None, gt=1)
    match: str | None = Field(default=None, min_length=1, max_length=ATTACH_PATTERN_MAX)

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _one_way(self) -> AttachSpec:
        if (self.pid is None) == (self.match is None):
            raise ValueError("attach takes one of pid: N or match: REGEX")
        return self


# What an attached job may not declare: the live process says it (its owner, command line,
# environment, state), and declaring it would grant it a trust its real uid does not give.
ATTACH_FORBIDS = (
    "cmdline",
    "user",
    "uid",
    "groups",
    "env",
    "spawn",
    "orphaned",
    "status",
    "nice",
    "cpu_pct",
    "rss_mib",
    "container",
    "pod",
    "slurm_job",
    "unit",
    "started",
    "on_term",
    "ack",
)


class JobSpec(_Strict):
    """A process that uses GPUs. ``spawn: true`` starts a real stand-in process; ``attach``
    names a live one instead."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    cmdline: tuple[str, ...] = ()
    attach: AttachSpec | None = None
    exe: str | None = Field(default=None, pattern=r"^/")
    user: str | None = None
    uid: int | None = None
    groups: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    spawn: bool = False
    orphaned: bool = False
    status: Literal["running", "sleeping", "disk-sleep", "stopped", "zombie"] = "running"
    nice: int = Field(default=0, ge=-20, le=19)
    cpu_pct: float | None = Field(default=None, ge=0)
    rss_mib: Mib | None = None
    container: str | None = None
    pod: str | None = None
    slurm_job: str | None = None
    slurm_partition: str | None = None  # as Slurm reports it (the environment only claims)
    slurm_qos: str | None = None
    unit: str | None = None
    cgroup: str | None = Field(default=None, pattern=r"^/")
    started: Seconds = 0.0
    on_term: Literal["exit", "ignore"] = "exit"
    ack: Literal["immediate", "never"] | Seconds = "immediate"
    # A spawned stand-in runs as this user (an account on this machine; needs root): what a
    # real job of another user looks like, for priority rules, protections and owner messages.
    run_as: str | None = Field(default=None, pattern=r"^[a-z_][a-z0-9_.-]*\$?$")

    @field_validator("cmdline", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                raise ValueError(f"cannot split the command line: {exc}") from None
        return value

    @field_validator("cmdline")
    @classmethod
    def _not_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("the command line is empty")
        return value

    @property
    def declared(self) -> frozenset[str]:
        """The fields the file gave for this job."""
        return frozenset(self.model_fields_set)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"not an environment variable name: {key!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.spawn and self.orphaned:
            raise ValueError("a spawned job is a real process; it cannot also be orphaned")
        if self.spawn and self.status != "running":
            raise ValueError("a spawned job's status is whatever the real process's is")
        return self


class JobUse(_Strict):
    memory_mib: Mib
    sm_pct: Percent | None = None


class EccFrame(_Strict):
    volatile_corrected: Mib | None = None
    volatile_uncorrected: Mib | None = None
    aggregate_corrected: Mib | None = None
    aggregate_uncorrected: Mib | None = None


class RemappedRowsFrame(_Strict):
    correctable: Mib = 0
    uncorrectable: Mib = 0
    pending: bool = False
    failure: bool = False


class RetiredPagesFrame(_Strict):
    single_bit: Mib = 0
    double_bit: Mib = 0
    pending: bool = False


class GpuFrame(_Strict):
    """What a keyframe changes on one GPU; anything not given keeps its previous value."""

    utilization_pct: Percent | None = None
    memory_utilization_pct: Percent | None = None
    temperature_c: float | None = None
    power_w: float | None = Field(default=None, ge=0)
    memory_used_mib: Mib | None = None
    other_mib: Mib | None = None
    throttle: tuple[str, ...] | None = None
    ecc: EccFrame | None = None
    remapped_rows: RemappedRowsFrame | None = None
    retired_pages: RetiredPagesFrame | None = None
    pstate: int | None = Field(default=None, ge=0, le=15)
    lost: bool | str | None = None
    jobs: dict[str, Mib | JobUse] | None = None

    @field_validator("throttle")
    @classmethod
    def _throttle_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None:
            unknown = sorted(set(value) - THROTTLE_NAMES)
            if unknown:
                raise ValueError(
                    f"unknown throttle reason(s) {unknown}; known: {sorted(THROTTLE_NAMES)}"
                )
        return value


class EventSpec(_Strict):
    gpu: int | None = Field(default=None, ge=0)
    kind: EventKind = EventKind.XID
    xid: int | None = Field(default=None, ge=0)
    detail: str = ""

    @model_validator(mode="after")
    def _xid_given(self) -> EventSpec:
        if self.kind is EventKind.XID and self.xid is None:
            raise ValueError("an xid event needs its number: xid: 79")
        return self


class Keyframe(_Strict):
    at: Seconds
    ramp: bool = False
    gpus: dict[int, GpuFrame] = Field(default_factory=dict)
    events: tuple[EventSpec, ...] = ()
    end: bool = False


class Scenario(_Strict):
    version: Literal[1] = 1
    name: str
    description: str = ""
    host: str = "scenario-host"
    start: dt.datetime | None = None
    gpus: tuple[GpuSpec, ...]
    jobs: tuple[JobSpec, ...] = ()
    timeline: tuple[Keyframe, ...]

    @field_validator("start")
    @classmethod
    def _aware(cls, value: dt.datetime | None) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value

    @property
    def duration(self) -> float:
        return self.timeline[-1].at if self.timeline else 0.0


def _cross_check(scenario: Scenario, located: yamlfile.Located) -> list[Problem]:
    """What a schema alone cannot say: references, order, uniqueness."""
    problems: list[Problem] = []
    for key, what in (("gpus", "at least one GPU"), ("timeline", "at least one keyframe")):
        if not getattr(scenario, key):
            problems.append(located.problem((key,), f"{key} is empty", what))
    gpu_indexes: set[int] = set()
    for i, gpu in enumerate(scenario.gpus):
        if gpu.index in gpu_indexes:
            problems.append(
                located.problem(
                    ("gpus", i, "index"),
                    f"GPU index {gpu.index} is declared twice",
                    "each index once",
                )
            )
        gpu_indexes.add(gpu.index)
    job_ids: set[str] = set()
    for i, job in enumerate(scenario.jobs):
        if job.attach is not None:
            for name in sorted(job.declared & set(ATTACH_FORBIDS)):
                problems.append(
                    located.problem(
                        ("jobs", i, name),
                        f"{name} on an attached job",
                        "attach alone: the live process tells its owner, command line, "
                        "environment and state",
                        "remove it; the priority class comes from the process's real "
                        "owner and environment, never from the scenario",
                        key=True,
                    )
                )
        elif "cmdline" not in job.declared:
            problems.append(
                located.problem(
                    ("jobs", i),
                    f"job {job.id!r} has no cmdline",
                    "cmdline: (the command line), or attach: {pid: N} / {match: REGEX}",
                )
            )
        if job.id in job_ids:
            problems.append(
                located.problem(
                    ("jobs", i, "id"), f"job id {job.id!r} is declared twice", "each id once"
                )
            )
        job_ids.add(job.id)
        if job.run_as is not None and not job.spawn:
            problems.append(
                located.problem(
                    ("jobs", i, "run_as"),
                    "run_as applies to a spawned stand-in only",
                    "spawn: true, or user: for a job that is not spawned",
                )
            )
    known_gpus = ", ".join(str(g) for g in sorted(gpu_indexes))
    previous = -1.0
    last = len(scenario.timeline) - 1
    for k, frame in enumerate(scenario.timeline):
        where = ("timeline", k)
        if frame.at < previous:
            problems.append(
                located.problem(
                    (*where, "at"),
                    f"keyframe at {frame.at:g}s comes before the previous one at {previous:g}s",
                    "keyframes in time order",
                )
            )
        previous = frame.at
        if frame.ramp and k == 0:
            problems.append(
                located.problem(
                    (*where, "ramp"),
                    "the first keyframe has nothing to ramp from",
                    "ramp: true on later keyframes",
                )
            )
        if frame.end and k != last:
            problems.append(
                located.problem(
                    (*where, "end"),
                    "end: true on a keyframe that is not the last",
                    "end only on the last keyframe",
                )
            )
        for index, gpu_frame in frame.gpus.items():
            if index not in gpu_indexes:
                problems.append(
                    located.problem(
                        (*where, "gpus", index),
                        f"GPU {index} is not declared",
                        f"one of the GPUs: {known_gpus}",
                        key=True,
                    )
                )
            for job_id in gpu_frame.jobs or {}:
                if job_id not in job_ids:
                    hint = None if job_ids else "declare it under jobs: first"
                    problems.append(
                        located.problem(
                            (*where, "gpus", index, "jobs", job_id),
                            f"unknown job {job_id!r}",
                            f"one of the jobs: {', '.join(sorted(job_ids)) or '(none declared)'}",
                            hint,
                            key=True,
                        )
                    )
        for e, event in enumerate(frame.events):
            if event.gpu is not None and event.gpu not in gpu_indexes:
                problems.append(
                    located.problem(
                        (*where, "events", e, "gpu"),
                        f"GPU {event.gpu} is not declared",
                        f"one of the GPUs: {known_gpus}",
                    )
                )
    return problems


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raises ``InputError`` naming file:line:col."""
    return load_located(path)[0]


def load_located(path: str | Path) -> tuple[Scenario, yamlfile.Located]:
    """``load``, with where each key stands (for errors found later, such as ``attach``)."""
    scenario, located, _facts = load_checked(path)
    return scenario, located


def load_checked(path: str | Path) -> tuple[Scenario, yamlfile.Located, os.stat_result]:
    """``load_located``, with the owner and mode of the very file that was read (who may
    write it bounds what its ``attach`` jobs may reach)."""
    text, facts = yamlfile.read(path)
    located = yamlfile.parse(text, str(path))
    if not isinstance(located.data, dict):
        raise located.error(
            (), "a scenario must be a mapping", "keys name, host, gpus, jobs, timeline"
        )
    scenario = yamlfile.validate(Scenario, located)
    problems = _cross_check(scenario, located)
    if problems:
        raise InputError(problems)
    return scenario, located, facts
