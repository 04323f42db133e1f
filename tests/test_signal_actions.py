"""checkpoint, suspend, resume and renice against real processes that log what they receive."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from gpuwarden.actions import checkpoint, renice, resume, spool, suspend
from gpuwarden.model import Undo
from gpuwarden.playbook.schema import (
    CheckpointParams,
    ReniceParams,
    ResumeParams,
    SuspendParams,
)
from tests.signal_targets import (
    IS_ROOT,
    NOBODY,
    fast,
    intent,
    job_target,
    nice_of,
    procs,
    real,
    status_of,
    target_for,
    thread_nices,
    wait_until,
)

__all__ = ["procs"]


# -- checkpoint --------------------------------------------------------------------------------


def test_checkpoint_acknowledged(procs) -> None:
    job = procs.job(ack="0")
    outcome = checkpoint.execute(
        intent("checkpoint", job_target(job), params=CheckpointParams(wait=10)), real()
    )
    assert outcome.ok
    assert [t.state for t in outcome.targets] == ["acknowledged"]
    assert "stand-in acknowledged SIGUSR1" in outcome.targets[0].detail
    assert job.signals()[1:] == ["signal SIGUSR1", "ack SIGUSR1"]
    assert job.alive()


def test_checkpoint_never_acknowledged_times_out_on_the_clock(procs) -> None:
    job = procs.job(ack="never")
    ctx = fast()
    started = time.monotonic()
    outcome = checkpoint.execute(
        intent("checkpoint", job_target(job), params=CheckpointParams(wait=600)), ctx
    )
    assert time.monotonic() - started < 5  # ten simulated minutes, not real ones
    assert ctx.clock.monotonic() == pytest.approx(600, abs=0.1)
    assert not outcome.ok
    assert [(t.state, t.detail) for t in outcome.targets] == [
        ("timed_out", "no acknowledgement within 600s")
    ]
    wait_until(lambda: "signal SIGUSR1" in job.signals())


def test_checkpoint_stops_waiting_when_the_process_exits(procs) -> None:
    child = procs.child(
        """
        signal.signal(signal.SIGUSR1, lambda *_: os._exit(3))
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    started = time.monotonic()
    outcome = checkpoint.execute(
        intent("checkpoint", target_for(child.pid), params=CheckpointParams(wait=30)), real()
    )
    assert time.monotonic() - started < 10
    assert [t.state for t in outcome.targets] == ["gone"]
    assert child.process.wait(5) == 3


def test_checkpoint_of_a_stopped_job_says_why_it_cannot_answer(procs) -> None:
    job = procs.job(ack="0")
    suspend.execute(intent("suspend", target_for(job.pid)), real())
    outcome = checkpoint.execute(
        intent("checkpoint", job_target(job), params=CheckpointParams(wait=60)), fast()
    )
    assert [t.state for t in outcome.targets] == ["timed_out"]
    assert "stopped" in outcome.targets[0].detail


def own_dir(job) -> None:
    """The job's user's directory in the spool, as the daemon makes it."""
    job.ack_file.parent.mkdir(mode=0o700, exist_ok=True)


def test_checkpoint_removes_a_stale_ack_first(procs) -> None:
    job = procs.job(ack="never")
    own_dir(job)
    stale = job.ack_file
    stale.write_text(json.dumps({"pid": job.pid, "detail": "from an earlier request"}))
    outcome = checkpoint.execute(
        intent("checkpoint", job_target(job), params=CheckpointParams(wait=60)), fast()
    )
    assert [t.state for t in outcome.targets] == ["timed_out"]
    assert not stale.exists()


@pytest.mark.skipif(not IS_ROOT, reason="needs root to give the file another owner")
def test_an_old_ack_owned_by_someone_else_is_removed_before_the_request(procs) -> None:
    job = procs.job(ack="never")
    own_dir(job)
    planted = job.ack_file
    planted.write_text(json.dumps({"pid": job.pid}))
    os.chown(planted, NOBODY, NOBODY)
    outcome = checkpoint.execute(
        intent("checkpoint", job_target(job), params=CheckpointParams(wait=60)), fast()
    )
    assert [t.state for t in outcome.targets] == ["timed_out"]
    assert not planted.exists()  # the spool is gpuwarden's: nothing in it outlives a request


def logged_at(job, line: str) -> float:
    """When the stand-in logged ``line`` (its log's own timestamp)."""
    for entry in job.log.read_text().splitlines():
        stamp, _, text = entry.partition(" ")
        if text == line:
            return float(stamp)
    raise AssertionError(f"{line!r} not logged")


