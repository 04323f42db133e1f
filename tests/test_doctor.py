"""Self-checks (``gpuwarden doctor``) against real files, real processes and this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.cli import doctor, selfcheck
from gpuwarden.cli.selfcheck import Finding
from gpuwarden.config import CloudProfile, Config, ExecConfig

PLAYBOOK = """\
rules:
  - name: hot
    for_each: gpu
    when: gpu.temperature_c > 90
    steps:
      - notify: oncall
"""
SECRET = "s3cretpassw0rd"


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A real process to probe instead of PID 1 (whose environ a sandbox may hide)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child.pid
    child.kill()
    child.wait()


def write_setup(tmp_path: Path, notify: str = "") -> tuple[Path, Path]:
    books = tmp_path / "playbooks"
    books.mkdir(mode=0o755)
    (books / "hot.yaml").write_text(PLAYBOOK)
    (books / "hot.yaml").chmod(0o644)
    config = tmp_path / "gpuwarden.yaml"
    config.write_text(
        f"playbooks: {books}\nstate_dir: {tmp_path / 'state'}\n"
        + (notify or "notify:\n  targets:\n    oncall:\n      urls: ['json://127.0.0.1:9/hook']\n")
    )
    config.chmod(0o600)
    return config, books


def by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


def test_valid_setup_is_all_ok_except_nvml_without_a_gpu(tmp_path: Path, sleeper: int) -> None:
    config, books = write_setup(tmp_path)
    findings = selfcheck.run_checks(None, config, [books], probe_pid=sleeper)
    checks = by_check(findings)
    assert checks["nvml"].severity == "warning"
    assert checks["nvml"].fix is not None
    assert "driver" in checks["nvml"].fix
    others = [f for f in findings if f.check != "nvml"]
    assert [f for f in others if not f.ok] == []
    assert {"config", "signal", "renice", "environ", "state_dir", "modes", "playbooks"} <= set(
        checks
    )
    assert checks["notify oncall"].ok
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    assert doctor.exit_code(findings) == 0


def test_group_writable_playbook_refuses_unless_insecure(tmp_path: Path, sleeper: int) -> None:
    config, books = write_setup(tmp_path)
    (books / "hot.yaml").chmod(0o664)
    strict = selfcheck.run_checks(None, config, [books], probe_pid=sleeper)
    bad = by_check(strict)[f"mode {books / 'hot.yaml'}"]
    assert bad.severity == "error"
    assert bad.fix is not None
    assert bad.fix.startswith(f"chmod go-w {books / 'hot.yaml'}")
    assert doctor.exit_code(strict) == 1
    assert selfcheck.blocking(strict) == [bad]

    loose = selfcheck.run_checks(
        None, config, [books], probe_pid=sleeper, insecure_permissions=True
    )
    assert by_check(loose)[f"mode {books / 'hot.yaml'}"].severity == "warning"
    assert doctor.exit_code(loose) == 0


def test_world_writable_config_is_an_error(tmp_path: Path, sleeper: int) -> None:
    config, books = write_setup(tmp_path)
    config.chmod(0o606)
    finding = by_check(selfcheck.run_checks(None, config, [books], probe_pid=sleeper))[
        f"mode {config}"
    ]
    assert finding.severity == "error"
    assert "writable by group or other" in finding.detail


def test_a_writable_directory_above_the_playbooks_is_an_error(tmp_path: Path, sleeper: int) -> None:
    config, books = write_setup(tmp_path)
    books.chmod(0o777)
    try:
        findings = selfcheck.run_checks(None, config, [books], probe_pid=sleeper)
    finally:
        books.chmod(0o755)
    finding = by_check(findings)[f"mode {books}"]
    assert finding.severity == "error"
    assert "writable by group or others (mode drwxrwxrwx)" in finding.detail
    assert finding.fix == f"chmod go-w {books} (or start with --insecure-permissions)"
    assert selfcheck.blocking(findings) == [finding]


def test_the_ack_spool_is_checked_without_being_created(tmp_path: Path) -> None:
    spool = tmp_path / "run" / "ack"
    fresh = selfcheck.check_ack_spool(spool)
    assert (fresh.ok, fresh.detail) == (True, f"{spool} is created at the first checkpoint request")
    assert not spool.parent.exists()
    spool.mkdir(parents=True)
    spool.parent.chmod(0o777)
    open_parent = selfcheck.check_ack_spool(spool)
    assert open_parent.severity == "warning"
    assert open_parent.detail.startswith(f"{spool.parent} is writable by group or others")
    assert "checkpoint steps will ask no job" in open_parent.detail


def test_the_exec_user_must_exist_and_not_be_root() -> None:
    assert selfcheck.check_exec_user(Config()).detail.startswith("exec steps run as nobody")
    missing = selfcheck.check_exec_user(Config(exec=ExecConfig(user="gw-no-such-user")))
    assert missing.severity == "warning"
    assert "is not a user on this host" in missing.detail
    assert selfcheck.check_exec_user(Config(exec=ExecConfig(user="root"))).severity == "warning"


def test_state_dir_under_a_regular_file_is_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    finding = selfcheck.check_state_dir(blocker / "state")
    assert finding.severity == "error"
    assert str(blocker / "state") in finding.detail
    assert finding.fix is not None
    assert "0700" in finding.fix


def test_state_dir_created_and_probe_removed(tmp_path: Path) -> None:
    state = tmp_path / "a" / "b"
    assert selfcheck.check_state_dir(state).ok
    assert list(state.iterdir()) == []


def test_missing_notify_secret_names_the_variable_not_any_secret(
    tmp_path: Path, sleeper: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUWARDEN_DOCTOR_MISSING", raising=False)
    notify = (
        "notify:\n  targets:\n"
        "    oncall:\n      urls: [{env: GPUWARDEN_DOCTOR_MISSING}]\n"
        f"    chat:\n      urls: ['json://bot:{SECRET}@127.0.0.1:9/hook']\n"
        f"    broken:\n      urls: ['nosuchscheme://{SECRET}@x/y']\n"
    )
    config, books = write_setup(tmp_path, notify)
    findings = selfcheck.run_checks(None, config, [books], probe_pid=sleeper)
    checks = by_check(findings)
    assert checks["notify oncall"].severity == "error"
    assert "GPUWARDEN_DOCTOR_MISSING" in checks["notify oncall"].detail
    assert checks["notify chat"].ok
    assert checks["notify broken"].severity == "error"
    text = doctor.render(findings) + json.dumps(doctor.as_json(findings))
    assert SECRET not in text
    assert doctor.exit_code(findings) == 1


def test_config_error_carries_its_position(tmp_path: Path, sleeper: int) -> None:
    config, books = write_setup(tmp_path)
    config.write_text("tick: 2s\nno_such_key: 1\n")
    config.chmod(0o600)
    findings = selfcheck.run_checks(None, config, [books], probe_pid=sleeper)
    bad = by_check(findings)["config"]
    assert bad.severity == "error"
    assert f"{config}:2:1" in bad.detail
    assert "playbooks" not in by_check(findings)  # nothing to check them against


def test_broken_playbook_is_an_error_with_position(tmp_path: Path, sleeper: int) -> None:
    config, books = write_setup(tmp_path)
    (books / "hot.yaml").write_text(PLAYBOOK.replace("gpu.temperature_c", "gpu.nope"))
    finding = by_check(selfcheck.run_checks(None, config, [books], probe_pid=sleeper))["playbooks"]
    assert finding.severity == "error"
    assert f"{books / 'hot.yaml'}:4:" in finding.detail


@pytest.mark.parametrize(
    ("capeff", "expected"),
    [
        ("0000000000000000", set()),
        ("0000000000000020", {"CAP_KILL"}),
        ("0000000000a80004", {"CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE", "CAP_SYS_ADMIN",
                              "CAP_SYS_NICE"}),
        # this sandbox's mask: every capability but CAP_SYS_RESOURCE (bit 24)
        ("000001fffeffffff", set(selfcheck.CAPABILITY_BITS) - {"CAP_SYS_RESOURCE"}),
    ],
)  # fmt: skip
def test_capabilities_decode(capeff: str, expected: set[str]) -> None:
    assert selfcheck.capabilities(capeff) == expected


def test_own_capabilities_read_from_a_status_file(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapPrm:\t0000000000000000\nCapEff:\t0000000000800020\n")
    assert selfcheck.own_capabilities(status) == {"CAP_KILL", "CAP_SYS_NICE"}
    assert selfcheck.own_capabilities(tmp_path / "missing") is None


def test_signal_probe_of_a_gone_process_warns() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    finding = selfcheck.check_signal(child.pid, None)
    assert finding.severity == "warning"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
def test_unprivileged_user_gets_capability_fixes() -> None:
    """A forked child becomes nobody (no capabilities left) and probes its root parent."""
    parent = os.getpid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running pytest's teardown
        code = 0
        try:
            os.setgid(65534)
            os.setuid(65534)
            caps = selfcheck.own_capabilities()
            found = [
                selfcheck.check_signal(parent, caps),
                selfcheck.check_renice(parent, caps),
                selfcheck.check_environ(parent),
            ]
            os.write(write, json.dumps(doctor.as_json(found)).encode())
        except BaseException:
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as handle:
        data = handle.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    reported = {f["check"]: f for f in json.loads(data)}
    assert reported["signal"]["severity"] == "warning"
    assert "CAP_KILL" in reported["signal"]["fix"]
    assert reported["renice"]["severity"] == "warning"
    assert "CAP_SYS_NICE" in reported["renice"]["fix"]
    assert reported["environ"]["severity"] == "warning"
    assert "CAP_SYS_PTRACE" in reported["environ"]["fix"]


def test_cloud_credentials() -> None:
    profile = CloudProfile(
        region="us-east-1", instance_types=("p4d.24xlarge",), ami="ami-0123456789abcdef0"
    )
    config = Config.model_validate({"cloud": {"profiles": {"burst": profile.model_dump()}}})

    def missing_boto3(_: CloudProfile) -> bool:
        raise ImportError("boto3")

    none = selfcheck.check_cloud(config, lambda _: False)
    assert none[0].severity == "warning"
    assert none[0].detail == "no AWS credentials found"
    assert selfcheck.check_cloud(config, lambda _: True)[0].ok
    absent = selfcheck.check_cloud(config, missing_boto3)[0]
    assert absent.severity == "warning"
    assert absent.fix == "pip install 'gpuwarden[cloud]'"
    assert selfcheck.check_cloud(Config(), missing_boto3) == []


def test_nvml_skipped_for_other_sources() -> None:
    assert selfcheck.check_nvml("scenario:drill.yaml").ok


def test_render_and_exit_codes() -> None:
    ok = Finding("nvml", True, "ok", "reachable, 2 GPU(s)")
    warn = Finding("environ", False, "warning", "cannot read", "grant CAP_SYS_PTRACE")
    fail = Finding("state_dir", False, "error", "not writable", "chmod 0700")
    assert doctor.render([ok, warn, fail]).splitlines() == [
        "ok   nvml: reachable, 2 GPU(s)",
        "WARN environ: cannot read",
        "  fix: grant CAP_SYS_PTRACE",
        "FAIL state_dir: not writable",
        "  fix: chmod 0700",
    ]
    assert doctor.exit_code([]) == 0
    assert doctor.exit_code([ok]) == 0
    assert doctor.exit_code([ok, warn]) == 0
    assert doctor.exit_code([ok, warn, fail]) == 1


def test_doctor_names_the_daemon_that_holds_the_state_dir(tmp_path: Path) -> None:
    config, _ = write_setup(tmp_path)
    state = tmp_path / "state"
    doctor_cmd = [sys.executable, "-m", "gpuwarden", "doctor", "--config", str(config), "--json"]

    def daemon_line() -> str:
        done = subprocess.run(doctor_cmd, check=False, capture_output=True, text=True, timeout=60)
        found = {f["check"]: f for f in json.loads(done.stdout)}
        assert found["daemon"]["severity"] == "ok"
        return str(found["daemon"]["detail"])

    assert daemon_line().startswith("no gpuwarden daemon holds")
    # A real process takes the lock the way `gpuwarden run` does and keeps it.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from gpuwarden.journal.lock import StateLock;"
            "StateLock(Path(sys.argv[1])).acquire(); print('held', flush=True); time.sleep(60)",
            str(state),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        line = daemon_line()
        assert line.startswith(f"pid {holder.pid} (python")
        assert str(state / "journal.lock") in line
    finally:
        holder.kill()
        holder.wait()
    # The kernel dropped the lock with its holder; asking never took it.
    assert daemon_line().startswith("no gpuwarden daemon holds")
