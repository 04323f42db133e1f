"""The pure decisions of cloud bursting: which launches to try, what the caps allow, which
instances to reap, and how the journal and EC2's view combine."""

from __future__ import annotations

import dataclasses

import pytest

from gpuwarden.cloud import plan
from gpuwarden.cloud.instance import ENDED_STATES, GONE, LIVE_STATES, Managed
from gpuwarden.cloud.plan import Allowance, Attempt, ReapDecision
from gpuwarden.config import CloudProfile

NOW = 1_800_000_000.0
HOUR = 3600.0


def profile(**fields: object) -> CloudProfile:
    base: dict[str, object] = {
        "region": "us-east-1",
        "instance_types": ["p4d.24xlarge", "p5.48xlarge"],
        "ami": "ami-0123456789abcdef0",
        "max_instances": 4,
    }
    base.update(fields)
    return CloudProfile.model_validate(base)


def budget(max_hourly_usd: float, **fields: object) -> CloudProfile:
    prices = {"p4d.24xlarge": 32.77, "p5.48xlarge": 98.32, "g5.xlarge": 1.006}
    return profile(max_hourly_usd=max_hourly_usd, prices=prices, **fields)


def managed(
    instance_id: str = "i-1",
    *,
    profile: str = "burst",
    instance_type: str = "p4d.24xlarge",
    state: str = "running",
    launched_at: float = NOW - HOUR,
    expires_at: float = NOW + 7 * HOUR,
    incident: str | None = "inc-1",
    hourly_usd: float | None = 32.77,
    **fields: object,
) -> Managed:
    return Managed(
        instance_id=instance_id,
        profile=profile,
        region="us-east-1",
        instance_type=instance_type,
        market="on-demand",
        state=state,
        launched_at=launched_at,
        expires_at=expires_at,
        host="node7",
        incident=incident,
        hourly_usd=hourly_usd,
        **fields,  # type: ignore[arg-type]
    )


# --- attempts and prices -------------------------------------------------------------------


def test_attempts_without_subnets_use_the_default_subnet_per_type() -> None:
    assert plan.attempts(profile()) == [
        Attempt("p4d.24xlarge", None),
        Attempt("p5.48xlarge", None),
    ]


def test_attempts_go_through_subnets_for_each_type_in_order_of_preference() -> None:
    p = profile(subnets=["subnet-a1", "subnet-b2"], instance_types=["p5.48xlarge", "p4d.24xlarge"])
    assert plan.attempts(p) == [
        Attempt("p5.48xlarge", "subnet-a1"),
        Attempt("p5.48xlarge", "subnet-b2"),
        Attempt("p4d.24xlarge", "subnet-a1"),
        Attempt("p4d.24xlarge", "subnet-b2"),
    ]


def test_attempt_keys_are_distinct_and_stable() -> None:
    p = profile(subnets=["subnet-a1", "subnet-b2"])
    keys = [a.key for a in plan.attempts(p)]
    assert keys[0] == "p4d.24xlarge@subnet-a1"
    assert len(set(keys)) == len(keys)
    assert Attempt("g5.xlarge", None).key == "g5.xlarge@default"


@pytest.mark.parametrize(
    ("instance_type", "expected"),
    [("p4d.24xlarge", 32.77), ("g5.xlarge", 1.006), ("p3.2xlarge", None)],
)
def test_price(instance_type: str, expected: float | None) -> None:
    assert plan.price(budget(100), instance_type) == expected


def test_price_without_a_table() -> None:
    assert plan.price(profile(), "p4d.24xlarge") is None


# --- allowance: max_instances --------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_instances", "live", "want", "expected"),
    [
        (4, 0, 1, Allowance(1, "")),
        (4, 0, 4, Allowance(4, "")),
        (4, 3, 1, Allowance(1, "")),
        (4, 0, 5, Allowance(4, "max_instances 4 leaves room for 4: 0 live")),
        (4, 2, 3, Allowance(2, "max_instances 4 leaves room for 2: 2 live")),
        (4, 4, 1, Allowance(0, "max_instances 4 reached: 4 live")),
        (2, 3, 1, Allowance(0, "max_instances 2 reached: 3 live")),
        (1, 1, 1, Allowance(0, "max_instances 1 reached: 1 live")),
        (4, 0, 0, Allowance(0, "")),
        (4, 4, 0, Allowance(0, "")),
        (4, 0, -2, Allowance(0, "")),
    ],
    ids=[
        "room",
        "exactly-full-after",
        "last-slot",
        "want-more-than-max",
        "partial",
        "full",
        "over-full",
        "one-of-one",
        "want-nothing",
        "want-nothing-when-full",
        "negative-want",
    ],
)
def test_allowance_counts_live_instances_against_max_instances(
    max_instances: int, live: int, want: int, expected: Allowance
) -> None:
    owned = [managed(f"i-{n}", incident=f"inc-{n}") for n in range(live)]
    assert plan.allowance(profile(max_instances=max_instances), "burst", owned, want, "x") == (
        expected
    )


