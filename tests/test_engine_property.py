"""Property test: the engine's fast path gives exactly the records of the plain one.

``Engine(reference=True)`` evaluates every rule in every scope of every tick, each in a fresh
environment, one scope at a time, and records history the same way. The default engine
evaluates each rule over all scopes of a kind in one call and visits only the scopes that hold
or have a state. Random sequences of snapshots — GPUs and processes that come and go, a PID
listed twice on one GPU, events (two on one GPU in a tick), unknown values and a value of the
wrong type, the clock standing still or jumping — go through both, with every intent completed
at once as in a drill, and the records must be equal, field by field and in order. The same
holds when each tick is told which rules cannot hold there (``quiet``, as a drill's
fast-forward derives it from bounds on the fields), and does not when told wrongly.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.engine.engine import Engine
from gpuwarden.engine.quiet import quiet_rules, still_series
from gpuwarden.model import (
    Event,
    EventKind,
    GpuProcess,
    GpuState,
    Intent,
    Memory,
    Outcome,
    ProcessInfo,
    RuleChange,
    Snapshot,
)
from gpuwarden.playbook.loader import PlaybookSet, load
from tests.test_engine import T0, TOTAL_MIB, config

OK = Outcome(ok=True, detail="property")

# Every kind of scope and rule: `for`, `until`, cooldown, an `active` window, a schedule,
# history of each root (a process rule reading its GPU's), held_for, and a process rule that
# reads gpu.* and host.*.
RULES = """
rules:
  - name: mem
    when: gpu.memory.used_pct >= 90
    for: 20s
    until: gpu.memory.used_pct < 70
    cooldown: 30s
    steps:
      - notify: oncall
      - after: 10s
        kill: {select: process.priority <= low, order: [-gpu_memory_mib],
               free_until: gpu.memory.used_pct < 80, grace: 5s}
  - name: hot
    when: gpu.temperature_c >= 85 or "hw_thermal_slowdown" in gpu.throttle
    steps: [{notify: oncall}, {power_cap: {percent: 80}}]
  - name: trend
    when: predict(gpu.memory.used_pct, 2m, 1m) >= 100 and rate(gpu.memory.used_pct, 1m) > 0
    for: 10s
    until: avg(gpu.memory.used_pct, 30s) < 50
    steps: [{notify: oncall}]
  - name: power
    when: max(gpu.power_w, 1m) - min(gpu.power_w, 1m) > 100 or gpu.power_w / gpu.power_limit_w > 0.9
    steps: [{notify: team}]
  - name: idle-big
    for_each: process
    when: process.gpu_memory_mib >= 20000 and held_for(process.idle) >= 30s
    cooldown: 1m
    steps: [{notify: oncall}, {after: 20s, kill: {select: process.priority <= low}}]
  - name: squeeze
    for_each: process
    when: >-
      process.priority <= low and gpu.memory.used_pct >= 80
      and avg(gpu.memory.used_pct, 1m) >= 75 and host.memory_used_pct >= 50
    for: 15s
    steps: [{notify: team}, {renice: {nice: 19}}]
  - name: working-hours
    for_each: process
    active: "Mon-Fri 08:00-20:00"
    when: process.cpu_pct >= 90 and process.age_s > 60
    steps: [{notify: team}]
  - name: host-full
    for_each: host
    when: max(host.memory_used_pct, 1m) >= 85 and host.process_count > 1
    for: 10s
    steps: [{notify: oncall}]
  - name: xid
    for_each: event
    when: event.kind == "xid" and event.xid in [48, 79, 94] or event.kind == "gpu_lost"
    cooldown: 20s
    steps:
      - notify: oncall
      - checkpoint: {select: process.checkpointable and process.gpu == event.gpu}
  - name: scheduled
    every: 45s
    when: gpu.memory.used_pct >= 60 and time.hour >= 0
    steps: [{notify: team}]
