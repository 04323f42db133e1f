"""The command line as a user runs it: real subprocesses, exit codes, stdout and stderr."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gpuwarden.errors import ExitCode
from tests.cli_runner import gpuwarden

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
CSV_LOGS = sorted((ROOT / "scenarios").glob("*.csv"))
SCHEMA = json.loads((ROOT / "docs" / "status.schema.json").read_text())


def test_every_shipped_scenario_and_log_is_covered() -> None:
    assert len(SCENARIOS) >= 5
    assert len(CSV_LOGS) >= 1


@pytest.mark.parametrize("path", SCENARIOS + CSV_LOGS, ids=lambda p: p.name)
def test_status_json_of_each_shipped_source_matches_the_schema(path: Path) -> None:
    scheme = "scenario" if path.suffix == ".yaml" else "smi-csv"
    result = gpuwarden("status", "--source", f"{scheme}:{path.relative_to(ROOT)}@1m", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    jsonschema.validate(document, SCHEMA)
    assert document["gpus"], "a shipped scenario shows at least one GPU"
    # an nvidia-smi --query-gpu log cannot see processes: an empty list must not read as "none"
    assert document["processes_visible"] is (scheme == "scenario")


def test_status_table_fits_80_columns() -> None:
    for path in SCENARIOS:
        result = gpuwarden("status", "--source", f"scenario:{path}@3m")
        assert result.returncode == 0, result.stderr
        for line in result.stdout.splitlines():
            assert len(line) <= 80, line
        assert "\x1b[" not in result.stdout  # no colour when not on a terminal


def test_xid_scenario_shows_the_lost_gpu_and_the_event() -> None:
    path = "scenarios/xid79-one-of-eight.yaml"
    data = json.loads(gpuwarden("status", "--source", f"scenario:{path}@5m", "--json").stdout)
    lost = [g["index"] for g in data["gpus"] if g["lost"]]
    assert lost == [5]
    assert len(data["gpus"]) == 8
    assert [(e["kind"], e["gpu"], e["xid"]) for e in data["events"]] == [("xid", 5, 79)]
    assert data["events"][0]["detail"] == "GPU has fallen off the bus"
    table = gpuwarden("status", "--source", f"scenario:{path}@5m").stdout
    assert "[5] H100 80GB HBM3  LOST" in table
    assert "XID 79 (GPU has fallen off the bus)" in table


def test_nvml_on_a_machine_without_a_gpu_fails_with_one_clear_line() -> None:
    result = gpuwarden("status", "--source", "nvml")
    if result.returncode == 0:
        pytest.skip("this machine has a working NVML")
    assert result.returncode == ExitCode.SOURCE_UNAVAILABLE
    assert result.stdout == ""
    first, *rest = result.stderr.splitlines()
    assert first.startswith("gpuwarden: NVML")
    assert all(line.startswith("  hint: ") for line in rest)
    assert "Traceback" not in result.stderr


BAD_SCENARIO = """name: broken
gpus:
  - {index: 0, memory_total_mib: lots}
timeline:
  - at: 0s
