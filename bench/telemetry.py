"""Telemetry benchmarks: what producing and showing one snapshot costs.

    python bench/telemetry.py

Scenario and nvidia-smi CSV replay, the status views of a snapshot, and attribution of real
processes (64 children of this process). Run through ``bench/run.py`` by ``make bench``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from gpuwarden.cli.status_view import render_table, snapshot_dict
from gpuwarden.config import Priorities
from gpuwarden.model import Snapshot
from gpuwarden.sources import kernel_log
from gpuwarden.sources.kernel_events import ReplayFeed, WithEvents
from gpuwarden.sources.procs import Attributor
from gpuwarden.sources.scenario import ScenarioSource
from gpuwarden.sources.smi_csv import SmiCsvSource
from harness import ROOT, banner, header, measure

ATTRIBUTED = 64  # real processes, as many as a busy 8-GPU node runs


KERNEL_LINES = 10_000  # a day of a busy node's dmesg -T, one XID report in a thousand lines


def kernel_events(csv: Path) -> None:
    """Reading a saved kernel log, and the cost it adds to each replayed snapshot."""
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as scratch:
        log = Path(scratch) / "dmesg.txt"
        lines = []
        for n in range(KERNEL_LINES):
            stamp = f"[Sun Jan 10 {3 + n // 3600 % 20:02d}:{n // 60 % 60:02d}:{n % 60:02d} 2026]"
            if n % 1000 == 999:
                lines.append(
                    f"{stamp} NVRM: Xid (PCI:0000:47:00): 31, pid={n}, name=python3, Ch 00000010,"
                    " intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted"
                )
            else:
                lines.append(f"{stamp} eth0: renamed from veth{n:x}: link becomes ready")
        log.write_text("\n".join(lines) + "\n", encoding="utf-8")
        measure(
            f"kernel log parse ({KERNEL_LINES} lines, dmesg -T)",
            lambda: kernel_log.load(log),
            rounds=5,
        )
        smi = SmiCsvSource(csv)
        wrapped = WithEvents(smi, [ReplayFeed(log)])
        at = [smi.start_time]

        def tick() -> object:
            at[0] += 1
            return wrapped.snapshot(at[0])

        measure("nvidia-smi CSV replay snapshot + kernel-log events", tick)


def main() -> None:
    header("Telemetry")
    eight = ScenarioSource.open(ROOT / "scenarios" / "xid79-one-of-eight.yaml")
    clock = [eight.start_time]

    def tick_eight() -> Snapshot:
        clock[0] += 1
        return eight.snapshot(clock[0])

    try:
        measure("scenario snapshot, 8 GPUs x 1 job each", tick_eight)
        snap = tick_eight()
        measure("status table of that snapshot", lambda: render_table(snap))
        measure("status JSON dict of that snapshot", lambda: snapshot_dict(snap))
    finally:
        eight.close()

    csv = ROOT / "scenarios" / "nvidia-smi-oom-night.csv"
    smi = SmiCsvSource(csv)
    at = [smi.start_time]

    def tick_smi() -> object:
        at[0] += 1
        return smi.snapshot(at[0])

    measure("nvidia-smi CSV replay snapshot, 4 GPUs", tick_smi)
    rows = max(0, len(csv.read_text(encoding="utf-8").splitlines()) - 1)
    measure(f"nvidia-smi CSV load + parse ({rows} rows)", lambda: SmiCsvSource(csv), rounds=5)
    kernel_events(csv)

    nvml()

    # Attribution of real processes: what a tick pays per GPU process on a busy node.
    children = [
        subprocess.Popen(
            [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"],
            env={"GPUWARDEN_PRIORITY": "low", "PATH": "/usr/bin"},
            stdout=subprocess.PIPE,
        )
        for _ in range(ATTRIBUTED)
    ]
    try:
        # Measure once every child has started and sleeps: 64 starting interpreters would
        # compete for the CPUs with the measurement.
        for child in children:
            assert child.stdout is not None
            child.stdout.readline()
        attributor = Attributor(Priorities())
        pids = [c.pid for c in children]
        attributor.describe(pids, 0.0)  # the first sight reads the fixed facts once
        timing = measure(
            f"attribution of {ATTRIBUTED} real processes (warm cache)",
            lambda: attributor.describe(pids, 0.0),
            rounds=5,
        )
        print(f"{'  = per process':<52} {timing.median_s / ATTRIBUTED * 1e6:>10.1f} µs")
    finally:
        for child in children:
            child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()


def nvml() -> None:
    """The real NVML source, where a driver and GPU exist (skipped, with a line, elsewhere)."""
    import socket

    from gpuwarden.errors import SourceUnavailable
    from gpuwarden.sources.nvml import NvmlSource

    try:
        source = NvmlSource(Attributor(Priorities()), host=socket.gethostname())
    except SourceUnavailable as exc:
        print(f"{'NVML snapshot':<52} skipped: {str(exc).splitlines()[0]}")
        return
    with source:
        snap = source.snapshot(0.0)
        what = f"NVML snapshot, {len(snap.gpus)} GPU(s) x {len(snap.processes)} process(es)"
        measure(what, lambda: source.snapshot(0.0), rounds=5)


if __name__ == "__main__":
    print(banner())
    main()
