"""What keeping readings for reports costs the daemon, and what drawing a report costs.

    python bench/report.py

The run loop calls ``SampleRecorder.observe`` every tick (8 GPUs x 64 processes here, the
engine benchmark's machine): with no incident open it remembers a snapshot now and then for
the preroll; with one open it turns its GPU's reading into a sample. Every 30 s the queued
readings go to the journal in one transaction (15 ticks at the shipped 2 s tick), on a real
SQLite file with the journal's ``synchronous=FULL``. Last, a report page: built and rendered
from an hour of one GPU's readings at 1 Hz (3,601 samples).
"""

from __future__ import annotations

import tempfile
import tracemalloc
from copy import copy
from dataclasses import replace
from pathlib import Path

from engine import START, Machine
from gpuwarden.journal.journal import Journal
from gpuwarden.journal.samples import RING, GpuSample, RuleFacts, SampleRecorder
from gpuwarden.report import page
from gpuwarden.report.model import IncidentView, Report, RuleView
from gpuwarden.report.series import GpuSeries
from harness import header, measure

TICK_S = 2.0


class _Open:
    id = "bench-incident"
    rule = "mem"
    gpu = 3


def _facts(incident: str, rule: str) -> RuleFacts:
    return RuleFacts(incident, rule, "gpu.memory.used_pct >= 95", "gpu.memory.used_pct < 85", 30)


def recorder_costs() -> None:
    machine = Machine(8, 64, firing=False)
    snapshots = [machine.snapshot(n, START + n * TICK_S) for n in range(64)]
    quiet = SampleRecorder(_facts)
    clock = iter(range(10**9))

    def idle_tick() -> None:
        n = next(clock)
        quiet.observe(snapshots[n % 64], START + n * TICK_S, ())

    measure("observe, no incident open (8 GPUs x 64 procs)", idle_tick)
    busy = SampleRecorder(_facts)
    watched = (_Open(),)
    busy.observe(snapshots[0], START, watched)
    busy.take(START)
    ticks = iter(range(1, 10**9))

    def open_tick() -> None:
        n = next(ticks)
        busy.observe(snapshots[n % 64], START + n * TICK_S, watched)

    measure("observe, one incident open", open_tick)
    writer = SampleRecorder(_facts)
    writer.observe(snapshots[0], START, watched)
    writer.take(START)
    batches = []
    for k in range(40):
        for n in range(15 * k + 1, 15 * k + 16):
            writer.observe(snapshots[n % 64], START + n * TICK_S, watched)
        batches.append(writer.take(START))
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        journal = Journal(Path(tmp) / "journal.db")
        queued = iter(batches)
        timing = measure(
            "write 30 s of readings (one batch of 15)",
            lambda: journal.record_samples(next(queued)),
            rounds=5,
            number=8,
        )
        journal.close()  # checkpoints the WAL into the file
        size = (Path(tmp) / "journal.db").stat().st_size
    print(f"{'':<52} {timing.median_s / 15 * 1e6:>10.1f} µs per tick, amortised")
    print(f"{'journal file after 40 batches (20 minutes)':<52} {size / 1024:>10,.0f} KiB")


def ring_memory(gpus: int, procs: int) -> None:
    """What the preroll holds once full: GPU states and process identities by reference
    (the source made them anyway; they live on for as long as the ring keeps them), and the
    compact moments themselves."""
    machine = Machine(gpus, procs, firing=False)
    snapshots = [
        replace(
            machine.snapshot(n, START + n),
            gpus=tuple(copy(g) for g in machine.snapshot(n, START + n).gpus),
        )
        for n in range(64)
    ]
    recorder = SampleRecorder(_facts)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for n in range(2 * RING * 10):
        recorder.observe(snapshots[n % 64], START + n * 10.0, ())
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    name = f"preroll held, {gpus} GPUs x {procs} processes (full ring)"
    print(f"{name:<52} {held / 1024:>10,.0f} KiB")


def render_costs() -> None:
    machine = Machine(8, 64, firing=False)
    series = GpuSeries(3, "NVIDIA H100 80GB HBM3")
    for n in range(3601):
        snap = machine.snapshot(n, START + n)
        gpu = snap.gpus[3]
        series.add(GpuSample.of(gpu, snap.processes_on(3), START + n))
    series.finish()
    incident = IncidentView(
        "bench-incident", "mem", "gpu:3", "GPU 3", 3, "critical", START + 600, START + 630,
        START + 2400, "until_met",
    )  # fmt: skip
    rule = RuleView("mem", "gpu.memory.used_pct >= 95", "gpu.memory.used_pct < 85", 30.0)
    report = Report(
        "incident", "mem on GPU 3", "bench", "bench-node", START, START + 3600, START + 630,
        incidents=[incident], rules={"mem": rule}, gpus={3: series},
    )  # fmt: skip
    text = page.render(report)
    name = "render a page: 1 h of one GPU at 1 Hz, 8 processes"
    measure(name, lambda: page.render(report), rounds=5)
    print(f"{'its size':<52} {len(text.encode()) / 1024:>10,.0f} KiB")


def main() -> None:
    header("Reports: readings kept by the daemon, pages drawn")
    recorder_costs()
    ring_memory(8, 64)
    ring_memory(16, 1024)
    render_costs()


if __name__ == "__main__":
    main()
