"""The benchmarks' shared harness, imported by every group (never the other way round).

``measure`` and ``time_rounds`` time a callable and report the median and the spread of
several rounds; ``machine``, ``banner`` and ``header`` say where and when figures come from;
``profile`` prints where a callable spends its time; ``playbook_text`` writes the synthetic
rules that the engine and daemon groups load. Nothing here asserts a time.
"""

from __future__ import annotations

import cProfile
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from string import Template

ROOT = Path(__file__).resolve().parent.parent


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


def profile(name: str, fn: Callable[[], object]) -> None:
    """Print where ``fn`` spends its time, the 15 costliest functions by own time."""
    print(f"\n## Profile: {name}\n", flush=True)
    profiler = cProfile.Profile()
    profiler.runcall(fn)
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(15)


# -- the synthetic workload ------------------------------------------------------------------

# Ten rule templates, used in turn: four per GPU, four per process, one per host, one per
# event; history functions in four of them. ``$``-fields vary with the rule's number, so no
# two rules of a set are the same text.
TEMPLATES = (
    """for_each: gpu
when: gpu.memory.used_pct >= $pct
for: 30s
until: gpu.memory.used_pct < 85
cooldown: 15m
steps:
  - notify: oncall
  - checkpoint: {select: process.checkpointable, wait: 2m}
  - after: 1m
    kill: {select: process.priority <= low, order: [priority, -gpu_memory_mib],
           free_until: gpu.memory.used_pct < $free, grace: 30s}""",
    """for_each: gpu
when: '"hw_thermal_slowdown" in gpu.throttle or gpu.temperature_c >= $temp'
for: 1m
until: gpu.temperature_c < 80 and not gpu.throttled
steps: [{notify: oncall}, {after: 2m, power_cap: {percent: 80}}]""",
    """for_each: gpu
when: gpu.power_pct >= 95 and avg(gpu.power_w, ${window}m) >= $watts
for: 30s
steps: [{notify: chat}]""",
    """for_each: gpu
when: predict(gpu.memory.used_pct, 10m) >= 100 and gpu.memory.used_pct < 95
for: 1m
until: predict(gpu.memory.used_pct, 10m) < 90
steps: [{notify: oncall}]""",
    """for_each: process
when: process.gpu_memory_mib >= $mib and held_for(process.idle) >= 1m
cooldown: 6h
steps: [{notify: oncall}, {after: 1m, kill: {select: process.priority <= low}}]""",
    """for_each: process
active: Mon-Fri 08:00-20:00
when: process.priority <= low and process.cpu_pct >= $cpu
for: 30s
steps: [{notify: chat}, {after: 1m, renice: {nice: 19}}]""",
    """for_each: process
when: process.orphaned and process.gpu_memory_mib >= $mib
for: 1m
steps: [{notify: oncall}]""",
    """for_each: process
when: '"train.py" in process.cmdline and process.rss_mib >= $rss'
for: 30s
steps:
  - notify: oncall
  - checkpoint: {select: process.checkpointable and process.priority <= normal}""",
    """for_each: host
when: max(host.memory_used_pct, 5m) >= $host and host.gpus_lost == 0
for: 1m
steps: [{notify: oncall}]""",
    """for_each: event
when: >-
  (event.kind == "xid" and event.xid in [48, 63, 64, 74, 79, 94, 95])
  or event.kind == "gpu_lost"
cooldown: 30m
steps:
  - notify: oncall
  - checkpoint: {select: process.checkpointable and process.gpu == event.gpu}""",
)


def playbook_text(count: int) -> str:
    lines = ["rules:"]
    for i in range(count):
        v = i // len(TEMPLATES)
        body = Template(TEMPLATES[i % len(TEMPLATES)]).substitute(
            pct=95 + v % 3,
            free=80 - v % 3,
            temp=88 + v % 3,
            window=2 + v % 3,
            watts=650 + v,
            mib=1024 + v,
            cpu=400 + v,
            rss=65536 + v,
            host=92 + v % 5,
        )
        lines += [f"  - name: bench-{i % len(TEMPLATES)}-{i:03d}", "    severity: warning"]
        lines += [f"    {text}" for text in body.splitlines()]
    return "\n".join(lines) + "\n"
