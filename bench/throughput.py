"""Drill throughput: how fast ``gpuwarden drill`` replays a day, and in how much memory.

    python bench/throughput.py              # playback, a 3-hour slice, the day, the month log
    python bench/throughput.py --profile    # where a one-hour drill spends its time
    python bench/throughput.py --vs DIR     # interleaved runs against another checkout's daemon/

A 24-hour, 8-GPU scenario is generated into a temporary directory (a keyframe every five
minutes, ramping between them, a few jobs and a day's worth of incidents) and run through
``gpuwarden.drill.run`` at 1 Hz with the shipped playbooks and config. Target: the whole day
in at most 10 s of wall time, peak RSS at most 80 MiB (docs/performance.md). Playback alone
(the scenario's snapshots without the engine) is timed beside it.

Memory is the peak RSS of a child process that does one drill and nothing else, so each
figure includes the interpreter and the imports. Two nvidia-smi logs, a day and thirty days
of 8 GPUs sampled every minute, are drilled the same way: a log is played as it is read, so
the month should need no more memory than the day.

``--vs DIR`` runs every child measurement alternately with ``PYTHONPATH=DIR`` (the ``daemon``
folder of another checkout, e.g. the main branch exported with ``git archive``) and with this
checkout, ``--runs`` times each, and prints the medians and the ratios: before and after a
change, in one run window. Each child also prints a digest of the timeline's records, so the
two sides can be seen to drill the same thing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import random
import resource
import statistics
import subprocess
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
from gpuwarden.sources import scenario_format
from gpuwarden.sources.scenario import ScenarioSource
from gpuwarden.sources.select import SourceSpec
from harness import ROOT, banner, from_samples, header, load, profile

TOTAL_MIB = 81559
DRILL_TARGET_S = 10.0  # a 24-hour drill at 1 Hz
RSS_TARGET_MIB = 80.0
SLICE_HOURS = 3  # 00:00-03:00, with the night's memory-pressure incident
SLICE_ROUNDS = 3
LOG_INTERVAL_S = 60  # the nvidia-smi logs: a sample a minute, drilled at one tick a minute
MONTH_HOURS = 30 * 24


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


SMI_HEADER = (
    "timestamp, index, name, pci.bus_id, utilization.gpu [%], memory.total [MiB], "
    "memory.used [MiB], memory.free [MiB], temperature.gpu, power.draw [W], "
    "enforced.power.limit [W], pstate"
)


def write_smi_log(path: Path, *, hours: int, interval_s: int = LOG_INTERVAL_S) -> Path:
    """An nvidia-smi ``--query-gpu=... --format=csv -l N`` log of ``hours`` on 8 H100s, a
    sample every ``interval_s`` seconds: busy GPUs, and each day GPU 7 filling up from 01:00
    to 01:30 (what the memory rules fire on). Written line by line (a month is ~50 MB)."""
    rng = random.Random(20261201)
    start = 1_796_083_200  # 2026-12-01T00:00:00Z
    with path.open("w", encoding="utf-8") as out:
        out.write(SMI_HEADER + "\n")
        for at in range(0, hours * 3600 + 1, interval_s):
            hour = at % 86400 / 3600
            for g in range(8):
                when = dt.datetime.fromtimestamp(start + at + g * 0.003, dt.UTC)
                stamp = when.strftime("%Y/%m/%d %H:%M:%S.") + f"{when.microsecond // 1000:03d}"
                full = g == 7 and 1 <= hour < 1.5
                used = 79_800 if full else 62_000 + rng.randint(-400, 400)
                out.write(
                    f"{stamp}, {g}, NVIDIA H100 80GB HBM3, 00000000:{0x18 + g * 0x10:02X}:00.0, "
                    f"{rng.randint(85, 99)} %, {TOTAL_MIB} MiB, {used} MiB, "
                    f"{TOTAL_MIB - used} MiB, {64 + rng.randint(0, 8)}, "
                    f"{480 + rng.randint(0, 150)}.{rng.randint(0, 99):02d} W, 700.00 W, P0\n"
                )
    return path


def shipped() -> tuple[Config, PlaybookSet]:
    cfg = config_module.load(ROOT / "config" / "gpuwarden.yaml")
    return cfg, loader.load([ROOT / "playbooks"], cfg)


def drill_once(
    path: Path | SourceSpec, cfg: Config, playbooks: PlaybookSet, *, tick: float = 1.0
) -> tuple[float, drill.Summary, str]:
    """One drill: its wall time, its summary and a digest of its records."""
    summary = drill.Summary()
    digest = hashlib.sha256()
    began = time.perf_counter()
    for record in drill.run(path, cfg, playbooks, tick=tick, summary=summary):
        digest.update(json.dumps(record, sort_keys=True).encode())
    return time.perf_counter() - began, summary, digest.hexdigest()[:12]


def playback_once(path: Path, cfg: Config, *, seconds: int | None = None) -> tuple[float, int]:
    """The scenario's snapshots at 1 Hz without the engine, as a drill opens and plays it:
    (wall seconds of the snapshots alone, without loading the file; snapshots)."""
    source = ScenarioSource.open(path, priorities=cfg.priorities, spawn=False)
    try:
        began = time.perf_counter()
        steps = int(source.duration if seconds is None else seconds)
        for n in range(steps + 1):
            source.snapshot(source.start_time + n)
        wall = time.perf_counter() - began
    finally:
        source.close()
    return wall, steps + 1


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(kind: str, path: Path) -> None:
    """One measurement in this process (``--child``), printed as a JSON line."""
    cfg, playbooks = shipped()
    result: dict[str, Any] = {"kind": kind}
    if kind == "load":
        began = time.perf_counter()
        scenario_format.load_checked(path)
        result["wall_s"] = time.perf_counter() - began
    elif kind == "playback":
        wall, snapshots = playback_once(path, cfg)
        result |= {
            "wall_s": wall,
            "snapshots": snapshots,
            "us_per_snapshot": wall / snapshots * 1e6,
        }
    else:
        spec = SourceSpec("smi-csv", str(path)) if kind == "log" else path
        tick = float(LOG_INTERVAL_S) if kind == "log" else 1.0
        wall, summary, digest = drill_once(spec, cfg, playbooks, tick=tick)
        result |= {
            "wall_s": wall,
            "ticks": summary.ticks,
            "fired": summary.fired,
            "resolved": summary.resolved,
            "digest": digest,
        }
    result["peak_rss_mib"] = _peak_rss_mib()
    print(json.dumps(result), flush=True)


def run_child(kind: str, path: Path, pythonpath: str | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", kind, str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench child {kind} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


class Files:
    """The generated recordings, in one temporary directory."""

    def __init__(self, tmp: Path, *, month: bool = True) -> None:
        self.day = write_day(tmp / "day.yaml", hours=24)
        self.part = write_day(tmp / "slice.yaml", hours=SLICE_HOURS)
        self.day_log = write_smi_log(tmp / "day.csv", hours=24)
        self.month_log = write_smi_log(tmp / "month.csv", hours=MONTH_HOURS) if month else None


def drills(rounds_of_slice: int = SLICE_ROUNDS) -> None:
    header("Drill throughput (8 GPUs, 1 Hz, shipped playbooks)")
    cfg, playbooks = shipped()
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        files = Files(Path(tmp))
        samples = []
        for _ in range(rounds_of_slice):
            wall, snapshots = playback_once(files.part, cfg)
            samples.append(wall / snapshots)
        timing = from_samples(samples, 1)
        print(
            f"{f'{SLICE_HOURS} h playback alone: µs per 8-GPU snapshot':<52} "
            f"{timing.median_s * 1e6:>10.1f} µs  {timing.spread:>11}  ({timing.how})"
        )
        samples = []
        for _ in range(rounds_of_slice):
            wall, summary, _digest = drill_once(files.part, cfg, playbooks)
            samples.append(wall / summary.simulated_s)
        timing = from_samples(samples, 1)
        print(
            f"{f'{SLICE_HOURS} h slice: simulated s per wall s':<52} "
            f"{1 / timing.median_s:>10,.0f} x   "
            f"{timing.spread:>11}  ({timing.how})",
            flush=True,
        )
        day = run_child("day", files.day)
        loaded = run_child("load", files.day)
        assert files.month_log is not None
        day_log = run_child("log", files.day_log)
        month_log = run_child("log", files.month_log)
    wall = day["wall_s"]
    print(f"{'24 h: load the scenario (YAML + validation)':<52} {loaded['wall_s']:>10.2f} s")
    print(f"{'24 h: simulated s per wall s':<52} {86400 / wall:>10,.0f} x")
    print(f"{'24 h: GPU samples per wall s':<52} {8 * day['ticks'] / wall:>10,.0f}")
    print(f"{'24 h: wall time':<52} {wall:>10.1f} s")
    print(f"{'24 h: peak RSS':<52} {day['peak_rss_mib']:>10.1f} MiB")
    print(
        f"  {day['ticks']} ticks, {len(playbooks.rules)} rules; incidents fired "
        f"{day['fired']}, resolved {day['resolved']}; records digest {day['digest']}"
    )
    for name, got in (("1 day", day_log), ("30 days", month_log)):
        print(
            f"{f'nvidia-smi log, {name} (1/min): wall, peak RSS':<52} "
            f"{got['wall_s']:>10.1f} s  {got['peak_rss_mib']:>7.1f} MiB  "
            f"({got['ticks']} ticks, fired {got['fired']})"
        )
    ratio = month_log["peak_rss_mib"] / day_log["peak_rss_mib"]
    met = wall <= DRILL_TARGET_S and day["peak_rss_mib"] <= RSS_TARGET_MIB
    print(
        f"\ntarget: 24 h drill <= {DRILL_TARGET_S:.0f} s and <= {RSS_TARGET_MIB:.0f} MiB; "
        f"measured {wall:.1f} s, {day['peak_rss_mib']:.1f} MiB: {'met' if met else 'NOT met'}"
    )
    print(
        f"target: 30-day log's peak RSS within 10 % of the day's; measured {ratio:.2f}x: "
        f"{'met' if ratio <= 1.10 else 'NOT met'}"
    )


COMPARED = ("playback", "load", "day", "log-day", "log-month")


def compare(base: str, runs: int, only: list[str]) -> None:
    """Interleaved child runs: ``base`` (a ``daemon`` folder) and this checkout, ``runs``
    times each, alternating; medians and ratios."""
    header(f"Interleaved: {base} (before) vs this checkout (after), {runs} runs each", "")
    print(banner())
    kinds = only or list(COMPARED)
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        files = Files(Path(tmp), month="log-month" in kinds)
        paths = {
            "playback": ("playback", files.day),
            "load": ("load", files.day),
            "day": ("day", files.day),
            "log-day": ("log", files.day_log),
            "log-month": ("log", files.month_log),
        }
        got: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for n in range(runs):
            for kind in kinds:
                child_kind, path = paths[kind]
                assert path is not None
                for side, pythonpath in (("before", base), ("after", None)):
                    result = run_child(child_kind, path, pythonpath)
                    got.setdefault((kind, side), []).append(result)
                    print(f"  run {n + 1} {kind:<10} {side:<6} {json.dumps(result)} · {load()}")
                    sys.stdout.flush()
    print(f"\n{'':<12} {'before':>22} {'after':>22} {'ratio':>8}")
    for kind in kinds:
        for field in ("wall_s", "peak_rss_mib"):
            before = statistics.median(r[field] for r in got[(kind, "before")])
            after = statistics.median(r[field] for r in got[(kind, "after")])
            print(f"{kind:<10} {field:<14} {before:>14.3f} {after:>22.3f} {before / after:>8.2f}x")
        digests = {r.get("digest") for side in ("before", "after") for r in got[(kind, side)]}
        if len(digests) > 1:
            print(f"{kind}: the timelines DIFFER between runs: {sorted(map(str, digests))}")


def main(*, with_profile: bool = False) -> None:
    if not with_profile:
        drills()
        return
    cfg, playbooks = shipped()
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        part = write_day(Path(tmp) / "slice.yaml", hours=1)
        profile("1 h drill, 8 GPUs, shipped playbooks", lambda: drill_once(part, cfg, playbooks))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"))
    parser.add_argument("--vs", metavar="DIR", help="a daemon/ folder to compare against")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", action="append", default=[], choices=COMPARED)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
    elif args.vs:
        compare(args.vs, args.runs, args.only)
    else:
        print(banner())
        main(with_profile=args.profile)
