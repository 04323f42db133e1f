"""The cloud service against a real EC2 API (moto on 127.0.0.1) and a real journal file.

A launch is capped across incidents, tagged, recorded, and never repeated for one step (the
journal or EC2's tags tell); the reaper ends what lingered after its incident or outlived its
ttl, and nothing else; after a restart the service adopts what carries this host's tags. What
moto cannot do (honour a ClientToken, run out of capacity, throttle, refuse) runs on botocore's
Stubber around a real client.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from gpuwarden.actions.base import Context
from gpuwarden.clock import SimClock
from gpuwarden.cloud import ec2, reaper, tags
from gpuwarden.cloud.ec2 import Ec2
from gpuwarden.cloud.instance import GONE, Managed
from gpuwarden.cloud.service import CloudService
from gpuwarden.cloud.store import InstanceStore
from gpuwarden.config import Cloud, CloudProfile
from gpuwarden.journal.journal import Journal
from gpuwarden.model import Intent, Outcome, Reason, RuleChange, Transition
from gpuwarden.playbook.schema import ProvisionParams
from tests.cloud_server import (  # noqa: F401
    REGION,
    MotoEc2,
    fixture_aws_env,
    fixture_fresh_ec2,
    fixture_moto_ec2,
)

HOUR = 3600.0
TTL = 8 * HOUR
LINGER = 1800.0
HOST = "gpu-a"
INCIDENT = "20260101T000000Z-mem-gpu:0"
OTHER = "20260101T000500Z-mem-gpu:1"
PRICES = {"g5.xlarge": 1.006, "g6.xlarge": 0.805}
LIVE = ("pending", "running")


def profile(server: MotoEc2 | None = None, **changes: Any) -> CloudProfile:
    fields: dict[str, Any] = {
        "region": REGION,
        "instance_types": ("g5.xlarge", "g6.xlarge"),
        "ami": server.ami if server else "ami-0123456789abcdef0",
        "subnets": (server.subnet,) if server else (),
        "security_groups": (server.security_group,) if server else (),
        "max_instances": 4,
        "prices": PRICES,
        "ttl": TTL,
        "linger": LINGER,
        "tags": {"team": "ml"},
        "endpoint_url": server.endpoint_url if server else None,
    }
    fields.update(changes)
    return CloudProfile(**fields)


def intent(incident: str = INCIDENT, step: int = 2, *, shadow: bool = False) -> Intent:
    return Intent(
        id=f"{incident}/{step}",
        incident=incident,
        rule="mem",
        scope="gpu:0",
        step=step,
        kind="provision",
        label="provision burst",
        time=SimClock().now(),  # planned when the rig's clock starts
        reason=Reason.STEP_DUE,
        severity="critical",
        shadow=shadow,
        params=ProvisionParams(profile="burst"),
    )


@dataclass
class Rig:
    """Services on one moto server, a journal file and a simulated clock; every EC2 call a
    service makes is written down (operation, parameters)."""

    server: MotoEc2
    tmp: Path
    clock: SimClock = field(default_factory=SimClock)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    stores: list[InstanceStore] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.tmp / "state" / "journal.db"

    def connect(self, p: CloudProfile) -> Ec2:
        """The daemon's own connect (boto3's credential chain, the profile's endpoint)."""
        made = ec2.connect(p)
        made.client.meta.events.register("provide-client-params.ec2", self._record)
        return made

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls.append((model.name, dict(params)))

    def called(self, operation: str) -> list[dict[str, Any]]:
        return [params for name, params in self.calls if name == operation]

    def service(
        self,
        profiles: dict[str, CloudProfile] | None = None,
        *,
        host: str = HOST,
        path: Path | None = None,
    ) -> CloudService:
        store = InstanceStore.open(path or self.path)
        self.stores.append(store)
        cloud = Cloud(profiles=profiles or {"burst": profile(self.server)})
        return CloudService(cloud, store, host=host, connect=self.connect)

    def provision(
        self,
        service: CloudService,
        step: Intent,
        *,
        name: str = "burst",
        count: int | None = None,
        dry_run: bool = False,
    ) -> Outcome:
        waiter = Context(dry_run=dry_run, clock=self.clock)
        return service.provision(
            step, name, count, dry_run=dry_run, now=self.clock.now(), waiter=waiter
        )

    def close(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture
def rig(fresh_ec2: MotoEc2, tmp_path: Path) -> Iterator[Rig]:
    made = Rig(fresh_ec2, tmp_path)
    yield made
    made.close()


def in_ec2(server: MotoEc2, states: tuple[str, ...] = LIVE, **wanted: str) -> list[dict[str, Any]]:
    """Instances as EC2 reports them, by state and by tag (``host="gpu-b"``)."""
    filters = [{"Name": "instance-state-name", "Values": list(states)}]
    filters += [{"Name": f"tag:gpuwarden:{k}", "Values": [v]} for k, v in wanted.items()]
    pages = server.client().describe_instances(Filters=filters)["Reservations"]
    return [i for r in pages for i in r["Instances"]]


def ids(instances: list[dict[str, Any]]) -> set[str]:
    return {str(i["InstanceId"]) for i in instances}


def state_of(server: MotoEc2, instance_id: str) -> str:
    pages = server.client().describe_instances(InstanceIds=[instance_id])["Reservations"]
    [instance] = [i for r in pages for i in r["Instances"]]
    return str(instance["State"]["Name"])


def incident_opens(path: Path, incident: str, at: float, resolved: float | None = None) -> None:
    """The incident as the run loop records it: firing at ``at``, resolved at ``resolved``."""
    with Journal(path) as journal:
        journal.record(
            RuleChange(
                Transition.FIRING, "mem", "gpu:0", at, Reason.FOR_ELAPSED, incident=incident
            ),
            at,
        )
        if resolved is not None:
            journal.record(
                RuleChange(
                    Transition.RESOLVED,
                    "mem",
                    "gpu:0",
                    resolved,
                    Reason.RESOLVED,
                    incident=incident,
                ),
                resolved,
            )


# -- launching ----------------------------------------------------------------------------------


def test_a_launch_tags_and_records_every_instance(rig: Rig) -> None:
    service = rig.service({"burst": profile(rig.server, count=2)})
    t0 = rig.clock.now()

    outcome = rig.provision(service, intent())

    assert outcome.ok
    assert not outcome.dry_run
    launched = in_ec2(rig.server)
    assert len(launched) == 2
    expected = {
        tags.MANAGED: "true",
        tags.INCIDENT: INCIDENT,
        tags.HOST: HOST,
        tags.RULE: "mem",
        tags.PROFILE: "burst",
        tags.STEP: "2",
        tags.EXPIRES: tags.format_expires(t0 + TTL),
        "Name": f"gpuwarden-{INCIDENT}",
        "team": "ml",
    }
    for instance in launched:
        assert tags.tag_dict(instance["Tags"]) == expected
        assert instance["InstanceType"] == "g5.xlarge"
        assert instance["SubnetId"] == rig.server.subnet
    volumes = rig.server.client().describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": sorted(ids(launched))}]
    )["Volumes"]
    assert len(volumes) == 2
    for volume in volumes:
        assert tags.tag_dict(volume["Tags"]) == expected

    rows = service.store.for_step(INCIDENT, 2)
    assert {m.instance_id for m in rows} == ids(launched)
    for row in rows:
        assert (row.host, row.profile, row.rule, row.intent) == (HOST, "burst", "mem", intent().id)
        assert (row.launched_at, row.expires_at) == (t0, t0 + TTL)
        assert (row.hourly_usd, row.adopted, row.subnet) == (1.006, False, rig.server.subnet)
    for instance_id in ids(launched):
        assert instance_id in outcome.detail
    assert "$2.01/h" in outcome.detail
    assert tags.format_expires(t0 + TTL) in outcome.detail
    assert "not all" not in outcome.detail


