"""The EC2 adapter against a real EC2 API (moto on 127.0.0.1) and, for what moto cannot do
(ClientToken, capacity and throttling errors, paging tokens), against botocore's Stubber."""

from __future__ import annotations

import functools
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from gpuwarden.cloud import tags
from gpuwarden.cloud.ec2 import CloudError, Ec2, LaunchRequest, connect, with_backoff
from gpuwarden.cloud.instance import ENDED_STATES
from gpuwarden.config import CloudProfile
from tests.cloud_server import (  # noqa: F401
    REGION,
    MotoEc2,
    fixture_aws_env,
    fixture_fresh_ec2,
    fixture_moto_ec2,
)

ROOT = Path(__file__).resolve().parents[1]


def our_tags(
    *, host: str = "gpu-a", profile: str = "burst", incident: str = "inc-1", step: int = 2
) -> dict[str, str]:
    return {
        tags.MANAGED: "true",
        tags.HOST: host,
        tags.PROFILE: profile,
        tags.INCIDENT: incident,
        tags.STEP: str(step),
        tags.EXPIRES: "2026-11-30T08:00:00Z",
        "team": "ml",
    }


def request(server: MotoEc2 | None = None, **overrides: Any) -> LaunchRequest:
    fields: dict[str, Any] = {
        "instance_type": "g5.xlarge",
        "count": 1,
        "client_token": "gpuwarden-inc-1-2-a",
        "tags": our_tags(),
        "image_id": server.ami if server else "ami-0123456789abcdef0",
        "subnet": server.subnet if server else None,
    }
    fields.update(overrides)
    return LaunchRequest(**fields)


def ec2_on(server: MotoEc2, **kwargs: Any) -> Ec2:
    return Ec2(server.client(), server.region, **kwargs)


def all_instances(server: MotoEc2) -> list[dict[str, Any]]:
    pages = server.client().describe_instances()["Reservations"]
    return [i for r in pages for i in r["Instances"]]


# --- against the moto server ---------------------------------------------------------------


def test_launch_tags_the_instances_and_their_volumes(fresh_ec2: MotoEc2) -> None:
    ec2 = ec2_on(fresh_ec2)
    before = time.time()
    seen = ec2.launch(request(fresh_ec2, count=2), dry_run=False)

    assert len(seen) == 2
    assert len({s.instance_id for s in seen}) == 2
    for s in seen:
        assert s.instance_type == "g5.xlarge"
        assert s.state in {"pending", "running"}
        assert s.tags == our_tags()
        assert s.subnet == fresh_ec2.subnet
        assert s.launch_time is not None
        assert before - 5 <= s.launch_time <= time.time() + 5
    volumes = fresh_ec2.client().describe_volumes(
        Filters=[{"Name": f"tag:{tags.INCIDENT}", "Values": ["inc-1"]}]
    )["Volumes"]
    assert sorted(a["InstanceId"] for v in volumes for a in v["Attachments"]) == sorted(
        s.instance_id for s in seen
    )
    for volume in volumes:
        assert tags.tag_dict(volume["Tags"]) == our_tags()


def test_spot_launch_asks_for_one_time_spot(fresh_ec2: MotoEc2) -> None:
    seen = ec2_on(fresh_ec2).launch(request(fresh_ec2, market="spot"), dry_run=False)
    [instance] = all_instances(fresh_ec2)
    assert instance["InstanceId"] == seen[0].instance_id
    assert instance["InstanceLifecycle"] == "spot"


def test_on_demand_launch_is_not_spot(fresh_ec2: MotoEc2) -> None:
    ec2_on(fresh_ec2).launch(request(fresh_ec2), dry_run=False)
    [instance] = all_instances(fresh_ec2)
    assert "InstanceLifecycle" not in instance


def test_security_groups_and_gpu_types(fresh_ec2: MotoEc2) -> None:
    ec2 = ec2_on(fresh_ec2)
    sg = (fresh_ec2.security_group,)
    ec2.launch(request(fresh_ec2, instance_type="p4d.24xlarge", security_groups=sg), dry_run=False)
    [instance] = all_instances(fresh_ec2)
    assert instance["InstanceType"] == "p4d.24xlarge"
    assert [g["GroupId"] for g in instance["SecurityGroups"]] == [fresh_ec2.security_group]


