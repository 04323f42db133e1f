"""A second look between ticks (a kill step re-reading the GPUs) takes no event: each source's
``peek`` leaves them to the next snapshot, and the daemon's re-read uses it."""

from __future__ import annotations

from pathlib import Path

from gpuwarden import config as config_mod
from gpuwarden.journal.journal import Journal
from gpuwarden.model import EventKind, GpuState, Intent, Reason, Snapshot
from gpuwarden.playbook import loader
from gpuwarden.runtime import Runtime
from gpuwarden.sources.kernel_events import ReplayFeed, WithEvents
from gpuwarden.sources.scenario import ScenarioSource
from gpuwarden.sources.smi_csv import SmiCsvSource

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def test_a_scenario_peek_leaves_its_events():
    with ScenarioSource.open(ROOT / "scenarios" / "xid79-one-of-eight.yaml", spawn=False) as source:
        source.snapshot(source.start_time)
        peeked = source.peek(source.start_time + 400)
        assert peeked.events == ()
        assert peeked.gpus[5].lost
        snap = source.snapshot(source.start_time + 400)
        assert sorted((str(e.kind), e.gpu, e.xid) for e in snap.events) == [
            ("gpu_lost", 5, None),
            ("xid", 5, 79),
        ]


def test_an_smi_csv_peek_leaves_the_lost_gpu_event():
    source = SmiCsvSource(FIXTURES / "smi" / "xid79-gpu-falls-off-bus.csv")
    source.snapshot(source.start_time)
    assert source.peek(source.start_time + 1.5).events == ()
    assert [(e.kind, e.gpu) for e in source.snapshot(source.start_time + 1.5).events] == [
        (EventKind.GPU_LOST, 1)
    ]


def test_kernel_log_reports_wait_for_the_next_snapshot():
    source = SmiCsvSource(FIXTURES / "smi" / "bus-id-only-nvidia-docs-query.csv")
    feed = ReplayFeed(FIXTURES / "kernel" / "rsyslog-rfc3339-driver-580.txt")
    wrapped = WithEvents(source, [feed])
    wrapped.snapshot(source.start_time)
    assert wrapped.peek(source.start_time + 8).events == ()
    snap = wrapped.snapshot(source.start_time + 8)
    assert [(e.kind, e.gpu, e.xid) for e in snap.events] == [
        (EventKind.XID, 1, 79),
        (EventKind.GPU_LOST, 1, None),
    ]


class Counting:
    """A source that counts how it is read (our own seam: the Source protocol)."""

    name = "counting"

    def __init__(self) -> None:
        self.snapshots = 0
        self.peeks = 0

    def _snap(self, now: float) -> Snapshot:
        return Snapshot(host="h", time=now, gpus=(GpuState(index=0),))

    def snapshot(self, now: float) -> Snapshot:
        self.snapshots += 1
        return self._snap(now)

    def peek(self, now: float) -> Snapshot:
        self.peeks += 1
        return self._snap(now)

    def close(self) -> None:
        pass


def test_a_kill_step_rereads_the_machine_with_a_peek(tmp_path):
    cfg = config_mod.load(ROOT / "config" / "demo.yaml")
    playbook = tmp_path / "kill.yaml"
    playbook.write_text(
        "rules:\n  - name: squeeze\n    for_each: gpu\n    when: gpu.memory.used_pct >= 95\n"
        "    steps:\n      - kill: {select: process.priority <= low, "
        "free_until: gpu.memory.used_pct < 80}\n"
    )
    source = Counting()
    runtime = Runtime(cfg, source, loader.load([playbook], cfg), Journal(tmp_path / "j.db"))
    try:
        intent = Intent(
            id="i", incident="inc", rule="squeeze", scope="gpu:0", step=0, kind="kill",
            label="kill", time=0.0, reason=Reason.STEP_DUE, severity="critical", gpu=0,
        )  # fmt: skip
        runtime.steps._still_needed(intent)()
        assert (source.peeks, source.snapshots) == (1, 0)
    finally:
        runtime.shutdown()