def test_the_same_step_again_launches_nothing(rig: Rig) -> None:
    service = rig.service()
    first = rig.provision(service, intent())
    rig.clock.advance(90)  # a retry, a minute and a half later

    again = rig.provision(service, intent())

    [instance_id] = ids(in_ec2(rig.server))
    assert first.ok
    assert again.ok
    assert "already launched" in again.detail
    assert instance_id in again.detail
    assert len(rig.called("RunInstances")) == 1


def _fresh_file(rig: Rig) -> Path:
    return rig.tmp / "restarted" / "journal.db"


def _rows_deleted(rig: Rig) -> Path:
    conn = sqlite3.connect(rig.path)
    try:
        with conn:
            conn.execute("DELETE FROM instances")
    finally:
        conn.close()
    return rig.path


@pytest.mark.parametrize("journal", [_fresh_file, _rows_deleted], ids=["new-file", "rows-gone"])
def test_a_restart_that_lost_the_journal_finds_the_launch_by_its_tags(
    rig: Rig, journal: Callable[[Rig], Path]
) -> None:
    assert rig.provision(rig.service(), intent()).ok
    [instance_id] = ids(in_ec2(rig.server))
    restarted = rig.service(path=journal(rig))
    assert restarted.store.for_step(INCIDENT, 2) == []

    again = rig.provision(restarted, intent())

    assert again.ok
    assert "already launched" in again.detail
    assert instance_id in again.detail
    assert ids(in_ec2(rig.server)) == {instance_id}
    assert len(rig.called("RunInstances")) == 1
    [row] = restarted.store.for_step(INCIDENT, 2)  # and the journal knows it again
    assert row.instance_id == instance_id


