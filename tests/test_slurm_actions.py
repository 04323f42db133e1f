"""Steps on real Slurm jobs: a single-node cluster (tests/slurm_cluster.py), real ``sbatch`` jobs
running stand-ins that log every signal, and Slurm's own view of each job afterwards."""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.actions import checkpoint, kill, requeue, resume, suspend
from gpuwarden.actions.base import Context
from gpuwarden.actions.slurm import Slurm, job_from_cgroup
from gpuwarden.clock import SystemClock
from gpuwarden.model import Outcome, Target
from gpuwarden.playbook.schema import (
    CheckpointParams,
    KillParams,
    RequeueParams,
    ResumeParams,
    SuspendParams,
)
from tests.signal_targets import Processes, intent, procs, status_of, target_for  # noqa: F401
from tests.slurm_cluster import (  # noqa: F401
    Job,
    SlurmCluster,
    fixture_slurm,
    fixture_slurm_cluster,
    wait_for,
)


def ctx(slurm: SlurmCluster | None, *, dry_run: bool = False, **changes: object) -> Context:
    control = Slurm(slurm.config(**changes)) if slurm is not None else None
    spool = slurm.spool if slurm is not None else None
    return Context(dry_run=dry_run, clock=SystemClock(), slurm=control, ack_spool=spool)


def down(slurm: SlurmCluster, tmp_path: Path, **changes: object) -> Context:
    """A context whose slurmctld does not answer: the cluster's config with a closed port
    for the controller (slurmd, on its own port, still answers ``scontrol pidinfo``)."""
    text = slurm.conf.read_text()
    port = next(line for line in text.splitlines() if line.startswith("SlurmctldPort="))
    conf = tmp_path / "down.conf"
    conf.write_text(text.replace(port, "SlurmctldPort=9"))
    control = Slurm(slurm.config(conf=conf, **changes))
    return Context(dry_run=False, clock=SystemClock(), slurm=control, ack_spool=slurm.spool)


def of(job: Job, index: int = 0, **changes: object) -> Target:
    """The target the planner makes for a job's stand-in (its job id from attribution)."""
    pid = job.pid(index)
    assert pid is not None
    fields: dict[str, object] = {
        "checkpoint_signal": "SIGUSR1",
        "ack_dir": str(job.ack_dir),
        "slurm_job": job.id,
    }
    fields.update(changes)
    return target_for(pid, **fields)


def states(outcome: Outcome) -> list[str]:
    return [t.state for t in outcome.targets]


