"""Pinning real processes: identity before any signal, and what each refusal looks like."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from gpuwarden.actions.kill import group_members
from gpuwarden.actions.pin import (
    Gone,
    OwnerChanged,
    PinError,
    Refused,
    Reused,
    Unverifiable,
    format_ionice,
    ionice_rank,
    parse_ionice,
    pin,
    pin_pid,
)
from tests.signal_targets import (
    IS_ROOT,
    as_nobody,
    procs,
    status_of,
    target_for,
    thread_nices,
    wait_until,
)

__all__ = ["procs"]  # the fixture, used by name


def test_a_verified_process_receives_the_signal(procs) -> None:
    job = procs.job()
    with pin(target_for(job.pid)) as pinned:
        assert pinned.alive()
        assert pinned.create_time == pytest.approx(psutil.Process(job.pid).create_time())
        pinned.send(signal.SIGUSR2)
    wait_until(lambda: "signal SIGUSR2" in job.signals())


@pytest.mark.parametrize("offset", [0.02, -0.5, 3600.0])
def test_a_different_start_time_is_a_reused_pid_and_receives_nothing(procs, offset) -> None:
    job = procs.job()
    target = target_for(job.pid)
    stale = target_for(job.pid, create_time=target.create_time + offset)
    with pytest.raises(Reused):
        pin(stale)
    assert job.signals() == [f"ready pid={job.pid}"]
    assert job.alive()


def test_a_start_time_within_the_tolerance_is_the_same_process(procs) -> None:
    child = procs.sleeper()
    started = psutil.Process(child.pid).create_time()
    with pin(target_for(child.pid, create_time=started + 0.009)) as pinned:
        assert pinned.alive()


@pytest.mark.parametrize("pid", [1, os.getpid()], ids=["init", "itself"])
def test_gpuwarden_never_pins_itself_or_init(pid) -> None:
    with pytest.raises(Refused):
        pin(target_for(pid))


def test_no_start_time_cannot_be_verified(procs) -> None:
    child = procs.sleeper()
    with pytest.raises(Unverifiable) as caught:
        pin(target_for(child.pid, create_time=None))
    assert caught.value.state == "unverifiable"


def test_another_owner_is_refused(procs) -> None:
    job = procs.job()
    with pytest.raises(OwnerChanged) as caught:
        pin(target_for(job.pid, uid=os.getuid() + 4242))
    assert caught.value.result(target_for(job.pid)).state == "owner_changed"
    assert job.signals() == [f"ready pid={job.pid}"]


def test_an_unknown_owner_is_not_checked(procs) -> None:
    child = procs.sleeper()
    with pin(target_for(child.pid, uid=None)) as pinned:
        assert pinned.alive()


def test_a_reaped_process_is_gone(procs) -> None:
    child = procs.sleeper()
    target = target_for(child.pid)
    child.process.kill()
    child.process.wait()
    with pytest.raises((Gone, Reused)) as caught:  # Reused only if the PID was taken again
        pin(target)
    assert caught.value.state in ("gone", "reused")


def test_a_zombie_is_gone(procs) -> None:
    child = procs.sleeper()
    target = target_for(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    wait_until(lambda: status_of(child.pid) == psutil.STATUS_ZOMBIE)
    with pytest.raises(Gone, match="zombie"):
        pin(target)


def test_exit_while_pinned_is_seen_and_later_signals_are_refused(procs) -> None:
    child = procs.sleeper()
    with pin(target_for(child.pid)) as pinned:
        os.kill(child.pid, signal.SIGKILL)
        child.process.wait()  # reaped: the PID is free for anyone now
        assert pinned.exited()
        assert not pinned.alive()
        assert pinned.status() is None
        with pytest.raises(Gone):
            pinned.send(signal.SIGTERM)
        with pytest.raises(Gone):
            pinned.verify()
        with pytest.raises(Gone):
            pinned.renice(19)


def test_a_stopped_process_is_alive_and_reads_stopped(procs) -> None:
    child = procs.sleeper()
    with pin(target_for(child.pid)) as pinned:
        pinned.send(signal.SIGSTOP)
        wait_until(lambda: pinned.status() == psutil.STATUS_STOPPED)
        assert pinned.alive()
        pinned.send(signal.SIGCONT)
        wait_until(lambda: pinned.status() != psutil.STATUS_STOPPED)


def test_renice_reaches_every_thread_and_never_raises_a_priority(procs) -> None:
    child = procs.child(
        """
        for _ in range(3):
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    assert len(thread_nices(child.pid)) == 4
    with pin(target_for(child.pid)) as pinned:
        assert pinned.renice(10, lower_only=True) == 4
        assert thread_nices(child.pid) == [10] * 4
        assert pinned.renice(5, lower_only=True) == 0  # would raise the priority: left alone
        assert thread_nices(child.pid) == [10] * 4
        assert pinned.renice(3, raise_only=True) == 4  # restoring
        assert thread_nices(child.pid) == [3] * 4
        assert pinned.nice() == 3


