"""What Slurm itself says about a job: its partition and QOS, never the environment's claim.

A job's environment is its owner's to write: ``SLURM_JOB_PARTITION=prod`` set by hand outside
Slurm is as good as any other string. slurmctld assigns the partition and QOS, and ``squeue``
reports them. So when Slurm is installed (``squeue`` is on the PATH) and a process sits in a
Slurm job's cgroup (owned by root, so the job id is the kernel's word), the partition and QOS
are asked of Slurm, once per job, and the priority rules compare against those.

``squeue`` is run with an argv list, a timeout and a small environment; a failure (slurmctld
down, a job that has ended) means "Slurm does not say", and after a timeout Slurm is not asked
again for ``backoff`` seconds, so a stuck slurmctld costs a tick at most ``timeout`` seconds a
``backoff``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

_FORMAT: Final = "%P|%q"  # partition|QOS
_CACHE_SIZE: Final = 4096


class _TimedOut:
    """squeue did not answer in time."""


_TIMED_OUT: Final = _TimedOut()


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """Slurm's account of one job."""

    partition: str | None
    qos: str | None


class SlurmJobs:
    """Looks jobs up with ``squeue``: ``lookup(job_id)`` is the job's ``SlurmJob`` or None.

    Answers are kept ``ttl`` seconds (a job's partition does not change while it runs); a job
    Slurm does not know is asked again after ``retry`` seconds."""

    def __init__(
        self,
        squeue: str,
        *,
        timeout: float = 2.0,
        ttl: float = 3600.0,
        retry: float = 60.0,
        backoff: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.squeue = squeue
        self._timeout = timeout
        self._ttl = ttl
        self._retry = retry
        self._backoff = backoff
        self._clock = clock
        self._known: OrderedDict[str, tuple[float, SlurmJob | None]] = OrderedDict()
        self._quiet_until = 0.0

    @classmethod
    def detect(cls) -> SlurmJobs | None:
        """A lookup when Slurm's ``squeue`` is on the PATH; None where Slurm is not there."""
        found = shutil.which("squeue")
        return cls(found) if found else None

    def lookup(self, job_id: str) -> SlurmJob | None:
        if not job_id.isdigit():
            return None
        now = self._clock()
        known = self._known.get(job_id)
        if known is not None and now < known[0]:
            return known[1]
        if now < self._quiet_until:
            return None
        job = self._ask(job_id)
        if isinstance(job, _TimedOut):  # not kept: asked again once the backoff is over
            self._quiet_until = now + self._backoff
            return None
        self._known[job_id] = (now + (self._ttl if job is not None else self._retry), job)
        self._known.move_to_end(job_id)
        while len(self._known) > _CACHE_SIZE:
            self._known.popitem(last=False)
        return job

    def _ask(self, job_id: str) -> SlurmJob | _TimedOut | None:
        argv = [self.squeue, "--noheader", f"--jobs={job_id}", f"--format={_FORMAT}"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self._timeout,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return _TIMED_OUT
        except OSError:
            return None
        if done.returncode != 0:
            return None
        lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        if len(lines) != 1 or "|" not in lines[0]:
            return None
        partition, _, qos = lines[0].partition("|")
        return SlurmJob(partition=partition or None, qos=qos or None)
