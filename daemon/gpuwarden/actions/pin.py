"""Pin a process before acting on it. Every signal gpuwarden sends goes through this module.

A PID is a number the kernel hands out again once a process has exited and been reaped, so a
PID chosen by the planner a few seconds ago may now belong to someone else's shell. A target is
therefore identified by ``(pid, create_time)`` and, when known, its owner's uid. Pinning:

1. ``os.pidfd_open(pid)``: a file descriptor for exactly the process that holds the PID *now*;
2. then verify that process is the target: its start time (within ``CREATE_TIME_TOLERANCE_S``)
   and its real uid. The order matters: the target existed when it was planned and still exists
   when its start time is read after the pidfd was opened, so it held the PID the whole time and
   the pidfd refers to it;
3. probe with signal 0 through the pidfd: permission is checked without touching the process.

Signals then go through ``signal.pidfd_send_signal`` on that descriptor, which the kernel refuses
(ProcessLookupError) once the process has exited, even if its PID was reused meanwhile: no race.

Residual races, stated honestly:

- ``renice`` and ``ionice`` have no pidfd form. The identity is verified again (pidfd still open
  and not exited, start time unchanged) immediately before each ``setpriority``/``ioprio_set``
  call, and so is the thread's membership (a nice value belongs to each thread, named by its
  id); the process or thread could still exit and its id be reused by a new process in the
  microseconds between that check and the call. Only a priority would change, never a signal
  be sent, and the kernel would have to wrap its PID space within that window.
- A process group is never signalled by number (``killpg``): its members are found in
  ``/proc`` and each is pinned (``pin_pid``), checked (its group, its owner, its protection;
  see ``gpuwarden.actions.kill``) and signalled through its own pidfd. A process that joins
  the group between the listing and the signals is not signalled in that round.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from pathlib import Path
from typing import ClassVar

import psutil

from gpuwarden.model import Target, TargetResult

# psutil derives a start time from clock ticks since boot (100 per second on Linux).
CREATE_TIME_TOLERANCE_S = 0.01
_FLOAT_SLACK = 1e-6
_PROC = Path("/proc")
IONICE_LEVEL_LOWEST = 7  # best-effort levels run 0 (highest) .. 7 (lowest)


class PinError(Exception):
    """Why a process cannot be acted on; ``state`` is the word a TargetResult records."""

    state: ClassVar[str] = "error"

    def __init__(self, pid: int, detail: str) -> None:
        super().__init__(detail)
        self.pid = pid
        self.detail = detail

    def result(self, target: Target) -> TargetResult:
        return TargetResult(target.pid, target.create_time, False, self.state, self.detail)


class Gone(PinError):
    """No such process any more (exited, possibly waiting to be reaped)."""

    state = "gone"


class Reused(PinError):
    """The PID now belongs to a process started at another time."""

    state = "reused"


class OwnerChanged(PinError):
    """The process is the planned one but now runs as another user."""

    state = "owner_changed"


class Denied(PinError):
    """No permission to read or signal the process."""

    state = "denied"


class Refused(PinError):
    """gpuwarden itself or PID 1: never acted on, whatever a playbook says."""

    state = "refused"


class Unverifiable(PinError):
    """The target carries no start time, so its identity cannot be checked: never acted on."""

    state = "unverifiable"


def _same_time(a: float, b: float) -> bool:
    return abs(a - b) <= CREATE_TIME_TOLERANCE_S + _FLOAT_SLACK


def format_ionice(ioclass: int, value: int | None) -> str:
    """``"idle"``, ``"best-effort:7"``, ``"none:0"``, ``"realtime:0"``."""
    if ioclass == psutil.IOPRIO_CLASS_IDLE:
        return "idle"
    names = {
        int(psutil.IOPRIO_CLASS_NONE): "none",
        int(psutil.IOPRIO_CLASS_RT): "realtime",
        int(psutil.IOPRIO_CLASS_BE): "best-effort",
    }
    return f"{names.get(int(ioclass), f'class{int(ioclass)}')}:{value or 0}"


def parse_ionice(text: str) -> tuple[int, int | None]:
    """The inverse of ``format_ionice``; ValueError for anything else."""
    name, _, level = text.partition(":")
    classes = {
        "none": psutil.IOPRIO_CLASS_NONE,
        "realtime": psutil.IOPRIO_CLASS_RT,
        "best-effort": psutil.IOPRIO_CLASS_BE,
        "idle": psutil.IOPRIO_CLASS_IDLE,
    }
    if name not in classes:
        raise ValueError(f"unknown I/O class {text!r}")
    ioclass = classes[name]
    if ioclass in (psutil.IOPRIO_CLASS_NONE, psutil.IOPRIO_CLASS_IDLE):
        return ioclass, None
    value = int(level or "0")
    if not 0 <= value <= IONICE_LEVEL_LOWEST:
        raise ValueError(f"I/O level out of range in {text!r}")
    return ioclass, value


def ionice_rank(text: str) -> int:
    """How low an I/O priority is (higher: lower priority); ``none`` is read as best-effort 4."""
    ioclass, value = parse_ionice(text)
    if ioclass == psutil.IOPRIO_CLASS_IDLE:
        return 100
    if ioclass == psutil.IOPRIO_CLASS_RT:
        return -10 + (value or 0)
    return 4 if ioclass == psutil.IOPRIO_CLASS_NONE else (value or 0)


class Pinned:
    """One verified process, held by its pidfd. Use as a context manager (it closes the fd)."""

    def __init__(self, pid: int, fd: int, proc: psutil.Process, create_time: float) -> None:
        self.pid = pid
        self.create_time = create_time
        self._fd = fd
        self._proc = proc

    def __enter__(self) -> Pinned:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- state -------------------------------------------------------------------------------

    def exited(self, block_s: float = 0.0) -> bool:
        """True once the pinned process has terminated (the pidfd turns readable). With
        ``block_s`` it waits up to that long for the exit (an event wait, not a clock read)."""
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return bool(poller.poll(max(0, round(block_s * 1000))))

    def status(self) -> str | None:
        """The psutil status (``running``, ``sleeping``, ``stopped``, ``zombie``...), ``None``
        once the process has exited. Read via /proc, trusted only if the pidfd shows the process
        still running afterwards (so the read cannot have been of a later holder of the PID)."""
        if self.exited():
            return None
        try:
            value = str(self._proc.status())
        except psutil.Error:
            return None
        return None if self.exited() else value

    def alive(self) -> bool:
        return self.status() not in (None, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)

    def verify(self) -> None:
        """Check again that the PID still holds the pinned process (before a call without a
        pidfd form). Raises Gone or Reused."""
        if self.exited():
            raise Gone(self.pid, "exited")
        try:
            now = psutil.Process(self.pid).create_time()
        except psutil.NoSuchProcess:
            raise Gone(self.pid, "exited") from None
        except psutil.AccessDenied:
            raise Denied(self.pid, "cannot read the start time") from None
        if not _same_time(now, self.create_time) or self.exited():
            raise Reused(self.pid, "the PID changed hands while it was pinned")

    # -- signals -----------------------------------------------------------------------------

    def send(self, sig: int) -> None:
        """Signal exactly the pinned process. Raises Gone or Denied."""
        try:
            signal.pidfd_send_signal(self._fd, sig)
        except ProcessLookupError:
            raise Gone(self.pid, "exited") from None
        except PermissionError:
            raise Denied(self.pid, f"not permitted to signal (as uid {os.geteuid()})") from None

    def probe(self) -> None:
        """Signal 0: checks existence and permission, delivers nothing."""
        self.send(0)

    def is_group_leader(self) -> bool:
        try:
            return os.getpgid(self.pid) == self.pid and not self.exited()
        except ProcessLookupError:
            return False

    # -- priority ----------------------------------------------------------------------------

    def threads(self) -> list[int]:
        """Thread ids of the process: on Linux a nice value belongs to each thread."""
        try:
            tids = sorted(int(name) for name in os.listdir(_PROC / str(self.pid) / "task"))
        except OSError:
            tids = []
        return tids or [self.pid]

    def _has_thread(self, tid: int) -> bool:
        """Verify the process, then that ``tid`` is still one of its threads (right before a
        call that names the thread by number)."""
        self.verify()
        return (_PROC / str(self.pid) / "task" / str(tid)).exists()

    def nice(self) -> int:
        self.verify()
        try:
            return os.getpriority(os.PRIO_PROCESS, self.pid)
        except ProcessLookupError:
            raise Gone(self.pid, "exited") from None

    def renice(self, nice: int, *, lower_only: bool = False, raise_only: bool = False) -> int:
        """Set the nice value of every thread. ``lower_only``: a thread already at least as nice
        is left as it is (a priority is never raised by accident); ``raise_only``: a thread
        already at most as nice is left (restoring never lowers). Returns threads changed."""
        changed = 0
        for tid in self.threads():
            if not self._has_thread(tid):
                continue
            try:
                current = os.getpriority(os.PRIO_PROCESS, tid)
                if (
                    current == nice
                    or (lower_only and current > nice)
                    or (raise_only and current < nice)
                ):
                    continue
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except ProcessLookupError:
                continue  # that thread ended; the process is re-verified for the next one
            except PermissionError:
                raise Denied(self.pid, f"not permitted to renice (as uid {os.geteuid()})") from None
            changed += 1
        self.verify()
        return changed

    def ionice(self) -> str | None:
        """The I/O class (``format_ionice``), ``None`` where the platform has none."""
        if not hasattr(self._proc, "ionice"):
            return None
        self.verify()
        try:
            current = self._proc.ionice()
        except psutil.NoSuchProcess:
            raise Gone(self.pid, "exited") from None
        except psutil.AccessDenied:
            raise Denied(self.pid, "cannot read the I/O priority") from None
        return format_ionice(int(current.ioclass), int(current.value))

    def set_ionice(self, value: str) -> int:
        """Set the I/O class of every thread (``parse_ionice`` forms). Returns threads changed."""
        ioclass, level = parse_ionice(value)
        changed = 0
        for tid in self.threads():
            if not self._has_thread(tid):
                continue
            try:
                psutil.Process(tid).ionice(ioclass, level)
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied:
                raise Denied(self.pid, "not permitted to change the I/O priority") from None
            changed += 1
        self.verify()
        return changed

    def uid(self) -> int:
        """The real uid. Raises Gone or Denied."""
        try:
            uid = int(self._proc.uids().real)
        except psutil.NoSuchProcess:
            raise Gone(self.pid, "exited") from None
        except psutil.AccessDenied:
            raise Denied(self.pid, "cannot read the process's owner") from None
        if self.exited():
            raise Gone(self.pid, "exited")
        return uid

    def uids(self) -> tuple[int, int, int]:
        """Real, effective and saved uid. Raises Gone or Denied."""
        try:
            found = self._proc.uids()
        except psutil.NoSuchProcess:
            raise Gone(self.pid, "exited") from None
        except psutil.AccessDenied:
            raise Denied(self.pid, "cannot read the process's owner") from None
        if self.exited():
            raise Gone(self.pid, "exited")
        return int(found.real), int(found.effective), int(found.saved)

    def own_pid(self) -> tuple[int, int | None]:
        """The PID as the process itself sees it and its PID namespace (an inode): in a
        container both differ from the host's. ``(pid, None)`` when they cannot be read."""
        inner, namespace = self.pid, None
        with contextlib.suppress(OSError, ValueError):
            status = (_PROC / str(self.pid) / "status").read_bytes().decode("ascii", "replace")
            for line in status.splitlines():
                if line.startswith("NSpid:"):
                    inner = int(line.split()[-1])
                    break
            namespace = os.stat(_PROC / str(self.pid) / "ns" / "pid").st_ino
        if self.exited():
            raise Gone(self.pid, "exited")
        return inner, namespace


