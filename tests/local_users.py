"""Two of the session's real users (``tests.system_users``) in their parts: the job's owner and
an attacker (``conftest.local_users``); a child's output read line by line; a source over real
processes."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from dataclasses import dataclass

from gpuwarden.config import Priorities
from gpuwarden.model import GpuProcess, GpuState, Memory, Snapshot
from gpuwarden.sources.procs import Attributor
from tests.system_users import User


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