"""

PIDS = (101, 102, 103, 104, 105, 106)
PRIORITIES = ("low", "normal", "high")


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> PlaybookSet:
    path: Path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(textwrap.dedent(RULES))
    return load([path], config())


@pytest.fixture(scope="module")
def idle_rules(tmp_path_factory: pytest.TempPathFactory) -> PlaybookSet:
    """``RULES`` less the rules that are never quiet (a host rule, one that reads ``host.*``,
    one that divides): ticks where nothing is left to evaluate happen (``Engine._idle``)."""
    head, *blocks = textwrap.dedent(RULES).split("\n  - name: ")
    kept = [b for b in blocks if b.split("\n", 1)[0] not in ("host-full", "squeeze", "power")]
    path: Path = tmp_path_factory.mktemp("idle") / "rules.yaml"
    path.write_text("\n  - name: ".join([head, *kept]))
    return load([path], config())


def _gpu(index: int, pct: int | None, temp: Any, power: float, hot: bool) -> GpuState:
    used = None if pct is None else pct * TOTAL_MIB // 100
    return GpuState(
        index=index,
        memory=Memory(TOTAL_MIB, used, None if used is None else TOTAL_MIB - used),
        temperature_c=temp,
        power_w=power,
        power_limit_w=700.0,
        throttle=("hw_thermal_slowdown",) if hot else (),
    )


def _proc(pid: int, gpu: int, mib: int | None, sm: int | None, cpu: float, rank: int) -> GpuProcess:
    info = ProcessInfo(
        pid=pid,
        create_time=T0 - 100 * pid,
        cpu_pct=cpu,
        priority=PRIORITIES[rank],
        checkpoint_signal="SIGUSR1" if pid % 2 else None,
    )
    return GpuProcess(pid=pid, gpu=gpu, gpu_memory_mib=mib, info=info, sm_util_pct=sm)


temps = st.one_of(st.none(), st.integers(60, 95), st.just("hot"))  # "hot": a wrong type
gpu_frames = st.tuples(
    st.one_of(st.none(), st.integers(40, 100)), temps, st.floats(300, 700), st.booleans()
)
proc_frames = st.tuples(
    st.sampled_from(PIDS),
    st.integers(0, 2),
    st.one_of(st.none(), st.integers(1000, 60000)),
    st.one_of(st.none(), st.sampled_from((0, 0, 50))),
    st.sampled_from((10.0, 95.0)),
    st.integers(0, 2),
)
event_frames = st.tuples(
    st.sampled_from((EventKind.XID, EventKind.GPU_LOST)),
    st.one_of(st.none(), st.integers(0, 2)),
    st.sampled_from((13, 48, 79)),
)
frames = st.lists(
    st.tuples(
        st.sampled_from((0, 1, 5, 10, 10, 30, 600)),  # seconds since the last tick
        st.lists(gpu_frames, min_size=0, max_size=3),
        st.lists(proc_frames, max_size=6),
        st.lists(event_frames, max_size=2),
    ),
    min_size=1,
    max_size=30,
)


def _snapshots(draw: list[Any]) -> list[tuple[float, Snapshot]]:
    out: list[tuple[float, Snapshot]] = []
    now = T0
    for gap, gpus, procs, events in draw:
        now += gap
        states = tuple(_gpu(i, *g) for i, g in enumerate(gpus))
        listed = tuple(_proc(*p) for p in procs)
        happened = tuple(Event(kind, now, gpu=g, xid=x) for kind, g, x in events)
        out.append((now, Snapshot("node-1", now, states, listed, happened)))
    return out


Quiet = Callable[[Engine, Snapshot, float], Collection[str]]
Still = Callable[[tuple[Snapshot, float] | None, Snapshot, float], Collection[int]]


def _run(
    engine: Engine,
    snapshots: list[tuple[float, Snapshot]],
    quiet: Quiet | None = None,
    still: Still | None = None,
) -> list[RuleChange | Intent]:
    records: list[RuleChange | Intent] = []
    last: tuple[Snapshot, float] | None = None
    for now, snapshot in snapshots:
        told = frozenset() if quiet is None else quiet(engine, snapshot, now)
        kept = frozenset() if still is None else still(last, snapshot, now)
        tick = engine.step(snapshot, now, quiet=told, still=kept)
        last = (snapshot, now)
        records.extend(tick.records)
        for intent in tick.intents:
            engine.complete(intent.id, OK)
    return records


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(draw=frames)
def test_fast_path_records_equal_the_plain_ones(rules: PlaybookSet, draw: list[Any]) -> None:
    cfg = config()
    snapshots = _snapshots(draw)
    fast = _run(Engine(rules, cfg), snapshots)
    plain = _run(Engine(rules, cfg, reference=True), snapshots)
    assert fast == plain
    assert _run(Engine(rules, cfg), snapshots, _proven(rules)) == plain


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(draw=frames, repeats=st.lists(st.integers(1, 4), min_size=30, max_size=30))
def test_idle_ticks_record_as_the_plain_path(
    idle_rules: PlaybookSet, draw: list[Any], repeats: list[int]
) -> None:
    """With rules that can all be quiet, some ticks evaluate nothing and only record history,
    some of it not again (``still``, where a tick shows the GPUs and processes of the one
    before: each drawn tick is held for a few more): the records are the plain path's."""
    cfg = config()
    held = [
        tick
        for (gap, gpus, procs, events), n in zip(draw, repeats, strict=False)
        for tick in [(gap, gpus, procs, events)] + [(10, gpus, procs, [])] * (n - 1)
    ]
    snapshots = _snapshots(held)
    plain = _run(Engine(idle_rules, cfg, reference=True), snapshots)
    proven, unchanged = _proven(idle_rules), _unchanged(idle_rules)
    assert _run(Engine(idle_rules, cfg), snapshots, proven, unchanged) == plain