def test_instances_of_every_incident_count() -> None:
    owned = [
        managed("i-1", incident="inc-1"),
        managed("i-2", incident="inc-2"),
        managed("i-3", incident=None, adopted=True),
    ]
    got = plan.allowance(profile(max_instances=3), "burst", owned, 1, "p4d.24xlarge")
    assert got == Allowance(0, "max_instances 3 reached: 3 live")


@pytest.mark.parametrize("state", LIVE_STATES)
def test_every_live_state_counts(state: str) -> None:
    owned = [managed(state=state)]
    assert plan.allowance(profile(max_instances=1), "burst", owned, 1, "x").count == 0


@pytest.mark.parametrize("state", [*ENDED_STATES, GONE])
def test_ended_instances_do_not_count(state: str) -> None:
    owned = [managed(state=state)]
    assert plan.allowance(profile(max_instances=1), "burst", owned, 1, "x") == Allowance(1, "")


def test_instances_of_other_profiles_do_not_count() -> None:
    owned = [managed("i-1", profile="other"), managed("i-2", profile="other")]
    assert plan.allowance(profile(max_instances=1), "burst", owned, 1, "x") == Allowance(1, "")


def test_an_instance_known_twice_counts_once() -> None:
    owned = [managed("i-1"), managed("i-1", state="pending"), managed("i-2")]
    got = plan.allowance(profile(max_instances=3), "burst", owned, 5, "x")
    assert got == Allowance(1, "max_instances 3 leaves room for 1: 2 live")


# --- allowance: max_hourly_usd -------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_usd", "live", "want", "instance_type", "expected"),
    [
        (100.0, [], 1, "p4d.24xlarge", Allowance(1, "")),
        (100.0, [], 3, "p4d.24xlarge", Allowance(3, "")),
        (
            100.0,
            [],
            4,
            "p4d.24xlarge",
            Allowance(
                3,
                "max_hourly_usd 100.00 leaves room for 3: 0.00/h live, p4d.24xlarge costs 32.77/h",
            ),
        ),
        (
            100.0,
            [32.77, 32.77],
            2,
            "p4d.24xlarge",
            Allowance(
                1,
                "max_hourly_usd 100.00 leaves room for 1: 65.54/h live, p4d.24xlarge costs 32.77/h",
            ),
        ),
        (
            100.0,
            [32.77],
            1,
            "p5.48xlarge",
            Allowance(
                0,
                "max_hourly_usd 100.00 leaves room for 0: 32.77/h live, p5.48xlarge costs 98.32/h",
            ),
        ),
        (
            65.54,
            [32.77],
            1,
            "p4d.24xlarge",
            Allowance(1, ""),
        ),
        (
            65.53,
            [32.77],
            1,
            "p4d.24xlarge",
            Allowance(
                0,
                "max_hourly_usd 65.53 leaves room for 0: 32.77/h live, p4d.24xlarge costs 32.77/h",
            ),
        ),
        (
            50.0,
            [98.32],
            1,
            "g5.xlarge",
            Allowance(
                0, "max_hourly_usd 50.00 leaves room for 0: 98.32/h live, g5.xlarge costs 1.01/h"
            ),
        ),
        (
            0.3,
            [],
            3,
            "tiny",
            Allowance(3, ""),
        ),
    ],
    ids=[
        "room",
        "fits-exactly-three",
        "capped",
        "partly-spent",
        "too-dear",
        "budget-boundary-fits",
        "a-cent-short",
        "overspent",
        "float-sums-exact",
    ],
)
def test_allowance_keeps_the_hourly_spend_within_the_budget(
    max_usd: float, live: list[float], want: int, instance_type: str, expected: Allowance
) -> None:
    p = profile(
        max_hourly_usd=max_usd,
        max_instances=10,
        instance_types=[instance_type],
        prices={"p4d.24xlarge": 32.77, "p5.48xlarge": 98.32, "g5.xlarge": 1.006, "tiny": 0.1},
    )
    owned = [managed(f"i-{n}", hourly_usd=h) for n, h in enumerate(live)]
    assert plan.allowance(p, "burst", owned, want, instance_type) == expected


