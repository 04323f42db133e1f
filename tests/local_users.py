"""Real users of this machine for the tests that try what a hostile user would: created with
``useradd`` (the tests run as root in CI), their processes started with their uid, and all of
it removed at the end (``conftest.local_users``)."""

from __future__ import annotations

import contextlib
import os
import pwd
import queue
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpuwarden.config import Priorities
from gpuwarden.model import GpuProcess, GpuState, Memory, Snapshot
from gpuwarden.sources.procs import Attributor

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "daemon"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def popen(
        self, argv: list[str], env: dict[str, str] | None = None, **kw: object
    ) -> subprocess.Popen[str]:
        """Start ``argv`` as this user (no supplementary groups), stdout piped as text."""
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            argv,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd="/",
            **kw,
        )

    def run(self, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as this user to its end."""
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            argv,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            capture_output=True,
            text=True,
            cwd="/",
            timeout=30,
            check=False,
            **kw,
        )

    def python(
        self, code: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """``code`` (dedented) in a Python this user can run, with gpuwarden.job importable."""
        return self.popen(
            [LocalUsers.interpreter(), "-c", textwrap.dedent(code), *args],
            {"PYTHONPATH": str(PACKAGE_ROOT), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
        )


class Lines:
    """A child's output, line by line, read by a thread so that a wait can time out."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self._queue: queue.Queue[str] = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))

    def expect(self, prefix: str, timeout: float = 20.0) -> str:
        """The next line starting with ``prefix`` (lines before it are passed over)."""
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(0.0, left))
            except queue.Empty:
                raise AssertionError(f"no line starting {prefix!r}; saw {seen}") from None
            seen.append(line)
            if line.startswith(prefix):
                return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass(frozen=True)
class LocalUsers:
    victim: User  # owns the job gpuwarden acts on
    mallory: User  # another user of the machine, who tries to interfere

    @staticmethod
    def create(suffix: str) -> LocalUsers:
        made = []
        for role in ("gwvictim", "gwmallory"):
            name = f"{role}{suffix}"
            subprocess.run(
                ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "-U", name],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(name)
            made.append(User(name, entry.pw_uid, entry.pw_gid))
        return LocalUsers(made[0], made[1])

    def remove(self) -> None:
        uids = {self.victim.uid, self.mallory.uid}
        for proc in psutil.process_iter(["uids"]):
            with contextlib.suppress(psutil.Error):
                if proc.info["uids"] is not None and proc.info["uids"].real in uids:
                    proc.send_signal(signal.SIGKILL)  # started by these tests, as these users
        for user in (self.victim, self.mallory):
            subprocess.run(["userdel", user.name], check=False, capture_output=True)

    @staticmethod
    def interpreter() -> str:
        """A Python 3.11+ every user can run (the tests' own may live under /root)."""
        for candidate in (
            os.path.realpath(sys.executable),
            "/usr/bin/python3",
            "/usr/local/bin/python3",
        ):
            path = Path(candidate)
            if path.exists() and _world_reachable(path):
                return str(path)
        found = shutil.which("python3")
        if found and _world_reachable(Path(found)):
            return found
        raise RuntimeError("no Python interpreter that other users may run")


def _world_reachable(path: Path) -> bool:
    """Every directory above ``path`` can be searched, and the file run, by anyone."""
    real = Path(os.path.realpath(path))
    if not os.stat(real).st_mode & 0o001:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in real.parents)


class ProcessSource:
    """A source over real processes: one 80 GB GPU holding what the PIDs given to ``hold``
    hold, each process described from /proc by the real ``Attributor``. A process that has
    exited leaves the GPU, as it does under NVML."""

    name = "real-processes"

    def __init__(self, priorities: Priorities | None = None, total_mib: int = 81_920) -> None:
        self.total_mib = total_mib
        self.holding: dict[int, int] = {}
        self._attributor = Attributor(priorities or Priorities())

    def hold(self, pid: int, mib: int) -> None:
        self.holding[pid] = mib

    def snapshot(self, now: float) -> Snapshot:
        infos = self._attributor.describe(self.holding, now)
        procs = tuple(
            GpuProcess(pid=pid, gpu=0, gpu_memory_mib=mib, info=infos[pid])
            for pid, mib in self.holding.items()
            if not infos[pid].orphaned and not infos[pid].zombie
        )
        used = sum(p.gpu_memory_mib or 0 for p in procs)
        memory = Memory(self.total_mib, used, self.total_mib - used, 0)
        gpu = GpuState(index=0, name="NVIDIA A100-SXM4-80GB", memory=memory)
        return Snapshot("test-node", now, (gpu,), procs, source=self.name)

    def close(self) -> None:
        pass