"""


@pytest.mark.parametrize(
    ("args", "code", "stderr_start"),
    [
        (["status", "--source", "scenario:scenarios/thermal-throttling.yaml"], ExitCode.OK, ""),
        (["status", "--source", "ftp:x"], ExitCode.BAD_INPUT, "gpuwarden: unknown source"),
        (
            ["status", "--source", "scenario:absent.yaml"],
            ExitCode.BAD_INPUT,
            "gpuwarden: --source scenario:absent.yaml: no such file",
        ),
        (
            ["status", "--source", "scenario:scenarios/thermal-throttling.yaml@soon"],
            ExitCode.BAD_INPUT,
            "gpuwarden: --source scenario:scenarios/thermal-throttling.yaml@soon",
        ),
        (["status", "--source", "scenario:BAD"], ExitCode.BAD_INPUT, "BAD:3:34: gpus.0.memory"),
        (["status", "--source", "nvml:x"], ExitCode.BAD_INPUT, "gpuwarden: --source nvml takes"),
        (
            ["status", "--config", "BAD", "--source", "scenario:scenarios/thermal-throttling.yaml"],
            ExitCode.BAD_INPUT,
            "BAD:1:1: name: unknown field",
        ),
        (["status", "--bogus"], ExitCode.BAD_INPUT, "usage: gpuwarden"),
        ([], ExitCode.BAD_INPUT, "usage: gpuwarden"),
        (["status", "--source", "nvml"], None, ""),
    ],
)
def test_exit_codes(
    tmp_path: Path, args: list[str], code: ExitCode | None, stderr_start: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_SCENARIO)
    args = [a.replace("BAD", str(bad)) for a in args]
    result = gpuwarden(*args)
    if code is None:  # depends on whether this machine has a GPU
        assert result.returncode in (ExitCode.OK, ExitCode.SOURCE_UNAVAILABLE)
        return
    assert result.returncode == code, result.stderr
    assert result.stderr.startswith(stderr_start.replace("BAD", str(bad)))
    assert "Traceback" not in result.stderr
    if code != ExitCode.OK:
        assert result.stdout == ""


def test_malformed_scenario_lists_every_problem_with_position(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\ngpus:\n  - {index: 0, memory_total_mib: 0}\n"
        "jobs: [{id: a, cmdline: a}]\n"
        "timeline:\n  - {at: 1m, gpus: {0: {jobs: {b: 1}}}}\n  - {at: 30s}\n"
    )
    result = gpuwarden("status", "--source", f"scenario:{bad}")
    assert result.returncode == ExitCode.BAD_INPUT
    assert result.stderr.splitlines()[0] == (
        f"{bad}:3:34: gpus.0.memory_total_mib: input should be greater than 0 (got 0)"
    )
    bad.write_text(bad.read_text().replace("memory_total_mib: 0", "memory_total_mib: 10"))
    lines = gpuwarden("status", "--source", f"scenario:{bad}").stderr.splitlines()
    assert lines[0].startswith(f"{bad}:6:32: unknown job 'b' — expected one of the jobs: a")
    assert lines[1].startswith(f"{bad}:7:10: keyframe at 30s comes before the previous one at 60s")


def test_record_round_trips_through_the_scenario_format(tmp_path: Path) -> None:
    out = tmp_path / "rec.yaml"
    result = gpuwarden(
        "record",
        "--source",
        "scenario:scenarios/xid79-one-of-eight.yaml@4m",
        "--out",
        str(out),
        "--duration",
        "2m",
        "--interval",
        "30s",
    )
    assert result.returncode == 0, result.stderr
    assert "recorded 5 samples of 8 GPU(s) and 8 process(es)" in result.stderr
    replay = gpuwarden("status", "--source", f"scenario:{out}@60s", "--json")
    assert replay.returncode == 0, replay.stderr
    recorded = json.loads(replay.stdout)
    original = json.loads(
        gpuwarden(
            "status", "--source", "scenario:scenarios/xid79-one-of-eight.yaml@5m", "--json"
        ).stdout
    )
    assert recorded["time"] == original["time"]
    assert [g["lost"] for g in recorded["gpus"]] == [g["lost"] for g in original["gpus"]]
    assert [(e["kind"], e["gpu"], e["xid"]) for e in recorded["events"]] == [("xid", 5, 79)]

    def key(p: dict[str, object]) -> tuple[object, ...]:
        return (p["gpu"], p["gpu_memory_mib"], p["user"], p["priority"], p["slurm_job"])

    assert sorted(map(key, recorded["processes"])) == sorted(map(key, original["processes"]))
    for gpu_r, gpu_o in zip(recorded["gpus"], original["gpus"], strict=True):
        assert gpu_r["memory"] == gpu_o["memory"]


def test_record_never_writes_half_a_file(tmp_path: Path) -> None:
    out = tmp_path / "rec.yaml"
    result = gpuwarden("record", "--source", "nvml", "--out", str(out), "--duration", "1s")
    if result.returncode == 0:
        pytest.skip("this machine has a working NVML")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_watch_refreshes_until_interrupted() -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "status",
            "--json",
            "--watch",
            "0.2",
            "--source",
            "scenario:scenarios/memory-pressure-low-priority.yaml@1m",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(3)]
    process.send_signal(2)
    _out, err = process.communicate(timeout=30)
    times = [json.loads(line)["time"] for line in lines]
    assert times == sorted(times)
    assert process.returncode == 0, err
    assert "Traceback" not in err


@pytest.mark.parametrize("doc", ["README.md", "docs/operations.md"])
def test_the_exit_code_tables_list_exactly_the_exit_codes(doc: str) -> None:
    section = (ROOT / doc).read_text(encoding="utf-8").split("\n## Exit codes\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", section, re.MULTILINE)}
    assert documented == {int(code) for code in ExitCode}
