"""Slurm's own commands, for the steps that act on a Slurm job as a whole.

A SIGTERM sent to one process of a Slurm job ends that process, but slurmctld still counts the
job as running and its place in the queue is lost. Told through ``scancel`` and ``scontrol``,
Slurm itself signals, suspends, resumes, cancels or requeues the job, and its accounting says
so. This module runs those commands; ``actions.slurm_route`` decides, per target, whether a
step goes through them.

Which job a process belongs to is never taken from its environment (``SLURM_JOB_ID`` is its
owner's to write). It is read from the process's cgroup, where slurmstepd put it — cgroup v2
``/system.slice/slurmstepd.scope/job_N/...`` (``<node>_slurmstepd.scope`` where several slurmd
share a host), cgroup v1 ``/slurm/uid_U/job_N/...`` (``/slurm_<node>/...``), both made by root
at the top of the hierarchy, outside anything delegated to a user — and, where Slurm tracks
processes without cgroups, asked of slurmd with ``scontrol pidinfo PID``.

Every command is an argv list with a timeout, run with a small environment (``PATH``,
``LC_ALL=C`` and ``SLURM_CONF`` when set). A failure is a ``Ran`` with the command's exit
status and stderr, never an exception.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.config import SlurmConfig
from gpuwarden.playbook.schema import SLURM_KINDS

# The cgroup paths slurmstepd makes for a job's processes (anchored at the hierarchy's root),
# with the step the process belongs to (``batch``, ``extern``, ``0``, ``1``...) when named.
_STEP = r"(?:/step_(?P<step>[a-z0-9]+))?(?:/.*)?"
_V2_SCOPE = r"/(?:system\.slice/)?(?:[^/]+_)?slurmstepd\.scope"
_V2_JOB = re.compile(_V2_SCOPE + r"/job_(?P<job>[0-9]+)" + _STEP)
_V1_JOB = re.compile(r"/slurm(?:_[^/]+)?/uid_(?P<uid>[0-9]+)/job_(?P<job>[0-9]+)" + _STEP)
_PIDINFO = re.compile(r"Slurm JobId=(?P<job>[0-9]+)\b")
_FIELD = re.compile(r"(?:^|\s)(?P<key>[A-Za-z]+)=(?P<value>\S*)")
_DELETED = " (deleted)"
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STDERR_LIMIT = 2000
COMMANDS = ("scontrol", "scancel")


@dataclass(frozen=True, slots=True)
class JobRef:
    """A Slurm job and, when the cgroup names it, the step the process runs in."""

    job: str
    step: str | None = None


def job_in_cgroup(text: str, uid: int | None) -> JobRef | None:
    """The Slurm job (and step) in the text of a ``/proc/PID/cgroup``, or None. A v1 path names
    the job's owner too (``uid_U``): it must be ``uid`` (the process's real uid) to count."""
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        path = fields[2].strip().removesuffix(_DELETED)
        found = _V2_JOB.fullmatch(path)
        if found is None:
            found = _V1_JOB.fullmatch(path)
            if found is not None and (uid is None or int(found.group("uid")) != uid):
                found = None
        if found is not None:
            return JobRef(found.group("job"), found.group("step"))
    return None


def job_from_cgroup(text: str, uid: int | None) -> str | None:
    """The Slurm job id in the text of a ``/proc/PID/cgroup`` (``job_in_cgroup``), or None."""
    ref = job_in_cgroup(text, uid)
    return ref.job if ref is not None else None


def job_from_pidinfo(stdout: str) -> str | None:
    """The job id in ``scontrol pidinfo``'s answer (``Slurm JobId=7001 ends at ...``)."""
    found = _PIDINFO.search(stdout)
    return found.group("job") if found is not None else None


def step_in_listpids(stdout: str, job: str, pid: int) -> str | None:
    """The STEPID of ``pid`` in ``scontrol listpids JOB``'s table (``PID JOBID STEPID ...``)."""
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] == str(pid) and fields[1] == job:
            return fields[2]
    return None


def job_fields(stdout: str) -> dict[str, str]:
    """``scontrol show job -o``'s one line as a mapping (``JobState`` -> ``RUNNING``...)."""
    return {m.group("key"): m.group("value") for m in _FIELD.finditer(stdout)}


def via_for(kind: str, via: str | None, slurm_job: str | None, enabled: bool) -> str:
    """How a step of ``kind`` would reach a target planned in job ``slurm_job`` (the drill's
    answer; the executor checks the job again on the machine): ``slurm`` or ``signal``."""
    if kind not in SLURM_KINDS or slurm_job is None:
        return "signal"
    if via == "slurm" or kind == "requeue":
        return "slurm"
    return "slurm" if via in (None, "auto") and enabled else "signal"


def _printable(text: str, limit: int = STDERR_LIMIT) -> str:
    flat = " ".join(text.split())
    clean = "".join(ch if ch.isprintable() else "?" for ch in flat)
    return clean if len(clean) <= limit else clean[:limit] + "…"