def _unchanged(rules: PlaybookSet) -> Still:
    """The held series ``still_series`` shows unchanged from the last tick to this one (a
    stretch of two ticks: its ends are all it holds)."""
    tz = config().tz

    def still(
        last: tuple[Snapshot, float] | None, snapshot: Snapshot, now: float
    ) -> frozenset[int]:
        return frozenset() if last is None else still_series(rules, last, (snapshot, now), tz)

    return still


def _proven(rules: PlaybookSet) -> Quiet:
    """The rules ``quiet_rules`` shows false at a tick, from that tick alone and the history
    before it (a stretch of one tick: random snapshots do not move one way, so no longer
    stretch is sound)."""
    tz = config().tz
    told: list[frozenset[str]] = [frozenset()]

    def quiet(engine: Engine, snapshot: Snapshot, now: float) -> frozenset[str]:
        end = (snapshot, now)
        found = quiet_rules(rules, end, end, tz, history=engine.history, ticks=[now])
        if found != told[-1]:  # the same object while it does not change, as in a drill
            told.append(found)
        return told[-1]

    return quiet


def test_the_property_sees_every_kind_of_record(rules: PlaybookSet) -> None:
    """The random scenarios above can fire each rule: one hand-made sequence does."""
    cfg = config()
    gpus_hot = [(95, 90, 690.0, True), (92, "hot", 400.0, False), (None, None, 350.0, False)]
    procs = [(101, 0, 30000, 0, 95.0, 0), (101, 0, 30000, 0, 95.0, 0), (102, 1, 25000, 0, 95.0, 0)]
    draw: list[Any] = [(10, gpus_hot, procs, [(EventKind.XID, 0, 79), (EventKind.XID, 0, 48)])]
    draw += [(10, gpus_hot, procs, [])] * 8
    draw += [(30, [(50, 60, 300.0, False)], procs[:1], [])] * 4
    snapshots = _snapshots(draw)
    fast = _run(Engine(rules, cfg), snapshots)
    assert fast == _run(Engine(rules, cfg, reference=True), snapshots)
    fired = {r.rule for r in fast if isinstance(r, RuleChange) and str(r.kind) == "firing"}
    assert fired >= {"mem", "hot", "power", "idle-big", "squeeze", "xid", "scheduled"}
    proven = _proven(rules)
    assert _run(Engine(rules, cfg), snapshots, proven) == fast
    # At the cool ticks at the end some rules are shown quiet; not the one that holds
    # there (working-hours) nor one that reads held_for of a condition that holds.
    engine = Engine(rules, cfg)
    _run(engine, snapshots[:-1])
    end, last = snapshots[-1]
    at_end = proven(engine, last, end)
    assert {"mem", "hot", "squeeze", "trend"} <= set(at_end)
    assert not {"working-hours", "idle-big", "scheduled", "xid"} & set(at_end)
    # Told wrongly (every rule quiet at every tick), the engine loses records: the comparison
    # above can fail.
    every = frozenset(r.name for r in rules.rules)
    wrong = _run(Engine(rules, cfg), snapshots, lambda engine, snapshot, now: every)
    assert wrong != fast
    assert {r.rule for r in fast} - {r.rule for r in wrong} >= {"mem", "hot", "idle-big"}