def test_launch_template_by_name_and_by_id(fresh_ec2: MotoEc2) -> None:
    made = fresh_ec2.client().create_launch_template(
        LaunchTemplateName="gpu-burst", LaunchTemplateData={"ImageId": fresh_ec2.ami}
    )["LaunchTemplate"]
    ec2 = ec2_on(fresh_ec2)
    by_name = ec2.launch(
        request(fresh_ec2, image_id=None, launch_template="gpu-burst"), dry_run=False
    )
    by_id = ec2.launch(
        request(fresh_ec2, image_id=None, launch_template=made["LaunchTemplateId"]), dry_run=False
    )
    images = {i["InstanceId"]: i["ImageId"] for i in all_instances(fresh_ec2)}
    assert images == {by_name[0].instance_id: fresh_ec2.ami, by_id[0].instance_id: fresh_ec2.ami}


def test_unknown_launch_template_is_invalid(fresh_ec2: MotoEc2) -> None:
    with pytest.raises(CloudError) as caught:
        ec2_on(fresh_ec2).launch(
            request(fresh_ec2, image_id=None, launch_template="no-such"), dry_run=False
        )
    assert caught.value.kind == "invalid"
    assert caught.value.code.startswith("InvalidLaunchTemplateName.")


def test_managed_finds_exactly_ours_and_filters_by_tag(fresh_ec2: MotoEc2) -> None:
    ec2 = ec2_on(fresh_ec2)
    a = ec2.launch(request(fresh_ec2), dry_run=False)[0].instance_id
    b = ec2.launch(request(fresh_ec2, tags=our_tags(host="gpu-b")), dry_run=False)[0].instance_id
    c = ec2.launch(request(fresh_ec2, tags=our_tags(profile="big")), dry_run=False)[0].instance_id
    d = ec2.launch(request(fresh_ec2, tags=our_tags(incident="inc-2")), dry_run=False)
    e = ec2.launch(request(fresh_ec2, tags=our_tags(step=3)), dry_run=False)[0].instance_id
    # Not ours: no tags, and a managed tag that is not "true".
    ec2.launch(request(fresh_ec2, tags={}), dry_run=False)
    ec2.launch(request(fresh_ec2, tags={**our_tags(), tags.MANAGED: "false"}), dry_run=False)

    def ids(**filters: Any) -> set[str]:
        return {s.instance_id for s in ec2.managed(**filters)}

    assert ids() == {a, b, c, d[0].instance_id, e}
    assert ids(host="gpu-b") == {b}
    assert ids(host="gpu-a") == {a, c, d[0].instance_id, e}
    assert ids(profile="big") == {c}
    assert ids(incident="inc-2") == {d[0].instance_id}
    assert ids(incident="inc-1", step=3) == {e}
    assert ids(host="gpu-a", profile="burst", incident="inc-1", step=2) == {a}
    assert ids(host="nowhere") == set()


def test_terminate_ends_the_instance(fresh_ec2: MotoEc2) -> None:
    ec2 = ec2_on(fresh_ec2)
    keep, end = (s.instance_id for s in ec2.launch(request(fresh_ec2, count=2), dry_run=False))

    states = ec2.terminate([end], dry_run=False)

    assert states in ({end: "shutting-down"}, {end: "terminated"})
    assert {s.instance_id for s in ec2.managed()} == {keep}
    assert {s.instance_id for s in ec2.managed(states=ENDED_STATES)} == {end}


def test_terminate_nothing_calls_nothing(fresh_ec2: MotoEc2) -> None:
    assert ec2_on(fresh_ec2).terminate([], dry_run=False) == {}


def test_terminate_unknown_instance_is_invalid(fresh_ec2: MotoEc2) -> None:
    with pytest.raises(CloudError) as caught:
        ec2_on(fresh_ec2).terminate(["i-0123456789abcdef0"], dry_run=False)
    assert caught.value.kind == "invalid"
    assert caught.value.code == "InvalidInstanceID.NotFound"


