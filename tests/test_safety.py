"""Rate limits and the circuit breaker, counted in a real journal file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.config import Limit, Safety
from gpuwarden.journal.journal import Journal
from gpuwarden.model import Intent, Reason, Target
from gpuwarden.safety import Rails

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


def test_per_rule_limit(journal: Journal) -> None:
    r = rails(journal)
    assert r.refuse(intent(pids=(1, 2)), NOW) is None
    r.record(intent(pids=(1, 2)), NOW)
    refused = r.refuse(intent(pids=(3,)), NOW + 1)
    assert refused is not None
    assert refused.startswith("rate limit: rule r1 already did 2 destructive action(s)")
    assert r.refuse(intent(rule="r2", pids=(3,)), NOW + 1) is None  # another rule may act
    assert r.refuse(intent(pids=(3,)), NOW + 601) is None  # the window has passed


def test_overall_limit(journal: Journal) -> None:
    r = rails(journal, per_rule=5, overall=3)
    for rule in ("a", "b", "c"):
        r.record(intent(rule=rule, pids=(1,)), NOW)
    refused = r.refuse(intent(rule="d", pids=(9,)), NOW)
    assert refused is not None
    assert "limit 3" in refused


def test_only_destructive_real_steps_count(journal: Journal) -> None:
    r = rails(journal, per_rule=1, overall=1, breaker=1)
    for kind in ("notify", "checkpoint", "renice", "resume"):
        r.record(intent(kind=kind), NOW)
        assert r.refuse(intent(kind=kind), NOW) is None
    r.record(intent(shadow=True), NOW)  # shadow: nothing was done
    assert journal.breaker() is None
    assert r.refuse(intent(), NOW) is None


def test_breaker_trips_persists_and_resets(journal: Journal, tmp_path: Path) -> None:
    r = rails(journal, per_rule=10, overall=10, breaker=3)
    assert r.record(intent(pids=(1, 2)), NOW) is None
    tripped = r.record(intent(pids=(3,)), NOW + 1)
    assert tripped is not None
    assert tripped.startswith("3 destructive actions within 10m")
    reopened = Journal(tmp_path / "journal.db")
    try:
        refused = rails(reopened).refuse(intent(rule="other", pids=(7,)), NOW + 2)
        assert refused is not None
        assert refused.startswith("circuit breaker open")
        assert reopened.reset_breaker(NOW + 3)
        assert (
            rails(reopened, per_rule=10, overall=10).refuse(
                intent(rule="other", pids=(7,)), NOW + 4
            )
            is None
        )
    finally:
        reopened.close()