def test_another_step_or_incident_launches_its_own(rig: Rig) -> None:
    service = rig.service()
    for step in (intent(INCIDENT, 2), intent(INCIDENT, 3), intent(OTHER, 2)):
        outcome = rig.provision(service, step)
        assert "launched 1 in" in outcome.detail, outcome.detail
    assert len(in_ec2(rig.server)) == 3


def test_the_same_incident_on_another_host_is_not_ours(rig: Rig) -> None:
    """Incident ids name a rule, a scope and a second, not a host: two hosts of a fleet hit by
    the same event fire the same id, and each must still get its own instances."""
    assert rig.provision(rig.service(host="gpu-b", path=rig.tmp / "b.db"), intent()).ok

    ours = rig.provision(rig.service(), intent())

    assert "already" not in ours.detail, ours.detail
    assert ours.ok
    assert len(in_ec2(rig.server, host=HOST)) == 1
    assert len(in_ec2(rig.server, host="gpu-b")) == 1
    tokens = [c["ClientToken"] for c in rig.called("RunInstances")]
    assert len(set(tokens)) == 2


# -- caps ---------------------------------------------------------------------------------------


def test_max_instances_counts_the_other_incidents(rig: Rig) -> None:
    service = rig.service({"burst": profile(rig.server, max_instances=2)})
    assert rig.provision(service, intent(INCIDENT), count=2).ok

    capped = rig.provision(service, intent(OTHER))

    assert not capped.ok
    assert not capped.recoverable
    assert "max_instances 2 reached" in capped.detail
    assert capped.detail.count("max_instances") == 1  # said once, not once per type
    assert len(in_ec2(rig.server)) == 2
    assert service.store.for_step(OTHER, 2) == []


def test_max_instances_counts_what_only_ec2_knows(rig: Rig) -> None:
    burst = {"burst": profile(rig.server, max_instances=2)}
    assert rig.provision(rig.service(burst), intent(INCIDENT), count=2).ok
    restarted = rig.service(burst, path=_fresh_file(rig))

    capped = rig.provision(restarted, intent(OTHER))

    assert not capped.ok
    assert "max_instances 2 reached" in capped.detail
    assert len(in_ec2(rig.server)) == 2


def test_max_hourly_usd_counts_the_other_incidents(rig: Rig) -> None:
    budget = profile(
        rig.server,
        max_instances=10,
        max_hourly_usd=2.5,
        prices={"g5.xlarge": 1.0, "g6.xlarge": 0.4},
    )
    service = rig.service({"burst": budget})
    assert rig.provision(service, intent(INCIDENT), count=2).ok  # 2.00/h

    cheaper = rig.provision(service, intent(OTHER))  # 0.50/h left: only a g6.xlarge fits
    broke = rig.provision(service, intent("20260101T001000Z-mem-gpu:2"))  # 0.10/h left

    assert cheaper.ok
    assert "$0.40/h" in cheaper.detail
    [row] = service.store.for_step(OTHER, 2)
    assert row.instance_type == "g6.xlarge"
    assert not broke.ok
    assert "max_hourly_usd 2.50" in broke.detail
    types = sorted(i["InstanceType"] for i in in_ec2(rig.server))
    assert types == ["g5.xlarge", "g5.xlarge", "g6.xlarge"]


