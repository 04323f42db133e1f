"""Who a GPU process is: its owner, command, container, pod, Slurm job, unit, and priority class.

NVML tells which PIDs hold GPU memory; this module turns each PID into a ``ProcessInfo`` from
psutil and ``/proc``. It never raises for a PID: a process that is gone is ``orphaned``, a fact
that may not be read is ``None`` and named in ``access_denied``.

The environment of a process holds secrets (tokens, passwords). Only the keys gpuwarden reads
(``KEPT_ENV_KEYS``) and the keys the configured match rules name are kept; the rest is dropped
as soon as it is read.

Most of what describes a process is fixed for its life: owner, command line, cgroup, initial
environment, hence container, pod, Slurm job, unit and priority. They are read once per process
identity, the PID with the start time in ``/proc/PID/stat``, and kept while the PID is asked
about; each later call reads one file, ``/proc/PID/stat``, for what changes (status, nice, CPU
time, resident memory) and to check that the PID still belongs to the same program:

- a new start time is a new process: a reused PID never inherits the facts of the last one;
- an ``exec()`` keeps the PID and start time but changes the command name or the memory layout
  (``startcode``, ``endcode``, ``startstack``, ``arg_start``..``env_end``, which the kernel
  randomises per ``exec()``): either change means the facts are read again. Without ptrace
  access to a process (the daemon runs with CAP_SYS_PTRACE) the kernel shows those addresses as
  0, and only a change of command name is seen;
- what a process can change without ``exec()`` (its uid by ``setuid()``, its cgroup when moved,
  its title by rewriting ``argv``) is seen when the facts are read again, at the latest
  ``refresh_after`` seconds after the last reading.
"""

from __future__ import annotations

import grp
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, TypeVar

import psutil

from gpuwarden.config import Priorities
from gpuwarden.model import ProcessInfo, bytes_to_mib
from gpuwarden.sources.cgroup_trust import DEFAULT_ROOT, CgroupTrust
from gpuwarden.sources.cgroups import CgroupFacts, parse_cgroup
from gpuwarden.sources.priority import (
    PriorityResolver,
    normalise_signal,
    rule_env_keys,
)
from gpuwarden.sources.proc_stat import ENDING, STATES, Stat, parse_stat
from gpuwarden.sources.slurm import SlurmJob, SlurmJobs

ENV_PRIORITY = "GPUWARDEN_PRIORITY"
ENV_CHECKPOINT_SIGNAL = "GPUWARDEN_CHECKPOINT_SIGNAL"
ENV_ACK_DIR = "GPUWARDEN_ACK_DIR"
ENV_SLURM_JOB = "SLURM_JOB_ID"
KEPT_ENV_KEYS = (ENV_SLURM_JOB, ENV_PRIORITY, ENV_CHECKPOINT_SIGNAL, ENV_ACK_DIR)

_SLURM_JOB_ID = re.compile(r"[0-9]+")

_T = TypeVar("_T")


# Facts that /proc/PID/stat gives on every call; a denial of one of them is not kept.
_DYNAMIC: Final = frozenset({"status", "nice", "cpu_pct", "rss_mib"})
_DELETED: Final = " (deleted)"
_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")


@dataclass(slots=True)
class _Known:
    """One process identity as last seen: the CPU time baseline, and the facts read for it
    (``facts`` is ``None`` while they are not kept, e.g. for a zombie)."""

    start: int
    cpu_ticks: int
    cpu_at: float
    program: tuple[bytes, ...] = ()
    facts: ProcessInfo | None = None
    read_at: float = 0.0


