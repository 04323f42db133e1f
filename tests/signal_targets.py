"""Real processes to act on, and the targets and intents that name them (shared by the pinning
and signal executor tests)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuwarden.actions.base import Context
from gpuwarden.clock import SimClock, SystemClock
from gpuwarden.model import Intent, Reason, Target
from gpuwarden.sources.spawn import Standin, spawn

NOBODY = 65534
IS_ROOT = os.geteuid() == 0


@functools.cache
def session_spool() -> Path:
    """The session's acknowledgement spool: a fresh directory of this user, mode 0755, in the
    system's temporary directory (a root-owned sticky directory, which the checks accept)."""
    path = Path(tempfile.mkdtemp(prefix="gpuwarden-spool-"))
    path.chmod(0o755)
    atexit.register(shutil.rmtree, path, True)
    return path


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def status_of(pid: int) -> str:
    return str(psutil.Process(pid).status())


def nice_of(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def thread_nices(pid: int) -> list[int]:
    return [os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


def target_for(pid: int, **changes: Any) -> Target:
    """The Target the planner would build for ``pid`` now (then ``changes`` applied)."""
    proc = psutil.Process(pid)
    fields: dict[str, Any] = {
        "pid": pid,
        "create_time": proc.create_time(),
        "gpu": 0,
        "user": proc.username(),
        "priority": "low",
        "gpu_memory_mib": 1024,
        "command": " ".join(proc.cmdline()),
        "uid": proc.uids().real,
    }
    fields.update(changes)
    return Target(**fields)


def job_target(job: Standin, **changes: Any) -> Target:
    """A stand-in job's target, with the checkpoint signal and ack directory it declared."""
    fields: dict[str, Any] = {"checkpoint_signal": "SIGUSR1", "ack_dir": str(job.ack_dir)}
    fields.update(changes)
    return target_for(job.pid, **fields)


def intent(kind: str, *targets: Target, params: object = None, shadow: bool = False) -> Intent:
    return Intent(
        id="intent-1",
        incident="gpu-memory-pressure/gpu:0/1",
        rule="gpu-memory-pressure",
        scope="gpu:0",
        step=1,
        kind=kind,
        label=kind,
        time=0.0,
        reason=Reason.STEP_DUE,
        severity="critical",
        shadow=shadow,
        targets=targets,
        params=params,
    )


def real(dry_run: bool = False, **kw: Any) -> Context:
    kw.setdefault("ack_spool", session_spool())
    return Context(dry_run=dry_run, clock=SystemClock(), **kw)


def fast(dry_run: bool = False, **kw: Any) -> Context:
    """A context on a simulated clock: waits end at once (for timeouts, not for reactions)."""
    kw.setdefault("ack_spool", session_spool())
    return Context(dry_run=dry_run, clock=SimClock(), **kw)


@dataclass
class Child:
    """A plain ``python -c`` child, ready once it has printed a line."""

    process: subprocess.Popen[str]

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(self.pid) == self.pid:
                    os.killpg(self.pid, signal.SIGKILL)
                else:
                    self.process.kill()
            self.process.wait(5)
        if self.process.stdout is not None:
            self.process.stdout.close()


@dataclass
class Processes:
    """Starts stand-ins and plain children; kills whatever is left at the end of a test."""

    workdir: Path
    standins: list[Standin] = field(default_factory=list)
    children: list[Child] = field(default_factory=list)

    def job(
        self, *, on_term: str = "exit", ack: str = "0", signal_name: str = "SIGUSR1"
    ) -> Standin:
        env = {"GPUWARDEN_CHECKPOINT_SIGNAL": signal_name, "GPUWARDEN_PRIORITY": "low"}
        name = f"job{len(self.standins)}"
        standin = spawn(
            name,
            ("python", "train.py", "--run", name),
            env,
            self.workdir / name,
            on_term=on_term,
            ack=ack,
            ack_spool=session_spool(),
        )
        self.standins.append(standin)
        return standin

    def child(self, code: str, *, new_session: bool = True) -> Child:
        """Run ``code`` (after ``import os, signal, sys, threading, time``); it must print one
        line when it is ready."""
        source = "import os, signal, sys, threading, time\n" + textwrap.dedent(code)
        process = subprocess.Popen(
            [sys.executable, "-c", source],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=new_session,
        )
        child = Child(process)
        self.children.append(child)
        assert process.stdout is not None
        assert process.stdout.readline(), "the child exited before it was ready"
        return child

    def sleeper(self, *, new_session: bool = True) -> Child:
        return self.child("print('ready', flush=True)\ntime.sleep(60)\n", new_session=new_session)

    def close(self) -> None:
        for standin in self.standins:
            standin.stop()
        for child in self.children:
            child.stop()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    processes = Processes(tmp_path)
    yield processes
    processes.close()


def as_nobody(work: Callable[[], str]) -> str:
    """Run ``work`` in a forked child that has dropped to uid/gid nobody; returns its answer."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        answer = "crash"
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            answer = work()
        except BaseException as err:  # reported to the parent, which fails the test
            answer = f"crash: {type(err).__name__}: {err}"
        finally:
            os.write(write_end, answer.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    return answer