def test_incidents_provisioning_from_eight_threads_never_exceed_max_instances(rig: Rig) -> None:
    service = rig.service({"burst": profile(rig.server, max_instances=3, count=2)})
    start = threading.Barrier(8)
    outcomes: list[Outcome] = []
    failures: list[BaseException] = []

    def fire(n: int) -> None:
        try:
            start.wait()
            outcomes.append(rig.provision(service, intent(f"20260101T00000{n}Z-mem-gpu:{n}")))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=fire, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert failures == []
    assert len(outcomes) == 8
    assert len(in_ec2(rig.server)) == 3
    assert len(service.store.live("burst")) == 3
    assert sum(1 for o in outcomes if o.ok) == 2  # 2, then 1 of 2, then nothing
    assert sum(1 for o in outcomes if "launched 1 of 2" in o.detail) == 1


# -- dry-run ------------------------------------------------------------------------------------


def test_a_dry_run_launches_nothing_and_says_what_it_would(rig: Rig) -> None:
    service = rig.service()

    outcome = rig.provision(service, intent(), dry_run=True)

    assert outcome.ok
    assert outcome.dry_run
    assert outcome.detail.startswith(
        f"would launch 1 x g5.xlarge (on-demand) in {REGION}/{rig.server.subnet} at $1.01/h"
    )
    assert in_ec2(rig.server, (*LIVE, "shutting-down", "terminated")) == []
    assert service.store.all() == []
    [call] = rig.called("RunInstances")
    assert call["DryRun"] is True


# -- the reaper ---------------------------------------------------------------------------------


def _launched(rig: Rig, service: CloudService) -> str:
    outcome = rig.provision(service, intent())
    assert outcome.ok, outcome.detail
    [row] = service.store.for_step(INCIDENT, 2)
    return row.instance_id


def test_the_reaper_waits_for_linger_after_the_incident_resolved(rig: Rig) -> None:
    service = rig.service()
    t0 = rig.clock.now()
    instance_id = _launched(rig, service)
    incident_opens(rig.path, INCIDENT, t0)

    assert reaper.reap(service, t0 + 4 * HOUR, dry_run=False) == []  # open: kept however long
    incident_opens(rig.path, INCIDENT, t0, resolved=t0 + 4 * HOUR)
    assert reaper.reap(service, t0 + 4 * HOUR + LINGER - 1, dry_run=False) == []
    assert state_of(rig.server, instance_id) in LIVE
    assert rig.called("TerminateInstances") == []

    [reaped] = reaper.reap(service, t0 + 4 * HOUR + LINGER, dry_run=False)

    assert (reaped.instance_id, reaped.profile, reaped.reason) == (instance_id, "burst", "linger")
    assert reaped.state in {"shutting-down", "terminated"}
    assert state_of(rig.server, instance_id) in {"shutting-down", "terminated"}
    row = service.store.get(instance_id)
    assert row is not None
    assert not row.live
    assert (row.end_reason, row.terminated_at) == ("linger", t0 + 4 * HOUR + LINGER)
    assert reaper.reap(service, t0 + 5 * HOUR, dry_run=False) == []  # once


def test_ttl_reaps_with_no_incident_resolved(rig: Rig) -> None:
    service = rig.service()
    t0 = rig.clock.now()
    instance_id = _launched(rig, service)
    incident_opens(rig.path, INCIDENT, t0)

    assert reaper.reap(service, t0 + TTL - 1, dry_run=False) == []
    [reaped] = reaper.reap(service, t0 + TTL, dry_run=False)

    assert (reaped.instance_id, reaped.reason) == (instance_id, "ttl")
    assert state_of(rig.server, instance_id) in {"shutting-down", "terminated"}
    row = service.store.get(instance_id)
    assert row is not None
    assert row.end_reason == "ttl"


