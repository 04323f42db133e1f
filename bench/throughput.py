"""Drill throughput: how fast ``gpuwarden drill`` replays a day on a simulated clock.

    python bench/throughput.py              # a 3-hour slice three times, then the whole day
    python bench/throughput.py --profile    # where a one-hour drill spends its time

A 24-hour, 8-GPU scenario is generated into a temporary directory (a keyframe every five
minutes, ramping between them, a few jobs and a day's worth of incidents) and run through
``gpuwarden.drill.run`` at 1 Hz with the shipped playbooks and config. Target: the whole day
in at most 10 s of wall time (docs/performance.md).
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gpuwarden import config as config_module
from gpuwarden import drill
from gpuwarden.config import Config
from gpuwarden.playbook import loader
from gpuwarden.playbook.loader import PlaybookSet
from harness import ROOT, banner, from_samples, header, profile

TOTAL_MIB = 81559
DRILL_TARGET_S = 10.0  # a 24-hour drill at 1 Hz
SLICE_HOURS = 3  # 00:00-03:00, with the night's memory-pressure incident
SLICE_ROUNDS = 3


def _job(name: str, cmdline: str, user: str, **more: Any) -> dict[str, Any]:
    return {"id": name, "cmdline": cmdline, "user": user, "started": "2d", **more}


TRAIN_ENV = {"GPUWARDEN_PRIORITY": "high", "GPUWARDEN_CHECKPOINT_SIGNAL": "SIGUSR2"}
SWEEP_ENV = {"GPUWARDEN_PRIORITY": "low", "GPUWARDEN_CHECKPOINT_SIGNAL": "SIGUSR1"}
DAY_JOBS = [
    *(
        _job(f"train-r{g}", f"torchrun pretrain.py --rank {g}", "erin", env=dict(TRAIN_ENV))
        for g in range(6)
    ),
    _job("notebook", "python -m ipykernel_launcher -f kernel.json", "dave"),
    _job("serve", "python serve.py --port 8000", "svc-infer", env={"GPUWARDEN_PRIORITY": "normal"}),
    _job("sweep-a", "python sweep.py --trial 17", "carol", env=dict(SWEEP_ENV)),
    _job("sweep-b", "python sweep.py --trial 18", "carol", env=dict(SWEEP_ENV)),
    _job("finetune", "python finetune.py --lora", "bob", env={"GPUWARDEN_PRIORITY": "low"}),
    {"id": "ghost", "cmdline": "python eval.py", "orphaned": True},
]


def _day_frame(g: int, at: int, rng: random.Random) -> dict[str, Any]:
    """GPU ``g`` at ``at`` seconds into the day: busy, jittered, and the day's incidents:
    01:00 GPU 7 fills up; 09:00 the weekly check finds GPU 3's pending row remap; 10:30-13:00
    a large low-priority job in working hours; 14:00 GPU 3 overheats; 16:00 GPU 4 leaks
    memory; 18:00 XID 94 on GPU 5; 20:00 the notebook goes idle holding 38 GiB; 21:00 memory
    held by a dead PID on GPU 2."""
    hour = at / 3600

    def use(mib: int, sm: tuple[int, int]) -> dict[str, int]:
        return {"memory_mib": mib + rng.randint(-400, 400), "sm_pct": rng.randint(*sm)}

    frame: dict[str, Any] = {
        "utilization_pct": rng.randint(85, 99),
        "temperature_c": 64 + rng.randint(0, 8),
        "power_w": 480 + rng.randint(0, 150),
    }
    jobs: dict[str, Any] = {}
    if g < 6:
        leak = 80_000 if g == 4 and 16 + 1 / 3 <= hour < 16.5 else 62_000
        jobs[f"train-r{g}"] = use(leak, (85, 98))
    if g == 2 and 21 <= hour < 21.5:
        jobs["ghost"] = {"memory_mib": 6000}
    if g == 3:
        hot = 14 + 1 / 6 <= hour < 14 + 2 / 3
        frame["throttle"] = ["sw_thermal_slowdown", "hw_thermal_slowdown"] if hot else []
        frame["temperature_c"] = 90 if hot else frame["temperature_c"]
        if at == 0:
            frame["remapped_rows"] = {"correctable": 2, "uncorrectable": 0, "pending": True}
    if g == 6:
        jobs["notebook"] = (
            {"memory_mib": 38_000, "sm_pct": 0} if hour >= 20 else use(20_000, (5, 40))
        )
        jobs["serve"] = use(30_000, (30, 60))
    if g == 7:
        if hour < 1.5:
            jobs["sweep-a"] = use(52_000 if 1 + 1 / 12 <= hour < 1.5 else 30_000, (70, 95))
        jobs["sweep-b"] = use(28_000, (70, 95))
        if 10.5 <= hour < 13:
            jobs["finetune"] = use(45_000, (80, 95))
    frame["jobs"] = jobs
    return frame


def write_day(path: Path, *, hours: int) -> Path:
    """A scenario of ``hours`` (24: a whole Monday) on an 8-GPU H100 node, one keyframe
    every five minutes, ramping between them."""
    rng = random.Random(20261130)
    timeline: list[dict[str, Any]] = []
    for at in range(0, hours * 3600 + 1, 300):
        frame: dict[str, Any] = {"at": at}
        if at:
            frame["ramp"] = True
        frame["gpus"] = {g: _day_frame(g, at, rng) for g in range(8)}
        if at == 18 * 3600:
            frame["events"] = [{"gpu": 5, "xid": 94}]
        timeline.append(frame)
    timeline[-1]["end"] = True
    scenario = {
        "version": 1,
        "name": f"bench-{hours}h-eight-gpus",
        "host": "bench-node",
        "start": "2026-11-30T00:00:00Z",
        "gpus": [
            {
                "index": g,
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total_mib": TOTAL_MIB,
                "power_limit_w": 700,
            }
            for g in range(8)
        ],
        "jobs": DAY_JOBS,
        "timeline": timeline,
    }
    path.write_text(yaml.safe_dump(scenario, sort_keys=False), encoding="utf-8")
    return path


def shipped() -> tuple[Config, PlaybookSet]:
    cfg = config_module.load(ROOT / "config" / "gpuwarden.yaml")
    return cfg, loader.load([ROOT / "playbooks"], cfg)


def drill_once(path: Path, cfg: Config, playbooks: PlaybookSet) -> tuple[float, drill.Summary]:
    summary = drill.Summary()
    began = time.perf_counter()
    for _ in drill.run(path, cfg, playbooks, tick=1.0, summary=summary):
        pass
    return time.perf_counter() - began, summary


def drills(rounds_of_slice: int = SLICE_ROUNDS) -> None:
    header("Drill throughput (8 GPUs, 1 Hz, shipped playbooks)")
    cfg, playbooks = shipped()
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        day = write_day(Path(tmp) / "day.yaml", hours=24)
        part = write_day(Path(tmp) / "slice.yaml", hours=SLICE_HOURS)
        samples = []
        for _ in range(rounds_of_slice):
            wall, summary = drill_once(part, cfg, playbooks)
            samples.append(wall / summary.simulated_s)
        timing = from_samples(samples, 1)
        print(
            f"{f'{SLICE_HOURS} h slice: simulated s per wall s':<52} "
            f"{1 / timing.median_s:>10,.0f} x   "
            f"{timing.spread:>11}  ({timing.how})",
            flush=True,
        )
        wall, summary = drill_once(day, cfg, playbooks)
    speed = summary.simulated_s / wall
    steps = ", ".join(f"{k} {v}" for k, v in sorted(summary.steps.items()))
    print(f"{'24 h: simulated s per wall s':<52} {speed:>10,.0f} x")
    print(f"{'24 h: wall time':<52} {wall:>10.1f} s")
    print(
        f"  {summary.ticks} ticks, {len(playbooks.rules)} rules; incidents fired "
        f"{summary.fired}, resolved {summary.resolved}; steps: {steps}"
    )
    verdict = "met" if wall <= DRILL_TARGET_S else "NOT met"
    print(f"\ntarget: 24 h drill <= {DRILL_TARGET_S:.0f} s; measured {wall:.1f} s: {verdict}")


def main(*, with_profile: bool = False) -> None:
    if not with_profile:
        drills()
        return
    cfg, playbooks = shipped()
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        part = write_day(Path(tmp) / "slice.yaml", hours=1)
        profile("1 h drill, 8 GPUs, shipped playbooks", lambda: drill_once(part, cfg, playbooks))


if __name__ == "__main__":
    print(banner())
    main(with_profile="--profile" in sys.argv[1:])
