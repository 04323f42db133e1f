"""The job side: examples/train_with_checkpoint.py run as a real process and signalled as
gpuwarden would, and ``job.on_checkpoint`` / ``job.maybe_checkpoint`` in real child processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden import job

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_with_checkpoint.py"
PACKAGE_ROOT = Path(job.__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """A minimal environment: PATH, the package, and what the test declares."""
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(PACKAGE_ROOT), **extra}


def wait_for(path: Path, timeout: float = 10.0) -> Path:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout}s")
        time.sleep(0.01)
    return path


class Example:
    """The example running as a child process, its output read line by line."""

    def __init__(self, tmp_path: Path, *args: str, **env: str) -> None:
        self.checkpoint = tmp_path / "ckpt.json"
        argv = [sys.executable, str(EXAMPLE), "--no-torch", "--checkpoint", str(tmp_path / "ckpt")]
        self.proc = subprocess.Popen(
            [*argv, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_env(**env),
        )

    def line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().rstrip("\n")

    def until(self, prefix: str) -> str:
        seen = []
        while (text := self.line()) or self.proc.poll() is None:
            seen.append(text)
            if text.startswith(prefix):
                return text
        raise AssertionError(f"no line starting {prefix!r}; output: {seen}")

    def saved(self) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(self.checkpoint.read_text())
        return record


@pytest.fixture
def example(tmp_path: Path) -> Iterator[list[Example]]:
    started: list[Example] = []
    yield started
    for ex in started:
        if ex.proc.poll() is None:
            ex.proc.kill()
        ex.proc.wait()
        if ex.proc.stdout is not None:
            ex.proc.stdout.close()


@pytest.mark.parametrize(
    ("declared", "sig"),
    [({}, signal.SIGUSR1), ({"GPUWARDEN_CHECKPOINT_SIGNAL": "SIGUSR2"}, signal.SIGUSR2)],
)
def test_the_example_checkpoints_on_request_and_acknowledges(
    tmp_path: Path, example: list[Example], declared: dict[str, str], sig: signal.Signals
) -> None:
    spool = tmp_path / "spool"
    ack_dir = user_dir(spool)
    env = {"GPUWARDEN_ACK_DIR": str(spool), **declared}
    ex = Example(tmp_path, "--steps", "1000000", "--step-time", "0.001", **env)
    example.append(ex)
    assert ex.until("ready ") == f"ready pid={ex.proc.pid} model=PlainModel"
    signalled_at = time.time()
    os.kill(ex.proc.pid, sig)
    ack = json.loads(wait_for(ack_dir / f"{ex.proc.pid}.ack").read_text())
    line = ex.until("checkpoint ")
    step = int(line.split()[1].removeprefix("step="))
    assert ack["pid"] == ex.proc.pid
    assert ack["signal"] == sig.name
    assert ack["time"] >= signalled_at
    assert ack["detail"] == f"step {step} saved to {ex.checkpoint}"
    saved = ex.saved()
    assert saved["step"] >= step  # the ack comes after the save it reports
    assert set(saved["state"]) == {"w", "b"}
    assert not list(tmp_path.glob(".*.tmp"))
    assert not list(ack_dir.glob(".*.tmp"))

    ex.proc.send_signal(signal.SIGTERM)  # a kill step's first signal: save once more, exit 0
    assert ex.proc.wait(timeout=10) == 0
    final = ex.until("stopped by SIGTERM at ")
    assert final.startswith(f"stopped by SIGTERM at step={ex.saved()['step']} ")
    assert ex.saved()["step"] > step


def test_the_example_finishes_and_resumes(tmp_path: Path, example: list[Example]) -> None:
    first = Example(tmp_path, "--steps", "150", "--step-time", "0")
    example.append(first)
    assert first.proc.wait(timeout=30) == 0
    assert first.until("done at ").startswith("done at step=150 ")
    assert first.saved()["step"] == 150

    second = Example(tmp_path, "--steps", "230", "--step-time", "0")
    example.append(second)
    assert second.line() == f"resumed from {second.checkpoint} at step 150"
    assert second.proc.wait(timeout=30) == 0
    assert second.until("done at ").startswith("done at step=230 ")
    saved = second.saved()
    assert saved["step"] == 230
    assert abs(saved["state"]["w"] - 2.0) < 0.05  # it learned y = 2x + 1
    assert abs(saved["state"]["b"] - 1.0) < 0.05


def test_without_its_directory_in_the_spool_the_example_warns_and_goes_on(
    tmp_path: Path, example: list[Example]
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()  # the daemon has not asked yet: no directory of this user in it
    ex = Example(
        tmp_path, "--steps", "1000000", "--step-time", "0.001", GPUWARDEN_ACK_DIR=str(spool)
    )
    example.append(ex)
    ex.until("ready ")
    ex.proc.send_signal(signal.SIGUSR1)
    warning = ex.until("gpuwarden: checkpoint saved but the acknowledgement could not be written")
    assert f"no acknowledgement directory {spool / str(os.getuid())}" in warning
    assert list(spool.iterdir()) == []  # the job creates nothing in the spool
    ex.until("step=")  # and trains on
    ex.proc.send_signal(signal.SIGTERM)
    assert ex.proc.wait(timeout=10) == 0


def test_the_default_spool_is_the_daemons() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from gpuwarden import job; print(job.ack_dir(), job.ack_path(7))"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=30,
        check=True,
    )
    spool, path = done.stdout.split()
    assert spool == "/run/gpuwarden/ack"
    assert path == f"/run/gpuwarden/ack/{os.getuid()}/7.ack"


# -- on_checkpoint and maybe_checkpoint, each in a child process of its own ----------------------

PRELUDE = textwrap.dedent("""
    import json, os, signal, sys
    from gpuwarden import job
    report = {}

    def request():
        os.kill(os.getpid(), signal.SIGUSR1)
        assert job.wait_for_request(5)

    def ack():
        path = job.ack_path(os.getpid())
        return json.loads(path.read_text()) if path.exists() else None
