"""gpuwarden.job in a real training-script-like child process receiving a real signal."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuwarden import job

SCRIPT = textwrap.dedent("""
    import sys, time
    from gpuwarden import job
    sig = job.install()
    print("ready", sig.name, flush=True)
    saved = 0
    for _ in range(2000):
        time.sleep(0.005)
        if job.checkpoint_requested():
            saved += 1
            job.acknowledge(detail=f"checkpoint {saved}")
            print("saved", saved, flush=True)
            if saved == 2:
                break
""")


def run_job(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    root = Path(job.__file__).resolve().parent.parent
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        stdout=subprocess.PIPE,
        text=True,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(root),
            "GPUWARDEN_ACK_DIR": str(tmp_path),
            **env,
        },
    )


@pytest.mark.parametrize(
    ("declared", "sig"),
    [
        ({}, signal.SIGUSR1),
        ({"GPUWARDEN_CHECKPOINT_SIGNAL": "SIGUSR2"}, signal.SIGUSR2),
        ({"GPUWARDEN_CHECKPOINT_SIGNAL": "HUP"}, signal.SIGHUP),
    ],
)
def test_a_job_acknowledges_each_checkpoint(
    tmp_path: Path, declared: dict[str, str], sig: signal.Signals
) -> None:
    own = tmp_path / str(os.getuid())  # made by the daemon before it asks
    own.mkdir(mode=0o700)
    child = run_job(tmp_path, declared)
    assert child.stdout is not None
    assert child.stdout.readline().split() == ["ready", sig.name]
    ack = own / f"{child.pid}.ack"
    for n in (1, 2):
        os.kill(child.pid, sig)
        assert child.stdout.readline().split() == ["saved", str(n)]
        record = json.loads(ack.read_text())
        assert record["pid"] == child.pid
        assert record["signal"] == sig.name
        assert record["detail"] == f"checkpoint {n}"
    assert child.wait(timeout=10) == 0
    assert not list(own.glob(".*.tmp"))  # written by rename, nothing left half-done
    assert stat.S_IMODE(ack.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("text", "sig"),
    [
        ("SIGUSR1", signal.SIGUSR1),
        ("usr2", signal.SIGUSR2),
        ("15", signal.SIGTERM),
        (None, signal.SIGUSR1),
        ("", signal.SIGUSR1),
        (12, signal.SIGUSR2),
    ],
)
def test_signal_names(text: str | int | None, sig: signal.Signals) -> None:
    assert job.signal_from_name(text) is sig


def test_unknown_signal_name_is_an_error() -> None:
    with pytest.raises(KeyError):
        job.signal_from_name("SIGNOPE")


def test_without_a_request_nothing_is_pending() -> None:
    assert not job.checkpoint_requested()
    assert not job.wait_for_request(0.05)
