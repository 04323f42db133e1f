"""Rate limits and the circuit breaker, counted in a real journal file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.config import Limit, Safety
from gpuwarden.journal.journal import Journal
from gpuwarden.model import Intent, Outcome, Reason, Target, TargetResult
from gpuwarden.safety import ACTED, RATE_LIMITED, Rails

NOW = 1_767_225_600.0


def intent(
    kind: str = "kill", rule: str = "r1", pids: tuple[int, ...] = (100,), shadow: bool = False
) -> Intent:
    targets = tuple(
        Target(pid=p, create_time=1.0, gpu=0, user="u", priority="low", gpu_memory_mib=1)
        for p in pids
    )
    return Intent(
        id=f"i-{kind}-{pids}",
        incident="inc",
        rule=rule,
        scope="gpu:0",
        step=0,
        kind=kind,
        label=kind,
        time=NOW,
        reason=Reason.STEP_DUE,
        severity="critical",
        shadow=shadow,
        targets=targets,
    )


@pytest.fixture
def journal(tmp_path: Path):
    j = Journal(tmp_path / "journal.db")
    yield j
    j.close()


def rails(journal: Journal, per_rule: int = 2, overall: int = 3, breaker: int = 10) -> Rails:
    return Rails(
        Safety(
            per_rule=Limit(actions=per_rule, window=600),
            overall=Limit(actions=overall, window=600),
            breaker=Limit(actions=breaker, window=600),
        ),
        journal,
    )


def done(i: Intent, state: str = "killed") -> Outcome:
    """The outcome of a step that did ``state`` to each of its targets."""
    results = tuple(TargetResult(t.pid, t.create_time, state in ACTED, state) for t in i.targets)
    return Outcome(ok=True, targets=results)


def run(r: Rails, i: Intent, now: float, state: str = "killed") -> str | None:
    """Admit ``i`` whole, let it do ``state`` to every target, count it."""
    admitted = r.admit(i, now)
    assert admitted.refused is None
    assert admitted.dropped == ()
    return r.finish(i, done(i, state), now)


def test_per_rule_limit(journal: Journal) -> None:
    r = rails(journal)
    run(r, intent(pids=(1, 2)), NOW)
    refused = r.admit(intent(pids=(3,)), NOW + 1).refused
    assert refused is not None
    assert refused.startswith("rate limit: rule r1 already did 2 destructive action(s)")
    assert r.admit(intent(rule="r2", pids=(3,)), NOW + 1).refused is None  # another rule may
    assert r.admit(intent(pids=(3,)), NOW + 601).refused is None  # the window has passed


def test_overall_limit(journal: Journal) -> None:
    r = rails(journal, per_rule=5, overall=3)
    for rule in ("a", "b", "c"):
        run(r, intent(rule=rule, pids=(1,)), NOW)
    refused = r.admit(intent(rule="d", pids=(9,)), NOW).refused
    assert refused is not None
    assert "limit 3" in refused


def test_only_destructive_real_steps_count(journal: Journal) -> None:
    r = rails(journal, per_rule=1, overall=1, breaker=1)
    for kind in ("notify", "checkpoint", "renice", "resume"):
        run(r, intent(kind=kind), NOW)
        assert r.admit(intent(kind=kind), NOW).refused is None
    run(r, intent(shadow=True), NOW, state="would")  # shadow: nothing was done
    assert journal.breaker() is None
    assert r.admit(intent(), NOW).refused is None


def test_a_step_over_the_limit_is_trimmed_to_its_first_targets(journal: Journal) -> None:
    r = rails(journal, per_rule=5, overall=20)
    run(r, intent(rule="r1", pids=(1,)), NOW)
    big = intent(pids=(10, 11, 12, 13, 14, 15))
    admitted = r.admit(big, NOW + 1)
    assert admitted.refused is None
    assert [t.pid for t in admitted.intent.targets] == [10, 11, 12, 13]  # the planned order
    assert [t.pid for t in admitted.dropped] == [14, 15]
    assert admitted.note.startswith("rate limit: acted on the first 4 of 6 targets; rule r1")
    outcome = admitted.completed(done(admitted.intent))
    assert not outcome.ok
    assert [(t.pid, t.state) for t in outcome.targets] == [
        (10, "killed"),
        (11, "killed"),
        (12, "killed"),
        (13, "killed"),
        (14, RATE_LIMITED),
        (15, RATE_LIMITED),
    ]
    assert outcome.targets[-1].detail == admitted.note


def test_room_is_reserved_while_a_step_runs(journal: Journal) -> None:
    r = rails(journal, per_rule=5, overall=20)
    first = intent(pids=(1, 2, 3))
    assert r.admit(first, NOW).dropped == ()
    second = r.admit(intent(pids=(4, 5, 6)), NOW)  # in the same tick, before the first ends
    assert [t.pid for t in second.intent.targets] == [4, 5]
    assert r.admit(intent(pids=(7,)), NOW).refused is not None
    r.finish(first, done(first, "not_needed"), NOW)  # it acted on nobody: its room comes back
    assert r.admit(intent(pids=(8, 9, 10)), NOW).dropped == ()


def test_only_actions_carried_out_count(journal: Journal) -> None:
    r = rails(journal, per_rule=2, overall=20, breaker=2)
    plan = intent(pids=(1, 2, 3, 4, 5, 6))
    admitted = r.admit(plan, NOW)
    assert len(admitted.intent.targets) == 2
    results = (
        TargetResult(1, 1.0, True, "terminated"),
        TargetResult(2, 1.0, True, "not_needed"),
    )
    r.finish(plan, Outcome(ok=True, targets=results), NOW)
    assert journal.actions_since(NOW - 1) == 1
    assert journal.breaker() is None  # a plan of six, one action: the breaker is at two
    gone = intent(pids=(7, 8))
    r.admit(gone, NOW + 1)
    r.finish(gone, done(gone, "gone"), NOW + 1)  # exited before anything was sent
    assert journal.actions_since(NOW - 1) == 1
    assert r.admit(intent(pids=(9,)), NOW + 2).refused is None


def test_a_step_without_targets_counts_once_when_it_succeeded(journal: Journal) -> None:
    r = rails(journal, per_rule=5, overall=20)
    hook = intent(kind="exec", pids=())
    r.admit(hook, NOW)
    r.finish(hook, Outcome(ok=False, detail="cannot run"), NOW)
    r.admit(hook, NOW)
    r.finish(hook, Outcome(ok=True), NOW)
    assert journal.actions_since(NOW - 1) == 1


def test_an_interrupted_step_counts_every_target(journal: Journal) -> None:
    r = rails(journal)
    r.interrupted("r1", "kill", intent(pids=(1, 2)).targets, NOW)
    r.interrupted("r1", "notify", (), NOW)
    assert journal.actions_since(NOW - 1) == 2


def test_breaker_trips_persists_and_resets(journal: Journal, tmp_path: Path) -> None:
    r = rails(journal, per_rule=10, overall=10, breaker=3)
    assert run(r, intent(pids=(1, 2)), NOW) is None
    tripped = run(r, intent(pids=(3,)), NOW + 1)
    assert tripped is not None
    assert tripped.startswith("3 destructive actions within 10m")
    reopened = Journal(tmp_path / "journal.db")
    try:
        refused = rails(reopened).admit(intent(rule="other", pids=(7,)), NOW + 2).refused
        assert refused is not None
        assert refused.startswith("circuit breaker open")
        assert reopened.reset_breaker(NOW + 3)
        again = rails(reopened, per_rule=10, overall=10).admit(
            intent(rule="other", pids=(7,)), NOW + 4
        )
        assert again.refused is None
    finally:
        reopened.close()
