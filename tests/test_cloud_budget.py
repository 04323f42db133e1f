"""The fleet-wide burst budget against a real DynamoDB API and a real EC2 API (moto on
127.0.0.1), with many hosts — each its own cloud service, journal file and host name — racing
for slots from threads at the same moment.

What must hold: the fleet never runs more than the budget allows, whatever the timing; every
slot comes back when the reaper ends its instance; a host that dies holding slots loses them
when its lease runs out, and not before; a budget that cannot be asked launches nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.actions.base import Context
from gpuwarden.clock import SimClock
from gpuwarden.cloud import budget, ec2, reaper
from gpuwarden.cloud.budget import FleetBudget
from gpuwarden.cloud.ec2 import Ec2
from gpuwarden.cloud.service import CloudService
from gpuwarden.cloud.slots import MICRO
from gpuwarden.cloud.store import InstanceStore
from gpuwarden.config import Budget, Cloud, CloudProfile
from gpuwarden.model import Intent, Outcome, Reason
from gpuwarden.playbook.schema import ProvisionParams
from tests.cloud_server import (  # noqa: F401
    REGION,
    MotoEc2,
    fixture_aws_env,
    fixture_fresh_ec2,
    fixture_moto_ec2,
)
from tests.test_cloud_service import LIVE, in_ec2, incident_opens

TABLE = "gpuwarden-budget"
PRICES = {"g5.xlarge": 1.006, "g6.xlarge": 0.805}
LEASE = 600.0
LINGER = 60.0
HOSTS = 12


def profile(server: MotoEc2, *, count: int = 1, **budget: Any) -> CloudProfile:
    spec: dict[str, Any] = {"table": TABLE, "lease": LEASE, "endpoint_url": server.endpoint_url}
    spec.update(budget)
    return CloudProfile(
        region=REGION,
        instance_types=("g5.xlarge", "g6.xlarge"),
        ami=server.ami,
        subnets=(server.subnet,),
        max_instances=2,  # each host's own cap: the fleet's is the budget's
        count=count,
        prices=PRICES,
        linger=LINGER,
        endpoint_url=server.endpoint_url,
        budget=Budget(**spec),
    )


def step(host: str, n: int = 0) -> Intent:
    incident = f"20260101T00000{n}Z-mem-{host}-gpu:0"
    return Intent(
        id=f"{incident}/2",
        incident=incident,
        rule="mem",
        scope="gpu:0",
        step=2,
        kind="provision",
        label="provision burst",
        time=SimClock().now(),
        reason=Reason.STEP_DUE,
        severity="critical",
        params=ProvisionParams(profile="burst"),
    )


@dataclass
class Fleet:
    """Hosts sharing one moto server, each with its own journal file and cloud service.
    The hosts share one EC2 and one DynamoDB client (boto3 clients are thread-safe; making
    two per host takes most of a test's time); ``own_clients`` uses the daemon's connects."""

    server: MotoEc2
    tmp: Path
    clock: SimClock = field(default_factory=SimClock)
    stores: list[InstanceStore] = field(default_factory=list)
    _clients: dict[str, Any] = field(default_factory=dict)

    def host(self, name: str, burst: CloudProfile, *, own_clients: bool = False) -> CloudService:
        store = InstanceStore.open(self.tmp / name / "journal.db")
        self.stores.append(store)
        cloud = Cloud(profiles={"burst": burst})
        if own_clients:
            return CloudService(cloud, store, host=name)
        return CloudService(cloud, store, host=name, connect=self._ec2, connect_budget=self._budget)

    def _ec2(self, burst: CloudProfile) -> Ec2:
        if "ec2" not in self._clients:
            self._clients["ec2"] = ec2.connect(burst)
        return self._clients["ec2"]  # type: ignore[no-any-return]

    def _budget(self, burst: CloudProfile, key: str, host: str) -> FleetBudget:
        if "dynamodb" not in self._clients:
            self._clients["dynamodb"] = budget.connect(burst, key, host).client
        assert burst.budget is not None
        return FleetBudget(self._clients["dynamodb"], burst.budget, key=key, host=host)

    def provision(self, service: CloudService, n: int = 0, *, dry_run: bool = False) -> Outcome:
        waiter = Context(dry_run=dry_run, clock=self.clock)
        return service.provision(
            step(service.host, n),
            "burst",
            None,
            dry_run=dry_run,
            now=self.clock.now(),
            waiter=waiter,
        )

    def item(self, key: str = "burst") -> dict[str, Any]:
        found = self.server.dynamodb().get_item(
            TableName=TABLE, Key={"budget": {"S": key}}, ConsistentRead=True
        )
        item = found.get("Item")
        if item is None:
            return {"instances": 0, "micro_usd": 0, "holders": {}}
        return {
            "instances": int(item["instances"]["N"]),
            "micro_usd": int(item["micro_usd"]["N"]),
            "holders": {
                k: {
                    "host": v["M"]["host"]["S"],
                    "n": int(v["M"]["n"]["N"]),
                    "expires": float(v["M"]["expires"]["N"]),
                }
                for k, v in item["holders"]["M"].items()
            },
        }

    def close(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture
def fleet(fresh_ec2: MotoEc2, tmp_path: Path) -> Iterator[Fleet]:
    fresh_ec2.budget_table(TABLE)
    made = Fleet(fresh_ec2, tmp_path)
    yield made
    made.close()


def race(fleet: Fleet, services: list[CloudService], n: int = 0) -> list[Outcome]:
    """Every host provisions at the same moment, each from its own thread."""
    start = threading.Barrier(len(services))
    outcomes: dict[str, Outcome] = {}
    failures: list[BaseException] = []

    def fire(service: CloudService) -> None:
        try:
            start.wait()
            outcomes[service.host] = fleet.provision(service, n)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=fire, args=(s,)) for s in services]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    assert len(outcomes) == len(services)
    return [outcomes[s.host] for s in services]


def live_ids(services: list[CloudService]) -> set[str]:
    return {m.instance_id for s in services for m in s.store.live("burst")}


def test_hosts_racing_for_slots_never_exceed_the_fleet_cap_and_reaping_frees_every_slot(
    fleet: Fleet,
) -> None:
    burst = profile(fleet.server, count=2, max_instances=5)
    services = [fleet.host(f"node-{i:02}", burst) for i in range(HOSTS)]
    t0 = fleet.clock.now()

    outcomes = race(fleet, services)

    # 12 hosts want 2 each, 24 in all: the fleet runs 5, never more, and the item says so.
    running = ids_in_ec2 = {i["InstanceId"] for i in in_ec2(fleet.server)}
    assert len(running) == 5
    assert live_ids(services) == ids_in_ec2
    item = fleet.item()
    assert item["instances"] == 5
    assert set(item["holders"]) == running  # one holder per instance, no reservation left
    assert item["micro_usd"] == round(5 * PRICES["g5.xlarge"] * MICRO)
    granted = sum(len(s.store.live("burst")) for s in services)
    assert granted == 5
    refused = [o for o in outcomes if not o.ok]
    assert len(refused) >= HOSTS - 5
    for outcome in refused:
        assert outcome.detail.startswith("nothing launched: ")
        assert "fleet budget 'burst' (table gpuwarden-budget): max_instances 5 reached" in (
            outcome.detail
        )
    for service in services:
        for m in service.store.live("burst"):
            assert item["holders"][m.instance_id]["host"] == service.host

    # The incidents resolve; once they lingered, every host's reaper ends its instances.
    for service in services:
        for m in service.store.live("burst"):
            assert m.incident is not None
            incident_opens(service.store.path, m.incident, t0, resolved=t0 + 10)
    ended = []
    for service in services:
        ended += reaper.reap(service, t0 + 10 + LINGER, dry_run=False)
    assert sorted(r.instance_id for r in ended) == sorted(running)
    assert in_ec2(fleet.server) == []
    assert fleet.item() == {"instances": 0, "micro_usd": 0, "holders": {}}

    # The slots are free again: a second wave gets the whole budget once more.
    outcomes = race(fleet, services, n=1)
    assert len(in_ec2(fleet.server)) == 5
    assert fleet.item()["instances"] == 5
    assert sum(1 for o in outcomes if o.ok) in {3, 4, 5}


def test_the_dollar_cap_holds_across_hosts_and_a_cheaper_type_fills_what_is_left(
    fleet: Fleet,
) -> None:
    # $3.00 an hour: two g5.xlarge ($2.012) leave room for one g6.xlarge ($0.805), no more.
    burst = profile(fleet.server, max_dollars_per_hour=3.0)
    services = [fleet.host(f"node-{i:02}", burst) for i in range(6)]

    outcomes = race(fleet, services)

    types = sorted(i["InstanceType"] for i in in_ec2(fleet.server))
    assert types == ["g5.xlarge", "g5.xlarge", "g6.xlarge"]
    item = fleet.item()
    assert item["instances"] == 3
    assert item["micro_usd"] == round((2 * 1.006 + 0.805) * MICRO)
    assert item["micro_usd"] <= 3 * MICRO
    refused = [o for o in outcomes if not o.ok]
    assert len(refused) == 6 - 3
    assert all("max_dollars_per_hour $3.00 leaves room for 0" in o.detail for o in refused)


def test_a_dead_hosts_slots_come_back_when_its_lease_runs_out_and_not_before(
    fleet: Fleet,
) -> None:
    burst = profile(fleet.server, count=2, max_instances=2)
    dead = fleet.host("node-dead", burst)
    alive = fleet.host("node-alive", burst)
    other = fleet.host("node-other", burst)
    assert fleet.provision(dead).ok
    assert fleet.provision(alive).detail.startswith("nothing launched: fleet budget")

    # node-dead stops renewing (it died). Until its lease ends its slots stay taken.
    fleet.clock.advance(LEASE - 1)
    assert not fleet.provision(alive, n=1).ok
    assert fleet.item()["instances"] == 2

    fleet.clock.advance(2)  # the lease ran out: the next take removes the holders, then fits
    outcome = fleet.provision(alive, n=2)
    assert outcome.ok, outcome.detail
    item = fleet.item()
    assert item["instances"] == 2
    assert {h["host"] for h in item["holders"].values()} == {"node-alive"}

    # A live host renews at each reap round: however long it runs, nobody takes its slots.
    for _ in range(4):
        fleet.clock.advance(LEASE / 2)
        assert alive.renew_budgets(fleet.clock.now()) == []
        assert not fleet.provision(other, n=3).ok
    assert {h["host"] for h in fleet.item()["holders"].values()} == {"node-alive"}
    assert len(in_ec2(fleet.server)) == 4  # node-dead's two still run: nobody reaps them


def test_a_round_holds_slots_for_what_runs_and_drops_what_ended(fleet: Fleet) -> None:
    burst = profile(fleet.server, count=2, max_instances=4)
    node = fleet.host("node-a", burst)
    assert fleet.provision(node).ok
    [one, two] = sorted(m.instance_id for m in node.store.live("burst"))
    now = fleet.clock.now()
    # The item lost one holder (a release that reached DynamoDB twice, an operator's edit),
    # and one instance ended outside gpuwarden: the next round puts the item right.
    node.fleet.item(node.cloud, "burst").release([one])  # type: ignore[union-attr]
    node.store.ended(two, "terminated", now, "external")
    assert set(fleet.item()["holders"]) == {two}

    assert node.renew_budgets(now + 30) == []

    item = fleet.item()
    assert set(item["holders"]) == {one}
    assert item["instances"] == 1
    assert item["holders"][one]["expires"] == pytest.approx(now + 30 + LEASE)


def test_a_dry_run_takes_no_slot_and_says_what_would_fit(fleet: Fleet) -> None:
    burst = profile(fleet.server, count=2, max_instances=3)
    first, second = fleet.host("node-a", burst), fleet.host("node-b", burst)
    assert fleet.provision(first).ok

    outcome = fleet.provision(second, dry_run=True)

    assert outcome.ok
    assert outcome.dry_run
    assert outcome.detail.startswith("would launch 1 x g5.xlarge")
    assert "max_instances 3 leaves room for 1: 2 held across the fleet" in outcome.detail
    assert fleet.item()["instances"] == 2
    assert len(in_ec2(fleet.server, (*LIVE,))) == 2


def test_when_dynamodb_cannot_be_reached_nothing_is_launched(fleet: Fleet) -> None:
    # A port nothing listens on: the connection is refused.
    burst = profile(fleet.server, endpoint_url="http://127.0.0.1:9", max_instances=5)
    node = fleet.host("node-a", burst, own_clients=True)

    outcome = fleet.provision(node)

    assert not outcome.ok
    assert outcome.recoverable  # trying again may help
    assert outcome.detail.startswith(
        "nothing launched: fleet budget 'burst' (table gpuwarden-budget): "
    )
    assert "cannot reach DynamoDB" in outcome.detail
    assert in_ec2(fleet.server) == []
    assert node.store.all() == []


def test_a_missing_table_says_how_to_create_it(fleet: Fleet) -> None:
    missing = profile(fleet.server, table="no-such-table", max_instances=5)
    node = fleet.host("node-a", missing, own_clients=True)

    outcome = fleet.provision(node)

    assert not outcome.ok
    assert not outcome.recoverable
    assert "ResourceNotFoundException" in outcome.detail
    assert "create the table: docs/fleet.md" in outcome.detail
    assert in_ec2(fleet.server) == []


def test_profiles_naming_one_key_share_one_item(fleet: Fleet) -> None:
    a100 = profile(fleet.server, key="gpu-burst", max_instances=2)
    h100 = profile(fleet.server, key="gpu-burst", max_instances=2)
    store = InstanceStore.open(fleet.tmp / "journal.db")
    fleet.stores.append(store)
    both = Cloud(profiles={"burst": a100, "big": h100})
    node = CloudService(
        both, store, host="node-a", connect=fleet._ec2, connect_budget=fleet._budget
    )
    waiter = Context(dry_run=False, clock=fleet.clock)
    now = fleet.clock.now()
    assert node.provision(step("node-a", 0), "burst", 1, dry_run=False, now=now, waiter=waiter).ok
    assert node.provision(step("node-a", 1), "big", 1, dry_run=False, now=now, waiter=waiter).ok

    third = node.provision(step("node-a", 2), "big", 1, dry_run=False, now=now, waiter=waiter)

    assert not third.ok
    assert "fleet budget 'gpu-burst'" in third.detail
    assert fleet.item("gpu-burst")["instances"] == 2
    assert node.renew_budgets(now + 1) == []  # one renewal holds both profiles' instances
    assert fleet.item("gpu-burst")["instances"] == 2