def test_the_tighter_cap_says_why() -> None:
    # max_instances leaves 2, the budget 1: the budget is named.
    p = budget(70, max_instances=3)
    owned = [managed("i-1")]
    got = plan.allowance(p, "burst", owned, 5, "p4d.24xlarge")
    assert got.count == 1
    assert got.why.startswith("max_hourly_usd 70.00 leaves room for 1")
    # The budget leaves 3, max_instances 1: max_instances is named.
    got = plan.allowance(budget(1000, max_instances=2), "burst", owned, 5, "p4d.24xlarge")
    assert got == Allowance(1, "max_instances 2 leaves room for 1: 1 live")


def test_an_unpriced_type_under_a_budget_allows_nothing() -> None:
    p = budget(1000).model_copy(update={"instance_types": ("p3.2xlarge",)})
    got = plan.allowance(p, "burst", [], 1, "p3.2xlarge")
    assert got == Allowance(0, "no price for p3.2xlarge in the profile")


def test_an_unpriced_type_without_a_budget_is_only_counted() -> None:
    got = plan.allowance(profile(max_instances=2), "burst", [managed(hourly_usd=None)], 3, "p3")
    assert got == Allowance(1, "max_instances 2 leaves room for 1: 1 live")


def test_a_live_instance_without_its_own_price_takes_the_tables() -> None:
    owned = [managed("i-1", hourly_usd=None, instance_type="p5.48xlarge")]
    got = plan.allowance(budget(130), "burst", owned, 1, "p4d.24xlarge")
    assert got == Allowance(0, got.why)
    assert "98.32/h live" in got.why
    assert plan.allowance(budget(131.09), "burst", owned, 1, "p4d.24xlarge") == Allowance(1, "")


def test_a_live_instance_of_unknown_price_under_a_budget_allows_nothing() -> None:
    owned = [
        managed("i-1", hourly_usd=None, instance_type="x1.32xlarge"),
        managed("i-2", hourly_usd=None, instance_type="z.big"),
    ]
    got = plan.allowance(budget(1000), "burst", owned, 1, "p4d.24xlarge")
    assert got == Allowance(
        0,
        "max_hourly_usd cannot be checked: no price for live i-1 (x1.32xlarge), i-2 (z.big)",
    )


def test_ended_and_foreign_instances_cost_nothing_against_the_budget() -> None:
    owned = [
        managed("i-1", state="terminated", hourly_usd=98.32),
        managed("i-2", profile="other", hourly_usd=98.32),
        managed("i-3", state="shutting-down", hourly_usd=None, instance_type="unknown"),
    ]
    assert plan.allowance(budget(33), "burst", owned, 1, "p4d.24xlarge") == Allowance(1, "")


def test_when_max_instances_already_allows_nothing_the_price_is_not_asked() -> None:
    p = budget(1000, max_instances=1)
    got = plan.allowance(p, "burst", [managed()], 1, "not-in-the-table")
    assert got == Allowance(0, "max_instances 1 reached: 1 live")


def test_the_cap_holds_across_incidents_launching_in_turn() -> None:
    # Several incidents in one tick: each asks after the previous one's instances are owned.
    p = budget(100, max_instances=5)
    owned: list[Managed] = []
    granted = []
    for n in range(6):
        got = plan.allowance(p, "burst", owned, 2, "p4d.24xlarge")
        granted.append(got.count)
        owned += [managed(f"i-{n}-{k}", incident=f"inc-{n}") for k in range(got.count)]
    assert granted == [2, 1, 0, 0, 0, 0]
    assert sum(m.hourly_usd or 0 for m in owned) <= 100


# --- reap_plan -----------------------------------------------------------------------------

LINGER = {"burst": 1800.0}


