"""Readings around incidents, kept in the journal for reports: what the recorder queues (the
preroll, the open stretch, the tail), when it writes, and what a real SQLite file gives back."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from gpuwarden.journal.journal import Journal
from gpuwarden.journal.records import REDACTED
from gpuwarden.journal.samples import RING, GpuSample, RuleFacts, SampleRecorder
from gpuwarden.journal.schema import MIGRATIONS
from gpuwarden.model import GpuProcess, GpuState, Memory, ProcessInfo, Snapshot

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class Open:
    """An open incident as the recorder reads it."""

    id: str
    rule: str = "mem"
    gpu: int | None = 0


def snapshot(t: float, used: int = 40_000, gpus: int = 2) -> Snapshot:
    info = ProcessInfo(
        pid=4242,
        user="bob",
        cmdline=("python", "sweep.py", "--token", "hunter2"),
        create_time=T0 - 60,
        priority="low",
    )
    return Snapshot(
        host="node",
        time=t,
        gpus=tuple(
            GpuState(
                g,
                memory=Memory(total_mib=81_920, used_mib=used + g),
                temperature_c=70 + g,
                power_w=300.5,
            )
            for g in range(gpus)
        ),
        processes=(GpuProcess(4242, 0, used - 600, info), GpuProcess(4243, 1, 900, info)),
    )


def describe(incident: str, rule: str) -> RuleFacts:
    return RuleFacts(incident, rule, "gpu.memory.used_pct >= 95", "gpu.memory.used_pct < 85", 30.0)


def test_nothing_is_queued_while_no_incident_is_open() -> None:
    recorder = SampleRecorder(describe, preroll=600.0)
    for n in range(400):
        recorder.observe(snapshot(T0 + 2 * n), T0 + 2 * n, [])
        assert not recorder.due(T0 + 2 * n)
    assert not recorder.take(T0 + 800)


def test_an_incident_brings_its_preroll_its_stretch_and_a_tail() -> None:
    recorder = SampleRecorder(describe, preroll=300.0, tail=20.0, flush_every=30.0)
    t = T0
    for _ in range(200):  # 400 s of quiet: the ring keeps the last 300 s, thinned
        recorder.observe(snapshot(t), t, [])
        t += 2
    opened = t
    recorder.observe(snapshot(t, used=79_000), t, [Open("inc-1")])
    assert recorder.due(t)  # an incident opened: write at once
    batch = recorder.take(t)
    assert [r.incident for r in batch.rules] == ["inc-1"]
    times = [s.time for s in batch.samples]
    assert {s.gpu for s in batch.samples} == {0}  # the incident's GPU only
    assert times == sorted(times)
    assert times[-1] == opened
    spacing = 300.0 / RING  # the ring keeps a moment at most this often (here every 3 ticks)
    assert 300.0 - 3 * spacing <= opened - times[0] <= 300.0 + 3 * spacing
    assert len(times) <= RING + 1
    (proc,) = batch.procs
    assert (proc.gpu, proc.pid, proc.user, proc.priority) == (0, 4242, "bob", "low")
    assert "hunter2" not in proc.command
    assert REDACTED in proc.command
    # open: one reading per tick, written every flush_every
    for _ in range(10):
        t += 2
        recorder.observe(snapshot(t, used=79_000), t, [Open("inc-1")])
    assert not recorder.due(t)
    t += 20
    recorder.observe(snapshot(t), t, [Open("inc-1")])
    assert recorder.due(t)
    batch = recorder.take(t)
    assert [s.time for s in batch.samples][-1] == t
    assert len(batch.samples) == 11
    assert batch.procs == []  # who they are was written once
    # resolved: due at once, then the tail, then nothing
    resolved = t + 2
    recorder.observe(snapshot(resolved), resolved, [])
    assert recorder.due(resolved)
    recorder.take(resolved)
    for n in range(1, 20):
        recorder.observe(snapshot(resolved + 2 * n), resolved + 2 * n, [])
    tail = recorder.take(resolved + 40)
    assert max(s.time for s in tail.samples) == pytest.approx(resolved + 20)
    assert recorder.watching == 0


def test_an_incident_without_a_gpu_keeps_every_gpu() -> None:
    recorder = SampleRecorder(describe, preroll=60.0)
    recorder.observe(snapshot(T0), T0, [Open("host-1", gpu=None)])
    batch = recorder.take(T0)
    assert {s.gpu for s in batch.samples} == {0, 1}
    assert {(p.gpu, p.pid) for p in batch.procs} == {(0, 4242), (1, 4243)}


def test_two_incidents_on_one_gpu_share_its_readings() -> None:
    recorder = SampleRecorder(describe, preroll=60.0)
    for n in range(10):
        recorder.observe(snapshot(T0 + 2 * n), T0 + 2 * n, [Open("a")])
    recorder.observe(snapshot(T0 + 20), T0 + 20, [Open("a"), Open("b", rule="other")])
    batch = recorder.take(T0 + 20)
    times = [s.time for s in batch.samples]
    assert len(times) == len(set(times)) == 11  # b's preroll was already there
    assert [r.incident for r in batch.rules] == ["a", "b"]


def test_the_journal_keeps_readings_and_rules_and_forgets_them(tmp_path: Path) -> None:
    path = tmp_path / "state" / "journal.db"
    recorder = SampleRecorder(describe, preroll=60.0)
    for n in range(30):
        recorder.observe(snapshot(T0 + 2 * n, used=50_000 + 100 * n), T0 + 2 * n, [Open("a")])
    with Journal(path) as journal:
        journal.record_samples(recorder.take(T0 + 60))
        journal.record_samples(recorder.take(T0 + 60))  # empty: nothing written
    with Journal.open_readonly(path) as view:
        samples, procs = view.samples(T0 + 10, T0 + 20, gpu=0)
        assert [s.time for s in samples] == [T0 + 10 + 2 * k for k in range(6)]
        assert samples[0] == GpuSample(
            T0 + 10, 0, 50_500, 81_920, 70, 300.5, procs=((4242, 49_900),)
        )
        assert [(p.pid, p.priority) for p in procs] == [(4242, "low")]
        assert view.rule_facts("a") == describe("a", "mem")
        assert view.rule_facts("b") is None
    with Journal(path) as journal:
        journal.prune(T0 + 30)
        samples, procs = journal.samples(0, T0 + 100)
        assert min(s.time for s in samples) >= T0 + 30
        assert procs == []  # first seen before T0 + 30


def test_a_version_3_journal_gains_the_tables_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with Journal(path, migrations=MIGRATIONS[:3]) as old:
        old.note_action("mem", "kill", 42, T0)
    with Journal(path) as journal:
        assert journal.actions_since(T0) == 1
        assert journal.samples(0, T0) == ([], [])
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert {"samples", "sample_procs", "incident_rules"} <= tables


def test_a_process_that_left_before_the_incident_is_still_named() -> None:
    """The preroll shows a job that died (say, of an out-of-memory error) before the rule
    fired: who it was is kept from when it was seen."""
    recorder = SampleRecorder(describe, preroll=120.0)
    gone = GpuProcess(5151, 0, 9000, ProcessInfo(5151, user="carol", cmdline=("python", "x.py")))
    for n in range(60):
        snap = snapshot(T0 + 2 * n)
        if n < 30:
            snap = replace(snap, processes=(*snap.processes, gone))
        recorder.observe(snap, T0 + 2 * n, [])
    recorder.observe(snapshot(T0 + 120), T0 + 120, [Open("a")])
    batch = recorder.take(T0 + 120)
    assert any((5151, 9000) in s.procs for s in batch.samples)
    assert {(p.pid, p.user) for p in batch.procs} == {(4242, "bob"), (5151, "carol")}
    assert all(5151 not in dict(s.procs) for s in batch.samples if s.time > T0 + 60)
