"""``gpuwarden drill`` as on-call staff run it: a real subprocess, shipped files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from gpuwarden.errors import ExitCode
from tests.cli_runner import gpuwarden as run_gpuwarden

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "scenarios/memory-pressure-low-priority.yaml"


def gpuwarden(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run_gpuwarden(*args, cwd=cwd, timeout=120)


def test_memory_pressure_drill_json_shows_the_whole_ladder() -> None:
    result = gpuwarden("drill", SCENARIO, "--config", "config/gpuwarden.yaml", "--json")
    assert result.returncode == 0, result.stderr
    everything = [json.loads(line) for line in result.stdout.splitlines()]
    records = [r for r in everything if r["kind"] != "message"]
    for record in records:
        assert {"t", "at", "kind", "rule", "scope", "reason"} <= set(record)
        assert record["kind"] in {
            "pending",
            "firing",
            "step",
            "skip",
            "resolved",
            "cooldown",
            "cancelled",
            "waiting",
        }
    ladder = [
        (r["t"], r["kind"], r.get("step"), [t["job"] for t in r.get("targets", [])])
        for r in records
        if r["rule"] == "gpu-memory-pressure" and r["kind"] != "skip"
    ]
    assert ladder == [
        (94.0, "pending", None, []),
        (124.0, "firing", None, []),
        (124.0, "step", "notify", []),
        (124.0, "step", "checkpoint", ["trainer"]),
        (244.0, "step", "kill", ["sweep"]),
        (246.0, "resolved", None, []),
    ]
    kills = [r for r in records if r["kind"] == "step" and r.get("step") == "kill"]
    assert [t["priority"] for k in kills for t in k["targets"]] == ["low"]
    # The wall clock, in the scenario's time zone (it starts at 02:58:00Z), and what the
    # condition read when the rule went pending and fired.
    (pending,) = [
        r for r in records if r["rule"] == "gpu-memory-pressure" and r["kind"] == "pending"
    ]
    assert pending["at"] == "2026-03-14T02:59:34+00:00"
    assert pending["values"] == {"gpu.memory.used_pct": pending["values"]["gpu.memory.used_pct"]}
    assert pending["values"]["gpu.memory.used_pct"] >= 95
    assert pending["detail"].startswith("gpu.memory.used_pct = 95")
    # Each message the run would send, with its text: the page at group_wait after firing,
    # the resolve message a group_interval after the last one.
    messages = [
        r for r in everything if r["kind"] == "message" and "GPU memory pressure" in r["title"]
    ]
    assert [(m["t"], m["target"], m["message"]) for m in messages] == [
        (154.0, "oncall", "open"),
        (454.0, "oncall", "resolve"),
    ]
    assert messages[0]["title"] == "[DRILL] [CRITICAL] GPU memory pressure on gpu-node-07: GPU 0"
    assert "memory 99.5 % used" in messages[0]["body"]
    assert (
        "kill pid 4195305 (bob, low, 28900 MiB, python sweep.py --trial 17)"
        in (messages[1]["body"])
    )


def test_drill_uses_the_checkouts_playbooks_when_none_are_installed(tmp_path: Path) -> None:
    result = gpuwarden("drill", SCENARIO, "--config", "config/gpuwarden.yaml")
    assert result.returncode == 0, result.stderr
    if not Path("/etc/gpuwarden/playbooks").exists():
        assert "using ./playbooks" in result.stderr
    assert "STEP kill → pid" in result.stdout
    assert "(sweep) bob/low" in result.stdout
    assert result.stdout.splitlines()[-4].startswith(f"summary: {SCENARIO}: 9 rule(s)")


SLURM_LADDER = """
rules:
  - name: make-room
    when: gpu.memory.used_pct >= 95
    for: 30s
    until: gpu.memory.used_pct < 85
    steps:
      - checkpoint: {select: process.checkpointable}
      - after: 1m
        suspend: {select: process.priority <= low, via: signal}
      - after: 2m
        requeue: {select: process.priority <= low, hold: true}
      - after: 2m
        kill: {select: process.priority <= low}
