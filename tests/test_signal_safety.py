"""What every signal executor shares: a stale identity, another owner or a missing permission
gets nothing; dry-run touches nothing yet reports refusals exactly; logs stay one clean line."""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from gpuwarden.actions import checkpoint, kill, renice, resume, suspend
from gpuwarden.actions.base import Context
from gpuwarden.model import Intent, Outcome, Target
from gpuwarden.playbook.schema import (
    CheckpointParams,
    KillParams,
    ReniceParams,
    ResumeParams,
    SuspendParams,
)
from tests.signal_targets import (
    IS_ROOT,
    as_nobody,
    fast,
    intent,
    job_target,
    nice_of,
    procs,
    real,
    status_of,
    target_for,
)

__all__ = ["procs"]

Execute = Callable[[Intent, Context], Outcome]
EXECUTORS: dict[str, tuple[Execute, object]] = {
    "checkpoint": (checkpoint.execute, CheckpointParams(wait=1)),
    "suspend": (suspend.execute, SuspendParams()),
    "resume": (resume.execute, ResumeParams()),
    "renice": (renice.execute, ReniceParams()),
    "kill": (kill.execute, KillParams(grace=1, settle=0)),
}
KINDS = list(EXECUTORS)


def run(kind: str, ctx: Context, *targets: Target, shadow: bool = False) -> Outcome:
    execute, params = EXECUTORS[kind]
    return execute(intent(kind, *targets, params=params, shadow=shadow), ctx)


def untouched(job) -> None:
    """The stand-in is alive, running, at its nice value, and received no signal at all."""
    assert job.alive()
    assert status_of(job.pid) != psutil.STATUS_STOPPED
    assert nice_of(job.pid) == 0
    assert psutil.Process(job.pid).ionice().ioclass != psutil.IOPRIO_CLASS_IDLE
    assert job.signals() == [f"ready pid={job.pid}"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dry_run", [False, True], ids=["real", "dry"])
def test_a_stale_identity_receives_nothing(procs, kind, dry_run) -> None:
    job = procs.job(on_term="exit")
    stale = job_target(job, create_time=psutil.Process(job.pid).create_time() - 30)
    outcome = run(kind, real(dry_run=dry_run), stale)
    assert [(t.state, t.ok) for t in outcome.targets] == [("reused", False)]
    assert not outcome.ok
    assert not outcome.recoverable
    assert outcome.undo == ()
    untouched(job)


@pytest.mark.parametrize("kind", KINDS)
def test_an_owner_change_is_refused_and_nothing_sent(procs, kind) -> None:
    job = procs.job()
    outcome = run(kind, real(), job_target(job, uid=os.getuid() + 1000))
    assert [t.state for t in outcome.targets] == ["owner_changed"]
    untouched(job)


@pytest.mark.parametrize("kind", KINDS)
def test_a_target_without_a_start_time_is_never_acted_on(procs, kind) -> None:
    job = procs.job()
    outcome = run(kind, real(), job_target(job, create_time=None))
    assert [t.state for t in outcome.targets] == ["unverifiable"]
    untouched(job)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["dry_run", "shadow"])
def test_dry_run_touches_nothing_and_says_what_it_would_do(procs, kind, how) -> None:
    jobs = [procs.job(ack="0"), procs.job(ack="0")]
    ctx = fast(dry_run=how == "dry_run")
    outcome = run(kind, ctx, *(job_target(j) for j in jobs), shadow=how == "shadow")
    assert outcome.dry_run
    assert outcome.ok
    assert [t.state for t in outcome.targets] == ["would", "would"]
    assert all(t.detail for t in outcome.targets)
    assert outcome.undo == ()
    for j in jobs:
        untouched(j)
        assert not j.ack_file.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_dry_run_reports_gone_and_reused_exactly_like_a_real_run(procs, kind) -> None:
    gone, alive = procs.sleeper(), procs.job()
    gone_target = target_for(gone.pid)
    gone.stop()
    targets = (gone_target, job_target(alive, create_time=1.0), job_target(alive))
    dry = run(kind, real(dry_run=True), *targets)
    assert dry.targets[0].state in ("gone", "reused")  # reused only if the PID was taken
    assert dry.targets[1].state == "reused"
    assert dry.targets[2].state == "would"
    assert [t.state for t in run(kind, real(), *targets[:2]).targets] == [
        t.state for t in dry.targets[:2]
    ]


