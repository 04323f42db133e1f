"""Stand-in processes: their command lines read like the jobs', and they react to real signals."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from gpuwarden.sources.spawn import Standin, spawn
from tests.signal_targets import session_spool


def cmdline_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")


def environ_of(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_text().rstrip("\0").split("\0")
    return dict(item.split("=", 1) for item in items)


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def started(tmp_path: Path):
    standins: list[Standin] = []

    def start(cmdline: tuple[str, ...], env: dict[str, str] | None = None, **kw) -> Standin:
        kw.setdefault("ack_spool", session_spool())
        s = spawn("job", cmdline, env or {}, tmp_path / f"job{len(standins)}", **kw)
        standins.append(s)
        return s

    yield start
    for s in standins:
        s.stop()


@pytest.mark.parametrize(
    "cmdline",
    [
        ("python", "train.py", "--model", "llama"),
        ("python3", "scripts/finetune.py", "--lr", "3e-4"),
        ("python3.11", "-m", "torch.distributed.run", "--nproc-per-node", "8", "train.py"),
    ],
)
def test_python_command_lines_are_reproduced_exactly(started, cmdline) -> None:
    assert cmdline_of(started(cmdline).pid) == list(cmdline)


def test_other_command_lines_are_carried_after_the_launcher(started) -> None:
    s = started(("jupyter-lab", "--no-browser", "--port", "8888"))
    argv = cmdline_of(s.pid)
    assert argv[0] == sys.executable
    assert argv[1].endswith("gpuwarden-standin.py")
    assert argv[2:] == ["jupyter-lab", "--no-browser", "--port", "8888"]


def test_a_path_escaping_the_workdir_is_not_written(started, tmp_path: Path) -> None:
    s = started(("python", "../../escape.py"))
    assert not (tmp_path / "escape.py").exists()
    assert not (tmp_path.parent / "escape.py").exists()
    assert cmdline_of(s.pid)[2:] == ["python", "../../escape.py"]


def test_environment_is_the_jobs_own(started, monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    s = started(("python", "t.py"), {"GPUWARDEN_PRIORITY": "low"})
    env = environ_of(s.pid)
    assert env["GPUWARDEN_PRIORITY"] == "low"
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["GPUWARDEN_ACK_DIR"] == str(s.ack_dir)


def test_each_stand_in_leads_its_own_process_group(started) -> None:
    s = started(("python", "t.py"))
    assert os.getpgid(s.pid) == s.pid
    assert os.getsid(s.pid) == s.pid


def test_suspend_and_resume_are_logged(started) -> None:
    s = started(("python", "t.py"))
    os.kill(s.pid, signal.SIGSTOP)
    wait_until(lambda: Path(f"/proc/{s.pid}/stat").read_text().split()[2] == "T")
    os.kill(s.pid, signal.SIGCONT)
    wait_until(lambda: "signal SIGCONT" in s.signals())
    assert s.alive()


def test_on_term_ignore_needs_sigkill(started) -> None:
    s = started(("python", "t.py"), on_term="ignore")
    os.kill(s.pid, signal.SIGTERM)
    wait_until(lambda: "signal SIGTERM" in s.signals())
    assert s.alive()
    os.kill(s.pid, signal.SIGKILL)
    wait_until(lambda: not s.alive())
    assert s.process.returncode == -signal.SIGKILL


def test_ack_never_and_delayed(started) -> None:
    env = {"GPUWARDEN_CHECKPOINT_SIGNAL": "SIGUSR2"}
    silent = started(("python", "a.py"), env, ack="never")
    slow = started(("python", "b.py"), env, ack="0.3")
    slow.ack_file.parent.mkdir(mode=0o700, exist_ok=True)  # as the daemon makes it
    for s in (silent, slow):
        os.kill(s.pid, signal.SIGUSR2)
    wait_until(lambda: "ack SIGUSR2" in slow.signals())
    assert slow.ack_file.exists()
    assert silent.signals() == [f"ready pid={silent.pid}", "signal SIGUSR2"]
    assert not silent.ack_file.exists()


def test_the_spool_is_the_daemons_unless_the_job_names_its_own(tmp_path: Path) -> None:
    plain = spawn("a", ("python", "a.py"), {}, tmp_path / "a", ack_spool=tmp_path / "spool")
    own = spawn("b", ("python", "b.py"), {"GPUWARDEN_ACK_DIR": "/elsewhere"}, tmp_path / "b")
    try:
        assert environ_of(plain.pid)["GPUWARDEN_ACK_DIR"] == str(tmp_path / "spool")
        assert plain.ack_file == tmp_path / "spool" / str(os.getuid()) / f"{plain.pid}.ack"
        assert environ_of(own.pid)["GPUWARDEN_ACK_DIR"] == "/elsewhere"
    finally:
        plain.stop()
        own.stop()


def test_non_checkpoint_signals_are_only_logged(started) -> None:
    s = started(("python", "t.py"), {"GPUWARDEN_CHECKPOINT_SIGNAL": "SIGUSR1"})
    os.kill(s.pid, signal.SIGUSR2)
    os.kill(s.pid, signal.SIGHUP)
    wait_until(lambda: {"signal SIGHUP", "signal SIGUSR2"} <= set(s.signals()))
    assert not any(line.startswith("ack") for line in s.signals())
    assert s.alive()


def test_a_stand_in_runs_as_the_user_it_is_told_to(job_owner: str) -> None:
    import pwd
    import shutil
    import tempfile

    # A work directory the user can reach, as a scenario's is (pytest's tmp_path is not).
    scenario = Path(tempfile.mkdtemp(prefix="gpuwarden-test-"))
    standin = spawn(
        "job",
        ("python", "train.py"),
        {"GPUWARDEN_CHECKPOINT_SIGNAL": "SIGUSR1"},
        scenario / "job",
        run_as=job_owner,
    )
    try:
        status = Path(f"/proc/{standin.pid}/status").read_text()
        uid = pwd.getpwnam(job_owner).pw_uid
        (uids,) = [line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")]
        assert uids == [str(uid)] * 4  # real, effective, saved, file system: for good
        os.kill(standin.pid, signal.SIGUSR1)
        wait_until(lambda: "ack SIGUSR1" in standin.signals())
        (ack,) = standin.ack_dir.glob("*.ack")
        assert ack.stat().st_uid == uid  # the job wrote it, as itself
    finally:
        standin.stop()
        assert "ready pid=" in standin.signals()[0]
        shutil.rmtree(scenario)


def test_run_as_an_unknown_user_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="there is no user 'no-such-user-x'"):
        spawn("job", ("python", "x.py"), {}, tmp_path / "job", run_as="no-such-user-x")