def test_dry_run_launch_launches_nothing(fresh_ec2: MotoEc2) -> None:
    assert ec2_on(fresh_ec2).launch(request(fresh_ec2, count=3), dry_run=True) == []
    assert all_instances(fresh_ec2) == []


def test_dry_run_terminate_leaves_the_instance_running(fresh_ec2: MotoEc2) -> None:
    ec2 = ec2_on(fresh_ec2)
    [seen] = ec2.launch(request(fresh_ec2), dry_run=False)
    assert ec2.terminate([seen.instance_id], dry_run=True) == {}
    assert [s.instance_id for s in ec2.managed()] == [seen.instance_id]


def test_managed_pages_through_every_reservation(fresh_ec2: MotoEc2) -> None:
    ec2 = ec2_on(fresh_ec2, page_size=5)
    launched = {
        ec2.launch(request(fresh_ec2, client_token=f"t-{n}"), dry_run=False)[0].instance_id
        for n in range(12)
    }
    first_page = fresh_ec2.client().describe_instances(MaxResults=5)
    assert first_page.get("NextToken")  # the server really pages at this size
    assert {s.instance_id for s in ec2.managed()} == launched


def test_unknown_subnet_is_invalid(fresh_ec2: MotoEc2) -> None:
    with pytest.raises(CloudError) as caught:
        ec2_on(fresh_ec2).launch(request(fresh_ec2, subnet="subnet-00000000"), dry_run=False)
    assert caught.value.kind == "invalid"
    assert caught.value.code == "InvalidSubnetID.NotFound"


# --- connect() ------------------------------------------------------------------------------


def profile(**overrides: Any) -> CloudProfile:
    fields: dict[str, Any] = {
        "region": REGION,
        "instance_types": ("g5.xlarge",),
        "ami": "ami-0123456789abcdef0",
    }
    fields.update(overrides)
    return CloudProfile(**fields)


def test_connect_uses_the_profile_endpoint(fresh_ec2: MotoEc2) -> None:
    ec2 = connect(profile(endpoint_url=fresh_ec2.endpoint_url))
    assert ec2.region == REGION
    [seen] = ec2.launch(request(fresh_ec2), dry_run=False)
    assert [i["InstanceId"] for i in all_instances(fresh_ec2)] == [seen.instance_id]