""")

CASES = {
    "saves_and_acknowledges": """
        calls = []

        @job.on_checkpoint
        def save():
            calls.append(1)
            return "epoch 3"

        report["before"] = job.maybe_checkpoint()
        request()
        report["requested"] = job.maybe_checkpoint()
        report["again"] = job.maybe_checkpoint()
        report["calls"] = len(calls)
        report["ack"] = ack()
        report["decorated"] = save.__name__
    """,
    "a_failing_save_is_not_acknowledged": """
        attempts = []

        @job.on_checkpoint
        def save():
            attempts.append(1)
            if len(attempts) == 1:
                raise OSError("disk full")

        request()
        try:
            job.maybe_checkpoint()
        except OSError as exc:
            report["raised"] = str(exc)
        report["pending"] = job.checkpoint_requested()
        report["ack_after_failure"] = ack()
        report["retried"] = job.maybe_checkpoint()
        report["ack"] = ack()
    """,
    "a_request_during_a_save_is_kept": """
        count = []

        def save():
            count.append(1)
            if len(count) == 1:
                request()  # gpuwarden asks again while we are saving

        job.on_checkpoint(save)
        request()
        report["first"] = job.maybe_checkpoint()
        report["pending"] = job.checkpoint_requested()
        report["second"] = job.maybe_checkpoint()
        report["third"] = job.maybe_checkpoint()
        report["calls"] = len(count)
    """,
    "a_function_passed_at_the_safe_point": """
        job.install()
        request()
        report["did"] = job.maybe_checkpoint(lambda: "passed in")
        report["ack"] = ack()
    """,
    "no_function_is_an_error": """
        job.install()
        request()
        try:
            job.maybe_checkpoint()
        except RuntimeError as exc:
            report["raised"] = str(exc)
        report["pending"] = job.checkpoint_requested()
    """,
    "an_unwritable_ack_dir_does_not_stop_the_job": """
        job.on_checkpoint(lambda: None)
        request()
        report["did"] = job.maybe_checkpoint()
        report["pending"] = job.checkpoint_requested()
    """,
}


def user_dir(spool: Path) -> Path:
    """This user's directory in ``spool``, made as the daemon makes it (0700)."""
    path = spool / str(os.getuid())
    path.mkdir(mode=0o700, parents=True)
    return path


def run_case(tmp_path: Path, name: str, **env: str) -> tuple[dict[str, Any], str]:
    code = PRELUDE + textwrap.dedent(CASES[name]) + "\nprint(json.dumps(report))\n"
    if "GPUWARDEN_ACK_DIR" not in env:
        env["GPUWARDEN_ACK_DIR"] = str(tmp_path / "ack")
        user_dir(tmp_path / "ack")
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=child_env(**env),
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report, done.stderr


def test_on_checkpoint_saves_once_per_request_and_acknowledges(tmp_path: Path) -> None:
    report, _ = run_case(tmp_path, "saves_and_acknowledges")
    assert report["before"] is False
    assert report["requested"] is True
    assert report["again"] is False
    assert report["calls"] == 1
    assert report["ack"]["detail"] == "epoch 3"
    assert report["ack"]["signal"] == "SIGUSR1"
    assert report["decorated"] == "save"  # the decorator gives the function back


def test_a_failing_save_is_not_acknowledged_and_is_retried(tmp_path: Path) -> None:
    report, _ = run_case(tmp_path, "a_failing_save_is_not_acknowledged")
    assert report["raised"] == "disk full"
    assert report["pending"] is True
    assert report["ack_after_failure"] is None
    assert report["retried"] is True
    assert report["ack"]["detail"] == ""


def test_a_request_during_a_save_is_kept_for_the_next_safe_point(tmp_path: Path) -> None:
    report, _ = run_case(tmp_path, "a_request_during_a_save_is_kept")
    assert report == {
        "first": True,
        "pending": True,
        "second": True,
        "third": False,
        "calls": 2,
    }


def test_a_function_can_be_passed_at_the_safe_point(tmp_path: Path) -> None:
    report, _ = run_case(tmp_path, "a_function_passed_at_the_safe_point")
    assert report["did"] is True
    assert report["ack"]["detail"] == "passed in"


def test_without_a_checkpoint_function_the_error_says_what_to_do(tmp_path: Path) -> None:
    report, _ = run_case(tmp_path, "no_function_is_an_error")
    assert report["raised"].startswith("no checkpoint function: decorate one with")
    assert report["pending"] is True


def test_an_unwritable_ack_dir_is_logged_and_the_job_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    report, stderr = run_case(
        tmp_path, "an_unwritable_ack_dir_does_not_stop_the_job", GPUWARDEN_ACK_DIR=str(blocker)
    )
    assert report == {"did": True, "pending": False}
    assert "the acknowledgement could not be written" in stderr
    assert "GPUWARDEN_ACK_DIR must name gpuwarden's spool" in stderr
