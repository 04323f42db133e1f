"""A real EC2 API on 127.0.0.1 for the cloud tests: one moto server per test session.

Import all three fixtures where any is needed (pytest looks a fixture's own fixtures up in
the test's module). Each is registered under its name without ``fixture_``, so a test's
parameter does not shadow the import::

    from tests.cloud_server import (  # noqa: F401
        fixture_aws_env,
        fixture_fresh_ec2,
        fixture_moto_ec2,
    )

``moto_ec2`` (session) is the running server with the ids a launch needs; ``aws_env`` gives the
test dummy credentials and hides the developer's own AWS configuration; ``fresh_ec2`` is both,
with the server's state cleared first.

The same server answers DynamoDB (the fleet budget's table: ``budget_table``). It serves one
request at a time: moto's backends do not lock, so two conditional writes handled in two
threads at once could both pass their condition, where DynamoDB applies each atomically.

moto checks instance types against its list of what each region offers
(``EC2_ENABLE_INSTANCE_TYPE_VALIDATION``), so a typo in a test's type fails like it would on EC2.
In us-east-1 it accepts p4d.24xlarge, p5.48xlarge, g5.*, g6.* and g6e.*; it refuses
p5e.48xlarge there (``InvalidInstanceType.NotFound``).
"""

from __future__ import annotations

import logging
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REGION = "us-east-1"
KEY = "testing"


@dataclass
class MotoEc2:
    """The running server, and a default AMI, subnet and security group in ``region``."""

    endpoint_url: str
    region: str = REGION
    ami: str = ""
    subnet: str = ""
    security_group: str = ""
    subnets: tuple[str, ...] = ()  # every default subnet (one per availability zone)
    _server: Any = field(default=None, repr=False)

    def client(self) -> Any:
        """A boto3 EC2 client for looking at the server's state (its own dummy keys)."""
        import boto3

        return boto3.client(
            "ec2",
            region_name=self.region,
            endpoint_url=self.endpoint_url,
            aws_access_key_id=KEY,
            aws_secret_access_key=KEY,
        )

    def dynamodb(self) -> Any:
        """A boto3 DynamoDB client on the same server."""
        import boto3

        return boto3.client(
            "dynamodb",
            region_name=self.region,
            endpoint_url=self.endpoint_url,
            aws_access_key_id=KEY,
            aws_secret_access_key=KEY,
        )

    def budget_table(self, name: str) -> None:
        """A fleet budget table as docs/fleet.md creates it (partition key ``budget``)."""
        self.dynamodb().create_table(
            TableName=name,
            AttributeDefinitions=[{"AttributeName": "budget", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "budget", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )

    def reset(self) -> None:
        """Forget every instance, volume and tag, then read the default ids again."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
        self.read_ids()

    def read_ids(self) -> None:
        client = self.client()
        # A name filter: listing all of moto's ~1300 default AMIs takes seconds.
        images = (
            client.describe_images(
                Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-2.0.*-x86_64-gp2"]}]
            )["Images"]
            or client.describe_images(Owners=["amazon"])["Images"]
        )
        self.ami = str(min(i["ImageId"] for i in images))
        subnets = sorted(
            client.describe_subnets()["Subnets"], key=lambda s: str(s["AvailabilityZone"])
        )
        self.subnets = tuple(str(s["SubnetId"]) for s in subnets)
        self.subnet = self.subnets[0]
        groups = client.describe_security_groups(GroupNames=["default"])["SecurityGroups"]
        self.security_group = str(groups[0]["GroupId"])


def _serialized_server() -> Any:
    """moto's threaded server, answering one request at a time (see the module's doc)."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class Serialized(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            lock = threading.Lock()

            def one_at_a_time(environ: Any, start_response: Any) -> Any:
                with lock:
                    return list(app(environ, start_response))

            self._server = make_server(
                self._ip_address,
                self._port,
                one_at_a_time,
                True,
                request_handler=MotoRequestHandler,
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    return Serialized(ip_address="127.0.0.1", port=0, verbose=False)


@pytest.fixture(scope="session", name="moto_ec2")
def fixture_moto_ec2() -> Iterator[MotoEc2]:
    from moto import settings as moto_settings

    werkzeug = logging.getLogger("werkzeug")
    level = werkzeug.level
    werkzeug.setLevel(logging.ERROR)  # one line per request otherwise
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(moto_settings, "EC2_ENABLE_INSTANCE_TYPE_VALIDATION", True)
        server = _serialized_server()
        server.start()
        try:
            host, port = server.get_host_and_port()
            ec2 = MotoEc2(endpoint_url=f"http://{host}:{port}", _server=server)
            ec2.read_ids()
            yield ec2
        finally:
            server.stop()
            werkzeug.setLevel(level)


@pytest.fixture(name="aws_env")
def fixture_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Dummy credentials in the environment; the developer's ~/.aws and any instance role are
    out of reach (empty config files, no metadata service)."""
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_EC2",
        "AWS_ENDPOINT_URL_DYNAMODB",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(name="fresh_ec2")
def fixture_fresh_ec2(moto_ec2: MotoEc2, aws_env: None) -> MotoEc2:
    """The session's server with no instances left from earlier tests."""
    moto_ec2.reset()
    return moto_ec2
