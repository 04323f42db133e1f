"""kill against real processes: polite first, forceful after the grace, whole groups when asked,
and never one victim more than needed."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from gpuwarden.actions import kill, suspend
from gpuwarden.actions.kill import group_members
from gpuwarden.playbook.schema import KillParams
from tests.signal_targets import fast, intent, procs, real, status_of, target_for, wait_until

__all__ = ["procs"]

KID = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def group(procs, *, leader_ignores_term: bool):
    """A process-group leader with two children that ignore SIGTERM."""
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if leader_ignores_term else ""
    return procs.child(
        "import subprocess\n"
        + ignore
        + f"kids = [subprocess.Popen([sys.executable, '-c', {KID!r}], stdout=subprocess.PIPE)"
        " for _ in range(2)]\n"
        "for kid in kids:\n"
        "    kid.stdout.readline()\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )


def test_a_job_that_exits_on_sigterm_is_terminated(procs) -> None:
    job = procs.job(on_term="exit")
    outcome = kill.execute(intent("kill", target_for(job.pid), params=KillParams(grace=5)), real())
    assert outcome.ok
    assert [t.state for t in outcome.targets] == ["terminated"]
    assert job.signals()[1:] == ["signal SIGTERM", "exit SIGTERM"]
    wait_until(lambda: not job.alive())


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(procs) -> None:
    job = procs.job(on_term="ignore")
    started = time.monotonic()
    outcome = kill.execute(
        intent("kill", target_for(job.pid), params=KillParams(grace=1.5)), real()
    )
    assert time.monotonic() - started >= 1.5
    assert [t.state for t in outcome.targets] == ["killed"]
    assert job.signals()[1:] == ["signal SIGTERM"]  # SIGKILL cannot be logged: it just ends
    assert job.process.wait(5) == -9


def test_a_suspended_job_is_continued_so_that_it_can_exit_on_sigterm(procs) -> None:
    job = procs.job(on_term="exit")
    suspend.execute(intent("suspend", target_for(job.pid)), real())
    assert status_of(job.pid) == psutil.STATUS_STOPPED
    outcome = kill.execute(intent("kill", target_for(job.pid), params=KillParams(grace=5)), real())
    assert [t.state for t in outcome.targets] == ["terminated"]
    assert "continued" in outcome.targets[0].detail
    # both arrive together when it continues; the handlers run in signal-number order
    assert sorted(job.signals()[1:]) == ["exit SIGTERM", "signal SIGCONT", "signal SIGTERM"]


def test_the_steps_signal_is_sent_first(procs) -> None:
    job = procs.job(on_term="ignore")
    outcome = kill.execute(
        intent("kill", target_for(job.pid), params=KillParams(grace=1.5, signal="SIGINT")),
        real(),
    )
    assert [t.state for t in outcome.targets] == ["killed"]
    assert job.signals()[1:] == ["signal SIGINT"]


def test_sigkill_as_the_first_signal_needs_no_grace(procs) -> None:
    child = procs.sleeper()
    started = time.monotonic()
    outcome = kill.execute(
        intent("kill", target_for(child.pid), params=KillParams(grace=60, signal="KILL")), real()
    )
    assert time.monotonic() - started < 5
    assert [t.state for t in outcome.targets] == ["killed"]


def test_process_group_kill_takes_the_children(procs) -> None:
    leader = group(procs, leader_ignores_term=True)
    wait_until(lambda: len(group_members(leader.pid)) == 3)
    outcome = kill.execute(
        intent("kill", target_for(leader.pid), params=KillParams(grace=0.3, process_group=True)),
        real(),
    )
    assert [t.state for t in outcome.targets] == ["killed"]
    assert group_members(leader.pid) == []
    assert leader.process.wait(5) == -9


def test_process_group_kill_of_an_exiting_leader_still_ends_the_members(procs) -> None:
    leader = group(procs, leader_ignores_term=False)
    wait_until(lambda: len(group_members(leader.pid)) == 3)
    outcome = kill.execute(
        intent("kill", target_for(leader.pid), params=KillParams(grace=0.3, process_group=True)),
        real(),
    )
    # the leader exits on SIGTERM; its members ignore it and are killed one by one
    assert [t.state for t in outcome.targets] == ["killed"]
    assert group_members(leader.pid) == []


def test_process_group_of_a_non_leader_takes_the_process_alone(procs) -> None:
    in_our_group = procs.sleeper(new_session=False)
    neighbour = procs.sleeper(new_session=False)
    outcome = kill.execute(
        intent(
            "kill", target_for(in_our_group.pid), params=KillParams(grace=2, process_group=True)
        ),
        real(),
    )
    assert [t.state for t in outcome.targets] == ["terminated"]
    assert "not a process-group leader" in outcome.targets[0].detail
    assert neighbour.alive()  # same group as the victim (and as this test run)


def test_still_needed_false_after_the_first_victim_spares_the_rest(procs) -> None:
    first, second = procs.job(), procs.job()
    asked: list[bool] = []

    def still_needed() -> bool:
        asked.append(True)
        return False

    outcome = kill.execute(
        intent(
            "kill",
            target_for(first.pid),
            target_for(second.pid),
            params=KillParams(grace=5, settle=0.1),
        ),
        real(still_needed=still_needed),
    )
    assert [t.state for t in outcome.targets] == ["terminated", "not_needed"]
    assert outcome.ok
    assert asked == [True]
    assert second.alive()
    assert second.signals() == [f"ready pid={second.pid}"]


def test_still_needed_true_goes_on_to_the_next(procs) -> None:
    first, second = procs.job(), procs.job()
    outcome = kill.execute(
        intent(
            "kill",
            target_for(first.pid),
            target_for(second.pid),
            params=KillParams(grace=5, settle=0),
        ),
        real(still_needed=lambda: True),
    )
    assert [t.state for t in outcome.targets] == ["terminated", "terminated"]


def test_a_failing_recheck_kills_no_more(procs) -> None:
    first, second = procs.job(), procs.job()

    def broken() -> bool:
        raise RuntimeError("NVML went away")

    outcome = kill.execute(
        intent("kill", target_for(first.pid), target_for(second.pid), params=KillParams(settle=0)),
        real(still_needed=broken),
    )
    assert [t.state for t in outcome.targets] == ["terminated", "not_rechecked"]
    assert "NVML went away" in outcome.targets[1].detail
    assert second.alive()


def test_settle_waits_on_the_contexts_clock(procs) -> None:
    first, second = procs.sleeper(), procs.sleeper()
    ctx = fast(still_needed=lambda: False)
    outcome = kill.execute(
        intent(
            "kill",
            target_for(first.pid),
            target_for(second.pid),
            params=KillParams(signal="SIGKILL", settle=300),
        ),
        ctx,
    )
    assert [t.state for t in outcome.targets] == ["killed", "not_needed"]
    assert ctx.clock.monotonic() >= 300
    assert second.alive()


def test_a_gone_target_is_reported_and_the_next_is_still_killed(procs) -> None:
    gone, other = procs.sleeper(), procs.sleeper()
    gone_target = target_for(gone.pid)
    gone.stop()
    outcome = kill.execute(
        intent("kill", gone_target, target_for(other.pid), params=KillParams(settle=0)), real()
    )
    assert outcome.targets[0].state in ("gone", "reused")
    assert outcome.targets[1].state == "terminated"
    assert not outcome.ok


def test_cancel_during_the_grace_does_not_escalate(procs) -> None:
    first, second = procs.job(on_term="ignore"), procs.job()
    ctx = fast()
    ctx.cancel.set()
    outcome = kill.execute(
        intent("kill", target_for(first.pid), target_for(second.pid), params=KillParams(grace=30)),
        ctx,
    )
    assert [t.state for t in outcome.targets] == ["cancelled", "cancelled"]
    assert first.alive()
    assert second.alive()
    assert second.signals() == [f"ready pid={second.pid}"]


@pytest.mark.parametrize(
    "params", ["not params", KillParams(signal="SIGNOPE")], ids=["wrong type", "bad signal"]
)
def test_bad_parameters_are_an_outcome(procs, params) -> None:
    child = procs.sleeper()
    outcome = kill.execute(intent("kill", target_for(child.pid), params=params), real())
    assert not outcome.ok
    assert outcome.targets == ()
    assert child.alive()


def test_no_targets_is_nothing_to_do() -> None:
    outcome = kill.execute(intent("kill"), fast())
    assert outcome.ok
    assert outcome.detail == "kill: no targets"


def test_our_own_process_group_is_never_taken() -> None:
    leader = os.getpgid(0)
    if leader in (1, os.getpid()):
        pytest.skip("this test run leads its own process group")
    if not os.path.exists(f"/proc/{leader}"):
        pytest.skip("this test run's process group leader has exited (started by make, say)")
    outcome = kill.execute(
        intent("kill", target_for(leader), params=KillParams(process_group=True)),
        real(dry_run=True),  # only the plan: the leader is whoever started this test run
    )
    (result,) = outcome.targets
    assert result.state == "would"
    assert "its group is gpuwarden's own: the process alone" in result.detail
    assert "send SIGTERM to the process," in result.detail
