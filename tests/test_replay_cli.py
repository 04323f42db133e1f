"""``gpuwarden status --source smi-csv:FILE@TIME`` and ``gpuwarden drill`` on every kind of log
people have, with kernel-log events beside them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuwarden.cli.main import main
from gpuwarden.errors import ExitCode
from tests.cli_runner import gpuwarden

ROOT = Path(__file__).resolve().parent.parent
SMI = ROOT / "tests" / "fixtures" / "smi"
KERNEL = ROOT / "tests" / "fixtures" / "kernel"
SCHEMA = json.loads((ROOT / "docs" / "status.schema.json").read_text())
SMI_CSV = f"smi-csv:{SMI}/"
BUS = SMI_CSV + "bus-id-only-nvidia-docs-query.csv"
COLUMNS = "--query-gpu=timestamp,index,temperature.gpu,memory.used,memory.total,power.draw"
KERNEL_LOGS = {
    "dmesg-driver-470.txt": ["--boot-time", "2026-03-03T12:00:00Z"],
    "dmesg-T-driver-535.txt": [],
    "journalctl-k-driver-550.txt": [],
    "journalctl-k-json-driver-570.jsonl": [],
    "kern-log-without-pid.txt": [],
    "rsyslog-rfc3339-driver-580.txt": [],
}
PRECISE = {  # the logs that keep microseconds
    "dmesg-driver-470.txt",
    "journalctl-k-json-driver-570.jsonl",
    "rsyslog-rfc3339-driver-580.txt",
}


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def status_json(capsys: pytest.CaptureFixture[str], *args: str | Path) -> dict[str, Any]:
    code, out, err = run(
        capsys, "status", "--config", ROOT / "config" / "demo.yaml", *args, "--json"
    )
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    jsonschema.validate(document, SCHEMA)
    return document


# --- status on each kind of log -----------------------------------------------------------------

STATUS_CASES = [
    # source, extra arguments, (index, used MiB, util %, lost) per GPU
    (SMI_CSV + "no-index-name-memory.csv@3s", [], [(0, 48931, 100, False), (1, 17, 3, False)]),
    (
        f"{BUS}@#3",
        [],
        [
            (0, 30727, 97, False),
            (1, None, None, True),
            (2, 28679, 100, False),
            (3, 16391, 93, False),
        ],
    ),
    (
        SMI_CSV + "windows-powershell-utf16le-bom-crlf.csv@#2",
        [],
        [(0, 22389, 99, False), (1, 1196, 0, False)],
    ),
    (SMI_CSV + "windows-nvidia-smi-exe-cmd.csv@2.1s", [], [(0, 1432, 0, False)]),
    (
        SMI_CSV + "h100-seventy-two-columns.csv",
        ["--at-sample", "2"],
        [(0, 67211, 100, False), (1, 0, 0, False)],
    ),
    (
        SMI_CSV + "noheader-nounits-query-pasted.csv@#2",
        ["--columns", COLUMNS],
        [(0, 41230, None, False), (1, 81477, None, False)],
    ),
]


@pytest.mark.parametrize(("source", "extra", "gpus"), STATUS_CASES)
def test_status_shows_each_log_at_a_time(capsys, source, extra, gpus):
    document = status_json(capsys, "--source", source, *extra)
    got = [
        (g["index"], g["memory"]["used_mib"], g["utilization_pct"], g["lost"])
        for g in document["gpus"]
    ]
    assert got == gpus
    assert document["processes_visible"] is False


def test_status_table_says_which_sample_it_shows_and_what_to_do_about_the_xids(capsys):
    log = KERNEL / "dmesg-driver-470.txt"
    code, out, err = run(
        capsys, "status", "--source", f"{BUS}@#3", "--events", f"dmesg:{log}",
        "--boot-time", "2026-03-03T12:00:00Z", "--color", "never",
    )  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("bus-id-only-nvidia-docs-query  2026-03-03T14:00:10Z  smi-csv:")
    assert lines[1] == "  showing sample 3 of 5 (line 10), taken 2026-03-03T14:00:10.241Z"
    assert "[1] Tesla V100-SXM2-32GB  LOST: GPU is lost" in lines
    events = lines[lines.index("events") + 1 :]
    # Each line fits the 80 columns of a pipe; what is cut ends in "…" (--json has it whole).
    assert events == [
        "  2026-03-03T14:00:07Z  GPU 1  XID 79 (GPU has fallen off the bus): GPU has fal…",
        "      → drain the node and reboot it; check PCIe seating, power and cooling; re…",
        "  2026-03-03T14:00:07Z  GPU 1  GPU_LOST: GPU has fallen off the bus [kernel: PC…",
    ]


@pytest.mark.parametrize("name", sorted(KERNEL_LOGS))
def test_status_with_each_kernel_log(capsys, name):
    document = status_json(
        capsys, "--source", f"{BUS}@15s", "--events", f"dmesg:{KERNEL / name}", *KERNEL_LOGS[name]
    )
    got = [(e["kind"], e["gpu"], e["xid"]) for e in document["events"]]
    thirteens = 2 if name in ("dmesg-driver-470.txt", "dmesg-T-driver-535.txt") else 1
    assert got == [
        ("xid", 1, 79),
        ("gpu_lost", 1, None),
        ("xid", 2, 48),
        *[("xid", 3, 13)] * thirteens,
        ("xid", 3, 31),
    ]
    actions = {e["xid"]: e["action"] for e in document["events"]}
    assert actions[48].startswith("drain the GPU and reset it")
    assert actions[None] is None


# --- drills over each of them --------------------------------------------------------------------

PLAYBOOK = """\
rules:
  - name: watch
    for_each: gpu
    when: {when}
    severity: warning
