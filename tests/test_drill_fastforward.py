"""The drill's fast-forward: what it rests on, and that it changes no record.

1. ``playbook.bounds.decide`` is sound: it says NEVER only where no value within the bounds
   makes the condition true (checked against the compiled condition on sampled values).
2. ``ScenarioSource.stretch`` keeps its promise: within a stretch every numeric field of every
   GPU and process lies between its values at the stretch's first and last instant, and
   nothing else changes (every shipped scenario, and a day like the benchmark's).
3. A drill with the fast-forward writes the records of one without it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from gpuwarden import config as config_module
from gpuwarden import drill
from gpuwarden.engine.quiet import decide_stretch
from gpuwarden.model import GpuProcess, GpuState, Memory, Snapshot
from gpuwarden.playbook import loader
from gpuwarden.playbook.bounds import Const, Span, Truth, decide, parse
from gpuwarden.playbook.expr import Compiler
from gpuwarden.sources.scenario import ScenarioSource

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
RANKS = {"critical": 3, "high": 2, "normal": 1, "low": 0}


# -- 1. the bounds ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fields", "expected"),
    [
        ("gpu.memory.used_pct >= 95", {"gpu.memory.used_pct": Span(70, 94.9)}, Truth.FALSE),
        ("gpu.memory.used_pct >= 95", {"gpu.memory.used_pct": Span(70, 95)}, Truth.MAYBE),
        ("gpu.memory.used_pct >= 95", {"gpu.memory.used_pct": Span(95, 99)}, Truth.ALWAYS),
        ("gpu.memory.used_pct >= 95", {}, Truth.MAYBE),
        ("gpu.memory.used_pct >= 95", {"gpu.memory.used_pct": Const(None)}, Truth.NEVER),
        ("not gpu.memory.used_pct >= 95", {"gpu.memory.used_pct": Span(1, 2)}, Truth.ALWAYS),
        ("not gpu.memory.used_pct >= 95", {"gpu.memory.used_pct": Const(None)}, Truth.MAYBE),
        ("gpu.power_w - 100 > 500", {"gpu.power_w": Span(480, 599)}, Truth.FALSE),
        ("gpu.power_w * 2 > 1300", {"gpu.power_w": Span(480, 651)}, Truth.MAYBE),
        ("gpu.power_w / 2 > 1300", {"gpu.power_w": Span(1, 2)}, Truth.MAYBE),
        ('"hw_slowdown" in gpu.throttle', {"gpu.throttle": Const(("sw_power_cap",))}, Truth.FALSE),
        ('"hw_slowdown" in gpu.throttle', {"gpu.throttle": Const(("hw_slowdown",))}, Truth.ALWAYS),
        ('"hw_slowdown" in gpu.throttle', {}, Truth.MAYBE),
        ("process.priority <= low", {"process.priority": Span(1, 1)}, Truth.FALSE),
        ("process.priority in [low, normal]", {"process.priority": Span(3, 3)}, Truth.FALSE),
        ("process.user == 'bob'", {"process.user": Const("alice")}, Truth.FALSE),
        ("process.user == 'bob'", {"process.user": Const(None)}, Truth.MAYBE),
        # held_for of a condition that never holds is 0 throughout; otherwise unknown
        ("held_for(process.idle) >= 30m", {"process.sm_util_pct": Span(5, 40)}, Truth.FALSE),
        ("held_for(process.idle) >= 30m", {"process.sm_util_pct": Span(0, 40)}, Truth.MAYBE),
        ("held_for(process.idle) >= 30m", {"process.sm_util_pct": Const(None)}, Truth.FALSE),
        (
            "predict(gpu.memory.used_pct, 10m) >= 100",
            {"gpu.memory.used_pct": Span(1, 2)},
            Truth.MAYBE,
        ),
        ("avg(gpu.memory.used_pct, 1m) >= 100", {"gpu.memory.used_pct": Span(1, 2)}, Truth.MAYBE),
        ("time.hour >= 8", {}, Truth.MAYBE),
        ("host.gpus_lost > 0", {}, Truth.MAYBE),
        ("0 < gpu.temperature_c < 80", {"gpu.temperature_c": Span(90, 95)}, Truth.MAYBE),
        # Kleene: one conjunct that never holds decides an `and`; an `or` needs all
        (
            "process.orphaned and process.gpu_memory_mib >= 1024",
            {"process.orphaned": Truth.FALSE},
            Truth.NEVER,
        ),
        (
            "process.orphaned or process.gpu_memory_mib >= 1024",
            {"process.orphaned": Truth.FALSE},
            Truth.MAYBE,
        ),
        (
            "process.orphaned or process.gpu_memory_mib >= 1024",
            {"process.orphaned": Truth.FALSE, "process.gpu_memory_mib": Span(0, 1000)},
            Truth.FALSE,
        ),
    ],
)
def test_decide(text: str, fields: dict[str, Any], expected: Truth) -> None:
    assert decide(parse(text), fields, RANKS) is expected


def test_a_text_that_does_not_parse_is_undecided() -> None:
    assert decide(parse("gpu.memory.used_pct >="), {}, RANKS) is Truth.MAYBE


def test_never_means_never_on_sampled_values() -> None:
    """For conditions of each shape, every value tried within bounds decided NEVER/FALSE
    makes the compiled condition false, and ALWAYS true."""
    compiler = Compiler(tuple(sorted(RANKS, key=RANKS.__getitem__, reverse=True)))
    texts = [
        "gpu.memory.used_pct >= 95 and gpu.temperature_c < 80",
        "gpu.temperature_c >= 88 or gpu.power_w * 2 - 100 > 1000",
        "not (gpu.utilization_pct < 50) and -gpu.power_w < -600",
        "gpu.temperature_c != 70 and gpu.utilization_pct == 90",
        "gpu.temperature_c >= gpu.utilization_pct or gpu.power_w < gpu.memory.used_pct",
        "gpu.temperature_c > gpu.utilization_pct and gpu.power_w <= gpu.memory.used_pct + 600",
        "gpu.temperature_c <= gpu.utilization_pct and gpu.temperature_c < gpu.power_w - 600",
    ]
    spans = [(0.0, 10.0), (60.0, 75.0), (85.0, 96.0), (90.0, 90.0), (70.0, 70.0), (600, 700)]
    names = ("used_pct", "temperature_c", "power_w", "utilization_pct")
    decided = 0
    for text, ranges in itertools.product(texts, itertools.product(spans, repeat=4)):
        fields = {
            f"gpu.memory.{n}" if n == "used_pct" else f"gpu.{n}": Span(*r)
            for n, r in zip(names, ranges, strict=True)
        }
        verdict = decide(parse(text), fields, RANKS)
        if verdict is Truth.MAYBE:
            continue
        decided += 1
        condition = compiler.compile(text, roots=("gpu",))
        for corner in itertools.product(*((r[0], (r[0] + r[1]) / 2, r[1]) for r in ranges)):
            used, temp, power, util = corner
            total = 1000
            gpu = GpuState(
                index=0,
                memory=Memory(total, round(used * total / 100), total - round(used * total / 100)),
                temperature_c=cast(Any, temp),  # a float where an int goes: still ordered
                power_w=power,
                utilization_pct=cast(Any, util),
            )
            if gpu.memory.used_pct != used:  # rounding: not a value within the bounds
                continue
            env: dict[str, object] = {"gpu": gpu, "process": None, "event": None}
            assert condition.test(env) is (verdict is Truth.ALWAYS), (text, ranges, corner)
    assert decided > 100


# -- 2. the stretches -----------------------------------------------------------------------


def _numbers(obj: object, prefix: str) -> Iterator[tuple[str, object]]:
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _numbers(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def _flat(snapshot: Snapshot) -> dict[str, object]:
    out: dict[str, object] = {}
    for gpu in snapshot.gpus:
        out.update(_numbers(gpu, f"gpu{gpu.index}."))
        out[f"gpu{gpu.index}.memory.used_pct"] = gpu.memory.used_pct if gpu.memory else None
    for proc in snapshot.processes:
        assert isinstance(proc, GpuProcess)
        out.update(_numbers(proc, f"pid{proc.pid}@{proc.gpu}."))
    return out


def _check_stretches(path: Path, step: float) -> int:
    """Play ``path`` every ``step`` seconds; check each stretch against its ends. Returns how
    many stretches of more than one instant there were."""
    cfg = config_module.load(ROOT / "config" / "gpuwarden.yaml")
    source = ScenarioSource.open(path, priorities=cfg.priorities, spawn=False)
    try:
        groups: list[list[dict[str, object]]] = []
        key: object = None
        n = 0
        while (now := source.start_time + n * step) <= source.start_time + source.duration:
            got = source.stretch(now)
            flat = _flat(source.snapshot(now))
            if got is None or got != key:
                groups.append([])  # an instant without a stretch is one on its own
            groups[-1].append(flat)
            key = got
            n += 1
    finally:
        source.close()
    long = 0
    for group in groups:
        if len(group) < 2:
            continue
        long += 1
        first, last = group[0], group[-1]
        for flat in group:
            assert flat.keys() == first.keys() == last.keys()
            for name, value in flat.items():
                a, b = first[name], last[name]
                if isinstance(value, int | float) and not isinstance(value, bool):
                    assert isinstance(a, int | float), name
                    assert isinstance(b, int | float), name
                    slack = 2.0 if ".memory." in name else 0.0
                    if name.endswith("_pct") and ".memory." in name:
                        slack = 1.0
                    assert min(a, b) - slack <= value <= max(a, b) + slack, (path.name, name)
                else:
                    assert value == a == b, (path.name, name)
    return long


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_a_stretch_lies_between_its_ends(path: Path) -> None:
    assert _check_stretches(path, 1.0) >= 1
    _check_stretches(path, 0.37)


def test_a_day_like_the_benchmark_s_lies_between_its_ends(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import throughput
    finally:
        sys.path.remove(str(ROOT / "bench"))
    path = throughput.write_day(tmp_path / "day.yaml", hours=1)
    assert _check_stretches(path, 1.0) >= 11


# -- 3. the records -------------------------------------------------------------------------


def _records(path: Path, tick: float) -> list[str]:
    cfg = config_module.load(ROOT / "config" / "gpuwarden.yaml")
    playbooks = loader.load([ROOT / "playbooks"], cfg)
    return [json.dumps(r, sort_keys=True) for r in drill.run(path, cfg, playbooks, tick=tick)]


@pytest.mark.parametrize("tick", [1.0, 0.37])
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_fast_forward_changes_no_record(
    path: Path, tick: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[frozenset[str]] = []
    real = decide_stretch

    def spy(*args: Any, **kwargs: Any) -> tuple[frozenset[str], frozenset[int]]:
        found = real(*args, **kwargs)
        told.append(found[0])
        return found

    monkeypatch.setattr(drill, "decide_stretch", spy)
    fast = _records(path, tick)
    assert any(told), "the fast-forward never found a quiet rule"
    nothing: tuple[frozenset[str], frozenset[int]] = (frozenset(), frozenset())
    monkeypatch.setattr(drill, "decide_stretch", lambda *args, **kwargs: nothing)
    assert _records(path, tick) == fast