"""


def test_a_drill_shows_via_slurm_on_steps_whose_targets_are_slurm_jobs(tmp_path: Path) -> None:
    # The trainer runs in Slurm job 48213 (the scenario says so); the sweep is in no job.
    playbook = tmp_path / "make-room.yaml"
    playbook.write_text(SLURM_LADDER)
    args = ("drill", SCENARIO, "--config", "config/gpuwarden.yaml", "--playbooks", str(playbook))
    result = gpuwarden(*args)
    assert result.returncode == 0, result.stderr
    steps = [line.split("STEP ", 1)[1] for line in result.stdout.splitlines() if "STEP " in line]
    assert steps == [
        "checkpoint → pid 4195304 (trainer) alice/high, 52000 MiB via slurm job 48213",
        "suspend → pid 4195305 (sweep) bob/low, 28900 MiB",  # via: signal
        "requeue → nobody (no candidates)",  # the sweep is in no Slurm job: skipped
        "kill → pid 4195305 (sweep) bob/low, 28900 MiB",  # in no job: a signal
    ]
    assert "skip pid 4195305 (sweep) bob/low, 28900 MiB: not slurm job" in result.stdout
    records = [json.loads(line) for line in gpuwarden(*args, "--json").stdout.splitlines()]
    [checkpoint] = [r for r in records if r.get("step") == "checkpoint" and r["kind"] == "step"]
    assert (
        checkpoint["targets"][0] | {"via": "slurm", "slurm_job": "48213"}
        == (checkpoint["targets"][0])
    )
    off = tmp_path / "off.yaml"
    off.write_text(
        (ROOT / "config" / "gpuwarden.yaml")
        .read_text()
        .replace("  enabled: true", "  enabled: false", 1)
    )
    quiet = gpuwarden("drill", SCENARIO, "--config", str(off), "--playbooks", str(playbook))
    assert "via slurm" not in quiet.stdout  # slurm.enabled: false: plain signals


def test_drill_touches_nothing_outside(tmp_path: Path) -> None:
    before = set(os.listdir("/proc"))
    result = gpuwarden("drill", SCENARIO, "--config", "config/gpuwarden.yaml", "--json")
    assert result.returncode == 0
    # no stand-in was spawned: every PID in the timeline is a synthetic one
    pids = {
        t["pid"] for line in result.stdout.splitlines() for t in json.loads(line).get("targets", [])
    }
    assert pids
    assert all(pid > 2**22 for pid in pids)
    assert not {
        p
        for p in set(os.listdir("/proc")) - before
        if p.isdigit()
        and Path(f"/proc/{p}/cmdline").exists()
        and b"standin" in Path(f"/proc/{p}/cmdline").read_bytes()
    }


def test_drill_of_a_broken_playbook_fails_with_its_position(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "playbooks", tmp_path / "playbooks")
    broken = tmp_path / "playbooks" / "memory-pressure.yaml"
    broken.write_text(
        broken.read_text().replace("gpu.memory.used_pct >= 95", "gpu.memory.used_pc >= 95")
    )
    result = gpuwarden(
        "drill",
        SCENARIO,
        "--config",
        "config/gpuwarden.yaml",
        "--playbooks",
        str(tmp_path / "playbooks"),
    )
    assert result.returncode == ExitCode.BAD_INPUT
    assert result.stdout == ""
    assert f"{broken}:13:" in result.stderr
    assert "did you mean gpu.memory.used_pct" in result.stderr
    assert "Traceback" not in result.stderr


def test_drill_of_a_missing_scenario_is_a_usage_error() -> None:
    result = gpuwarden("drill", "nope.yaml", "--config", "config/gpuwarden.yaml")
    assert result.returncode == ExitCode.BAD_INPUT
    assert "no such scenario file: nope.yaml" in result.stderr
