"""Whether a step reaches a target through Slurm or by signals, and the Slurm half of each
step kind (the commands are ``actions.slurm``).

A ``Router`` is made for one step. For each target it pins the process, finds the Slurm job it
belongs to (its cgroup, else ``scontrol pidinfo``; never its environment) and decides by the
step's ``via``:

- ``signal``: signals, as if there were no Slurm;
- ``auto``: through Slurm when the config's ``slurm`` is enabled, Slurm's commands are
  installed and the process is in a job; signals otherwise. When slurmctld does not answer
  ``scontrol ping``, the config's ``slurm.fallback`` decides: ``signal`` (signals, said in the
  result) or ``fail``;
- ``slurm``: through Slurm only; a process in no job, or Slurm unreachable, fails its target.

Slurm acts on the whole job, so a step runs each command once per job however many of its
targets the job holds; the others share that command's result. What Slurm answers is checked
on the process itself, through its pidfd: stopped after a suspend, continued after a resume,
gone after a cancel or requeue (SIGKILL through the pidfd once ``grace`` has passed).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field, replace

import psutil

from gpuwarden.actions.base import Context
from gpuwarden.actions.pin import Gone, PinError, Pinned, pin
from gpuwarden.actions.slurm import JobRef, Ran, Slurm, job_in_cgroup
from gpuwarden.model import Target, TargetResult, Undo
from gpuwarden.playbook.schema import KillParams

POLL_S = 0.05
CONFIRM_S = 10.0  # how long Slurm's suspend or resume may take to show on the process
KILL_CONFIRM_S = 5.0
_PROC = "/proc"


class SlurmFailed(PinError):
    """Slurm could not be asked, or refused; the detail has the command and its stderr."""

    state = "slurm_failed"


class NotSlurmJob(PinError):
    """The step acts only through Slurm, and the process is in no Slurm job."""

    state = "not_slurm_job"


class SlurmUnreachable(PinError):
    """slurmctld did not answer, and the step may not fall back to signals."""

    state = "slurm_unreachable"


def _result(target: Target, ok: bool, state: str, detail: str = "") -> TargetResult:
    return TargetResult(target.pid, target.create_time, ok=ok, state=state, detail=detail)


def joined(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def with_note(result: TargetResult, note: str) -> TargetResult:
    """``result`` with ``note`` (how the step reached it) put first in its detail."""
    return replace(result, detail=joined(note, result.detail)) if note else result


@dataclass(frozen=True, slots=True)
class Route:
    """How one target is reached: ``job`` is the Slurm job to act on, or None for signals
    (``note`` then says why, when Slurm was expected)."""

    job: str | None
    note: str = ""
    step: str | None = None  # the job step the process runs in, when its cgroup says


def read_job(slurm: Slurm | None, pinned: Pinned, *, ask: bool) -> JobRef | None:
    """The Slurm job (and step) of the pinned process: from its cgroup, else (``ask``) from
    slurmd (``scontrol pidinfo``, then ``scontrol listpids`` for the step)."""
    try:
        uid = psutil.Process(pinned.pid).uids().real
        with open(f"{_PROC}/{pinned.pid}/cgroup", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except (OSError, psutil.Error):
        text, uid = "", None
    pinned.verify()  # what was read is the pinned process's own
    found = job_in_cgroup(text, uid)
    if found is None and ask and slurm is not None and slurm.missing is None:
        job = slurm.pidinfo(pinned.pid)
        if job is not None:
            found = JobRef(job, slurm.step_of(job, pinned.pid))
        pinned.verify()
    return found


@dataclass
class Router:
    """Routes the targets of one step (see the module docstring)."""

    ctx: Context
    via: str
    kind: str
    _reachable: Ran | None = None
    _ran: dict[tuple[str, ...], Ran] = field(default_factory=dict)
    undone: set[str] = field(default_factory=set)  # jobs that already have their undo
    notes: dict[int, str] = field(default_factory=dict)  # pid -> why signals, not Slurm

    @property
    def slurm(self) -> Slurm | None:
        return self.ctx.slurm

    @property
    def only_slurm(self) -> bool:
        """The step has no signal to fall back to: ``via: slurm``, or a requeue."""
        return self.via == "slurm" or self.kind == "requeue"

    def considered(self) -> bool:
        """Whether any target of this step may go through Slurm (else: no Slurm lookups)."""
        return self.only_slurm or (self.via == "auto" and self.slurm is not None)

    def route(self, target: Target, pinned: Pinned) -> Route:
        """Raises NotSlurmJob or SlurmUnreachable when the target can be reached neither way."""
        if not self.considered():
            return Route(None)
        slurm = self.slurm
        needs = "requeue acts only through Slurm" if self.kind == "requeue" else "via: slurm"
        if slurm is None or slurm.missing is not None:
            if self.only_slurm:
                why = "Slurm is turned off in the config" if slurm is None else slurm.missing
                raise NotSlurmJob(target.pid, f"{needs}, but {why}")
            return Route(None)
        found = read_job(slurm, pinned, ask=self.only_slurm or target.slurm_job is not None)
        if found is None:
            if self.only_slurm:
                raise NotSlurmJob(target.pid, f"{needs}, but the process is in no Slurm job")
            return Route(None)
        job = found.job
        if self._reachable is None:
            self._reachable = slurm.ping()
        if not self._reachable.ok:
            down = f"slurmctld unreachable ({self._reachable.describe()})"
            if slurm.config.fallback == "signal" and not self.only_slurm:
                note = f"{down}: signalled instead of job {job}"
                self.notes[target.pid] = note
                return Route(None, note)
            raise SlurmUnreachable(target.pid, f"job {job}: {down}")
        return Route(job, step=found.step)

    def noted(self, target: Target, result: TargetResult) -> TargetResult:
        """A result reached by signals, with why it was not through Slurm (when it was
        expected to be: slurmctld did not answer)."""
        return with_note(result, self.notes.get(target.pid, ""))

    def once(self, command: tuple[str, tuple[str, ...]], pid: int) -> Ran:
        """Run a Slurm command once per step (the job's other targets share its answer).
        Raises SlurmFailed when it failed."""
        name, args = command
        key = (name, *args)
        ran = self._ran.get(key)
        if ran is None:
            assert self.slurm is not None
            ran = self._ran[key] = self.slurm.run(name, *args)
        if not ran.ok:
            raise SlurmFailed(pid, ran.describe())
        return ran

    def shown(self, command: tuple[str, tuple[str, ...]]) -> str:
        name, args = command
        return " ".join((name, *args))

    # -- the step kinds ------------------------------------------------------------------------

    def send_signal(self, route: Route, pinned: Pinned, name: str) -> str:
        """Deliver a checkpoint signal: to the whole job through ``scancel``, or to the pinned
        process. Returns how it went (for the result's detail)."""
        if route.job is None:
            pinned.send(signal.Signals[name])
            return route.note
        assert self.slurm is not None
        ran = self.once(self.slurm.signal_argv(route.job, name, route.step), pinned.pid)
        return f"via slurm: {ran.command}"

    def would_signal(self, route: Route, name: str) -> str:
        if route.job is None:
            return route.note
        assert self.slurm is not None
        return f"via slurm: {self.shown(self.slurm.signal_argv(route.job, name, route.step))}"

    def suspend(
        self, target: Target, *, resume_on_resolve: bool, dry: bool
    ) -> tuple[TargetResult, Undo | None] | None:
        """Suspend the target's job with ``scontrol suspend``; None: signals are the way."""
        if not self.considered():
            return None
        with pin(target) as pinned:
            route = self.route(target, pinned)
            if route.job is None:
                return None
            assert self.slurm is not None
            command = self.slurm.suspend_argv(route.job)
            if pinned.status() == psutil.STATUS_STOPPED:
                return _result(target, True, "already", "already stopped: left as it is"), None
            if dry:
                return _result(target, True, "would", f"via slurm: {self.shown(command)}"), None
            ran = self.once(command, target.pid)
            undo = None
            if resume_on_resolve and route.job not in self.undone:
                self.undone.add(route.job)
                undo = Undo(
                    kind="slurm_resume",
                    pid=target.pid,
                    create_time=pinned.create_time,
                    value=int(route.job),
                )
            status = self._wait_status(pinned, stopped=True)
        detail = f"via slurm: {ran.command}"
        if status is None:
            return _result(target, False, "gone", f"{detail}; the process exited"), undo
        if status != psutil.STATUS_STOPPED:
            late = f"{detail}; the process is {status} after {CONFIRM_S:g}s"
            return _result(target, False, "unconfirmed", late), undo
        if resume_on_resolve:
            detail += "; resumed when the incident resolves"
        return _result(target, True, "suspended", detail), undo

    def resume(self, target: Target, *, dry: bool) -> TargetResult | None:
        """Resume the target's job with ``scontrol resume``; None: signals are the way."""
        if not self.considered():
            return None
        with pin(target) as pinned:
            route = self.route(target, pinned)
            if route.job is None:
                return None
            assert self.slurm is not None
            command = self.slurm.resume_argv(route.job)
            if dry:
                return _result(target, True, "would", f"via slurm: {self.shown(command)}")
            ran = self.once(command, target.pid)
            status = self._wait_status(pinned, stopped=False)
        detail = f"via slurm: {ran.command}"
        if status is None:
            return _result(target, False, "gone", f"{detail}; the process exited")
        if status == psutil.STATUS_STOPPED:
            return _result(target, False, "unconfirmed", f"{detail}; still stopped")
        return _result(target, True, "resumed", detail)

    def end(
        self, target: Target, *, grace: float, hold: bool | None, dry: bool
    ) -> TargetResult | None:
        """Cancel the target's job (``hold`` None) or requeue it (held or not), then see the
        process go: SIGKILL through its pidfd if it is still there after ``grace``. None:
        signals are the way (a kill of a process in no job)."""
        if not self.considered():
            return None
        with pin(target) as pinned:
            route = self.route(target, pinned)
            if route.job is None:
                return None
            assert self.slurm is not None
            if hold is None:
                command, done = self.slurm.cancel_argv(route.job), "terminated"
            else:
                command, done = self.slurm.requeue_argv(route.job, hold=hold), "requeued"
            if dry:
                then = f"; SIGKILL after {grace:g}s if still running" if grace > 0 else ""
                return _result(target, True, "would", f"via slurm: {self.shown(command)}{then}")
            ran = self.once(command, target.pid)
            return self._see_it_go(target, pinned, ran, done, grace)

    def kill(
        self, target: Target, params: KillParams, sig: signal.Signals, dry: bool
    ) -> TargetResult | None:
        """A kill through Slurm: ``scancel JOB`` (Slurm sends SIGTERM, then SIGKILL after its
        KillWait; the step's own ``signal`` is not used), SIGKILL through the pidfd after
        ``grace`` (at once for ``signal: SIGKILL``). None: signals are the way."""
        grace = 0.0 if sig == signal.SIGKILL else params.grace
        return self.end(target, grace=grace, hold=None, dry=dry)

    def _see_it_go(
        self, target: Target, pinned: Pinned, ran: Ran, done: str, grace: float
    ) -> TargetResult:
        detail = f"via slurm: {ran.command}"
        ended = self._wait_gone(pinned, grace)
        if ended is None:
            return _result(target, False, "cancelled", f"{detail}; stopped waiting")
        if ended:
            return _result(target, True, done, f"{detail}; the process exited")
        try:
            pinned.send(signal.SIGKILL)
        except Gone:
            return _result(target, True, done, f"{detail}; the process exited")
        deadline = self.ctx.clock.monotonic() + KILL_CONFIRM_S
        while not pinned.exited(block_s=0.01):
            if self.ctx.clock.monotonic() >= deadline:
                still = f"{detail}; still running {KILL_CONFIRM_S:g}s after SIGKILL"
                return _result(target, False, "survived", still)
            self.ctx.clock.sleep(0.01)
        state = "killed" if done == "terminated" else done
        return _result(target, True, state, f"{detail}; SIGKILL after {grace:g}s")

    # -- waiting on the process ----------------------------------------------------------------

    def _wait_status(self, pinned: Pinned, *, stopped: bool) -> str | None:
        deadline = self.ctx.clock.monotonic() + CONFIRM_S
        while True:
            status = pinned.status()
            if status is None or (status == psutil.STATUS_STOPPED) == stopped:
                return status
            if self.ctx.clock.monotonic() >= deadline:
                return status
            self.ctx.clock.sleep(POLL_S / 5)

    def _wait_gone(self, pinned: Pinned, seconds: float) -> bool | None:
        """True once the process has exited, False at the deadline, None if cancelled."""
        deadline = self.ctx.clock.monotonic() + seconds
        while not pinned.exited(block_s=0.01):
            left = deadline - self.ctx.clock.monotonic()
            if left <= 0:
                return False
            if not self.ctx.wait(min(POLL_S, left)):
                return None if not pinned.exited() else True
        return True


def undo_resume(u: Undo, ctx: Context) -> TargetResult:
    """Put back a Slurm suspend (``Undo(kind="slurm_resume")``): ``scontrol resume`` the job
    while Slurm still has it suspended. The job is named by the id the suspend read from the
    process (Slurm does not hand a job id out again), so its processes need not be pinned: one
    that exited meanwhile must not leave the rest of the job stopped."""
    job = str(int(u.value)) if u.value is not None else ""
    pid, created = u.pid or 0, u.create_time

    def result(ok: bool, state: str, detail: str) -> TargetResult:
        return TargetResult(pid, created, ok=ok, state=state, detail=f"job {job}: {detail}")

    slurm = ctx.slurm
    if not job or slurm is None or slurm.missing is not None:
        why = "Slurm is turned off in the config" if slurm is None else slurm.missing
        return result(False, "error", f"cannot resume through Slurm: {why or 'no job id'}")
    shown = slurm.show_job(job)
    if shown is None:
        return result(False, "error", "slurmctld did not answer; tried again later")
    if shown.get("JobState") != "SUSPENDED":
        return result(True, "already", f"not suspended ({shown.get('JobState')})")
    if ctx.dry_run:
        return result(True, "would", "scontrol resume")
    name, args = Slurm.resume_argv(job)
    ran = slurm.run(name, *args)
    if not ran.ok:
        return result(False, "error", ran.describe())
    return result(True, "restored", f"via slurm: {ran.command}")
