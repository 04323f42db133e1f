"""Engine benchmarks: what one tick costs against GPUs x processes x rules.

    python bench/engine.py              # every shape, steady, and one with ~10% firing
    python bench/engine.py --profile    # where a tick spends its time (cProfile)

Ticks run the real ``Engine`` over playbooks generated into a temporary directory and loaded
by ``gpuwarden.playbook.loader.load``, with the shipped config, on snapshots built from the
model on a simulated clock (one tick a second), after 60 warm-up ticks. Each run reports the
median of five rounds and the fastest and slowest round. Nothing is asserted: the figures are
printed next to their targets, 0.5 ms a tick at 8 x 64 x 30 and 10 ms at 16 x 1024 x 100
(docs/performance.md). Drill
throughput is in bench/throughput.py.
"""

from __future__ import annotations

import datetime as dt
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path

from gpuwarden import config as config_module
from gpuwarden.config import Config
from gpuwarden.engine.engine import Engine
from gpuwarden.engine.incident import Tick
from gpuwarden.model import (
    Event,
    EventKind,
    GpuProcess,
    GpuState,
    Intent,
    Memory,
    Outcome,
    ProcessInfo,
    RemappedRows,
    Snapshot,
)
from gpuwarden.playbook import loader
from gpuwarden.playbook.loader import PlaybookSet
from harness import ROOT, Timing, banner, from_samples, header, playbook_text, profile

# Monday 30 November 2026, 10:00 UTC: inside the working-hours window some rules use.
START = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.UTC).timestamp()
TOTAL_MIB = 81559
WAVE = 30  # snapshots repeat their jitter every WAVE ticks
PERIOD = 240  # firing runs: the hot GPU moves on every PERIOD ticks
TICK_TARGET_S = 0.5e-3  # 8 GPUs x 64 processes x 30 rules
LARGE_TARGET_S = 10e-3  # 16 GPUs x 1024 processes x 100 rules
DRILL_TICK_TARGET_S = 60e-6  # the engine's part of a 24 h drill in 10 s (bench/throughput.py)
PRIORITIES = ("normal", "high", "normal", "low", "normal", "scavenger", "normal", "high")

# (gpus, processes, rules): the target shape first, then one dimension at a time, then both.
SHAPES = (
    (8, 64, 30),
    (8, 256, 30),
    (8, 1024, 30),
    (8, 64, 100),
    (16, 256, 60),
    (16, 1024, 100),
)


# -- playbooks ------------------------------------------------------------------------------


def load_rules(count: int, cfg: Config, directory: Path) -> PlaybookSet:
    path = directory / f"bench-{count}.yaml"
    path.write_text(playbook_text(count), encoding="utf-8")
    return loader.load([path], cfg)


# -- snapshots ------------------------------------------------------------------------------


