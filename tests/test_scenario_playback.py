"""Scenario playback against a plain reference: every snapshot of varied scenarios (random ones,
and every shipped one) equals what the module docstring's rules give when worked out from the
keyframes alone, instant by instant, with nothing kept from one snapshot to the next.

The scenarios mix everything playback has shortcuts for: ramping and non-ramping keyframes,
keyframes at the same time, a first keyframe after the start, fields given, dropped (null) or
unsupported, jobs ramping in and out with and without SM %, memory given outright, lost GPUs,
events; the plays mix instants inside and between seconds, repeated instants, peeks, and jobs
made to vanish as a drill does after a kill."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.model import (
    Ecc,
    Event,
    EventKind,
    GpuProcess,
    GpuState,
    Memory,
    RemappedRows,
    RetiredPages,
    Snapshot,
)
from gpuwarden.sources import scenario_format
from gpuwarden.sources.scenario import ScenarioSource
from gpuwarden.sources.scenario_format import Scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
ROUNDED = ("utilization_pct", "memory_utilization_pct", "temperature_c")
# A GPU after a keyframe: its fields' values, and its jobs' (MiB, SM %) by id.
GpuValues = tuple[dict[str, Any], dict[str, tuple[float, Any]]]


class Reference:
    """Playback worked out from scratch at every instant."""

    def __init__(self, scenario: Scenario, source: ScenarioSource) -> None:
        self.scenario = scenario
        self.source = source  # for what playback does not change: identities, attributions
        self.start = source.start_time
        self.frames = scenario.timeline
        self.vanished: set[str] = set()
        self.reported: float | None = None  # the offset of the last snapshot (not a peek)
        self.lost: set[int] = set()
        # Every GPU right at each keyframe.
        self.states: list[dict[int, GpuValues]] = []
        current: dict[int, GpuValues] = {gpu.index: ({"other_mib": 0}, {}) for gpu in scenario.gpus}
        for frame in self.frames:
            current = {i: (dict(v), dict(j)) for i, (v, j) in current.items()}
            for index, change in frame.gpus.items():
                values, _ = current[index]
                for name in change.model_fields_set - {"jobs"}:
                    values[name] = getattr(change, name)
                if change.jobs is not None:
                    jobs: dict[str, tuple[float, Any]] = {}
                    for job_id, use in change.jobs.items():
                        if isinstance(use, int):
                            jobs[job_id] = (float(use), None)
                        else:
                            jobs[job_id] = (float(use.memory_mib), use.sm_pct)
                    current[index] = (values, jobs)
            self.states.append(current)

    def snapshot(self, now: float, *, consume: bool = True) -> Snapshot:
        offset = max(0.0, now - self.start)
        due = sum(1 for frame in self.frames if frame.at <= offset)
        index = max(0, due - 1)
        ramps = 1 <= due < len(self.frames) and self.frames[due].ramp
        f = 0.0
        if ramps:
            span = self.frames[index + 1].at - self.frames[index].at
            f = (offset - self.frames[index].at) / span if span > 0 else 1.0
        gpus, processes = [], []
        for spec in self.scenario.gpus:
            before = self.states[index][spec.index]
            after = self.states[index + 1][spec.index] if ramps else None
            gpu, on_it = self.gpu(spec, before, after, f)
            gpus.append(gpu)
            processes += on_it
        events = []
        if consume:
            for gpu in gpus:
                if gpu.lost and gpu.index not in self.lost and self.reported is not None:
                    events.append(
                        Event(EventKind.GPU_LOST, now, gpu.index, None, gpu.error or "GPU is lost")
                    )
            self.lost = {gpu.index for gpu in gpus if gpu.lost}
            for frame in self.frames:
                if (self.reported is None or frame.at > self.reported) and frame.at <= offset:
                    for e in frame.events:
                        when = self.start + frame.at
                        events.append(Event(e.kind, when, e.gpu, e.xid, e.detail))
            self.reported = offset
        return Snapshot(
            host=self.scenario.host,
            time=now,
            gpus=tuple(gpus),
            processes=tuple(processes),
            events=tuple(sorted(events, key=lambda e: e.time)),
            source=self.source.name,
        )

    def gpu(
        self, spec: Any, before: Any, after: Any, f: float
    ) -> tuple[GpuState, list[GpuProcess]]:
        uuid, bus = self.source._identity(spec)
        values, jobs = before
        lost = values.get("lost")
        if lost:
            error = lost if isinstance(lost, str) else "GPU is lost"
            return GpuState(spec.index, spec.name, uuid, bus, lost=True, error=error), []
        unsupported = set(spec.unsupported)
        later = after[0] if after is not None else {}

        def at_f(name: str) -> Any:
            a, b = values.get(name), later.get(name)
            return a if a is None or b is None else a + (b - a) * f

        def field(name: str) -> Any:
            if name in unsupported:
                return None
            value = at_f(name)
            return round(value) if name in ROUNDED and value is not None else value

        present = []  # (job id, MiB, SM %)
        if after is None:
            present = [(job_id, mib, sm) for job_id, (mib, sm) in jobs.items()]
        else:
            for job_id in [*jobs, *(j for j in after[1] if j not in jobs)]:
                if job_id not in jobs and f <= 0:
                    continue  # ramping in: not there at the keyframe
                mib_a, sm_a = jobs.get(job_id, (0.0, None))
                mib_b, sm_b = after[1].get(job_id, (0.0, None))
                sm = sm_a  # a job ramping out keeps its SM %, as does one without it at the end
                if job_id in after[1] and sm_b is not None:
                    lerp = None if sm_a is None else sm_a + (sm_b - sm_a) * f
                    sm = sm_b if sm_a is None and f >= 1 else lerp
                present.append((job_id, mib_a + (mib_b - mib_a) * f or 0.0, sm))
        present = [job for job in present if job[0] not in self.vanished]
        used = at_f("memory_used_mib")
        if used is None:
            used = sum(mib for _, mib, _ in present) + (at_f("other_mib") or 0)
        used_mib = min(round(used), spec.memory_total_mib)
        reserved = None if "memory_reserved_mib" in unsupported else spec.memory_reserved_mib
        ecc, rows, pages = (
            None if name in unsupported else values.get(name)
            for name in ("ecc", "remapped_rows", "retired_pages")
        )
        zero_ecc = Ecc(0, 0, 0, 0)
        gpu = GpuState(
            index=spec.index,
            name=spec.name,
            uuid=uuid,
            pci_bus_id=bus,
            memory=Memory(
                spec.memory_total_mib, used_mib, spec.memory_total_mib - used_mib, reserved
            ),
            utilization_pct=field("utilization_pct"),
            memory_utilization_pct=field("memory_utilization_pct"),
            temperature_c=field("temperature_c"),
            power_w=field("power_w"),
            power_limit_w=None if "power_limit_w" in unsupported else spec.power_limit_w,
            throttle=None if "throttle" in unsupported else tuple(values.get("throttle") or ()),
            ecc=None if "ecc" in unsupported else Ecc(**ecc.model_dump()) if ecc else zero_ecc,
            remapped_rows=None
            if "remapped_rows" in unsupported or pages is not None
            else RemappedRows(**rows.model_dump())
            if rows
            else RemappedRows(0, 0, False, False),
            retired_pages=RetiredPages(**pages.model_dump()) if pages else None,
            pstate=None if "pstate" in unsupported else values.get("pstate") or 0,
            mig_mode=None if "mig_mode" in unsupported else spec.mig_mode,
        )
        on_it = []
        for job_id, mib, sm in present:
            info = self.source._synthetic_info(job_id)
            assert info is not None
            on_it.append(
                GpuProcess(
                    pid=info.pid,
                    gpu=spec.index,
                    gpu_memory_mib=None if "process_memory" in unsupported else round(mib),
                    info=info,
                    sm_util_pct=None if "sm_util" in unsupported or sm is None else round(sm),
                    gpu_uuid=uuid,
                )
            )
        return gpu, on_it


UNSUPPORTABLE = sorted(scenario_format.UNSUPPORTABLE)


def number(rng: random.Random, low: int, high: int) -> float:
    return rng.choice([rng.randint(low, high), round(rng.uniform(low, high), 2)])


def random_gpu_frame(rng: random.Random, jobs: list[str], first: bool) -> dict[str, Any]:
    frame: dict[str, Any] = {}
    for name, low, high in (
        ("utilization_pct", 0, 100),
        ("memory_utilization_pct", 0, 100),
        ("temperature_c", 20, 95),
        ("power_w", 50, 700),
    ):
        chance = rng.random()
        if chance < 0.6:
            frame[name] = number(rng, low, high)
        elif chance < 0.7:
            frame[name] = None
    chance = rng.random()
    if chance < 0.2:
        frame["memory_used_mib"] = rng.randint(0, 900)
    elif chance < 0.3 and not first:
        frame["memory_used_mib"] = None
    if rng.random() < 0.4:
        frame["other_mib"] = rng.randint(0, 300)
    if rng.random() < 0.3:
        frame["throttle"] = rng.choice([[], ["sw_power_cap"], ["hw_slowdown", "gpu_idle"]])
    if rng.random() < 0.2:
        frame["ecc"] = {"volatile_corrected": rng.randint(0, 3), "aggregate_uncorrected": 1}
    if rng.random() < 0.2:
        frame["remapped_rows"] = {"correctable": rng.randint(0, 3), "pending": True}
    if rng.random() < 0.1:
        frame["retired_pages"] = {"single_bit": 1, "double_bit": 0, "pending": False}
    if rng.random() < 0.2:
        frame["pstate"] = rng.randint(0, 8)
    if rng.random() < 0.1:
        frame["lost"] = rng.choice([True, "fell off the bus", False])
    if jobs and rng.random() < 0.7:
        uses: dict[str, Any] = {}
        for job_id in rng.sample(jobs, rng.randint(0, len(jobs))):
            chance = rng.random()
            if chance < 0.3:
                uses[job_id] = rng.randint(0, 400)
            elif chance < 0.5:
                uses[job_id] = {"memory_mib": rng.randint(0, 400)}
            else:
                sm = rng.choice([0, 37, round(rng.uniform(0, 100), 3)])
                uses[job_id] = {"memory_mib": rng.randint(0, 400), "sm_pct": sm}
        frame["jobs"] = uses
    return frame


def random_scenario(rng: random.Random) -> Scenario:
    jobs = [f"job{i}" for i in range(rng.randint(0, 5))]
    gpus = []
    for index in range(rng.randint(1, 3)):
        spec: dict[str, Any] = {"index": index, "memory_total_mib": rng.choice([1000, 81920])}
        if rng.random() < 0.5:
            spec["power_limit_w"] = rng.choice([300, 700.5])
        if rng.random() < 0.3:
            spec["memory_reserved_mib"] = 500
        if rng.random() < 0.3:
            spec["mig_mode"] = True
        if rng.random() < 0.4:
            spec["unsupported"] = rng.sample(UNSUPPORTABLE, rng.randint(1, 4))
        gpus.append(spec)
    timeline = []
    at: float = rng.choice([0, 0, 0, 3])
    for k in range(rng.randint(1, 7)):
        frame: dict[str, Any] = {"at": at, "ramp": k > 0 and rng.random() < 0.7}
        frame["gpus"] = {
            gpu["index"]: random_gpu_frame(rng, jobs, k == 0)
            for gpu in gpus
            if k == 0 or rng.random() < 0.75
        }
        if rng.random() < 0.3:
            frame["events"] = [{"gpu": rng.randrange(len(gpus)), "xid": rng.choice([13, 79])}]
        timeline.append(frame)
        at += rng.choice([0, 1, 1.5, 7, 30, 61])
    timeline[-1]["end"] = True
    return Scenario.model_validate(
        {
            "name": "random",
            "host": rng.choice(["h1", "node-2"]),
            "gpus": gpus,
            "jobs": [
                {"id": job_id, "cmdline": f"python {job_id}.py", "orphaned": rng.random() < 0.2}
                for job_id in jobs
            ],
            "timeline": timeline,
        }
    )


def play_both(scenario: Scenario, rng: random.Random, offsets: list[float]) -> int:
    """Play ``offsets`` through playback and the reference; the snapshots compared."""
    compared = 0
    with ScenarioSource(scenario, spawn=False) as source:
        reference = Reference(scenario, source)
        for offset in offsets:
            now = source.start_time + offset
            chance = rng.random()
            if chance < 0.05 and scenario.jobs:
                job_id = rng.choice(scenario.jobs).id
                assert source.vanish(source.pid_of(job_id))
                reference.vanished.add(job_id)
            if chance > 0.8:
                assert source.peek(now) == reference.snapshot(now, consume=False), offset
                compared += 1
            assert source.snapshot(now) == reference.snapshot(now), offset
            compared += 1
    return compared


@pytest.mark.parametrize("seed", range(120))
def test_random_scenarios_play_as_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    scenario = random_scenario(rng)
    # Every half second to past the end, and instants in between, some of them twice.
    offsets = [k * 0.5 for k in range(int(scenario.duration * 2) + 6)]
    offsets += [rng.uniform(-2, scenario.duration + 2) for _ in range(12)]
    offsets += rng.sample(offsets, 4)
    assert play_both(scenario, rng, sorted(offsets)) >= len(offsets)


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_scenarios_play_as_the_reference(path: Path) -> None:
    scenario, _, _ = scenario_format.load_checked(path)
    rng = random.Random(path.stem)
    seconds = int(scenario.duration)
    step = max(1, seconds // 600)  # at most ~600 instants a scenario
    offsets = [float(s) for s in range(0, seconds + 2, step)]
    assert play_both(scenario, rng, offsets) >= len(offsets)


@pytest.mark.parametrize("seed", range(60))
def test_a_stretch_never_comes_back_once_left(seed: int) -> None:
    """The drill finds a stretch's last tick by bisection: that needs each stretch's
    instants to follow one another."""
    scenario = random_scenario(random.Random(seed))
    with ScenarioSource(scenario, spawn=False) as source:
        keys = [
            source.stretch(source.start_time + k * 0.5)
            for k in range(-4, int(scenario.duration * 2) + 6)
        ]
    left: set[object] = set()
    for before, after in itertools.pairwise(keys):
        assert after not in left, (before, after, keys)
        if after != before and before is not None:
            left.add(before)
    assert any(key is not None for key in keys) or scenario.duration == 0
