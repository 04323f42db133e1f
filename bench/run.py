"""Benchmarks, run by hand or with ``make bench``; results go to docs/performance.md.

    python bench/run.py                 # everything (telemetry, then engine and drill)
    python bench/run.py telemetry       # one group: telemetry | engine | drill | daemon

Each benchmark repeats its operation, reports the median and the spread of several rounds,
and never asserts a time: machines are noisy, so compare medians and ratios, and always with
the machine and the date they were measured on (the header this prints).

This module is also the shared harness: ``measure`` and ``time_rounds`` time a callable,
``machine`` describes where the figures come from.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GROUPS = ("telemetry", "engine", "drill", "daemon")


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the median of ``rounds`` rounds of ``number`` calls each."""

    median_s: float
    low_s: float
    high_s: float
    rounds: int
    number: int

    @property
    def spread(self) -> str:
        """The fastest and the slowest round relative to the median, e.g. ``-2%/+5%``."""
        if self.median_s <= 0:
            return "n/a"
        low = (self.low_s / self.median_s - 1) * 100
        high = (self.high_s / self.median_s - 1) * 100
        return f"{low:+.0f}%/{high:+.0f}%"

    @property
    def how(self) -> str:
        return f"{self.rounds}x{self.number}"


def from_samples(samples: list[float], number: int) -> Timing:
    """A Timing from per-call seconds measured in each round."""
    return Timing(statistics.median(samples), min(samples), max(samples), len(samples), number)


def time_rounds(
    fn: Callable[[], object], *, rounds: int = 7, number: int = 0, round_s: float = 0.2
) -> Timing:
    """Call ``fn`` ``number`` times per round (0: enough for ``round_s`` seconds a round)."""
    if number == 0:
        began = time.perf_counter()
        fn()
        one = max(time.perf_counter() - began, 1e-7)
        number = max(1, int(round_s / one))
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - began) / number)
    return from_samples(samples, number)


def line(name: str, timing: Timing, *, unit: str = "µs", scale: float = 1e6) -> str:
    value = timing.median_s * scale
    return f"{name:<52} {value:>10.1f} {unit:<3} {timing.spread:>11}  ({timing.how})"


def measure(
    name: str, fn: Callable[[], object], *, rounds: int = 7, number: int = 0, round_s: float = 0.2
) -> Timing:
    """Time ``fn`` (see ``time_rounds``) and print one table line."""
    timing = time_rounds(fn, rounds=rounds, number=number, round_s=round_s)
    print(line(name, timing), flush=True)
    return timing


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def machine() -> str:
    """CPU model, cores, memory, Python and kernel: the context every figure needs."""
    model = next(
        (
            text.split(":", 1)[1].strip()
            for text in _read("/proc/cpuinfo").splitlines()
            if text.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    mem_kib = next(
        (
            int(text.split()[1])
            for text in _read("/proc/meminfo").splitlines()
            if text.startswith("MemTotal:")
        ),
        None,
    )
    memory = f"{mem_kib / 1024 / 1024:.1f} GiB" if mem_kib else "unknown memory"
    return (
        f"{time.strftime('%Y-%m-%d')} · {model} · {os.cpu_count()} CPUs · {memory} · "
        f"Python {platform.python_version()} · {platform.system()} {platform.release()}"
    )


def load() -> str:
    """The load average: other work on the machine is the usual cause of a wide spread."""
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min) {five:.2f} (5 min)"


def commit() -> str:
    """The commit the figures belong to (read only: no index refresh, no lock)."""
    try:
        done = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "commit unknown"
    return f"commit {done.stdout.strip()}" if done.returncode == 0 else "commit unknown"


def banner() -> str:
    return f"# gpuwarden benchmarks · {machine()} · {commit()} · {load()}"


def header(title: str, columns: str = "") -> None:
    print(f"\n## {title}\n")
    print(columns or f"{'':<52} {'median':>14} {'min/max':>11}  (rounds x calls)", flush=True)


def main(argv: list[str]) -> int:
    wanted = argv or list(GROUPS)
    unknown = [g for g in wanted if g not in GROUPS]
    if unknown:
        known = ", ".join(GROUPS)
        print(f"unknown benchmark group(s): {', '.join(unknown)}; known: {known}", file=sys.stderr)
        return 2
    print(banner(), flush=True)
    began = time.perf_counter()
    if "telemetry" in wanted:
        import telemetry

        telemetry.main()
    if "engine" in wanted:
        import engine

        engine.main()
    if "drill" in wanted:
        import throughput

        throughput.main()
    if "daemon" in wanted:
        import daemon

        daemon.main()
    print(f"\nall benchmarks: {time.perf_counter() - began:.0f} s wall · {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
