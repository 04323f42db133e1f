"""``provision``: a thin door to the cloud service. Without a service it launches nothing and
says so; with one, the service's outcome is the step's; shadow rules and dry-run ask EC2 for a
DryRun launch only."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.actions import provision
from gpuwarden.actions.base import Context, Waiter
from gpuwarden.clock import SimClock
from gpuwarden.cloud import ec2
from gpuwarden.cloud.service import CloudService
from gpuwarden.cloud.store import InstanceStore
from gpuwarden.config import Cloud, CloudProfile
from gpuwarden.model import Intent, Outcome, Reason
from gpuwarden.playbook.schema import KillParams, ProvisionParams
from tests.cloud_server import (  # noqa: F401
    REGION,
    MotoEc2,
    fixture_aws_env,
    fixture_fresh_ec2,
    fixture_moto_ec2,
)

INCIDENT = "20260101T000000Z-mem-gpu:0"


def intent(params: object = None, *, shadow: bool = False) -> Intent:
    return Intent(
        id=f"{INCIDENT}/3",
        incident=INCIDENT,
        rule="mem",
        scope="gpu:0",
        step=3,
        kind="provision",
        label="provision burst",
        time=0.0,
        reason=Reason.STEP_DUE,
        severity="critical",
        shadow=shadow,
        params=ProvisionParams(profile="burst") if params is None else params,
    )


@dataclass
class Call:
    intent: Intent
    profile: str
    count: int | None
    dry_run: bool
    now: float
    waiter: Waiter


@dataclass
class RecordingCloud:
    """The executor's seam (``CloudProvisioner``): answers with ``outcome``, keeps each call."""

    outcome: Outcome
    calls: list[Call] = field(default_factory=list)

    def provision(
        self,
        intent: Intent,
        profile_name: str,
        count: int | None,
        *,
        dry_run: bool,
        now: float,
        waiter: Waiter,
    ) -> Outcome:
        self.calls.append(Call(intent, profile_name, count, dry_run, now, waiter))
        return self.outcome


def test_without_a_cloud_service_nothing_is_launched_and_it_says_so() -> None:
    outcome = provision.execute(intent(), Context(dry_run=False, clock=SimClock()))

    assert not outcome.ok
    assert not outcome.recoverable
    assert not outcome.dry_run
    assert "burst" in outcome.detail
    assert "no cloud service" in outcome.detail


def test_without_a_cloud_service_a_shadow_step_is_dry_run_too() -> None:
    outcome = provision.execute(intent(shadow=True), Context(dry_run=False, clock=SimClock()))
    assert not outcome.ok
    assert outcome.dry_run


def test_the_services_outcome_is_the_steps_outcome(caplog: pytest.LogCaptureFixture) -> None:
    answer = Outcome(ok=True, detail="launched 2 in us-east-1: i-0a, i-0b; $2.01/h")
    cloud = RecordingCloud(answer)
    clock = SimClock(1_780_000_000.0)
    ctx = Context(dry_run=False, clock=clock, cloud=cloud)
    step = intent(ProvisionParams(profile="burst", count=2))

    with caplog.at_level(logging.INFO, logger="gpuwarden.action"):
        outcome = provision.execute(step, ctx)

    assert outcome is answer
    [call] = cloud.calls
    assert (call.intent, call.profile, call.count, call.dry_run) == (step, "burst", 2, False)
    assert call.now == 1_780_000_000.0
    assert call.waiter is ctx  # backoff waits on the step's clock and stops when cancelled
    [line] = [r.getMessage() for r in caplog.records if "action=provision" in r.getMessage()]
    assert "profile=burst" in line
    assert "ok=True" in line
    assert "dry_run=false" in line


def test_a_missing_count_is_left_to_the_profile() -> None:
    cloud = RecordingCloud(Outcome(ok=True))
    provision.execute(intent(), Context(dry_run=False, clock=SimClock(), cloud=cloud))
    assert cloud.calls[0].count is None


@pytest.mark.parametrize(
    ("global_dry_run", "shadow", "expected"),
    [(False, False, False), (True, False, True), (False, True, True), (True, True, True)],
)
def test_shadow_rules_and_dry_run_ask_for_a_dry_run(
    global_dry_run: bool, shadow: bool, expected: bool
) -> None:
    cloud = RecordingCloud(Outcome(ok=True, dry_run=expected))
    ctx = Context(dry_run=global_dry_run, clock=SimClock(), cloud=cloud)

    provision.execute(intent(shadow=shadow), ctx)

    assert [c.dry_run for c in cloud.calls] == [expected]


def test_parameters_of_another_kind_are_an_outcome() -> None:
    cloud = RecordingCloud(Outcome(ok=True))
    ctx = Context(dry_run=False, clock=SimClock(), cloud=cloud)

    outcome = provision.execute(intent(KillParams()), ctx)

    assert not outcome.ok
    assert "KillParams" in outcome.detail
    assert "ProvisionParams" in outcome.detail
    assert cloud.calls == []


# -- with the real service on the moto server ---------------------------------------------------


@pytest.fixture
def service(fresh_ec2: MotoEc2, tmp_path: Path) -> Iterator[CloudService]:
    burst = CloudProfile(
        region=REGION,
        instance_types=("g5.xlarge",),
        ami=fresh_ec2.ami,
        subnets=(fresh_ec2.subnet,),
        prices={"g5.xlarge": 1.006},
        endpoint_url=fresh_ec2.endpoint_url,
    )
    with InstanceStore.open(tmp_path / "journal.db") as store:
        yield CloudService(
            Cloud(profiles={"burst": burst}), store, host="gpu-a", connect=ec2.connect
        )


def live_in(server: MotoEc2) -> list[dict[str, Any]]:
    pages = server.client().describe_instances(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )["Reservations"]
    return [i for r in pages for i in r["Instances"]]


def test_a_shadow_step_asks_ec2_for_a_dry_run_and_launches_nothing(
    service: CloudService, fresh_ec2: MotoEc2
) -> None:
    ctx = Context(dry_run=False, clock=SimClock(), cloud=service)

    outcome = provision.execute(intent(shadow=True), ctx)

    assert outcome.ok
    assert outcome.dry_run
    assert outcome.detail.startswith("would launch 1 x g5.xlarge (on-demand)")
    assert "$1.01/h" in outcome.detail
    assert live_in(fresh_ec2) == []
    assert service.store.all() == []


def test_a_step_launches_and_the_outcome_names_the_instance(
    service: CloudService, fresh_ec2: MotoEc2
) -> None:
    clock = SimClock()
    ctx = Context(dry_run=False, clock=clock, cloud=service)

    outcome = provision.execute(intent(), ctx)

    [instance] = live_in(fresh_ec2)
    assert outcome.ok
    assert not outcome.dry_run
    assert instance["InstanceId"] in outcome.detail
    [row] = service.store.for_step(INCIDENT, 3)
    assert (row.instance_id, row.launched_at) == (instance["InstanceId"], clock.now())
