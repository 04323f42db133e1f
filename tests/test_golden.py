"""Every shipped playbook, drilled against its scenario, produces exactly its golden timeline.

A failure here is a change of behaviour: if it is intended, run ``make golden`` and review the
diff of tests/golden/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.golden_pairs import PAIRS, ROOT, golden_path, timeline


def test_every_shipped_playbook_has_a_golden_timeline() -> None:
    shipped = {p.stem for p in (ROOT / "playbooks").glob("*.yaml")}
    assert shipped == set(PAIRS)
    for stem, scenario in PAIRS.items():
        assert (ROOT / "scenarios" / f"{scenario}.yaml").is_file(), stem
        assert golden_path(stem).is_file(), f"run `make golden` for {stem}"


@pytest.mark.parametrize("playbook", sorted(PAIRS))
def test_golden_timeline(playbook: str) -> None:
    expected = golden_path(playbook).read_text().splitlines()
    actual = timeline(playbook)
    assert actual == expected


def records(playbook: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in golden_path(playbook).read_text().splitlines()]


def sequence(playbook: str) -> list[tuple[object, ...]]:
    return [
        (r["t"], r["kind"], r.get("step"), tuple(t["job"] for t in r.get("targets", [])))
        for r in records(playbook)
        if r["kind"] not in ("skip", "message")
    ]


def test_memory_pressure_ladder_reads_as_documented() -> None:
    # 0:00 GPU 0 at 79 %; the sweep grows and crosses 95 % at 1:34; 30 s later the rule
    # fires: page, ask checkpointable jobs to save; 2 min after firing kill low priority
    # only until the GPU would be below 80 %; the GPU drops to 64 % and the incident closes.
    assert sequence("memory-pressure") == [
        (94.0, "pending", None, ()),
        (124.0, "firing", None, ()),
        (124.0, "step", "notify", ()),
        (124.0, "step", "checkpoint", ("trainer",)),
        (244.0, "step", "kill", ("sweep",)),
        (246.0, "resolved", None, ()),
    ]


def test_memory_pressure_timeline_says_when_what_and_what_was_said() -> None:
    pending, firing = (r for r in records("memory-pressure") if r["kind"] in ("pending", "firing"))
    assert pending["at"] == "2026-03-14T02:59:34+00:00"  # 1:34 after the 02:58:00Z start
    assert pending["detail"] == "gpu.memory.used_pct = 95.02"
    assert firing["values"]["gpu.memory.used_pct"] > 99
    said = [
        (r["t"], r["target"], r["title"])
        for r in records("memory-pressure")
        if r["kind"] == "message"
    ]
    assert said == [
        (154.0, "oncall", "[DRILL] [CRITICAL] GPU memory pressure on gpu-node-07: GPU 0"),
        (454.0, "oncall", "[DRILL] [RESOLVED] GPU memory pressure on gpu-node-07: GPU 0"),
    ]


def test_fatal_xid_pages_and_checkpoints_the_surviving_ranks() -> None:
    steps = [r for r in records("gpu-lost-fatal-xid") if r["kind"] == "step"]
    assert [s["step"] for s in steps] == ["notify", "checkpoint"]
    ranks = sorted(t["job"] for t in steps[1]["targets"])
    assert ranks == [f"rank{i}" for i in range(8) if i != 5]


def test_weekly_check_finds_only_the_gpu_with_a_pending_remap() -> None:
    fired = [r for r in records("weekly-health-check") if r["kind"] == "firing"]
    assert [(r["t"], r["scope"]) for r in fired] == [(300.0, "gpu:2")]


def test_working_hours_rule_waits_for_the_window() -> None:
    pending = [r for r in records("working-hours-large-jobs") if r["kind"] == "pending"]
    assert [r["t"] for r in pending] == [1200.0]  # 08:00, not 07:40 when the scenario starts


def test_golden_files_are_not_stale(tmp_path: Path) -> None:
    extra = {p.stem for p in golden_path("x").parent.glob("*.jsonl")} - set(PAIRS)
    assert not extra, f"golden timelines without a playbook: {sorted(extra)}"