def test_held_series_told_unchanged(idle_rules: PlaybookSet) -> None:
    """A process turns idle while it holds little memory (every rule quiet: idle ticks),
    then grows: ``idle-big`` fires once it has been idle 30 s. Shown unchanged where they
    are, the held series give the same records; told so wrongly at every tick, the engine
    never records that the process turned idle, and the rule does not fire."""
    cfg = config()
    cool = [(50, 60, 300.0, False)]
    busy, idle_small, idle_big = (
        (101, 0, 1000, 50, 10.0, 0),
        (101, 0, 1000, 0, 10.0, 0),
        (
            101,
            0,
            30000,
            0,
            10.0,
            0,
        ),
    )
    draw: list[Any] = [(10, cool, [busy], [])] * 2
    draw += [(10, cool, [idle_small], [])] * 4 + [(10, cool, [idle_big], [])] * 3
    snapshots = _snapshots(draw)
    plain = _run(Engine(idle_rules, cfg, reference=True), snapshots)
    assert "idle-big" in {r.rule for r in plain}
    proven, unchanged = _proven(idle_rules), _unchanged(idle_rules)
    engine = Engine(idle_rules, cfg)
    assert _run(engine, snapshots, proven, unchanged) == plain
    held = frozenset(s.id for s in idle_rules.series if s.kind == "held")
    wrong = _run(Engine(idle_rules, cfg), snapshots, proven, lambda last, snapshot, now: held)
    fired = [r.time for r in plain if isinstance(r, RuleChange) and str(r.kind) == "firing"]
    late = [r.time for r in wrong if isinstance(r, RuleChange) and str(r.kind) == "firing"]
    assert len(fired) == 1
    assert late == []


def test_a_quiet_rule_cooling_down_is_not_evaluated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mem`` (alone) fires, resolves and cools down for 30 s while the GPU is shown quiet:
    those ticks evaluate no rule (``Engine._idle``) until the cooldown ends, and when the
    GPU fills again the rule fires when the plain path fires it."""
    cfg = config()
    head, *blocks = textwrap.dedent(RULES).split("\n  - name: ")
    path = tmp_path / "mem.yaml"
    path.write_text("\n  - name: ".join([head, *(b for b in blocks if b.startswith("mem\n"))]))
    idle_rules = load([path], cfg)
    assert [r.name for r in idle_rules.rules] == ["mem"]
    full, calm = [(95, 60, 300.0, False)], [(50, 60, 300.0, False)]
    draw: list[Any] = [(1, full, [], [])] * 40 + [(1, calm, [], [])] * 50 + [(1, full, [], [])] * 30
    snapshots = _snapshots(draw)
    plain = _run(Engine(idle_rules, cfg, reference=True), snapshots)
    changes = [
        (str(r.kind), r.time - T0) for r in plain if isinstance(r, RuleChange) and r.rule == "mem"
    ]
    assert changes == [
        ("pending", 1.0),
        ("firing", 21.0),
        ("resolved", 41.0),
        ("pending", 91.0),
        ("firing", 111.0),
    ]
    engine = Engine(idle_rules, cfg)
    idle_cooling: list[float] = []
    idle = Engine._idle

    def spy(self: Engine, snapshot: Snapshot, now: float, *args: Any) -> bool:
        was = idle(self, snapshot, now, *args)
        held = self._lifecycle.states.get("mem")
        if was and held:
            idle_cooling.append(now - T0)
        return was

    monkeypatch.setattr(Engine, "_idle", spy)
    assert _run(engine, snapshots, _proven(idle_rules)) == plain
    # Resolved at 41 s with a 30 s cooldown: from the next tick until the cooldown ends.
    assert idle_cooling == [float(t) for t in range(42, 71)]
