"""``gpuwarden run``, ``incidents``, ``incident`` and ``reset-breaker`` as a user runs them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpuwarden.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "scenario:scenarios/memory-pressure-low-priority.yaml"


def gpuwarden(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def run_args(state: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gpuwarden",
        "run",
        "--config",
        "config/demo.yaml",
        "--source",
        SCENARIO,
        "--playbooks",
        "playbooks/memory-pressure.yaml",
        "--state-dir",
        str(state),
        *extra,
    ]


def test_run_then_read_the_post_mortem(tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = subprocess.run(
        run_args(state, "--speed", "40"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "action=kill pid=" in result.stderr
    assert "result=terminated" in result.stderr
    assert " resolved for GPU 0 (until_met)" in result.stderr  # as "fired for GPU 0" was
    # `make demo` runs this: its oncall target has no URL (the self-check says so once, at
    # start), and the messages for it wait in the outbox without a warning per retry.
    assert "check=notify oncall severity=error" in result.stderr
    assert "notify retry" not in result.stderr
    assert "is not configured" not in result.stderr
    listing = json.loads(gpuwarden("incidents", "--state-dir", str(state), "--json").stdout)
    (incident,) = listing["incidents"]
    assert incident["rule"] == "gpu-memory-pressure"
    assert incident["resolve_reason"] == "until_met"
    timeline = json.loads(
        gpuwarden("incident", incident["id"][:12], "--state-dir", str(state), "--json").stdout
    )
    kinds = [e["kind"] for e in timeline["events"]]
    assert kinds[:2] == ["pending", "firing"]
    assert kinds[-1] == "resolved"
    text = gpuwarden("incident", "last", "--state-dir", str(state)).stdout
    assert "STEP 2: kill" in text
    assert "terminated" in text
    assert (
        gpuwarden("incidents", "--state-dir", str(state), "--open").stdout.count(
            "gpu-memory-pressure"
        )
        == 0
    )


def test_sigterm_stops_cleanly_and_takes_the_jobs_down(tmp_path: Path) -> None:
    process = subprocess.Popen(
        run_args(tmp_path / "state"),
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    first = process.stderr.readline()
    while first.startswith("WARNING gpuwarden.doctor"):  # self-check findings come first
        first = process.stderr.readline()
    assert first.startswith("gpuwarden: running 1 rule(s)")
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    _out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "received SIGTERM: stopping" in err
    assert "stopped after" in err
    assert "Traceback" not in err


def test_once_takes_one_tick(tmp_path: Path) -> None:
    result = subprocess.run(
        run_args(tmp_path / "state", "--once", "--dry-run"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "(shadow mode (--dry-run): recording and notifying, acting on nothing;" in result.stderr
    assert "stopped after 1 tick(s)" in result.stderr


def test_a_corrupt_journal_is_a_clear_error(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "journal.db").write_bytes(b"this is not a database" * 100)
    for args in (
        ["incidents", "--state-dir", str(state)],
        [
            "run",
            "--config",
            "config/demo.yaml",
            "--source",
            SCENARIO,
            "--once",
            "--playbooks",
            "playbooks/memory-pressure.yaml",
            "--state-dir",
            str(state),
        ],
    ):
        result = gpuwarden(*args)
        assert result.returncode == ExitCode.FAILURE
        assert "journal.db" in result.stderr
        assert "Traceback" not in result.stderr


def test_missing_journal_and_unknown_incident(tmp_path: Path) -> None:
    result = gpuwarden("incidents", "--state-dir", str(tmp_path / "none"))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    state = tmp_path / "state"
    assert (
        subprocess.run(
            run_args(state, "--once"), cwd=ROOT, capture_output=True, timeout=60, check=False
        ).returncode
        == 0
    )
    result = gpuwarden("incident", "nope", "--state-dir", str(state))
    assert result.returncode == ExitCode.BAD_INPUT
    assert "nope" in result.stderr


def test_reset_breaker_when_not_tripped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for command in (["reset-breaker"], ["ack", "last"]):  # writers never start a journal
        missing = gpuwarden(*command, "--state-dir", str(state))
        assert missing.returncode == ExitCode.FAILURE
        assert missing.stderr.startswith(f"gpuwarden: no journal at {state / 'journal.db'}\n")
        assert "Traceback" not in missing.stderr
        assert not state.exists()
    ran = subprocess.run(
        run_args(state, "--once", "--dry-run"),
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    result = gpuwarden("reset-breaker", "--state-dir", str(state))
    assert result.returncode == 0, result.stderr
    assert "not tripped" in result.stdout


def test_run_refuses_playbooks_others_can_edit(tmp_path: Path) -> None:
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    rules = playbooks / "memory-pressure.yaml"
    rules.write_text((ROOT / "playbooks" / "memory-pressure.yaml").read_text())
    rules.chmod(0o666)
    args = [
        "run",
        "--config",
        "config/demo.yaml",
        "--source",
        SCENARIO,
        "--once",
        "--playbooks",
        str(playbooks),
        "--state-dir",
        str(tmp_path / "state"),
    ]
    refused = gpuwarden(*args)
    assert refused.returncode == ExitCode.UNSAFE_SETUP
    assert f"chmod go-w {rules}" in refused.stderr
    allowed = gpuwarden(*args, "--insecure-permissions")
    assert allowed.returncode == 0, allowed.stderr
    assert "allowed by --insecure-permissions" in allowed.stderr


def test_doctor_lists_findings_with_fixes(tmp_path: Path) -> None:
    result = gpuwarden(
        "doctor", "--config", "config/demo.yaml", "--state-dir", str(tmp_path / "state"), "--json"
    )
    findings = json.loads(result.stdout)
    checks = {f["check"]: f for f in findings}
    assert checks["state_dir"]["ok"]
    assert not checks["notify oncall"]["ok"]  # GPUWARDEN_ONCALL_URL is not set here
    assert "GPUWARDEN_ONCALL_URL" in checks["notify oncall"]["detail"]
    assert result.returncode == 1