def test_connect_without_credentials_says_what_to_do(
    aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(CloudError) as caught:
        connect(profile(endpoint_url="http://127.0.0.1:9"))
    assert caught.value.kind == "unavailable"
    message = str(caught.value)
    assert "no AWS credentials" in message
    assert "AWS_PROFILE" in message
    assert "instance role" in message
    assert "\n" not in message


def test_connect_with_an_unknown_aws_profile_is_unavailable(
    aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    with pytest.raises(CloudError) as caught:
        connect(profile())
    assert caught.value.kind == "unavailable"
    assert "no-such-profile" in str(caught.value)


def test_unreachable_endpoint_is_unavailable(aws_env: None) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ec2 = connect(profile(endpoint_url=f"http://127.0.0.1:{port}"))
    with pytest.raises(CloudError) as caught:
        ec2.managed()
    assert caught.value.kind == "unavailable"
    assert caught.value.code == ""
    assert "cannot reach EC2" in str(caught.value)


def test_importing_the_adapter_does_not_import_boto3() -> None:
    probe = (
        "import sys, gpuwarden.cloud.ec2, gpuwarden.cloud.tags, gpuwarden.config\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "[]"


# --- against botocore's Stubber --------------------------------------------------------------


@functools.cache
def stub_session() -> Any:
    return boto3.session.Session()  # one model loader for every stubbed client


@pytest.fixture
def stubbed() -> Any:
    client = stub_session().client(
        "ec2",
        region_name=REGION,
        aws_access_key_id="AKIAEXAMPLEEXAMPLE12",
        aws_secret_access_key="not-a-real-secret",
    )
    with Stubber(client) as stubber:
        yield Ec2(client, REGION), stubber
        stubber.assert_no_pending_responses()


def instance_doc(instance_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "InstanceId": instance_id,
        "InstanceType": "g5.xlarge",
        "State": {"Code": 0, "Name": "pending"},
        **extra,
    }


def test_run_instances_parameters(stubbed: Any) -> None:
    ec2, stubber = stubbed
    full = request(
        count=2,
        client_token="gpuwarden-inc-7-1-g5.xlarge",
        image_id=None,
        launch_template="lt-0abc",
        subnet="subnet-1",
        security_groups=("sg-1", "sg-2"),
        key_name="ops",
        market="spot",
        user_data="#!/bin/sh\necho ready\n",
    )
    tag_list = [{"Key": k, "Value": v} for k, v in our_tags().items()]
    stubber.add_response(
        "run_instances",
        {"Instances": [instance_doc("i-1", SubnetId="subnet-1"), instance_doc("i-2")]},
        {
            "DryRun": False,
            "InstanceType": "g5.xlarge",
            "MinCount": 2,
            "MaxCount": 2,
            "ClientToken": "gpuwarden-inc-7-1-g5.xlarge",
            "LaunchTemplate": {"LaunchTemplateId": "lt-0abc", "Version": "$Default"},
            "SubnetId": "subnet-1",
            "SecurityGroupIds": ["sg-1", "sg-2"],
            "KeyName": "ops",
            "UserData": "#!/bin/sh\necho ready\n",
            "InstanceMarketOptions": {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            },
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tag_list},
                {"ResourceType": "volume", "Tags": tag_list},
            ],
        },
    )
    seen = ec2.launch(full, dry_run=False)
    assert [(s.instance_id, s.subnet, s.launch_time, s.tags) for s in seen] == [
        ("i-1", "subnet-1", None, {}),
        ("i-2", None, None, {}),
    ]


def test_launch_template_name_and_plain_ami(stubbed: Any) -> None:
    ec2, stubber = stubbed
    base = {"InstanceType": "g5.xlarge", "MinCount": 1, "MaxCount": 1, "ClientToken": "tok"}
    tag_list = [{"Key": "k", "Value": "v"}]
    spec = [
        {"ResourceType": "instance", "Tags": tag_list},
        {"ResourceType": "volume", "Tags": tag_list},
    ]
    stubber.add_client_error(
        "run_instances",
        "DryRunOperation",
        http_status_code=412,
        expected_params={
            **base,
            "DryRun": True,
            "LaunchTemplate": {"LaunchTemplateName": "gpu-burst", "Version": "$Default"},
            "TagSpecifications": spec,
        },
    )
    stubber.add_client_error(
        "run_instances",
        "DryRunOperation",
        http_status_code=412,
        expected_params={**base, "DryRun": True, "ImageId": "ami-1", "TagSpecifications": spec},
    )
    named = request(client_token="tok", tags={"k": "v"}, image_id=None, launch_template="gpu-burst")
    plain = request(client_token="tok", tags={"k": "v"}, image_id="ami-1")
    assert ec2.launch(named, dry_run=True) == []
    assert ec2.launch(plain, dry_run=True) == []


def test_launch_needs_an_ami_or_a_template(stubbed: Any) -> None:
    ec2, _ = stubbed  # no response queued: any call would fail the test
    with pytest.raises(CloudError) as caught:
        ec2.launch(request(image_id=None, launch_template=None), dry_run=True)
    assert caught.value.kind == "invalid"
    assert "ami or a launch_template" in str(caught.value)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("InsufficientInstanceCapacity", "capacity"),
        ("InsufficientCapacity", "capacity"),
        ("InstanceLimitExceeded", "capacity"),
        ("MaxSpotInstanceCountExceeded", "capacity"),
        ("SpotMaxPriceTooLow", "capacity"),
        ("Unsupported", "capacity"),
        ("RequestLimitExceeded", "throttled"),
        ("Throttling", "throttled"),
        ("ThrottlingException", "throttled"),
        ("UnauthorizedOperation", "denied"),
        ("AuthFailure", "denied"),
        ("AccessDenied", "denied"),
        ("InvalidClientTokenId", "denied"),
        ("OptInRequired", "denied"),
        ("InvalidParameterValue", "invalid"),
        ("InvalidAMIID.NotFound", "invalid"),
        ("InvalidAMIID.Malformed", "invalid"),
        ("InvalidSubnetID.NotFound", "invalid"),
        ("InvalidGroup.NotFound", "invalid"),
        ("InvalidKeyPair.NotFound", "invalid"),
        ("IdempotentParameterMismatch", "invalid"),
        ("InternalError", "unavailable"),
        ("SomethingNew", "other"),
    ],
)
def test_error_code_kinds(stubbed: Any, code: str, kind: str) -> None:
    ec2, stubber = stubbed
    stubber.add_client_error("run_instances", code, "what EC2 said", http_status_code=400)
    with pytest.raises(CloudError) as caught:
        ec2.launch(request(), dry_run=False)
    assert (caught.value.kind, caught.value.code) == (kind, code)
    assert str(caught.value) == f"run_instances: {code}: what EC2 said"


