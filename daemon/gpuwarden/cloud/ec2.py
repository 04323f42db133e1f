"""The thin adapter over EC2: launch, find by tag, terminate; errors sorted into kinds.

This is the only module that talks to boto3, and it imports boto3 and botocore inside the
functions that need them, so a daemon without cloud profiles never loads them (about 0.4 s and
60 MB). Every AWS failure leaves here as a ``CloudError`` whose ``kind`` tells the caller what to
do next: try the next type or subnet (``capacity``), back off (``throttled``), or stop and tell a
person (``denied``, ``invalid``, ``unavailable``). Messages are one line and never carry keys,
tokens or signatures.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from gpuwarden.cloud import tags
from gpuwarden.cloud.instance import LIVE_STATES

if TYPE_CHECKING:
    from gpuwarden.config import CloudProfile

T = TypeVar("T")

KINDS: tuple[str, ...] = (
    "capacity",  # no room for this type here: try the next type or subnet
    "throttled",  # too many requests: back off and retry
    "denied",  # credentials or IAM policy: a person must fix it
    "dry_run_ok",  # DryRun=True and the call would have succeeded
    "invalid",  # a bad AMI, subnet, group, key, template or parameter in the profile
    "unavailable",  # boto3 missing, no credentials, endpoint unreachable, EC2 failing
    "other",
)

_KIND_BY_CODE: dict[str, str] = {
    "InsufficientInstanceCapacity": "capacity",
    "InsufficientCapacity": "capacity",
    "InstanceLimitExceeded": "capacity",
    "MaxSpotInstanceCountExceeded": "capacity",
    "SpotMaxPriceTooLow": "capacity",
    "Unsupported": "capacity",  # the type is not offered in that availability zone
    "RequestLimitExceeded": "throttled",
    "Throttling": "throttled",
    "ThrottlingException": "throttled",
    "UnauthorizedOperation": "denied",
    "AuthFailure": "denied",
    "AccessDenied": "denied",
    "AccessDeniedException": "denied",
    "InvalidClientTokenId": "denied",
    "OptInRequired": "denied",
    "SignatureDoesNotMatch": "denied",
    "ExpiredToken": "denied",
    "DryRunOperation": "dry_run_ok",
    "InvalidParameterValue": "invalid",
    "InvalidParameterCombination": "invalid",
    "MissingParameter": "invalid",
    "IdempotentParameterMismatch": "invalid",
    "InternalError": "unavailable",
    "InternalFailure": "unavailable",
    "ServiceUnavailable": "unavailable",
    "Unavailable": "unavailable",
    # DynamoDB (the fleet budget, cloud/budget.py)
    "ProvisionedThroughputExceededException": "throttled",
    "ResourceNotFoundException": "invalid",
    "ValidationException": "invalid",
    "InternalServerError": "unavailable",
}
# Codes with a suffix: InvalidAMIID.NotFound, InvalidSubnetID.Malformed, InvalidGroup.NotFound, ...
_INVALID_PREFIXES: tuple[str, ...] = (
    "InvalidAMIID.",
    "InvalidSubnetID.",
    "InvalidGroup.",
    "InvalidKeyPair.",
    "InvalidInstanceType",
    "InvalidInstanceID.",
    "InvalidLaunchTemplateName.",
    "InvalidLaunchTemplateId.",
)

_MESSAGE_LIMIT = 300
_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|ANPA|AGPA)[A-Z0-9]{12,}\b")
_SECRETISH = re.compile(
    r"(?i)\b(signature|x-amz-signature|x-amz-security-token|x-amz-credential|credential|"
    r"aws_secret_access_key|aws_session_token|securitytoken|sessiontoken)\s*[=:]\s*[^\s,;&]+"
)
_ENCODED = re.compile(r"(?i)(encoded authorization failure message:)\s*\S+")
_USERINFO = re.compile(r"://[^/@\s]+@")


def _kind_of(code: str) -> str:
    kind = _KIND_BY_CODE.get(code)
    if kind is not None:
        return kind
    if code.startswith(_INVALID_PREFIXES):
        return "invalid"
    return "other"


def _redact(text: str) -> str:
    """One line, bounded, with access key ids, signatures and tokens blanked out."""
    text = " ".join(text.split())
    text = _ENCODED.sub(r"\1 (omitted: decode it with aws sts decode-authorization-message)", text)
    text = _KEY_ID.sub("<access-key-id>", text)
    text = _SECRETISH.sub(lambda m: f"{m.group(1)}=<redacted>", text)
    text = _USERINFO.sub("://<redacted>@", text)
    if len(text) > _MESSAGE_LIMIT:
        text = text[: _MESSAGE_LIMIT - 1] + "…"
    return text


class CloudError(Exception):
    """An EC2 call failed. ``kind`` is one of ``KINDS``; ``code`` is the AWS error code ("" when
    the failure never reached AWS); the message is one line with no credentials in it."""

    def __init__(self, kind: str, message: str, *, code: str = "") -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown cloud error kind {kind!r}")
        self.kind = kind
        self.code = code
        self.message = _redact(message)
        super().__init__(self.message)


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """One ``run_instances`` call: ``count`` instances of one type in one subnet, all or none."""

    instance_type: str
    count: int
    client_token: str  # deterministic (tags.client_token): a retry cannot launch twice
    tags: dict[str, str]
    image_id: str | None = None
    launch_template: str | None = None  # "lt-..." is an id, anything else a name
    subnet: str | None = None
    security_groups: tuple[str, ...] = ()
    key_name: str | None = None
    market: str = "on-demand"  # "on-demand" | "spot"
    user_data: str | None = None  # plain text; boto3 base64-encodes it


@dataclass(frozen=True, slots=True)
class Seen:
    """One instance as EC2 describes it."""

    instance_id: str
    instance_type: str
    state: str
    launch_time: float | None  # epoch seconds, EC2's clock
    tags: dict[str, str]
    subnet: str | None


def _seen(instance: dict[str, Any]) -> Seen:
    launched = instance.get("LaunchTime")
    return Seen(
        instance_id=str(instance["InstanceId"]),
        instance_type=str(instance.get("InstanceType", "")),
        state=str((instance.get("State") or {}).get("Name", "")),
        launch_time=launched.timestamp() if launched is not None else None,
        tags=tags.tag_dict(instance.get("Tags")),
        subnet=instance.get("SubnetId") or None,
    )


def translate(error: Exception, operation: str, service: str = "EC2") -> CloudError:
    """A botocore exception as a CloudError; anything else unchanged in kind "other".
    ``service`` names what could not be reached (EC2, DynamoDB)."""
    from botocore import exceptions as bx

    if isinstance(error, bx.ClientError):
        details = error.response.get("Error") or {}
        code = str(details.get("Code") or "")
        text = str(details.get("Message") or "")
        return CloudError(_kind_of(code), f"{operation}: {code}: {text}", code=code)
    if isinstance(error, bx.NoCredentialsError | bx.PartialCredentialsError):
        return CloudError("unavailable", f"{operation}: {NO_CREDENTIALS}")
    if isinstance(error, bx.ProfileNotFound):
        return CloudError("unavailable", f"{operation}: {error}: check AWS_PROFILE")
    if isinstance(
        error,
        bx.EndpointConnectionError
        | bx.ConnectTimeoutError
        | bx.ReadTimeoutError
        | bx.ConnectionClosedError
        | bx.ProxyConnectionError,
    ):
        return CloudError("unavailable", f"{operation}: cannot reach {service}: {error}")
    if isinstance(error, bx.ParamValidationError):
        return CloudError("invalid", f"{operation}: {error}")
    return CloudError("other", f"{operation}: {type(error).__name__}: {error}")


NO_CREDENTIALS = (
    "no AWS credentials found: set AWS_PROFILE (with ~/.aws/credentials or SSO), "
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the service environment, "
    "or attach an instance role"
)


class Ec2:
    """EC2 calls for one region. ``client`` is a boto3 EC2 client (tests wrap one in a Stubber)."""

    def __init__(self, client: Any, region: str, *, page_size: int = 1000) -> None:
        self.client = client
        self.region = region
        self.page_size = page_size  # describe_instances MaxResults (EC2 allows 5..1000)

    def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response: dict[str, Any] = getattr(self.client, operation)(**params)
        except (ClientError, BotoCoreError) as error:
            raise translate(error, operation) from None
        return response

    def launch(self, request: LaunchRequest, *, dry_run: bool) -> list[Seen]:
        """Launch ``request.count`` instances (all or none). In dry-run EC2 checks permissions
        and parameters and launches nothing: returns [] when the launch would be allowed."""
        params = _run_params(request)
        try:
            response = self._call("run_instances", DryRun=dry_run, **params)
        except CloudError as error:
            if dry_run and error.kind == "dry_run_ok":
                return []
            raise
        if dry_run:
            return []
        return [_seen(i) for i in response.get("Instances") or ()]

    def managed(
        self,
        *,
        host: str | None = None,
        profile: str | None = None,
        incident: str | None = None,
        step: int | None = None,
        states: Sequence[str] = LIVE_STATES,
    ) -> list[Seen]:
        """Instances tagged ``gpuwarden:managed=true`` (and the given tags) in ``states``."""
        if not states:
            return []
        wanted = {tags.MANAGED: "true"}
        for key, value in (
            (tags.HOST, host),
            (tags.PROFILE, profile),
            (tags.INCIDENT, incident),
            (tags.STEP, None if step is None else str(step)),
        ):
            if value is not None:
                wanted[key] = value
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in wanted.items()]
        filters.append({"Name": "instance-state-name", "Values": list(states)})
        return [_seen(i) for i in self._pages(filters)]

    def _pages(self, filters: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        token: str | None = None
        tokens: set[str] = set()  # an endpoint that repeats a token would loop forever
        while True:
            params: dict[str, Any] = {"Filters": filters, "MaxResults": self.page_size}
            if token:
                params["NextToken"] = token
            response = self._call("describe_instances", **params)
            for reservation in response.get("Reservations") or ():
                yield from reservation.get("Instances") or ()
            token = response.get("NextToken")
            if not token:
                return
            if token in tokens:
                raise CloudError("other", "describe_instances: the same NextToken came back twice")
            tokens.add(token)

    def terminate(self, ids: Sequence[str], *, dry_run: bool) -> dict[str, str]:
        """Terminate ``ids``; returns each id's new state. Dry-run returns {} when allowed."""
        if not ids:
            return {}
        try:
            response = self._call("terminate_instances", InstanceIds=list(ids), DryRun=dry_run)
        except CloudError as error:
            if dry_run and error.kind == "dry_run_ok":
                return {}
            raise
        if dry_run:
            return {}
        return {
            str(item["InstanceId"]): str((item.get("CurrentState") or {}).get("Name", ""))
            for item in response.get("TerminatingInstances") or ()
        }


