"""Benchmarks, run by hand or with ``make bench``; results go to docs/performance.md.

Each benchmark repeats its operation, reports the median and the spread of several rounds,
and never asserts a time: machines are noisy, so compare medians and ratios.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpuwarden.config import Priorities
from gpuwarden.model import Snapshot
from gpuwarden.sources.procs import Attributor
from gpuwarden.sources.scenario import ScenarioSource
from gpuwarden.sources.smi_csv import SmiCsvSource
from gpuwarden.status import render_table, snapshot_dict

ROOT = Path(__file__).resolve().parent.parent


def measure(name: str, fn: Callable[[], object], *, rounds: int = 7, number: int = 0) -> float:
    if number == 0:  # pick a repeat count that takes ~0.2 s per round
        number, began = 1, time.perf_counter()
        fn()
        one = max(time.perf_counter() - began, 1e-7)
        number = max(1, int(0.2 / one))
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - began) / number)
    median = statistics.median(samples)
    spread = (max(samples) - min(samples)) / median * 100
    print(f"{name:<58} {median * 1e6:>10.1f} µs  (±{spread:.0f}% over {rounds}x{number})")
    return median


def main() -> int:
    print(
        f"# {time.strftime('%Y-%m-%d')} · {platform.node()} · {platform.processor() or '?'} · "
        f"{os.cpu_count()} CPUs · Python {platform.python_version()}"
    )
    eight = ScenarioSource.open(ROOT / "scenarios" / "xid79-one-of-eight.yaml")
    clock = [eight.start_time]

    def tick_eight() -> Snapshot:
        clock[0] += 1
        return eight.snapshot(clock[0])

    measure("scenario snapshot, 8 GPUs x 1 job (synthetic)", tick_eight)
    snap = tick_eight()
    measure("status table of that snapshot", lambda: render_table(snap))
    measure("status JSON dict of that snapshot", lambda: snapshot_dict(snap))
    eight.close()

    smi = SmiCsvSource(ROOT / "scenarios" / "nvidia-smi-oom-night.csv")
    t = [smi.start_time]

    def tick_smi() -> object:
        t[0] += 1
        return smi.snapshot(t[0])

    measure("nvidia-smi CSV replay snapshot, 4 GPUs", tick_smi)
    measure(
        "nvidia-smi CSV load + parse (1060 rows)",
        lambda: SmiCsvSource(ROOT / "scenarios" / "nvidia-smi-oom-night.csv"),
        rounds=5,
    )

    # Attribution of real processes: what a tick pays per GPU process on a busy node.
    with tempfile.TemporaryDirectory():
        children = [
            subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(120)"],
                env={"GPUWARDEN_PRIORITY": "low", "PATH": "/usr/bin"},
            )
            for _ in range(64)
        ]
        try:
            time.sleep(0.5)
            attributor = Attributor(Priorities())
            pids = [c.pid for c in children]
            attributor.describe(pids, 0.0)
            per_64 = measure(
                "attribution of 64 real processes (warm cache)",
                lambda: attributor.describe(pids, 0.0),
                rounds=5,
            )
            print(f"{'  = per process':<58} {per_64 / 64 * 1e6:>10.1f} µs")
        finally:
            for child in children:
                child.kill()
                child.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