def test_a_dry_run_reap_terminates_nothing(rig: Rig) -> None:
    service = rig.service()
    instance_id = _launched(rig, service)

    [would] = reaper.reap(service, rig.clock.now() + TTL, dry_run=True)

    assert (would.instance_id, would.reason, would.state) == (instance_id, "ttl", "would")
    [call] = rig.called("TerminateInstances")
    assert call["DryRun"] is True
    assert state_of(rig.server, instance_id) in LIVE
    assert [m.instance_id for m in service.store.live()] == [instance_id]


def test_an_instance_terminated_behind_our_back_is_marked_ended_not_terminated_again(
    rig: Rig,
) -> None:
    service = rig.service()
    instance_id = _launched(rig, service)
    rig.server.client().terminate_instances(InstanceIds=[instance_id])

    assert reaper.reap(service, rig.clock.now() + TTL, dry_run=False) == []

    assert rig.called("TerminateInstances") == []
    row = service.store.get(instance_id)
    assert row is not None
    assert not row.live
    assert row.state in {"shutting-down", "terminated"}
    assert row.end_reason == "external"


# -- reconcile after a restart ------------------------------------------------------------------


def test_a_restart_adopts_this_hosts_instances_and_reaps_them_past_their_expiry(rig: Rig) -> None:
    t0 = rig.clock.now()
    instance_id = _launched(rig, rig.service())
    restarted = rig.service(path=_fresh_file(rig))

    report = reaper.reconcile(restarted, t0 + HOUR)

    assert [line.split()[0] for line in report.adopted] == [instance_id]
    assert report.gone == report.foreign == report.errors == []
    row = restarted.store.get(instance_id)
    assert row is not None
    assert row.adopted
    assert row.live
    assert (row.incident, row.rule, row.step, row.host) == (INCIDENT, "mem", 2, HOST)
    assert row.expires_at == t0 + TTL  # from the tag, on gpuwarden's clock
    assert row.hourly_usd == 1.006
    assert reaper.reconcile(restarted, t0 + HOUR).lines() == []  # adopted once

    assert reaper.reap(restarted, t0 + TTL - 1, dry_run=False) == []
    [reaped] = reaper.reap(restarted, t0 + TTL, dry_run=False)
    assert (reaped.instance_id, reaped.reason) == (instance_id, "ttl")
    assert state_of(rig.server, instance_id) in {"shutting-down", "terminated"}


def test_journal_rows_ec2_does_not_know_are_marked_gone(rig: Rig) -> None:
    service = rig.service()
    t0 = rig.clock.now()
    ghost = Managed(
        instance_id="i-0123456789abcdef0",
        profile="burst",
        region=REGION,
        instance_type="g5.xlarge",
        market="on-demand",
        state="running",
        launched_at=t0 - HOUR,
        expires_at=t0 + TTL,
        host=HOST,
        incident=INCIDENT,
        step=2,
    )
    service.store.add(ghost, t0 - HOUR)

    report = reaper.reconcile(service, t0)

    assert report.gone == [f"{ghost.instance_id} (burst)"]
    row = service.store.get(ghost.instance_id)
    assert row is not None
    assert (row.state, row.end_reason, row.terminated_at) == (GONE, "gone", t0)
    assert service.store.live() == []


def test_reconcile_follows_an_instance_ended_outside(rig: Rig) -> None:
    service = rig.service()
    instance_id = _launched(rig, service)
    rig.server.client().terminate_instances(InstanceIds=[instance_id])

    report = reaper.reconcile(service, rig.clock.now() + 60)

    assert [line.split()[0] for line in report.updated] == [instance_id]
    row = service.store.get(instance_id)
    assert row is not None
    assert not row.live
    assert row.end_reason == "external"
    service.store.ended(instance_id, "shutting-down", rig.clock.now(), "external")
    reaper.reconcile(service, rig.clock.now() + 120)  # EC2 says terminated by now
    row = service.store.get(instance_id)
    assert row is not None
    assert row.state == state_of(rig.server, instance_id)