def _run_params(request: LaunchRequest) -> dict[str, Any]:
    if request.count < 1:
        raise CloudError("invalid", f"run_instances: count must be at least 1, not {request.count}")
    if request.image_id is None and request.launch_template is None:
        raise CloudError("invalid", "run_instances: the profile needs an ami or a launch_template")
    params: dict[str, Any] = {
        "InstanceType": request.instance_type,
        "MinCount": request.count,
        "MaxCount": request.count,
        "ClientToken": request.client_token,
    }
    if request.image_id is not None:
        params["ImageId"] = request.image_id
    if request.launch_template is not None:
        key = (
            "LaunchTemplateId"
            if request.launch_template.startswith("lt-")
            else "LaunchTemplateName"
        )
        params["LaunchTemplate"] = {key: request.launch_template, "Version": "$Default"}
    if request.subnet is not None:
        params["SubnetId"] = request.subnet
    if request.security_groups:
        params["SecurityGroupIds"] = list(request.security_groups)
    if request.key_name is not None:
        params["KeyName"] = request.key_name
    if request.user_data is not None:
        params["UserData"] = request.user_data
    if request.market == "spot":
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            },
        }
    if request.tags:
        pairs = [{"Key": k, "Value": v} for k, v in request.tags.items()]
        params["TagSpecifications"] = [
            {"ResourceType": "instance", "Tags": pairs},
            {"ResourceType": "volume", "Tags": pairs},
        ]
    return params