def test_dry_run_operation_outside_dry_run_is_not_swallowed(stubbed: Any) -> None:
    ec2, stubber = stubbed
    stubber.add_client_error("terminate_instances", "DryRunOperation", http_status_code=412)
    with pytest.raises(CloudError) as caught:
        ec2.terminate(["i-1"], dry_run=False)
    assert caught.value.kind == "dry_run_ok"


def test_denied_dry_run_is_an_error(stubbed: Any) -> None:
    ec2, stubber = stubbed
    stubber.add_client_error("terminate_instances", "UnauthorizedOperation", http_status_code=403)
    with pytest.raises(CloudError) as caught:
        ec2.terminate(["i-1"], dry_run=True)
    assert caught.value.kind == "denied"


def test_error_messages_are_one_line_without_credentials(stubbed: Any) -> None:
    ec2, stubber = stubbed
    said = (
        "You are not authorized.\nKey AKIAIOSFODNN7EXAMPLE, Signature=abcdef0123456789 "
        "X-Amz-Security-Token=FQoGZXIvYXdzEXAMPLE Encoded authorization failure message: "
        "Zm9vYmFyYmF6cXV4" + "x" * 500
    )
    said = "via https://admin:hunter2@proxy.example:3128 " + said
    stubber.add_client_error("run_instances", "UnauthorizedOperation", said, 403)
    with pytest.raises(CloudError) as caught:
        ec2.launch(request(), dry_run=False)
    message = str(caught.value)
    assert "\n" not in message
    for secret in (
        "AKIAIOSFODNN7EXAMPLE",
        "abcdef0123456789",
        "FQoGZXIvYXdzEXAMPLE",
        "Zm9vYmFy",
        "hunter2",
    ):
        assert secret not in message
    assert "<access-key-id>" in message
    assert "decode-authorization-message" in message
    assert len(message) <= 300


def test_managed_follows_next_token(stubbed: Any) -> None:
    ec2, stubber = stubbed
    filters = [
        {"Name": f"tag:{tags.MANAGED}", "Values": ["true"]},
        {"Name": f"tag:{tags.PROFILE}", "Values": ["burst"]},
        {"Name": "instance-state-name", "Values": ["running"]},
    ]
    stubber.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": [instance_doc("i-1")]}], "NextToken": "page-2"},
        {"Filters": filters, "MaxResults": 1000},
    )
    stubber.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": [instance_doc("i-2"), instance_doc("i-3")]}]},
        {"Filters": filters, "MaxResults": 1000, "NextToken": "page-2"},
    )
    found = ec2.managed(profile="burst", states=("running",))
    assert [s.instance_id for s in found] == ["i-1", "i-2", "i-3"]


def test_managed_stops_when_a_token_repeats(stubbed: Any) -> None:
    ec2, stubber = stubbed
    page = {"Reservations": [{"Instances": [instance_doc("i-1")]}], "NextToken": "again"}
    stubber.add_response("describe_instances", page)
    stubber.add_response("describe_instances", page)
    with pytest.raises(CloudError) as caught:
        ec2.managed()
    assert caught.value.kind == "other"
    assert "NextToken" in str(caught.value)