def test_another_hosts_instances_are_never_touched(rig: Rig) -> None:
    theirs = _launched(rig, rig.service(host="gpu-b", path=rig.tmp / "b.db"))
    ours = rig.service()

    report = reaper.reconcile(ours, rig.clock.now())
    reaped = reaper.reap(ours, rig.clock.now() + 10 * TTL, dry_run=False)

    assert report.lines() == []
    assert reaped == []
    assert ours.store.all() == []
    assert rig.called("TerminateInstances") == []
    assert state_of(rig.server, theirs) in LIVE


def test_a_profile_no_longer_configured_is_reported(rig: Rig) -> None:
    both = {"burst": profile(rig.server), "old": profile(rig.server)}
    before = rig.service(both)
    outcome = rig.provision(before, intent(), name="old")
    assert outcome.ok, outcome.detail
    [instance_id] = ids(in_ec2(rig.server))
    after = rig.service({"burst": profile(rig.server)}, path=_fresh_file(rig))

    report = reaper.reconcile(after, rig.clock.now())

    assert report.foreign == [f"{instance_id} (profile old)"]
    assert report.adopted == []
    assert after.store.all() == []
    assert reaper.reap(after, rig.clock.now() + 10 * TTL, dry_run=False) == []
    assert state_of(rig.server, instance_id) in LIVE


def test_two_profiles_in_one_region_each_adopt_their_own(rig: Rig) -> None:
    both = {"big": profile(rig.server), "burst": profile(rig.server)}
    before = rig.service(both)
    for name, step in (("big", intent(INCIDENT)), ("burst", intent(OTHER))):
        assert rig.provision(before, step, name=name).ok
    launched = {m.instance_id: m.profile for m in before.store.all()}
    restarted = rig.service(both, path=_fresh_file(rig))

    report = reaper.reconcile(restarted, rig.clock.now())

    assert len(report.adopted) == 2, report.lines()
    assert {m.instance_id: m.profile for m in restarted.store.all()} == launched
    assert sorted(launched.values()) == ["big", "burst"]


# -- on botocore's Stubber: what moto does not do -----------------------------------------------


@pytest.fixture
def stubbed() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.session.Session().client(
        "ec2",
        region_name=REGION,
        aws_access_key_id="AKIAEXAMPLEEXAMPLE12",
        aws_secret_access_key="not-a-real-secret",
    )
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


@dataclass
class Stubbed:
    """Services on one stubbed client; each ``run_instances`` call's parameters are kept."""

    client: Any
    stubber: Stubber
    tmp: Path
    clock: SimClock = field(default_factory=SimClock)
    launches: list[dict[str, Any]] = field(default_factory=list)
    stores: list[InstanceStore] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client.meta.events.register(
            "provide-client-params.ec2.RunInstances",
            lambda params, **_: self.launches.append(dict(params)),
        )

    def service(self, p: CloudProfile | None = None, *, host: str = HOST) -> CloudService:
        """A service on a journal file of its own (a restart that lost the journal)."""
        store = InstanceStore.open(self.tmp / f"journal-{len(self.stores)}.db")
        self.stores.append(store)
        connect = lambda _: Ec2(self.client, REGION)  # noqa: E731
        return CloudService(
            Cloud(profiles={"burst": p or profile()}), store, host=host, connect=connect
        )

    def nothing_there(self) -> None:
        """The two looks before a launch: this step's instances, then the host's."""
        for _ in range(2):
            self.stubber.add_response("describe_instances", {"Reservations": []})

    def launches_ok(self, instance_id: str = "i-0a", instance_type: str = "g5.xlarge") -> None:
        self.stubber.add_response(
            "run_instances",
            {
                "Instances": [
                    {
                        "InstanceId": instance_id,
                        "InstanceType": instance_type,
                        "State": {"Code": 0, "Name": "pending"},
                    }
                ]
            },
        )

    def fails(self, code: str, message: str = "no") -> None:
        self.stubber.add_client_error(
            "run_instances", service_error_code=code, service_message=message, http_status_code=400
        )

    def provision(self, service: CloudService, step: Intent, *, cancel: bool = False) -> Outcome:
        ctx = Context(dry_run=False, clock=self.clock)
        if cancel:
            ctx.cancel.set()
        return service.provision(
            step, "burst", None, dry_run=False, now=self.clock.now(), waiter=ctx
        )