class Machine:
    """Snapshots of ``gpus`` GPUs shared by ``procs`` processes. With ``firing``, one GPU in
    eight is *hot* (full, throttling, at its power limit) and so are its processes (idle, low
    priority, busy on the CPU, large); which GPU is hot moves on every ``PERIOD`` ticks, and
    an XID 79 on the hot GPU opens each period."""

    def __init__(self, gpus: int, procs: int, *, firing: bool) -> None:
        self.gpus, self.procs, self.firing = gpus, procs, firing
        per_gpu = max(1, procs // gpus)
        self.share = int(0.7 * TOTAL_MIB / per_gpu)
        self.cool = [self._info(k) for k in range(procs)]
        self.hot = [
            replace(i, priority="low", cpu_pct=800.0, rss_mib=70000, checkpoint_signal="SIGUSR1")
            for i in self.cool
        ]
        self._cache: dict[tuple[frozenset[int], int], Snapshot] = {}

    @staticmethod
    def _info(k: int) -> ProcessInfo:
        user = k % 17
        return ProcessInfo(
            pid=100_000 + k,
            name="python",
            cmdline=("python", "train.py", "--rank", str(k)),
            user=f"user{user}",
            uid=2000 + user,
            create_time=START - 86_400 - 60 * k,
            status="running",
            nice=0,
            cpu_pct=95.0,
            rss_mib=12_000,
            slurm_job=str(50_000 + k // 8),
            checkpoint_signal="SIGUSR1" if k % 2 == 0 else None,
            priority=PRIORITIES[k % len(PRIORITIES)],
        )

    def hot_gpus(self, n: int) -> frozenset[int]:
        if not self.firing:
            return frozenset()
        phase = (n // PERIOD) % 8
        return frozenset(g for g in range(self.gpus) if (g + phase) % 8 == 0)

    def snapshot(self, n: int, now: float) -> Snapshot:
        hot = self.hot_gpus(n)
        key = (hot, n % WAVE)
        snap = self._cache.get(key)
        if snap is None:
            snap = self._cache[key] = self._build(hot, n % WAVE)
        events: tuple[Event, ...] = ()
        if hot and n % PERIOD == 0:
            events = (Event(EventKind.XID, now, gpu=min(hot), xid=79, detail="bench"),)
        return replace(snap, time=now, events=events)

    def _build(self, hot: frozenset[int], wave: int) -> Snapshot:
        procs: list[GpuProcess] = []
        used = [800] * self.gpus
        for k in range(self.procs):
            gpu = k % self.gpus
            mib = self.share + ((k * 7 + wave) % 11 - 5) * 16
            used[gpu] += mib
            is_hot = gpu in hot
            procs.append(
                GpuProcess(
                    pid=100_000 + k,
                    gpu=gpu,
                    gpu_memory_mib=mib,
                    info=self.hot[k] if is_hot else self.cool[k],
                    sm_util_pct=0 if is_hot else 60 + (k + wave) % 30,
                )
            )
        states = []
        for g in range(self.gpus):
            is_hot = g in hot
            mem = int(0.98 * TOTAL_MIB) if is_hot else min(used[g], TOTAL_MIB)
            states.append(
                GpuState(
                    index=g,
                    name="NVIDIA H100 80GB HBM3",
                    uuid=f"GPU-bench-{g:04d}",
                    memory=Memory(TOTAL_MIB, mem, TOTAL_MIB - mem, 0),
                    utilization_pct=90 + (g + wave) % 10,
                    temperature_c=91 if is_hot else 62 + (g + wave) % 6,
                    power_w=695.0 if is_hot else 450.0 + 10 * ((g + wave) % 9),
                    power_limit_w=700.0,
                    throttle=("hw_thermal_slowdown",) if is_hot else (),
                    remapped_rows=RemappedRows(0, 0, pending=False, failure=False),
                    pstate=0,
                )
            )
        return Snapshot("bench-node", START, tuple(states), tuple(procs), source="bench")


# -- tick cost ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShapeResult:
    gpus: int
    procs: int
    rules: int
    evaluations: int  # rule x scope pairs whose `when` a tick evaluates
    timing: Timing  # seconds per tick
    records_per_tick: float
    open_incidents: int

    @property
    def per_eval_us(self) -> float:
        return self.timing.median_s * 1e6 / max(1, self.evaluations)


class Bench:
    """One engine ticking over one machine shape on a simulated clock (1 s per tick)."""

    def __init__(self, playbooks: PlaybookSet, cfg: Config, machine: Machine) -> None:
        self.engine = Engine(playbooks, cfg)
        self.machine = machine
        self.n = 0
        self.records = 0
        self.done = Outcome(ok=True, dry_run=True, detail="bench")

    def tick(self) -> None:
        now = START + self.n
        result = self.engine.step(self.machine.snapshot(self.n, now), now)
        self.n += 1
        self.records += len(result.records)
        for record in result.records:
            if isinstance(record, Intent):
                self.engine.complete(record.id, self.done)

    def run(self, ticks: int) -> float:
        began = time.perf_counter()
        for _ in range(ticks):
            self.tick()
        return time.perf_counter() - began


def evaluations(playbooks: PlaybookSet, gpus: int, procs: int) -> int:
    per_scope = {"gpu": gpus, "process": procs, "host": 1, "event": 0}
    return sum(per_scope[r.spec.for_each] for r in playbooks.rules)


def bench_shape(
    cfg: Config, directory: Path, shape: tuple[int, int, int], *, firing: bool = False
) -> ShapeResult:
    gpus, procs, rules = shape
    playbooks = load_rules(rules, cfg, directory)
    bench = Bench(playbooks, cfg, Machine(gpus, procs, firing=firing))
    warm = bench.run(PERIOD if firing else 60) / (PERIOD if firing else 60)
    # A steady round is at least 0.3 s. A firing round is exactly one period (every
    # transition), so that every version of the engine is timed over the same ticks.
    ticks = PERIOD if firing else max(5, int(0.3 / warm))
    bench.records = 0
    samples = [bench.run(ticks) / ticks for _ in range(5)]
    return ShapeResult(
        gpus,
        procs,
        rules,
        evaluations(playbooks, gpus, procs),
        from_samples(samples, ticks),
        bench.records / (5 * ticks),
        len(bench.engine.incidents),
    )


COLUMNS = (
    f"{'run':<10} {'shape':<15} {'evals':>6} {'µs/tick':>8} {'min/max':>10} {'µs/eval':>7} "
    f"{'x evals':>7} {'x time':>6} {'recs/tick':>9} {'open':>9}"
)


def print_shape(label: str, r: ShapeResult, base: ShapeResult | None) -> None:
    """One table line; ``x evals`` and ``x time`` compare with ``base`` (linear: equal)."""
    shape = f"{r.gpus} x {r.procs} x {r.rules}"
    base = base or r
    open_pct = 100 * r.open_incidents / r.evaluations
    more_evals = r.evaluations / base.evaluations
    more_time = r.timing.median_s / base.timing.median_s
    print(
        f"{label:<10} {shape:<15} {r.evaluations:>6} {r.timing.median_s * 1e6:>8.0f} "
        f"{r.timing.spread:>10} {r.per_eval_us:>7.2f} {more_evals:>7.1f} {more_time:>6.1f} "
        f"{r.records_per_tick:>9.2f} {r.open_incidents:>4} {open_pct:>3.0f}%",
        flush=True,
    )


def ticks(cfg: Config) -> None:
    header("Engine tick (GPUs x processes x rules)", COLUMNS)
    results: list[ShapeResult] = []
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        for shape in SHAPES:
            results.append(bench_shape(cfg, Path(tmp), shape))
            print_shape("steady", results[-1], results[0])
        hot = bench_shape(cfg, Path(tmp), SHAPES[0], firing=True)
        print_shape("~10% fire", hot, results[0])
    first = results[0]
    print()
    for r, target in ((first, TICK_TARGET_S), (results[-1], LARGE_TARGET_S)):
        verdict = "met" if r.timing.median_s <= target else "NOT met"
        print(
            f"target: {r.gpus} x {r.procs} x {r.rules} steady tick <= {target * 1e6:,.0f} µs; "
            f"measured {r.timing.median_s * 1e6:,.0f} µs: {verdict}"
        )
    per_eval = [r.per_eval_us for r in results]
    print(
        f"growth: {min(per_eval):.2f} to {max(per_eval):.2f} µs per evaluation over "
        f"{first.evaluations} to {max(r.evaluations for r in results)} evaluations a tick"
    )
    drill_ticks()


# -- the drill's engine ---------------------------------------------------------------------


def drill_snapshots(
    hours: int,
) -> tuple[Config, PlaybookSet, list[tuple[Snapshot, float, Collection[str], Collection[int]]]]:
    """What a drill of the first ``hours`` of throughput.py's day hands ``Engine.step`` at
    each tick, in order: the snapshot, its instant, and the quiet rules and unchanged held
    series its fast-forward told (the shipped playbooks and config)."""
    import throughput
    from gpuwarden import drill

    cfg, playbooks = throughput.shipped()
    played: list[tuple[Snapshot, float, Collection[str], Collection[int]]] = []
    step = Engine.step

    def told(
        engine: Engine,
        snapshot: Snapshot,
        now: float,
        *,
        quiet: Collection[str] = frozenset(),
        still: Collection[int] = frozenset(),
    ) -> Tick:
        played.append((snapshot, now, quiet, still))
        return step(engine, snapshot, now, quiet=quiet, still=still)

    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        path = throughput.write_day(Path(tmp) / "slice.yaml", hours=hours)
        Engine.step = told  # type: ignore[method-assign, assignment]
        try:
            for _ in drill.run(path, cfg, playbooks, tick=1.0):
                pass
        finally:
            Engine.step = step  # type: ignore[method-assign]
    return cfg, playbooks, played


def drill_ticks(hours: int = 3) -> None:
    """The engine alone over a drill's ticks: what the drill pays it per 8-GPU tick, told
    what its fast-forward tells it; and, for comparison, with every rule at every tick."""
    header(f"Engine alone over the {hours} h drill slice (8 GPUs, shipped playbooks, 1 Hz)")
    cfg, playbooks, played = drill_snapshots(hours)
    done = Outcome(ok=True, dry_run=True, detail="bench")

    def replay(*, told: bool) -> float:
        engine = Engine(playbooks, cfg)
        began = time.perf_counter()
        for snapshot, now, quiet, still in played:
            tick = (
                engine.step(snapshot, now, quiet=quiet, still=still)
                if told
                else engine.step(snapshot, now)
            )
            for record in tick.records:
                if isinstance(record, Intent):
                    engine.complete(record.id, done)
        return (time.perf_counter() - began) / len(played)

    timing = from_samples([replay(told=True) for _ in range(5)], len(played))
    every = from_samples([replay(told=False) for _ in range(5)], len(played))
    print(
        f"{'Engine.step per drill tick, as the drill runs it':<52} "
        f"{timing.median_s * 1e6:>9.1f} µs {timing.spread:>11}  ({timing.how})"
    )
    print(
        f"{'  every rule at every tick (no fast-forward)':<52} "
        f"{every.median_s * 1e6:>9.1f} µs {every.spread:>11}  ({every.how})"
    )
    verdict = "met" if timing.median_s <= DRILL_TICK_TARGET_S else "NOT met"
    print(
        f"\ntarget: engine per 8-GPU drill tick well under {DRILL_TICK_TARGET_S * 1e6:.0f} µs; "
        f"measured {timing.median_s * 1e6:.1f} µs: {verdict}"
    )


# -- profile --------------------------------------------------------------------------------


def main(*, with_profile: bool = False) -> None:
    cfg = config_module.load(ROOT / "config" / "gpuwarden.yaml")
    if not with_profile:
        ticks(cfg)
        return
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        bench = Bench(load_rules(30, cfg, Path(tmp)), cfg, Machine(8, 64, firing=False))
        bench.run(60)
        profile("1000 ticks of 8 x 64 x 30, steady", lambda: bench.run(1000))


if __name__ == "__main__":
    print(banner())
    main(with_profile="--profile" in sys.argv[1:])