def test_checkpoint_signals_every_target_before_waiting(procs) -> None:
    jobs = [procs.job(ack="0.5") for _ in range(3)]
    outcome = checkpoint.execute(
        intent("checkpoint", *(job_target(j) for j in jobs), params=CheckpointParams(wait=10)),
        real(),
    )
    assert [t.state for t in outcome.targets] == ["acknowledged"] * 3
    # every job had its request before the first one (half a second later) answered
    last_request = max(logged_at(j, "signal SIGUSR1") for j in jobs)
    first_answer = min(logged_at(j, "ack SIGUSR1") for j in jobs)
    assert last_request < first_answer


def test_checkpoint_sends_the_jobs_declared_signal(procs) -> None:
    job = procs.job(signal_name="SIGUSR2")
    target = target_for(job.pid, checkpoint_signal="SIGUSR2", ack_dir=str(job.ack_dir))
    outcome = checkpoint.execute(
        intent("checkpoint", target, params=CheckpointParams(wait=10, signal="SIGUSR1")),
        real(),
    )
    assert [t.state for t in outcome.targets] == ["acknowledged"]
    assert job.signals()[1:] == ["signal SIGUSR2", "ack SIGUSR2"]


def test_checkpoint_with_no_declared_signal_uses_the_steps(procs) -> None:
    job = procs.job(signal_name="SIGUSR2")
    target = target_for(job.pid, checkpoint_signal=None, ack_dir=str(job.ack_dir))
    outcome = checkpoint.execute(
        intent("checkpoint", target, params=CheckpointParams(wait=10, signal="USR2")), real()
    )
    assert [t.state for t in outcome.targets] == ["acknowledged"]


def test_checkpoint_with_a_bad_signal_name_sends_nothing(procs) -> None:
    job = procs.job()
    target = target_for(job.pid, checkpoint_signal="SIGBOGUS")
    outcome = checkpoint.execute(intent("checkpoint", target), fast())
    assert [t.state for t in outcome.targets] == ["invalid_signal"]
    assert job.signals() == [f"ready pid={job.pid}"]


def test_checkpoint_stops_waiting_when_cancelled(procs) -> None:
    job = procs.job(ack="never")
    ctx = fast()
    ctx.cancel.set()
    outcome = checkpoint.execute(
        intent("checkpoint", job_target(job), params=CheckpointParams(wait=600)), ctx
    )
    assert [t.state for t in outcome.targets] == ["cancelled"]
    assert ctx.clock.monotonic() == 0


def test_the_jobs_own_ack_dir_is_not_where_gpuwarden_reads(procs) -> None:
    job = procs.job(ack="never")
    target = job_target(job, ack_dir="/tmp/gpuwarden-ack")
    outcome = checkpoint.execute(
        intent("checkpoint", target, params=CheckpointParams(wait=5)), fast()
    )
    assert [t.state for t in outcome.targets] == ["timed_out"]
    assert "the job's GPUWARDEN_ACK_DIR is /tmp/gpuwarden-ack" in outcome.targets[0].detail
    assert str(job.ack_dir) in outcome.targets[0].detail


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("symlink", "is a symbolic link"),
        ("fifo", "is not a regular file"),
        ("directory", "is not a regular file"),
        ("other_pid", None),
        ("huge", "larger than 65536 bytes"),
        ("deep", "nested deeper than 8 levels"),
    ],
)
def test_an_ack_that_is_not_a_plain_answer_is_not_taken(tmp_path, kind, why) -> None:
    folder = tmp_path / str(os.getuid())
    folder.mkdir(mode=0o700)
    path = folder / "4242.ack"
    if kind == "symlink":
        (tmp_path / "real").write_text("{}")
        path.symlink_to(tmp_path / "real")
    elif kind == "fifo":
        os.mkfifo(path, 0o600)  # a reader that blocked here would hang the daemon
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        path.write_text(json.dumps({"pid": 4242, "detail": "x" * 70_000}))
    elif kind == "deep":
        path.write_text("[" * 65_000)
    else:
        path.write_text(json.dumps({"pid": 1}))
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        answer = spool.read(fd, str(folder), path.name, os.getuid(), 4242)
    finally:
        os.close(fd)
    if why is None:
        assert answer == spool.NOTHING
    else:
        assert answer.state == "rejected"
        assert why in answer.detail


# -- suspend and resume ------------------------------------------------------------------------


def test_suspend_then_resume(procs) -> None:
    job = procs.job()
    target = target_for(job.pid)
    outcome = suspend.execute(intent("suspend", target, params=SuspendParams()), real())
    assert [t.state for t in outcome.targets] == ["suspended"]
    assert status_of(job.pid) == psutil.STATUS_STOPPED
    assert outcome.undo == (Undo(kind="resume", pid=job.pid, create_time=target.create_time),)

    result = resume.undo(outcome.undo[0], real())
    assert (result.state, result.ok) == ("resumed", True)
    assert status_of(job.pid) != psutil.STATUS_STOPPED
    wait_until(lambda: "signal SIGCONT" in job.signals())