@pytest.fixture
def stub(stubbed: tuple[Any, Stubber], tmp_path: Path) -> Iterator[Stubbed]:
    made = Stubbed(*stubbed, tmp_path)
    yield made
    for store in made.stores:
        store.close()


def test_the_client_token_is_the_same_for_one_step_and_differs_otherwise(stub: Stubbed) -> None:
    runs = [
        (HOST, intent(INCIDENT, 2)),
        (HOST, intent(INCIDENT, 2)),  # the same step after a restart
        (HOST, intent(INCIDENT, 3)),
        (HOST, intent(OTHER, 2)),
        ("gpu-b", intent(INCIDENT, 2)),
    ]
    for n, (host, step) in enumerate(runs):
        stub.nothing_there()
        stub.launches_ok(f"i-0{n}")
        assert stub.provision(stub.service(host=host), step).ok

    tokens = [launch["ClientToken"] for launch in stub.launches]
    assert tokens[0] == tokens[1]
    assert len(set(tokens)) == 4
    assert all(t.isascii() and len(t) <= 64 for t in tokens)


def test_no_capacity_falls_back_to_the_next_subnet_then_the_next_type(stub: Stubbed) -> None:
    service = stub.service(profile(subnets=("subnet-0a", "subnet-0b")))
    stub.nothing_there()
    stub.fails("InsufficientInstanceCapacity", "We currently do not have sufficient capacity")
    stub.fails("InsufficientInstanceCapacity", "We currently do not have sufficient capacity")
    stub.launches_ok("i-0c", "g6.xlarge")

    outcome = stub.provision(service, intent())

    tried = [(launch["InstanceType"], launch["SubnetId"]) for launch in stub.launches]
    assert tried == [
        ("g5.xlarge", "subnet-0a"),
        ("g5.xlarge", "subnet-0b"),
        ("g6.xlarge", "subnet-0a"),
    ]
    assert len({launch["ClientToken"] for launch in stub.launches}) == 3
    assert outcome.ok
    assert "i-0c" in outcome.detail
    assert "$0.81/h" in outcome.detail
    assert "not all" not in outcome.detail
    assert "InsufficientInstanceCapacity" in outcome.detail  # what was tried first
    [row] = service.store.all()
    assert (row.instance_id, row.instance_type, row.subnet) == ("i-0c", "g6.xlarge", "subnet-0a")


def test_no_capacity_anywhere_launches_nothing(stub: Stubbed) -> None:
    service = stub.service()
    stub.nothing_there()
    stub.fails("InsufficientInstanceCapacity")
    stub.fails("Unsupported")

    outcome = stub.provision(service, intent())

    assert not outcome.ok
    assert "InsufficientInstanceCapacity" in outcome.detail
    assert "Unsupported" in outcome.detail
    assert service.store.all() == []


def test_throttling_is_retried_with_backoff_then_succeeds(stub: Stubbed) -> None:
    service = stub.service()
    t0 = stub.clock.now()
    stub.nothing_there()
    stub.fails("RequestLimitExceeded", "Request limit exceeded.")
    stub.fails("RequestLimitExceeded", "Request limit exceeded.")
    stub.launches_ok("i-0d")

    outcome = stub.provision(service, intent())

    assert outcome.ok
    assert "i-0d" in outcome.detail
    waited = stub.clock.now() - t0
    assert 0.5 / 2 + 1.0 / 2 <= waited <= 0.5 + 1.0  # two waits, 0.5 s then 1 s, jittered
    assert len({launch["ClientToken"] for launch in stub.launches}) == 1  # the same launch


def test_a_cancelled_wait_stops_the_retries(stub: Stubbed) -> None:
    service = stub.service()
    t0 = stub.clock.now()
    stub.nothing_there()
    stub.fails("RequestLimitExceeded")

    outcome = stub.provision(service, intent(), cancel=True)

    assert not outcome.ok
    assert outcome.recoverable
    assert "RequestLimitExceeded" in outcome.detail
    assert stub.clock.now() == t0
    assert len(stub.launches) == 1
    assert service.store.all() == []