@dataclass(frozen=True, slots=True)
class Ran:
    """One command and how it ended. ``returncode`` is None when it did not run to the end
    (timed out, or could not be started)."""

    argv: tuple[str, ...]
    returncode: int | None
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def command(self) -> str:
        """The command as people read it: the program's name and its arguments."""
        return " ".join((Path(self.argv[0]).name, *self.argv[1:]))

    def describe(self) -> str:
        """``scontrol requeue 7003: exit 1: Job is pending execution for job 7003``."""
        if self.ok:
            return f"{self.command}: done"
        status = "did not finish" if self.returncode is None else f"exit {self.returncode}"
        said = _printable(self.stderr) or _printable(self.stdout)
        return f"{self.command}: {status}" + (f": {said}" if said else "")


class Slurm:
    """Slurm's commands as the config says to run them. ``Slurm.from_config`` gives one, or
    None when Slurm is turned off; ``missing`` says why it cannot be used on this machine."""

    def __init__(self, config: SlurmConfig, *, environ: dict[str, str] | None = None) -> None:
        self.config = config
        env = os.environ if environ is None else environ
        self._env = {"PATH": env.get("PATH") or _DEFAULT_PATH, "LC_ALL": "C"}
        conf = str(config.conf) if config.conf is not None else env.get("SLURM_CONF")
        if conf:
            self._env["SLURM_CONF"] = conf
        search = str(config.bin_dir) if config.bin_dir is not None else self._env["PATH"]
        self.paths = {name: shutil.which(name, path=search) for name in COMMANDS}
        absent = [name for name, path in self.paths.items() if path is None]
        self.missing: str | None = None
        if absent:
            where = f"in {config.bin_dir}" if config.bin_dir is not None else "on the PATH"
            self.missing = f"Slurm's {' and '.join(absent)} not found {where}"

    @classmethod
    def from_config(cls, config: SlurmConfig) -> Slurm | None:
        return cls(config) if config.enabled else None

    @property
    def timeout(self) -> float:
        return self.config.timeout

    def run(self, name: str, *args: str) -> Ran:
        """Run ``name`` (``scontrol`` or ``scancel``) with ``args``; never raises."""
        program = self.paths.get(name)
        argv = (program or name, *args)
        if program is None:
            return Ran(argv, None, stderr=self.missing or f"{name} not found")
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.config.timeout,
                env=self._env,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return Ran(argv, None, stderr=f"no answer within {self.config.timeout:g}s")
        except OSError as err:
            return Ran(argv, None, stderr=str(err))
        return Ran(argv, done.returncode, done.stdout, done.stderr)

    # -- questions ----------------------------------------------------------------------------

    def ping(self) -> Ran:
        """``scontrol ping``: exit 0 while slurmctld answers."""
        return self.run("scontrol", "ping")

    def pidinfo(self, pid: int) -> str | None:
        """The job slurmd says ``pid`` belongs to, or None."""
        ran = self.run("scontrol", "pidinfo", str(pid))
        return job_from_pidinfo(ran.stdout) if ran.ok else None

    def step_of(self, job: str, pid: int) -> str | None:
        """The step of ``job`` that ``pid`` runs in, from ``scontrol listpids JOB`` (slurmd's
        answer; for a process whose cgroup does not name its step)."""
        ran = self.run("scontrol", "listpids", job)
        return step_in_listpids(ran.stdout, job, pid) if ran.ok else None

    def show_job(self, job: str) -> dict[str, str] | None:
        """``scontrol show job -o JOB`` as fields, None when Slurm does not answer."""
        ran = self.run("scontrol", "show", "job", "-o", job)
        return job_fields(ran.stdout) if ran.ok else None

    # -- actions ------------------------------------------------------------------------------

    def signal_argv(
        self, job: str, signal_name: str, step: str | None = None
    ) -> tuple[str, tuple[str, ...]]:
        """``scancel --signal=USR1 --full JOB``, ``--batch``, or neither (the job's steps),
        as ``signal_to`` says; ``auto``: the steps when the process runs in a numbered step
        (launched by ``srun``), else ``--full``."""
        mode = self.config.signal_to
        if mode == "auto":
            mode = "steps" if step is not None and step.isdigit() else "full"
        flags = () if mode == "steps" else (f"--{mode}",)
        return "scancel", (f"--signal={signal_name.removeprefix('SIG')}", *flags, job)

    @staticmethod
    def suspend_argv(job: str) -> tuple[str, tuple[str, ...]]:
        return "scontrol", ("suspend", job)

    @staticmethod
    def resume_argv(job: str) -> tuple[str, tuple[str, ...]]:
        return "scontrol", ("resume", job)

    @staticmethod
    def requeue_argv(job: str, *, hold: bool) -> tuple[str, tuple[str, ...]]:
        return "scontrol", ("requeuehold" if hold else "requeue", job)

    @staticmethod
    def cancel_argv(job: str) -> tuple[str, tuple[str, ...]]:
        return "scancel", (job,)