"""

DRILL_CASES = [
    # source, the rule's when, extra arguments, (t, where) of each firing
    (
        SMI_CSV + "no-index-name-memory.csv",
        "gpu.memory.used_pct >= 95",
        ["--tick", "1s"],
        [(3.0, "GPU 0")],
    ),
    (
        SMI_CSV + "windows-powershell-utf16le-bom-crlf.csv@#2",
        "gpu.memory.used_pct >= 90",
        [],
        [(1.013, "GPU 0")],
    ),
    (
        str(SMI / "windows-nvidia-smi-exe-cmd.csv"),
        "gpu.power_w >= 400",
        ["--tick", "1s"],
        [(0.0, "GPU 0")],
    ),
    (
        SMI_CSV + "h100-seventy-two-columns.csv",
        "gpu.power_w >= 690",
        ["--at-sample", "2"],
        [(1.028, "GPU 0")],
    ),
    (
        SMI_CSV + "noheader-nounits-query-pasted.csv",
        "gpu.memory.used_pct >= 99",
        ["--columns", COLUMNS],
        [(0.0, "GPU 1")],
    ),
    (BUS, "gpu.memory.used_pct >= 90", ["--tick", "5s"], [(0.0, "GPU 0"), (0.0, "GPU 1")]),
]


@pytest.mark.parametrize(("source", "when", "extra", "fired"), DRILL_CASES)
def test_drill_on_each_log(capsys, tmp_path, source, when, extra, fired):
    playbook = tmp_path / "watch.yaml"
    playbook.write_text(PLAYBOOK.format(when=when))
    code, out, err = run(capsys, "drill", source, "--playbooks", playbook, "--json", *extra)
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["t"], r["where"]) for r in records if r["kind"] == "firing"] == fired


@pytest.mark.parametrize("name", sorted(KERNEL_LOGS))
def test_drill_the_shipped_fatal_xid_playbook_over_each_kernel_log(capsys, name):
    code, out, err = run(
        capsys, "drill", BUS, "--events", f"dmesg:{KERNEL / name}", *KERNEL_LOGS[name],
        "--config", ROOT / "config" / "gpuwarden.yaml",
        "--playbooks", ROOT / "playbooks" / "gpu-lost-fatal-xid.yaml", "--tick", "1s", "--json",
    )  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    fired = [(r["t"], r["where"]) for r in records if r["kind"] == "firing"]
    # XID 79 at 7.3 s in (6.8 s where the log keeps whole seconds), XID 48 at 11.9 s (11.8 s)
    lost = 8.0 if name in PRECISE else 7.0
    assert fired == [(lost, "GPU 1"), (12.0, "GPU 2")]
    steps = [(r["t"], r["step"]) for r in records if r["kind"] == "step"]
    assert steps == [(lost, "notify"), (lost, "checkpoint"), (12.0, "notify"), (12.0, "checkpoint")]


# --- what cannot be used -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status", "--source", f"{BUS}@#9"], "there is no sample 9: the log has 5"),
        (["status", "--source", f"{BUS}@#0"], "after @# comes a sample number"),
        (["status", "--source", f"{BUS}@1s", "--at-sample", "2"], "both say where to look"),
        (["status", "--at-sample", "2"], "--at-sample needs a replayed source"),
        (["status", "--source", BUS, "--events", "dmesg:/nonexistent"], "no such file"),
        (["status", "--source", BUS, "--events", "syslog"], "unknown --events 'syslog'"),
        (["status", "--source", BUS, "--tz", "Mars/Olympus"], "unknown time zone 'Mars/Olympus'"),
        (["status", "--source", BUS, "--boot-time", "yesterday"], "--boot-time 'yesterday'"),
        (["drill", "nvml"], "a drill replays a recording"),
    ],
)
def test_usage_errors_say_what_to_write(capsys, args, message):
    code, _out, err = run(capsys, *args)
    assert code == ExitCode.BAD_INPUT
    assert message in err
    assert "Traceback" not in err


def test_a_noheader_log_without_columns_is_a_positioned_error(capsys):
    log = SMI / "noheader-nounits-query-pasted.csv"
    code, _out, err = run(capsys, "status", "--source", f"smi-csv:{log}")
    assert code == ExitCode.BAD_INPUT
    assert err.startswith(f"{log}:1:1: a record before any column names")
    assert "with --columns" in err


def test_status_and_drill_as_people_type_them():
    log = SMI / "windows-powershell-utf16le-bom-crlf.csv"
    status = gpuwarden("status", "--source", f"smi-csv:{log}@#2", "--color", "never")
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[1] == (
        "  showing sample 2 of 2 (line 4), taken 2026-01-22T09:15:32.817Z"
    )
    drill = gpuwarden(
        "drill", BUS, "--events", f"dmesg:{KERNEL / 'journalctl-k-driver-550.txt'}",
        "--config", "config/gpuwarden.yaml", "--playbooks", "playbooks/gpu-lost-fatal-xid.yaml",
        "--tick", "1s",
    )  # fmt: skip
    assert drill.returncode == 0, drill.stderr
    assert "+0:00:07  Tue 14:00:07  gpu-fatal-error  GPU 1  FIRING: event" in drill.stdout
    assert "incidents fired 2" in drill.stdout