@dataclass
class _Draft:
    """A ProcessInfo being filled in, fact by fact."""

    pid: int
    name: str | None = None
    cmdline: tuple[str, ...] | None = None
    exe: str | None = None
    user: str | None = None
    uid: int | None = None
    groups: tuple[str, ...] = ()
    create_time: float | None = None
    status: str | None = None
    nice: int | None = None
    rss_mib: int | None = None
    cgroup: CgroupFacts = field(default_factory=CgroupFacts)
    cgroup_trusted: bool = False
    slurm: SlurmJob | None = None
    env: dict[str, str] | None = None
    denied: list[str] = field(default_factory=list)
    zombie: bool = False

    def read(self, fact: str, getter: Callable[[], _T]) -> _T | None:
        """One psutil call: denied -> None (and noted), zombie or gone -> None. psutil also says
        "no such process" for single files of a live process (a kernel thread's environ), so
        whether the process is gone is decided once, after all facts are read."""
        try:
            return getter()
        except psutil.ZombieProcess:
            self.zombie = True
            return None
        except psutil.NoSuchProcess:
            return None
        except psutil.AccessDenied:
            self.denied.append(fact)
            return None

    def freeze(self) -> ProcessInfo:
        if self.zombie or self.status == "zombie":
            # Whatever was read before it died, a zombie has no command line or environment.
            self.status, self.cmdline, self.env = "zombie", None, None
        env = self.env
        slurm_job = self.cgroup.slurm_job
        if slurm_job is None and env is not None:
            declared_job = env.get(ENV_SLURM_JOB, "").strip()
            slurm_job = declared_job if _SLURM_JOB_ID.fullmatch(declared_job) else None
        declared = env.get(ENV_PRIORITY, "").strip().lower() if env is not None else ""
        return ProcessInfo(
            pid=self.pid,
            name=self.name,
            cmdline=self.cmdline,
            exe=self.exe,
            user=self.user,
            uid=self.uid,
            groups=self.groups,
            create_time=self.create_time,
            status=self.status,
            nice=self.nice,
            rss_mib=self.rss_mib,
            container=self.cgroup.container,
            pod=self.cgroup.pod,
            slurm_job=slurm_job,
            systemd_unit=self.cgroup.systemd_unit,
            cgroup=self.cgroup.path,
            cgroup_trusted=self.cgroup_trusted,
            slurm_partition=self.slurm.partition if self.slurm is not None else None,
            slurm_qos=self.slurm.qos if self.slurm is not None else None,
            env=env,
            declared_priority=declared or None,
            checkpoint_signal=normalise_signal(env.get(ENV_CHECKPOINT_SIGNAL))
            if env is not None
            else None,
            access_denied=tuple(dict.fromkeys(self.denied)),
        )