@pytest.mark.parametrize(
    ("instance", "resolved", "now", "expected"),
    [
        (managed(), {}, NOW, []),
        (managed(), {"inc-1": NOW - 1799.0}, NOW, []),
        (
            managed(),
            {"inc-1": NOW - 1800.0},
            NOW,
            [ReapDecision("i-1", "linger", "incident inc-1 resolved 30m ago (linger 30m)")],
        ),
        (
            managed(),
            {"inc-1": NOW - 7200.0},
            NOW,
            [ReapDecision("i-1", "linger", "incident inc-1 resolved 2h00m ago (linger 30m)")],
        ),
        (managed(), {"inc-2": NOW - 7200.0}, NOW, []),
        (managed(expires_at=NOW + 1), {}, NOW, []),
        (
            managed(expires_at=NOW),
            {},
            NOW,
            [ReapDecision("i-1", "ttl", "past its ttl: expired 2027-01-15T08:00:00Z")],
        ),
        (
            managed(expires_at=NOW - 10),
            {"inc-1": NOW - 7200.0},
            NOW,
            [ReapDecision("i-1", "ttl", "past its ttl: expired 2027-01-15T07:59:50Z")],
        ),
        (managed(incident=None), {"inc-1": NOW - 7200.0}, NOW, []),
        (
            managed(incident=None, expires_at=NOW - 1),
            {},
            NOW,
            [ReapDecision("i-1", "ttl", "past its ttl: expired 2027-01-15T07:59:59Z")],
        ),
        (managed(state="terminated", expires_at=NOW - HOUR), {"inc-1": NOW - HOUR}, NOW, []),
        (managed(state="shutting-down", expires_at=NOW - HOUR), {}, NOW, []),
        (managed(state=GONE, expires_at=NOW - HOUR), {}, NOW, []),
        (
            managed(state="stopped"),
            {"inc-1": NOW - HOUR},
            NOW,
            [ReapDecision("i-1", "linger", "incident inc-1 resolved 1h00m ago (linger 30m)")],
        ),
        (
            managed(state="pending", expires_at=NOW - 1),
            {},
            NOW,
            [ReapDecision("i-1", "ttl", "past its ttl: expired 2027-01-15T07:59:59Z")],
        ),
        (managed(), {"inc-1": NOW + 60.0}, NOW, []),
    ],
    ids=[
        "unresolved",
        "linger-one-second-short",
        "linger-boundary",
        "long-resolved",
        "another-incident-resolved",
        "ttl-one-second-short",
        "ttl-boundary",
        "ttl-wins-over-linger",
        "no-incident-no-linger",
        "no-incident-ttl",
        "already-terminated",
        "already-shutting-down",
        "gone",
        "stopped-is-reaped",
        "pending-is-reaped",
        "resolved-in-the-future",
    ],
)
def test_reap_plan_one_instance(
    instance: Managed, resolved: dict[str, float], now: float, expected: list[ReapDecision]
) -> None:
    assert plan.reap_plan([instance], resolved, now, LINGER) == expected


@pytest.mark.parametrize(
    ("linger", "since", "reaped"),
    [(0.0, 0.0, True), (0.0, -1.0, False), (60.0, 59.999, False), (60.0, 60.0, True)],
    ids=["zero-at-resolve", "zero-before-resolve", "just-short", "exact"],
)
def test_linger_boundary(linger: float, since: float, reaped: bool) -> None:
    decisions = plan.reap_plan([managed()], {"inc-1": NOW - since}, NOW, {"burst": linger})
    assert [d.reason for d in decisions] == (["linger"] if reaped else [])


def test_each_profile_has_its_own_linger() -> None:
    instances = [
        managed("i-short", profile="short"),
        managed("i-long", profile="long"),
    ]
    got = plan.reap_plan(instances, {"inc-1": NOW - 600.0}, NOW, {"short": 300.0, "long": 900.0})
    assert [d.instance_id for d in got] == ["i-short"]


def test_an_instance_of_a_profile_no_longer_configured_is_reaped_once_resolved() -> None:
    instance = managed(profile="removed")
    assert plan.reap_plan([instance], {}, NOW, LINGER) == []
    assert plan.reap_plan([instance], {"inc-1": NOW + 5}, NOW, LINGER) == []
    assert plan.reap_plan([instance], {"inc-1": NOW - 5}, NOW, LINGER) == [
        ReapDecision(
            "i-1",
            "linger",
            "incident inc-1 resolved 5s ago and profile removed is no longer configured",
        )
    ]


