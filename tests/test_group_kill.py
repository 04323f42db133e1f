"""A process-group kill reaches only the members that pass the same checks as a target: the
target's user, not protected. Real processes: a group led by a test user's job, with a root-owned
member, a protected member and a worker; only the job and its worker die."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from gpuwarden.actions import kill
from gpuwarden.actions.kill import group_members
from gpuwarden.config import Config, Protected
from gpuwarden.dispatch import member_protection
from gpuwarden.playbook.schema import KillParams
from tests.local_users import LocalUsers
from tests.signal_targets import intent, real, target_for, wait_until

LEADER = textwrap.dedent("""
    import os, subprocess, sys, time
    uid, gid = int(sys.argv[1]), int(sys.argv[2])
    # This process leads a new session and process group. Its members:
    helper = subprocess.Popen(["sleep", "3600"])  # root's, e.g. a setuid helper
    guarded = subprocess.Popen(["sleep", "3601"], user=uid, group=gid, extra_groups=[])
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)  # from here on, the job of the test user
    worker = subprocess.Popen(["sleep", "3602"])
    print(helper.pid, guarded.pid, worker.pid, flush=True)
    time.sleep(3600)
""")


@pytest.fixture
def group(local_users: LocalUsers) -> Iterator[tuple[int, int, int, int]]:
    """(leader, root-owned helper, protected member, worker), all in the leader's group."""
    victim = local_users.victim
    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER, str(victim.uid), str(victim.gid)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert leader.stdout is not None
    helper, guarded, worker = (int(p) for p in leader.stdout.readline().split())
    try:
        yield leader.pid, helper, guarded, worker
    finally:
        for pid in (leader.pid, helper, guarded, worker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # each started by this fixture
        leader.wait(10)
        leader.stdout.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_a_group_kill_leaves_a_root_owned_and_a_protected_member_alive(
    local_users: LocalUsers, group: tuple[int, int, int, int]
) -> None:
    leader, helper, guarded, worker = group
    assert group_members(leader) == sorted(group)
    config = Config(protected=Protected(pids=(guarded,)))
    protection = member_protection(config, os.getpid())
    target = target_for(leader)
    assert target.uid == local_users.victim.uid
    params = KillParams(grace=0.5, process_group=True)
    dry = kill.execute(intent("kill", target, params=params), real(True, protection=protection))
    assert "and 1 other member(s) of its process group" in dry.targets[0].detail
    outcome = kill.execute(intent("kill", target, params=params), real(protection=protection))
    (result,) = outcome.targets
    assert result.state in ("terminated", "killed")
    wait_until(lambda: not alive(leader) and not alive(worker))
    assert alive(helper)
    assert alive(guarded)
    assert f"pid {helper} runs as uid 0, not the target's uid {local_users.victim.uid}" in (
        result.detail
    )
    assert f"pid {guarded} protected: pid {guarded} is listed in protected.pids" in result.detail