def test_checkpoint_signals_the_job_through_scancel_and_waits_for_the_ack(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(tmp_path)
    step = intent("checkpoint", of(job), params=CheckpointParams(wait=20))
    outcome = checkpoint.execute(step, ctx(slurm))
    assert outcome.ok, outcome.detail
    assert states(outcome) == ["acknowledged"]
    assert f"via slurm: scancel --signal=USR1 --full {job.id}" in outcome.targets[0].detail
    assert job.signals() == ["signal SIGUSR1", "ack SIGUSR1"]
    assert slurm.state(job) == "RUNNING"  # a checkpoint leaves the job running
    # signal_to: batch reaches the batch script alone (here the stand-in: the script execs it)
    again = checkpoint.execute(step, ctx(slurm, signal_to="batch"))
    assert states(again) == ["acknowledged"]
    assert f"via slurm: scancel --signal=USR1 --batch {job.id}" in again.targets[0].detail
    assert job.signals()[2:] == ["signal SIGUSR1", "ack SIGUSR1"]


def test_a_process_srun_started_gets_the_signal_and_the_batch_script_is_spared(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(tmp_path, srun=True)  # bash, untrapped, waits for srun's step 0
    pid = job.pid()
    assert pid is not None
    assert Slurm(slurm.config()).step_of(job.id, pid) == "0"  # as its cgroup says, if any
    step = intent("checkpoint", of(job), params=CheckpointParams(wait=20))
    outcome = checkpoint.execute(step, ctx(slurm))  # signal_to: auto
    assert states(outcome) == ["acknowledged"], outcome.detail
    detail = outcome.targets[0].detail
    assert f"via slurm: scancel --signal=USR1 {job.id};" in detail  # the steps, not --full
    assert slurm.state(job) == "RUNNING"
    # --full would reach the batch script too, and bash dies of a USR1 it does not trap
    checkpoint.execute(step, ctx(slurm, signal_to="full"))
    assert slurm.wait_state(job, "FAILED", "CANCELLED", "COMPLETED") == "FAILED"


def test_one_scancel_per_job_however_many_of_its_processes_are_targets(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(tmp_path, standins=2)
    step = intent("checkpoint", of(job, 0), of(job, 1), params=CheckpointParams(wait=20))
    outcome = checkpoint.execute(step, ctx(slurm))
    assert states(outcome) == ["acknowledged", "acknowledged"]
    # --full reached both processes, each exactly once: one command for the job
    assert job.signals(0) == ["signal SIGUSR1", "ack SIGUSR1"]
    assert job.signals(1) == ["signal SIGUSR1", "ack SIGUSR1"]


def test_suspend_and_its_undo_go_through_scontrol(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.submit(tmp_path)
    pid = job.pid()
    assert pid is not None
    context = ctx(slurm)
    outcome = suspend.execute(intent("suspend", of(job), params=SuspendParams()), context)
    assert states(outcome) == ["suspended"], outcome.detail
    assert f"via slurm: scontrol suspend {job.id}" in outcome.targets[0].detail
    assert slurm.state(job) == "SUSPENDED"
    assert status_of(pid) == "stopped"
    [undo] = outcome.undo
    assert (undo.kind, undo.pid, undo.value) == ("slurm_resume", pid, int(job.id))
    restored = resume.undo(undo, context)
    assert restored.state == "restored", restored.detail
    assert slurm.state(job) == "RUNNING"
    wait_for(lambda: "signal SIGCONT" in job.signals(), 10, "the job to continue")
    assert status_of(pid) != "stopped"
    again = resume.undo(undo, context)  # already running: nothing to put back
    assert again.state == "already"


def test_resume_step_and_a_refusal_journaled_with_slurms_stderr(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(tmp_path)
    context = ctx(slurm)
    params = SuspendParams(resume_on_resolve=False)
    assert suspend.execute(intent("suspend", of(job), params=params), context).ok
    outcome = resume.execute(intent("resume", of(job), params=ResumeParams()), context)
    assert states(outcome) == ["resumed"], outcome.detail
    assert slurm.state(job) == "RUNNING"
    refused = resume.execute(intent("resume", of(job), params=ResumeParams()), context)
    assert not refused.ok
    [result] = refused.targets
    assert result.state == "slurm_failed"
    assert result.detail.startswith(f"scontrol resume {job.id}: exit 1: ")
    assert "suspend" in result.detail.lower()  # Slurm's own words: the job is not suspended


def test_kill_cancels_the_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.submit(tmp_path)
    outcome = kill.execute(intent("kill", of(job), params=KillParams(grace=20)), ctx(slurm))
    assert states(outcome) == ["terminated"], outcome.detail
    assert f"via slurm: scancel {job.id}" in outcome.targets[0].detail
    # slurmd sends SIGCONT, then SIGTERM: the job logs the second a moment after scancel.
    wait_for(lambda: job.signals()[-1:] == ["exit SIGTERM"], 10, "the job to end on SIGTERM")
    assert slurm.wait_state(job, "CANCELLED") == "CANCELLED"


def test_kill_sends_sigkill_after_grace_when_the_job_ignores_sigterm(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(tmp_path, on_term="ignore")
    outcome = kill.execute(intent("kill", of(job), params=KillParams(grace=0.5)), ctx(slurm))
    assert states(outcome) == ["killed"], outcome.detail
    assert "SIGKILL after 0.5s" in outcome.targets[0].detail
    assert "signal SIGTERM" in job.signals()
    assert slurm.wait_state(job, "CANCELLED") == "CANCELLED"


def test_requeue_puts_the_job_back_in_the_queue(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.submit(tmp_path)
    outcome = requeue.execute(
        intent("requeue", of(job), params=RequeueParams(grace=20)), ctx(slurm)
    )
    assert states(outcome) == ["requeued"], outcome.detail
    assert f"via slurm: scontrol requeue {job.id}" in outcome.targets[0].detail
    assert "exit SIGTERM" in job.signals()
    assert slurm.wait_state(job, "PENDING") == "PENDING"  # through REQUEUED, COMPLETING
    assert slurm.show(job)["Restarts"] == "1"


def test_requeue_with_hold_keeps_the_job_held(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.submit(tmp_path)
    params = RequeueParams(hold=True, grace=20)
    outcome = requeue.execute(intent("requeue", of(job), params=params), ctx(slurm))
    assert states(outcome) == ["requeued"], outcome.detail
    assert f"scontrol requeuehold {job.id}" in outcome.targets[0].detail
    slurm.wait_state(job, "PENDING")
    assert slurm.show(job)["Reason"] == "job_requeued_in_held_state"


def test_the_job_is_found_and_a_dry_run_says_the_command_and_leaves_it_alone(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(tmp_path)
    pid = job.pid()
    assert pid is not None
    control = Slurm(slurm.config())
    assert control.pidinfo(pid) == job.id  # slurmd's answer, whatever tracks the processes
    assert control.step_of(job.id, pid) == "batch"
    in_cgroup = job_from_cgroup(Path(f"/proc/{pid}/cgroup").read_text(), os.geteuid())
    assert in_cgroup == (job.id if slurm.proctrack == "cgroup" else None)
    assert control.pidinfo(os.getpid()) is None  # pytest is in no job
    context = ctx(slurm, dry_run=True)
    target = of(job)
    said = [
        checkpoint.execute(intent("checkpoint", target), context),
        suspend.execute(intent("suspend", target), context),
        kill.execute(intent("kill", target), context),
        requeue.execute(intent("requeue", target, params=RequeueParams(hold=True)), context),
    ]
    details = [o.targets[0].detail for o in said]
    assert all(o.ok and o.targets[0].state == "would" for o in said)
    assert f"scancel --signal=USR1 --full {job.id}" in details[0]
    assert f"scontrol suspend {job.id}" in details[1]
    assert f"scancel {job.id}; SIGKILL after 30s if still running" in details[2]
    assert f"scontrol requeuehold {job.id}" in details[3]
    assert job.signals() == []
    assert slurm.state(job) == "RUNNING"


def test_the_job_id_is_slurms_never_the_environments(
    slurm: SlurmCluster,
    tmp_path: Path,
    procs: Processes,  # noqa: F811
) -> None:
    # A process outside Slurm that claims a job (SLURM_JOB_ID is anyone's to set) is signalled
    # as itself; the job it names is not touched.
    victim = slurm.submit(tmp_path)
    liar = procs.job()
    claimed = target_for(liar.pid, slurm_job=victim.id)
    outcome = suspend.execute(intent("suspend", claimed, params=SuspendParams()), ctx(slurm))
    assert states(outcome) == ["suspended"]
    assert "slurm" not in outcome.targets[0].detail
    assert [u.kind for u in outcome.undo] == ["resume"]
    assert slurm.state(victim) == "RUNNING"
    resume.undo(outcome.undo[0], ctx(slurm))
    # and with via: slurm it is refused outright
    refused = kill.execute(intent("kill", claimed, params=KillParams(via="slurm")), ctx(slurm))
    assert states(refused) == ["not_slurm_job"]
    assert liar.alive()
    assert slurm.state(victim) == "RUNNING"


def test_via_signal_on_a_slurm_job_sends_the_signal_itself(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(tmp_path)
    pid = job.pid()
    assert pid is not None
    params = SuspendParams(via="signal")
    outcome = suspend.execute(intent("suspend", of(job), params=params), ctx(slurm))
    assert states(outcome) == ["suspended"]
    assert status_of(pid) == "stopped"
    assert slurm.state(job) == "RUNNING"  # what the issue is about: Slurm was not told
    resume.undo(outcome.undo[0], ctx(slurm))


def test_controller_down_falls_back_to_signals_or_fails_as_configured(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(tmp_path)
    failing = down(slurm, tmp_path, fallback="fail")
    refused = suspend.execute(intent("suspend", of(job), params=SuspendParams()), failing)
    [result] = refused.targets
    assert result.state == "slurm_unreachable"
    assert f"job {job.id}: slurmctld unreachable (scontrol ping: exit 1" in result.detail
    assert job.signals() == []
    not_requeued = requeue.execute(intent("requeue", of(job)), down(slurm, tmp_path))
    assert states(not_requeued) == ["slurm_unreachable"]  # requeue has no signal to fall to

    step = intent("kill", of(job), params=KillParams(grace=20))
    outcome = kill.execute(step, down(slurm, tmp_path))  # fallback: signal (the default)
    assert states(outcome) == ["terminated"], outcome.detail
    assert "slurmctld unreachable" in outcome.targets[0].detail
    assert job.signals() == ["signal SIGTERM", "exit SIGTERM"]
    # the job's batch process ended by itself: Slurm did not cancel it
    assert slurm.wait_state(job, "COMPLETED", "FAILED") in ("COMPLETED", "FAILED")


def test_a_process_in_no_job_and_slurm_turned_off(
    slurm: SlurmCluster,
    procs: Processes,  # noqa: F811
) -> None:
    plain = procs.job()
    target = target_for(plain.pid)
    refused = requeue.execute(intent("requeue", target), ctx(slurm))
    assert states(refused) == ["not_slurm_job"]
    off = requeue.execute(intent("requeue", target), ctx(None))
    assert states(off) == ["not_slurm_job"]
    assert "turned off" in off.targets[0].detail
    # via: auto on a process in no job: a plain signal, as before Slurm support
    outcome = kill.execute(intent("kill", target, params=KillParams(grace=10)), ctx(slurm))
    assert states(outcome) == ["terminated"]
    assert "slurm" not in outcome.targets[0].detail
