"""The status table and JSON: what people and programs read."""

from __future__ import annotations

import json

from gpuwarden.cli.status_view import render_table, snapshot_dict
from gpuwarden.model import (
    Ecc,
    Event,
    EventKind,
    GpuProcess,
    GpuState,
    Memory,
    ProcessInfo,
    RemappedRows,
    Snapshot,
)
from gpuwarden.text import safe_text

NOW = 1_767_225_600.0


def gpu(index: int = 0, **kw: object) -> GpuState:
    base: dict[str, object] = {
        "index": index,
        "name": "NVIDIA A100-SXM4-80GB",
        "memory": Memory(total_mib=81920, used_mib=40960, free_mib=40960),
        "utilization_pct": 50,
        "temperature_c": 60,
        "power_w": 200.0,
        "power_limit_w": 400.0,
        "throttle": (),
        "pstate": 0,
    }
    base.update(kw)
    return GpuState(**base)  # type: ignore[arg-type]


def proc(pid: int) -> GpuProcess:
    info = ProcessInfo(
        pid=pid, user="alice", cmdline=("python", "train.py"), create_time=NOW - 3600
    )
    return GpuProcess(pid=pid, gpu=0, gpu_memory_mib=1000, info=info, sm_util_pct=50)


def test_hostile_cmdline_cannot_reach_the_terminal() -> None:
    evil = ("python", "x.py", "\x1b[2J\x1b[31mroot\x07", "\u202eevil")
    info = ProcessInfo(pid=7, user="mallory\x1b[0m", cmdline=evil, create_time=NOW)
    snap = Snapshot(host="h", time=NOW, gpus=(gpu(),), processes=(GpuProcess(7, 0, 10, info),))
    table = render_table(snap, colour=False)
    assert "\x1b" not in table
    assert "\x07" not in table
    assert "\u202e" not in table
    assert "?[2J?[31mroot?" in table


def test_safe_text_keeps_printable_unicode() -> None:
    assert safe_text("naïve 模型 ✓") == "naïve 模型 ✓"
    assert safe_text("a\tb\nc\x00") == "a?b?c?"


def test_markers_for_what_on_call_looks_for_first() -> None:
    snap = Snapshot(
        host="h",
        time=NOW,
        gpus=(gpu(),),
        processes=(
            GpuProcess(11, 0, 3000, ProcessInfo(pid=11, orphaned=True)),
            GpuProcess(12, 0, 2000, ProcessInfo(pid=12, user="bob", status="zombie")),
            GpuProcess(13, 0, 1000, ProcessInfo(pid=13, user="eve", cmdline=("nb",)), 0),
            GpuProcess(14, 0, 500, ProcessInfo(pid=14, user="joe", status="stopped")),
        ),
    )
    lines = render_table(snap).splitlines()
    row = {int(line.split()[0]): line for line in lines if line[:3] == "  1"}
    assert "[orphaned: no such process]" in row[11]
    assert "[zombie]" in row[12]
    assert "[idle]" in row[13]
    assert "[stopped]" in row[14]


def test_processes_are_sorted_by_memory_and_labelled() -> None:
    small = proc(2)
    big = GpuProcess(
        3,
        0,
        9000,
        ProcessInfo(pid=3, user="bob", slurm_job="77", pod="abc-def", checkpoint_signal="SIGUSR1"),
    )
    table = render_table(Snapshot(host="h", time=NOW, gpus=(gpu(),), processes=(small, big)))
    assert table.index("  3 ") < table.index("  2 ")
    assert "↳ slurm job 77 · pod abc-def · checkpoints on SIGUSR1" in table


def test_unknown_values_say_na_never_zero() -> None:
    blank = GpuState(index=0, name="X", memory=Memory())
    table = render_table(Snapshot(host="h", time=NOW, gpus=(blank,)))
    assert "n/a" in table
    assert " 0%" not in table
    gpu_json = snapshot_dict(Snapshot(host="h", time=NOW, gpus=(blank,)))["gpus"][0]
    assert gpu_json["temperature_c"] is None
    assert gpu_json["memory"]["used_pct"] is None
    assert gpu_json["throttle"] is None


def test_health_alerts() -> None:
    sick = gpu(
        throttle=("gpu_idle", "hw_thermal_slowdown"),
        ecc=Ecc(volatile_uncorrected=2),
        remapped_rows=RemappedRows(correctable=0, uncorrectable=1, pending=True, failure=False),
    )
    table = render_table(Snapshot(host="h", time=NOW, gpus=(sick,)))
    alert = next(line for line in table.splitlines() if line.strip().startswith("!"))
    assert "throttle: hw_thermal_slowdown" in alert
    assert "gpu_idle" not in alert  # idle is not a problem
    assert "ecc: 2 uncorrected" in alert
    assert "remapped rows: 1 uncorrectable, pending" in alert


def test_lost_gpu_is_one_line_and_the_others_report() -> None:
    snap = Snapshot(
        host="h",
        time=NOW,
        gpus=(
            gpu(0),
            GpuState(index=1, name="NVIDIA H100", lost=True, error="GPU is lost"),
            gpu(2),
        ),
    )
    table = render_table(snap)
    assert "[1] H100  LOST: GPU is lost" in table
    assert "[0] A100" in table
    assert "[2] A100" in table


def test_colour_only_when_asked() -> None:
    snap = Snapshot(host="h", time=NOW, gpus=(gpu(),))
    assert "\x1b[" not in render_table(snap, colour=False)
    assert "\x1b[" in render_table(snap, colour=True)


def test_json_is_serialisable_and_events_explain_xids() -> None:
    snap = Snapshot(
        host="h",
        time=NOW,
        gpus=(gpu(),),
        processes=(proc(5),),
        events=(
            Event(EventKind.XID, NOW, 0, 48),
            Event(EventKind.ECC_DOUBLE_BIT, NOW, 0, None, "DBE"),
        ),
    )
    document = json.loads(json.dumps(snapshot_dict(snap)))
    assert document["time"] == "2026-01-01T00:00:00Z"
    assert document["processes"][0]["age_s"] == 3600.0
    assert document["processes"][0]["cmdline"] == ["python", "train.py"]
    assert [e["detail"] for e in document["events"]] == ["double-bit ECC error", "DBE"]


def test_a_future_start_time_is_unknown_age() -> None:
    future = GpuProcess(9, 0, 1, ProcessInfo(pid=9, create_time=NOW + 3600))
    assert future.age_s(NOW) is None
    assert snapshot_dict(Snapshot("h", NOW, (gpu(),), (future,)))["processes"][0]["age_s"] is None