def test_ionice_round_trip(procs) -> None:
    child = procs.sleeper()
    with pin(target_for(child.pid)) as pinned:
        before = pinned.ionice()
        assert before is not None
        pinned.set_ionice("idle")
        assert pinned.ionice() == "idle"
        assert psutil.Process(child.pid).ionice().ioclass == psutil.IOPRIO_CLASS_IDLE
        pinned.set_ionice("best-effort:7")
        assert pinned.ionice() == "best-effort:7"
        pinned.set_ionice(before)
        assert pinned.ionice() == before


@pytest.mark.parametrize("text", ["idle", "none:0", "best-effort:0", "best-effort:7", "realtime:3"])
def test_ionice_text_round_trips(text) -> None:
    assert format_ionice(*parse_ionice(text)) == text


@pytest.mark.parametrize("text", ["", "fast", "best-effort:8", "best-effort:-1", "realtime:x"])
def test_ionice_text_rejects_nonsense(text) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_ionice(text)


def test_ionice_rank_orders_from_highest_to_lowest_priority() -> None:
    order = ["realtime:0", "best-effort:0", "none:0", "best-effort:7", "idle"]
    assert sorted(order, key=ionice_rank) == order


def test_group_leadership_and_members(procs) -> None:
    leader = procs.child(
        """
        import subprocess
        kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                for _ in range(2)]
        print(" ".join(str(k.pid) for k in kids), flush=True)
        time.sleep(60)
        """
    )
    same_group = procs.sleeper(new_session=False)  # in pytest's own process group
    members = group_members(leader.pid)
    assert len(members) == 3
    assert leader.pid in members
    with pin(target_for(same_group.pid)) as pinned:
        assert not pinned.is_group_leader()
    with pin(target_for(leader.pid)) as pinned:
        assert pinned.is_group_leader()
        assert pinned.uids() == (os.getuid(), os.geteuid(), os.getuid())
    for pid in members:
        with pin_pid(pid) as member:
            member.send(signal.SIGKILL)
    leader.process.wait(5)
    wait_until(lambda: group_members(leader.pid) == [])


def test_pin_pid_reads_an_unplanned_process(procs) -> None:
    child = procs.sleeper()
    with pin_pid(child.pid) as pinned:
        assert pinned.create_time == pytest.approx(psutil.Process(child.pid).create_time())
        assert pinned.alive()


def test_closing_releases_the_pidfd(procs) -> None:
    child = procs.sleeper()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pin(target_for(child.pid)):
            pass
        with pytest.raises(PinError):
            pin(target_for(child.pid, create_time=1.0))
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.skipif(not IS_ROOT, reason="needs root to own a process nobody may not signal")
def test_no_permission_is_denied_not_a_crash(procs) -> None:
    job = procs.job()
    target = target_for(job.pid)

    def attempt() -> str:
        try:
            with pin(target) as pinned:
                pinned.send(signal.SIGTERM)
        except PinError as err:
            return err.state
        return "signalled"

    assert as_nobody(attempt) == "denied"
    assert job.alive()
    assert job.signals() == [f"ready pid={job.pid}"]