def test_an_existing_ack_is_left_in_place_by_a_dry_run(procs) -> None:
    job = procs.job()
    job.ack_file.parent.mkdir(mode=0o700, exist_ok=True)
    ack = job.ack_file
    ack.write_text("{}")
    outcome = run("checkpoint", fast(dry_run=True), job_target(job))
    assert [t.state for t in outcome.targets] == ["would"]
    assert ack.exists()


@pytest.mark.skipif(not IS_ROOT, reason="needs root to own a process nobody may not touch")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dry_run", [False, True], ids=["real", "dry"])
def test_permission_denied_is_an_outcome_not_a_crash(procs, kind, dry_run) -> None:
    job = procs.job()
    target = job_target(job)

    def attempt() -> str:
        outcome = run(kind, fast(dry_run=dry_run), target)
        states = ",".join(t.state for t in outcome.targets)
        return f"{states} ok={outcome.ok} recoverable={outcome.recoverable}"

    assert as_nobody(attempt) == "denied ok=False recoverable=True"
    untouched(job)


HOSTILE = (
    "python train.py $(touch /tmp/gpuwarden-pwned) `id` ; rm -rf / \n"
    "action=kill pid=1 \x1b[31mRED\x1b[0m \r\x00 " + "A" * 10_000
)


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_command_lines_are_logged_sanitised(procs, kind, caplog) -> None:
    job = procs.job()
    target = job_target(job, command=HOSTILE, user="eve\nroot")
    with caplog.at_level(logging.INFO, logger="gpuwarden.action"):
        run(kind, fast(dry_run=True), target)
    (record,) = [r for r in caplog.records if r.name == "gpuwarden.action"]
    line = record.getMessage()
    assert line.startswith(f"action={kind} pid={job.pid} result=would ")
    assert all(ch.isprintable() for ch in line)
    assert "\x1b" not in line
    assert len(line) < 1000
    fields = shlex.split(line)  # logfmt-style: the injected "action=" stays inside a value
    assert [f for f in fields if f.startswith("action=")] == [f"action={kind}"]
    assert [f for f in fields if f.startswith("pid=")] == [f"pid={job.pid}"]
    assert 'cmd="python train.py $(touch /tmp/gpuwarden-pwned)' in line
    assert not Path("/tmp/gpuwarden-pwned").exists()


def test_a_quote_in_a_command_line_cannot_forge_log_fields(procs, caplog) -> None:
    job = procs.job()
    target = job_target(job, command='x" pid=1 result=killed "y')
    with caplog.at_level(logging.INFO, logger="gpuwarden.action"):
        run("kill", fast(dry_run=True), target)
    (record,) = [r for r in caplog.records if r.name == "gpuwarden.action"]
    fields = shlex.split(record.getMessage())
    assert [f for f in fields if f.startswith("pid=")] == [f"pid={job.pid}"]


def test_one_log_line_per_target(procs, caplog) -> None:
    jobs = [procs.job(), procs.job(), procs.job()]
    with caplog.at_level(logging.INFO, logger="gpuwarden.action"):
        kill.execute(
            intent("kill", *(target_for(j.pid) for j in jobs), params=KillParams(settle=0)),
            real(still_needed=lambda: False),
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuwarden.action"]
    assert [line.split()[:3] for line in lines] == [
        ["action=kill", f"pid={jobs[0].pid}", "result=terminated"],
        ["action=kill", f"pid={jobs[1].pid}", "result=not_needed"],
        ["action=kill", f"pid={jobs[2].pid}", "result=not_needed"],
    ]
    assert all("rule=gpu-memory-pressure" in line and "dry_run=false" in line for line in lines)