def test_reap_plan_keeps_the_order_given_and_names_each_instance_once() -> None:
    instances = [
        managed("i-3", incident="inc-b"),
        managed("i-1", incident="inc-a", expires_at=NOW - 1),
        managed("i-2", incident="inc-c"),
        managed("i-1", incident="inc-a", expires_at=NOW - 1),
        managed("i-4", incident="inc-a", state="terminated"),
        managed("i-5", incident="inc-a"),
    ]
    resolved = {"inc-a": NOW - HOUR, "inc-b": NOW - HOUR}
    got = plan.reap_plan(instances, resolved, NOW, LINGER)
    assert [(d.instance_id, d.reason) for d in got] == [
        ("i-3", "linger"),
        ("i-1", "ttl"),
        ("i-5", "linger"),
    ]


def test_reap_plan_of_nothing() -> None:
    assert plan.reap_plan([], {"inc-1": NOW}, NOW, LINGER) == []


# --- merge ---------------------------------------------------------------------------------


def test_merge_keeps_each_instance_once_and_ec2s_state_wins() -> None:
    journal = [managed("i-1", state="pending"), managed("i-2", state="running")]
    seen = [
        managed("i-2", state="stopped", launched_at=0.0),
        managed("i-3", state="running", adopted=True),
    ]
    merged = plan.merge(journal, seen)
    assert [(m.instance_id, m.state) for m in merged] == [
        ("i-1", "pending"),
        ("i-2", "stopped"),
        ("i-3", "running"),
    ]
    # The journal's own facts (its clock's launch time) are kept.
    assert merged[1].launched_at == NOW - HOUR
    assert merged[2].adopted


def test_merge_fills_what_the_journal_lacks_from_ec2() -> None:
    journal = [managed("i-1", incident=None, hourly_usd=None)]
    seen = [managed("i-1", incident="inc-9", hourly_usd=5.0, subnet="subnet-a1", rule="r", step=3)]
    (merged,) = plan.merge(journal, seen)
    assert (merged.incident, merged.subnet, merged.rule, merged.step, merged.hourly_usd) == (
        "inc-9",
        "subnet-a1",
        "r",
        3,
        5.0,
    )


def test_merge_prefers_the_journals_facts_where_both_have_them() -> None:
    journal = [managed("i-1", incident="inc-1", subnet="subnet-a1", rule="r1", step=1)]
    seen = [managed("i-1", incident="inc-2", subnet="subnet-b2", rule="r2", step=2)]
    (merged,) = plan.merge(journal, seen)
    assert dataclasses.replace(merged, state="running") == journal[0]


def test_an_instance_ec2_reports_live_is_not_ended() -> None:
    journal = [
        managed("i-1", state="terminated", terminated_at=NOW - 60, end_reason="linger"),
    ]
    (merged,) = plan.merge(journal, [managed("i-1", state="running")])
    assert (merged.state, merged.terminated_at, merged.end_reason) == ("running", None, None)


def test_an_instance_ec2_reports_ended_keeps_the_journals_end() -> None:
    journal = [managed("i-1", state="running")]
    (merged,) = plan.merge(journal, [managed("i-1", state="terminated")])
    assert (merged.state, merged.terminated_at) == ("terminated", None)
    ended = [managed("i-2", state="shutting-down", terminated_at=NOW - 5, end_reason="ttl")]
    (merged,) = plan.merge(ended, [managed("i-2", state="terminated")])
    assert (merged.state, merged.terminated_at, merged.end_reason) == (
        "terminated",
        NOW - 5,
        "ttl",
    )


def test_merge_keeps_what_only_the_journal_knows() -> None:
    journal = [managed("i-1", state="running")]
    assert plan.merge(journal, []) == journal


def test_merge_of_duplicates_takes_the_first_of_each_side() -> None:
    journal = [managed("i-1", rule="first"), managed("i-1", rule="second")]
    seen = [managed("i-1", state="stopping"), managed("i-1", state="terminated")]
    (merged,) = plan.merge(journal, seen)
    assert (merged.rule, merged.state) == ("first", "stopping")


def test_merge_of_nothing() -> None:
    assert plan.merge([], []) == []