def test_managed_in_no_state_asks_nothing(stubbed: Any) -> None:
    ec2, _ = stubbed  # no response queued: any call would fail the test
    assert ec2.managed(states=()) == []


def test_terminate_reports_each_new_state(stubbed: Any) -> None:
    ec2, stubber = stubbed
    stubber.add_response(
        "terminate_instances",
        {
            "TerminatingInstances": [
                {"InstanceId": "i-1", "CurrentState": {"Code": 32, "Name": "shutting-down"}},
                {"InstanceId": "i-2", "CurrentState": {"Code": 48, "Name": "terminated"}},
            ]
        },
        {"InstanceIds": ["i-1", "i-2"], "DryRun": False},
    )
    assert ec2.terminate(["i-1", "i-2"], dry_run=False) == {
        "i-1": "shutting-down",
        "i-2": "terminated",
    }


# --- with_backoff ---------------------------------------------------------------------------


class Sleeps:
    """Records the waits; answers False (cancelled) from the ``cancel_at``-th wait on."""

    def __init__(self, cancel_at: int | None = None) -> None:
        self.waits: list[float] = []
        self.cancel_at = cancel_at

    def __call__(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return self.cancel_at is None or len(self.waits) < self.cancel_at


def test_backoff_retries_throttling_then_succeeds(stubbed: Any) -> None:
    ec2, stubber = stubbed
    for _ in range(2):
        stubber.add_client_error("run_instances", "RequestLimitExceeded", http_status_code=503)
    stubber.add_response("run_instances", {"Instances": [instance_doc("i-9")]})
    sleeps = Sleeps()

    seen = with_backoff(lambda: ec2.launch(request(), dry_run=False), sleep=sleeps, base=0.5)

    assert [s.instance_id for s in seen] == ["i-9"]
    assert len(sleeps.waits) == 2
    assert 0.25 <= sleeps.waits[0] <= 0.5
    assert 0.5 <= sleeps.waits[1] <= 1.0


def test_backoff_gives_up_after_attempts() -> None:
    calls: list[int] = []

    def throttled() -> None:
        calls.append(1)
        raise CloudError("throttled", f"call {len(calls)}", code="Throttling")

    sleeps = Sleeps()
    with pytest.raises(CloudError) as caught:
        with_backoff(throttled, sleep=sleeps, attempts=4, base=1.0, cap=3.0)
    assert len(calls) == 4
    assert str(caught.value) == "call 4"
    assert len(sleeps.waits) == 3
    assert all(w <= 3.0 for w in sleeps.waits)
    assert sleeps.waits[2] >= 1.5  # capped at 3, jittered down by at most half


def test_backoff_stops_when_the_wait_is_cancelled() -> None:
    calls: list[int] = []

    def throttled() -> None:
        calls.append(1)
        raise CloudError("throttled", f"call {len(calls)}", code="RequestLimitExceeded")

    with pytest.raises(CloudError) as caught:
        with_backoff(throttled, sleep=Sleeps(cancel_at=2), attempts=5)
    assert len(calls) == 2
    assert str(caught.value) == "call 2"


@pytest.mark.parametrize("kind", ["capacity", "denied", "invalid", "unavailable"])
def test_backoff_never_retries_other_kinds(kind: str) -> None:
    calls: list[int] = []

    def fails() -> None:
        calls.append(1)
        raise CloudError(kind, "no")

    sleeps = Sleeps()
    with pytest.raises(CloudError):
        with_backoff(fails, sleep=sleeps)
    assert calls == [1]
    assert sleeps.waits == []


def test_backoff_returns_the_first_success_without_waiting() -> None:
    sleeps = Sleeps()
    assert with_backoff(lambda: 42, sleep=sleeps) == 42
    assert sleeps.waits == []


def test_cloud_error_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown cloud error kind"):
        CloudError("oops", "message")