def connect(profile: CloudProfile) -> Ec2:
    """An ``Ec2`` for the profile's region, with credentials from boto3's usual chain."""
    try:
        import boto3.session
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError
    except ImportError:
        raise CloudError(
            "unavailable", "boto3 is not installed: pip install 'gpuwarden[cloud]'"
        ) from None
    try:
        session = boto3.session.Session(region_name=profile.region)
        if session.get_credentials() is None:
            raise CloudError("unavailable", f"region {profile.region}: {NO_CREDENTIALS}")
        client = session.client(
            "ec2",
            endpoint_url=profile.endpoint_url,
            config=Config(
                connect_timeout=5,
                read_timeout=30,
                retries={"mode": "standard", "total_max_attempts": 2},
            ),
        )
    except BotoCoreError as error:
        raise translate(error, "connect") from None
    return Ec2(client, profile.region)


def with_backoff(
    call: Callable[[], T],
    *,
    sleep: Callable[[float], bool],
    attempts: int = 5,
    base: float = 0.5,
    cap: float = 8.0,
) -> T:
    """``call()``, retried while it raises a ``throttled`` CloudError: up to ``attempts`` calls,
    waiting ``base * 2**n`` seconds (at most ``cap``, jittered down by up to half) in between.
    ``sleep(seconds)`` returns False when the wait was cancelled; the last error is raised then,
    as it is after the last attempt. Other errors are raised at once."""
    if attempts < 1:
        raise ValueError(f"with_backoff needs attempts >= 1, not {attempts}")
    for attempt in range(attempts):
        try:
            return call()
        except CloudError as error:
            if error.kind != "throttled" or attempt == attempts - 1:
                raise
            delay = min(cap, base * 2**attempt)
            # Jitter spreads retries from workers throttled together; not security-relevant.
            delay -= random.uniform(0, delay / 2)  # noqa: S311
            if not sleep(delay):
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")