def test_unauthorized_fails_and_is_not_recoverable(stub: Stubbed) -> None:
    service = stub.service()
    stub.nothing_there()
    stub.fails(
        "UnauthorizedOperation",
        "You are not authorized to perform this operation. AKIAEXAMPLEEXAMPLE12",
    )

    outcome = stub.provision(service, intent())

    assert not outcome.ok
    assert not outcome.recoverable
    assert "UnauthorizedOperation" in outcome.detail
    assert "AKIAEXAMPLEEXAMPLE12" not in outcome.detail
    assert service.store.all() == []


def test_an_unauthorized_dry_run_is_not_ok(stub: Stubbed) -> None:
    service = stub.service()
    stub.nothing_there()
    stub.fails("UnauthorizedOperation", "You are not authorized to perform this operation.")
    ctx = Context(dry_run=True, clock=stub.clock)

    outcome = service.provision(intent(), "burst", None, dry_run=True, now=0.0, waiter=ctx)

    assert not outcome.ok
    assert outcome.dry_run
    assert not outcome.recoverable
    assert "UnauthorizedOperation" in outcome.detail
    assert stub.launches[0]["DryRun"] is True


def test_when_ec2_cannot_be_asked_nothing_is_launched(stub: Stubbed) -> None:
    service = stub.service()
    stub.stubber.add_client_error(
        "describe_instances", service_error_code="Unavailable", http_status_code=503
    )

    outcome = stub.provision(service, intent())

    assert not outcome.ok
    assert outcome.recoverable
    assert stub.launches == []


def test_a_terminate_answer_without_a_state_is_recorded_as_shutting_down(stub: Stubbed) -> None:
    service = stub.service()
    t0 = stub.clock.now()
    row = Managed(
        instance_id="i-0e",
        profile="burst",
        region=REGION,
        instance_type="g5.xlarge",
        market="on-demand",
        state="running",
        launched_at=t0,
        expires_at=t0 + TTL,
        host=HOST,
        incident=INCIDENT,
        step=2,
    )
    service.store.add(row, t0)
    described = {
        "InstanceId": "i-0e",
        "InstanceType": "g5.xlarge",
        "State": {"Code": 16, "Name": "running"},
        "Tags": [{"Key": tags.MANAGED, "Value": "true"}, {"Key": tags.HOST, "Value": HOST}],
    }
    stub.stubber.add_response("describe_instances", {"Reservations": [{"Instances": [described]}]})
    stub.stubber.add_response(
        "terminate_instances",
        {"TerminatingInstances": [{"InstanceId": "i-0e"}]},  # no CurrentState
        {"InstanceIds": ["i-0e"], "DryRun": False},
    )

    [reaped] = reaper.reap(service, t0 + TTL, dry_run=False)

    assert (reaped.instance_id, reaped.reason, reaped.state) == ("i-0e", "ttl", "shutting-down")
    ended = service.store.get("i-0e")
    assert ended is not None
    assert (ended.state, ended.end_reason, ended.terminated_at) == (
        "shutting-down",
        "ttl",
        t0 + TTL,
    )


def test_a_reconcile_round_rides_out_throttling(stub: Stubbed) -> None:
    """The describe of a reconcile round is retried while EC2 throttles, not given up on."""
    service = stub.service()
    stub.stubber.add_client_error(
        "describe_instances",
        service_error_code="RequestLimitExceeded",
        service_message="Request limit exceeded.",
        http_status_code=503,
    )
    stub.stubber.add_response(
        "describe_instances",
        {
            "Reservations": [
                {
                    "Instances": [
                        {
                            "InstanceId": "i-0f",
                            "InstanceType": "g5.xlarge",
                            "State": {"Code": 16, "Name": "running"},
                            "Tags": [
                                {"Key": tags.MANAGED, "Value": "true"},
                                {"Key": tags.HOST, "Value": HOST},
                                {"Key": tags.PROFILE, "Value": "burst"},
                                {"Key": tags.INCIDENT, "Value": INCIDENT},
                            ],
                        }
                    ]
                }
            ]
        },
    )

    report = reaper.reconcile(service, stub.clock.now())

    assert report.errors == []
    assert report.adopted == ["i-0f (g5.xlarge, running)"]
    adopted = service.store.get("i-0f")
    assert adopted is not None
    assert adopted.incident == INCIDENT