def test_resume_step(procs) -> None:
    job = procs.job()
    suspend.execute(intent("suspend", target_for(job.pid)), real())
    outcome = resume.execute(intent("resume", target_for(job.pid), params=ResumeParams()), real())
    assert [t.state for t in outcome.targets] == ["resumed"]
    assert status_of(job.pid) != psutil.STATUS_STOPPED


def test_suspend_without_resume_on_resolve_leaves_no_undo(procs) -> None:
    child = procs.sleeper()
    outcome = suspend.execute(
        intent("suspend", target_for(child.pid), params=SuspendParams(resume_on_resolve=False)),
        real(),
    )
    assert [t.state for t in outcome.targets] == ["suspended"]
    assert outcome.undo == ()


def test_a_process_stopped_by_someone_else_is_left_alone(procs) -> None:
    child = procs.sleeper()
    child.process.send_signal(19)  # SIGSTOP, as a Ctrl-Z would
    wait_until(lambda: status_of(child.pid) == psutil.STATUS_STOPPED)
    outcome = suspend.execute(intent("suspend", target_for(child.pid)), real())
    assert [t.state for t in outcome.targets] == ["already"]
    assert outcome.undo == ()  # gpuwarden will not resume what it did not stop


def test_undo_of_a_resume_never_touches_a_reused_pid(procs) -> None:
    job = procs.job()
    outcome = suspend.execute(intent("suspend", target_for(job.pid)), real())
    started = psutil.Process(job.pid).create_time()
    assert outcome.undo[0].create_time == started
    reused = Undo(kind="resume", pid=job.pid, create_time=started - 5)
    assert resume.undo(reused, real()).state == "reused"
    assert status_of(job.pid) == psutil.STATUS_STOPPED
    assert "signal SIGCONT" not in job.signals()


def test_undo_of_a_gone_process(procs) -> None:
    child = procs.sleeper()
    outcome = suspend.execute(intent("suspend", target_for(child.pid)), real())
    child.process.kill()
    child.process.wait()
    assert resume.undo(outcome.undo[0], real()).state in ("gone", "reused")


# -- renice ------------------------------------------------------------------------------------


def test_renice_and_undo(procs) -> None:
    child = procs.child(
        """
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    target = target_for(child.pid)
    before_io = psutil.Process(child.pid).ionice()
    outcome = renice.execute(intent("renice", target, params=ReniceParams(nice=15)), real())
    assert [t.state for t in outcome.targets] == ["reniced"]
    assert thread_nices(child.pid) == [15, 15]
    assert psutil.Process(child.pid).ionice().ioclass == psutil.IOPRIO_CLASS_IDLE
    (undo,) = outcome.undo
    assert (undo.kind, undo.value) == ("renice", 0)

    result = renice.undo(undo, real())
    assert (result.state, result.ok) == ("restored", True)
    assert thread_nices(child.pid) == [0, 0]
    assert psutil.Process(child.pid).ionice() == before_io


def test_renice_best_effort_io(procs) -> None:
    child = procs.sleeper()
    outcome = renice.execute(
        intent("renice", target_for(child.pid), params=ReniceParams(nice=5, ionice="best-effort")),
        real(),
    )
    assert [t.state for t in outcome.targets] == ["reniced"]
    io = psutil.Process(child.pid).ionice()
    assert (io.ioclass, io.value) == (psutil.IOPRIO_CLASS_BE, 7)


def test_renice_never_raises_a_priority(procs) -> None:
    child = procs.sleeper()
    os.setpriority(os.PRIO_PROCESS, child.pid, 18)
    outcome = renice.execute(
        intent("renice", target_for(child.pid), params=ReniceParams(nice=10, ionice="unchanged")),
        real(),
    )
    assert [t.state for t in outcome.targets] == ["already"]
    assert outcome.undo == ()
    assert nice_of(child.pid) == 18


def test_renice_without_restore_leaves_no_undo(procs) -> None:
    child = procs.sleeper()
    outcome = renice.execute(
        intent("renice", target_for(child.pid), params=ReniceParams(restore=False)), real()
    )
    assert [t.state for t in outcome.targets] == ["reniced"]
    assert nice_of(child.pid) == 19
    assert outcome.undo == ()


def test_renice_undo_never_touches_a_reused_pid(procs) -> None:
    child = procs.sleeper()
    outcome = renice.execute(intent("renice", target_for(child.pid)), real())
    (undo,) = outcome.undo
    stale = Undo(kind="renice", pid=child.pid, create_time=1.0, value=0)
    assert renice.undo(stale, real()).state == "reused"
    assert nice_of(child.pid) == 19
    assert renice.undo(undo, real()).state == "restored"
    assert nice_of(child.pid) == 0


def test_an_undo_of_the_wrong_kind_is_refused() -> None:
    assert resume.undo(Undo(kind="renice", pid=1, create_time=1.0), fast()).state == "invalid"
    assert renice.undo(Undo(kind="resume", pid=None), fast()).state == "invalid"