class Attributor:
    """Describes PIDs (as NVML reports them) with psutil and ``/proc``; keep one per daemon.

    ``env_keys`` are environment variables to keep besides ``KEPT_ENV_KEYS`` and those the
    priority rules name (which are always kept). ``proc_root`` is where the files psutil does
    not parse are read: ``PID/stat`` (identity and the facts that change), ``PID/cgroup`` and
    ``PID/status`` (supplementary groups), ``PID/exe``; psutil itself reads
    ``psutil.PROCFS_PATH``. ``cgroup_root`` is where the cgroup file systems are mounted: a
    cgroup's directories must be owned by root there for its unit and path to count
    (``sources.cgroup_trust``). ``slurm`` asks Slurm for the partition and QOS of a job found
    in a trusted cgroup (``SlurmJobs.detect()`` where Slurm is installed).
    ``refresh_after`` (seconds of the ``now`` given to ``describe``) bounds how long the facts
    read for a process are kept before they are read again (see the module's docstring).

    The facts named in ``ProcessInfo.access_denied`` are among ``name``, ``cmdline``, ``user``,
    ``uid``, ``groups``, ``create_time``, ``status``, ``nice``, ``cpu_pct``, ``rss_mib``,
    ``exe``, ``cgroup`` and ``environ``; ``environ`` is the usual one (reading another user's
    environment needs CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH, and ``exe`` the former), and
    without it the priority, checkpoint signal and Slurm job fall back to what the cgroup and
    the rules say.
    """

    def __init__(
        self,
        priorities: Priorities,
        *,
        env_keys: Iterable[str] = (),
        proc_root: Path = Path("/proc"),
        cgroup_root: Path = DEFAULT_ROOT,
        slurm: SlurmJobs | None = None,
        refresh_after: float = 300.0,
    ) -> None:
        self._resolver = PriorityResolver(priorities)
        self._cgroups = CgroupTrust(cgroup_root)
        self._slurm = slurm
        self._keep = frozenset((*KEPT_ENV_KEYS, *env_keys, *rule_env_keys(priorities)))
        self._proc_root = proc_root
        self._proc_dir = f"{proc_root}/"
        self._refresh_after = refresh_after
        # One entry per PID asked about in the last call, dropped when it is not asked again.
        self._known: dict[int, _Known] = {}

    def describe(self, pids: Iterable[int], now: float) -> dict[int, ProcessInfo]:
        """One ``ProcessInfo`` per distinct PID, priority resolved. Never raises for a PID.

        ``now`` is the caller's time of this observation. CPU use is measured on a monotonic
        clock between consecutive calls, so the first call for a process gives
        ``cpu_pct=None``; it is a percentage of one CPU (above 100 when several are busy).
        """
        known: dict[int, _Known] = {}
        group_names: dict[int, str] = {}
        described: dict[int, ProcessInfo] = {}
        for pid in pids:
            if pid not in described:
                described[pid] = self._describe_one(pid, now, known, group_names)
        self._known = known
        return described

    def _describe_one(
        self, pid: int, now: float, known: dict[int, _Known], group_names: dict[int, str]
    ) -> ProcessInfo:
        if pid <= 0:
            return self._resolved(ProcessInfo(pid=pid, orphaned=True))
        stat = self._read_stat(pid)
        if stat is None:  # gone (psutil will say so), or a proc_root without stat files
            return self._resolved(self._read_all(pid, group_names))
        clock = time.monotonic()
        last = self._known.get(pid)
        if last is not None and last.start != stat.start:
            last = None  # the PID has a new owner: nothing of the last one carries over
        cpu_pct = _cpu_pct(last, stat, clock)
        mark = _Known(stat.start, stat.cpu_ticks, clock)
        if (
            last is not None
            and last.facts is not None
            and last.program == stat.program
            and stat.state not in ENDING
            and abs(now - last.read_at) < self._refresh_after
        ):
            mark.program, mark.facts, mark.read_at = last.program, last.facts, last.read_at
            known[pid] = mark
            return replace(
                last.facts,
                status=STATES.get(stat.state),
                nice=stat.nice,
                cpu_pct=cpu_pct,
                rss_mib=bytes_to_mib(stat.rss_pages * _PAGE_SIZE),
            )
        info = self._resolved(self._read_all(pid, group_names))
        after = self._read_stat(pid)
        if info.orphaned or after is None or after.start != stat.start:
            return info  # it changed hands while read: what was read is all that is known
        # The same process from before the reading to after it: what was read is its own.
        known[pid] = mark
        if not info.zombie and info.create_time is not None:
            mark.program, mark.read_at = stat.program, now
            mark.facts = replace(
                info, access_denied=tuple(f for f in info.access_denied if f not in _DYNAMIC)
            )
        return replace(info, cpu_pct=cpu_pct)

    def _resolved(self, info: ProcessInfo) -> ProcessInfo:
        return replace(info, priority=self._resolver.resolve(info))

    def _read_stat(self, pid: int) -> Stat | None:
        try:
            fd = os.open(f"{self._proc_dir}{pid}/stat", os.O_RDONLY)
        except OSError:
            return None
        try:
            return parse_stat(os.read(fd, 4096))
        except OSError:
            return None
        finally:
            os.close(fd)

    def _read_all(self, pid: int, group_names: dict[int, str]) -> ProcessInfo:
        """Every fact but CPU use, with psutil; the facts are priority-free."""
        draft = _Draft(pid)
        # The process may exit, or its PID be reused, while it is read. If, once read, it is no
        # longer the process it was, it is orphaned when its PID is free, and read once more
        # when the PID has a new owner (the one NVML may well mean).
        for _attempt in range(2):
            try:
                proc = psutil.Process(pid)
            except psutil.NoSuchProcess:
                return ProcessInfo(pid=pid, orphaned=True)
            except psutil.AccessDenied:
                return ProcessInfo(pid=pid, access_denied=("create_time",))
            draft = _Draft(pid)
            with proc.oneshot():
                self._read(proc, draft, group_names)
            if proc.is_running():
                return draft.freeze()
            if not psutil.pid_exists(pid):
                return ProcessInfo(pid=pid, orphaned=True)
        return draft.freeze()

    def _read(self, proc: psutil.Process, draft: _Draft, group_names: dict[int, str]) -> None:
        draft.create_time = draft.read("create_time", proc.create_time)
        draft.status = draft.read("status", proc.status)
        draft.name = draft.read("name", proc.name)
        cmdline = draft.read("cmdline", proc.cmdline)
        draft.cmdline = tuple(cmdline) if cmdline is not None else None
        uids = draft.read("uid", proc.uids)
        draft.uid = uids.real if uids is not None else None
        draft.user = draft.read("user", proc.username)
        draft.nice = draft.read("nice", proc.nice)
        memory = draft.read("rss_mib", proc.memory_info)
        draft.rss_mib = bytes_to_mib(memory.rss) if memory is not None else None
        draft.groups = self._groups(proc, draft, group_names)
        draft.exe = self._read_exe(proc.pid, draft)
        cgroup_text = self._read_proc_file(proc.pid, "cgroup", draft)
        if cgroup_text is not None:
            draft.cgroup = parse_cgroup(cgroup_text)
            draft.cgroup_trusted = self._cgroups.trusted(draft.cgroup)
            job = draft.cgroup.slurm_job
            if job is not None and draft.cgroup_trusted and self._slurm is not None:
                draft.slurm = self._slurm.lookup(job)
        environ = draft.read("environ", proc.environ)
        if environ is not None:
            draft.env = {k: v for k, v in environ.items() if k in self._keep}

    def _groups(
        self, proc: psutil.Process, draft: _Draft, group_names: dict[int, str]
    ) -> tuple[str, ...]:
        """Names of the real group and the supplementary groups (a number when unnamed)."""
        gids: list[int] = []
        found = draft.read("groups", proc.gids)
        if found is not None:
            gids.append(found.real)
        status = self._read_proc_file(proc.pid, "status", draft, fact="groups")
        for line in (status or "").splitlines():
            if line.startswith("Groups:"):
                gids.extend(int(g) for g in line.split()[1:] if g.isdigit())
                break
        return tuple(dict.fromkeys(_group_name(gid, group_names) for gid in gids))

    def _read_exe(self, pid: int, draft: _Draft) -> str | None:
        """The real path of the executable (``/proc/PID/exe``); a binary replaced since the
        process started keeps its path (the kernel appends `` (deleted)``)."""
        try:
            target = os.readlink(f"{self._proc_dir}{pid}/exe")
        except PermissionError:
            draft.denied.append("exe")
            return None
        except OSError:  # a kernel thread or a zombie has none; a gone process neither
            return None
        return target.removesuffix(_DELETED)

    def _read_proc_file(
        self, pid: int, name: str, draft: _Draft, *, fact: str | None = None
    ) -> str | None:
        """A /proc file as text; a missing file is an unknown fact (the caller's final liveness
        check decides whether the process is gone), a forbidden one is noted."""
        try:
            data = (self._proc_root / str(pid) / name).read_bytes()
        except PermissionError:
            draft.denied.append(fact or name)
            return None
        except OSError:
            return None
        return data.decode("utf-8", errors="replace")


def _cpu_pct(last: _Known | None, stat: Stat, clock: float) -> float | None:
    """CPU use since the last observation of the same process, in % of one CPU."""
    if last is None or clock <= last.cpu_at:
        return None
    used = (stat.cpu_ticks - last.cpu_ticks) / _CLOCK_TICKS
    return round(used / (clock - last.cpu_at) * 100, 1)


def _group_name(gid: int, cache: dict[int, str]) -> str:
    name = cache.get(gid)
    if name is None:
        try:
            name = grp.getgrgid(gid).gr_name
        except KeyError:
            name = str(gid)
        cache[gid] = name
    return name