def _open(pid: int) -> int:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise Gone(pid, "no such process") from None
    except PermissionError:
        raise Denied(pid, "not permitted to open a pidfd") from None


def _attach(pid: int) -> tuple[psutil.Process, float, int | None, str]:
    """Read the identity of whatever holds ``pid`` now: (process, start time, uid, status)."""
    try:
        proc = psutil.Process(pid)
        created = proc.create_time()
        status = str(proc.status())
        try:
            uid: int | None = proc.uids().real
        except psutil.AccessDenied:
            uid = None
    except psutil.NoSuchProcess:
        raise Gone(pid, "exited") from None
    except psutil.AccessDenied:
        raise Denied(pid, "cannot read the process's start time") from None
    return proc, created, uid, status


def _check_running(pid: int, status: str) -> None:
    if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
        raise Gone(pid, "exited (zombie, not yet reaped)")


def pin(target: Target) -> Pinned:
    """Pin ``target``: pidfd first, then identity, then a signal-0 permission probe.

    Raises Refused, Unverifiable, Gone, Reused, OwnerChanged or Denied (all PinError). The
    caller owns the returned Pinned and closes it (``with pin(t) as p: ...``).
    """
    if target.pid in (1, os.getpid()) or target.pid <= 0:
        raise Refused(target.pid, "gpuwarden never acts on itself or on PID 1")
    if target.create_time is None:
        raise Unverifiable(target.pid, "no start time was known for the target")
    fd = _open(target.pid)
    try:
        proc, created, uid, status = _attach(target.pid)
        if not _same_time(created, target.create_time):
            raise Reused(
                target.pid,
                f"started at {created:.2f}, the target at {target.create_time:.2f}",
            )
        _check_running(target.pid, status)
        pinned = Pinned(target.pid, fd, proc, created)
        if pinned.exited():
            raise Gone(target.pid, "exited")
        if target.uid is not None and uid is None:
            raise Denied(target.pid, "cannot read the process's owner")
        if target.uid is not None and uid != target.uid:
            raise OwnerChanged(target.pid, f"owner uid {uid}, planned for uid {target.uid}")
        pinned.probe()
    except BaseException:
        os.close(fd)
        raise
    return pinned


def pin_pid(pid: int) -> Pinned:
    """Pin a process gpuwarden did not plan (a member of a group being killed): its identity is
    read after the pidfd is opened and trusted only if the pidfd shows it alive afterwards."""
    fd = _open(pid)
    try:
        proc, created, _, status = _attach(pid)
        _check_running(pid, status)
        pinned = Pinned(pid, fd, proc, created)
        if pinned.exited():
            raise Gone(pid, "exited")
        pinned.probe()
    except BaseException:
        os.close(fd)
        raise
    return pinned
