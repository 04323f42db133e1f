"""The daemon's configuration file (``gpuwarden.yaml``): how it runs and who is who.

Playbooks say *what* to do; this file says how often to look, where playbooks and state live,
whether anything may really be done (``dry_run``), which processes matter how much (priority
classes), which must never be touched (protected), who to tell (notification targets) and
where to burst (cloud profiles). Unknown keys are errors, reported as file:line:col.
Secrets (webhook URLs with tokens, keys) can always come from a file or an environment
variable instead of standing in this file.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpuwarden import yamlfile
from gpuwarden.cloud import tags as cloud_tags
from gpuwarden.timewindow import parse_active
from gpuwarden.units import parse_duration

DEFAULT_PATH = Path("/etc/gpuwarden/gpuwarden.yaml")
DEFAULT_CLASSES = ("critical", "high", "normal", "low", "scavenger")
_T = TypeVar("_T")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Names = Annotated[tuple[str, ...], Field()]


def _check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    return value


Regex = Annotated[str, AfterValidator(_check_regex)]
Seconds = Annotated[float, BeforeValidator(parse_duration)]  # at most units.MAX_DURATION
MAX_PID = 4_194_304  # the kernel's largest pid_max


class MatchRule(_Strict):
    """One way to recognise a process. All given conditions must hold (AND); lists are any-of."""

    user: Names = ()
    group: Names = ()
    cmdline: Regex | None = None
    cgroup: Regex | None = None
    unit: Regex | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("user", "group", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _not_empty(self) -> MatchRule:
        if not (self.user or self.group or self.cmdline or self.cgroup or self.unit or self.env):
            raise ValueError(
                "a match rule needs at least one of user, group, cmdline, cgroup, unit, env"
            )
        return self


class PriorityClass(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    match: tuple[MatchRule, ...] = ()


class Priorities(_Strict):
    """Priority classes, highest first. A process takes the first class one of whose rules
    matches; failing that, the class its job declares in ``GPUWARDEN_PRIORITY`` (never above
    ``declared_max``); failing that, ``default``."""

    classes: tuple[PriorityClass, ...] = tuple(PriorityClass(name=n) for n in DEFAULT_CLASSES)
    default: str = "normal"
    declared_max: str = "high"

    @model_validator(mode="after")
    def _known(self) -> Priorities:
        names = [c.name for c in self.classes]
        if not names:
            raise ValueError("at least one priority class is needed")
        if len(set(names)) != len(names):
            raise ValueError(f"priority class names repeat: {names}")
        for field in ("default", "declared_max"):
            if getattr(self, field) not in names:
                raise ValueError(
                    f"{field} {getattr(self, field)!r} is not one of the classes {names}"
                )
        return self

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)

    def rank(self, name: str) -> int:
        """Higher is more important: the lowest class has rank 0."""
        names = self.names
        return len(names) - 1 - names.index(name)


class Protected(_Strict):
    """Processes no step ever acts on. PID 1 and 2 and gpuwarden itself are always protected."""

    root: bool = True
    users: Names = ("root",)
    names: Names = (
        "nvidia-persistenced",
        "nv-hostengine",
        "dcgm-exporter",
        "dcgmi",
        "nvidia-smi",
        "Xorg",
        "Xwayland",
        "gnome-shell",
        "sshd",
        "systemd",
        "slurmd",
        "slurmstepd",
        "kubelet",
        "containerd",
        "dockerd",
    )
    cmdline: tuple[Regex, ...] = ()
    units: tuple[Regex, ...] = ()
    priorities: Names = ()
    pids: tuple[Annotated[int, Field(ge=1, le=MAX_PID)], ...] = ()

    @field_validator("users", "names", "priorities", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value


class Secret(_Strict):
    """A secret value given inline, read from a file, or taken from an environment variable."""

    value: str | None = None
    file: Path | None = None
    env: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Secret:
        given = [k for k in ("value", "file", "env") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of value, file, env")
        return self


class NotifyTarget(_Strict):
    """A named destination for messages: apprise URLs (or a secret holding them)."""

    urls: tuple[str | Secret, ...] = ()
    config: Path | None = None
    tags: Names = ()
    min_severity: Literal["info", "warning", "critical"] = "info"
    quiet_hours: str | None = None
    fallback: str | None = None
    # How message bodies are written for this target; facts are escaped for it.
    body_format: Literal["text", "markdown", "html"] = "text"

    @field_validator("quiet_hours")
    @classmethod
    def _window(cls, value: str | None) -> str | None:
        if value is not None:
            parse_active(value)  # raises ValueError saying what was expected
        return value

    @model_validator(mode="after")
    def _has_destination(self) -> NotifyTarget:
        if not self.urls and self.config is None:
            raise ValueError("a target needs urls or an apprise config file")
        return self


class Notify(_Strict):
    targets: dict[str, NotifyTarget] = Field(default_factory=dict)
    admin: str | None = None  # where reload failures and circuit-breaker trips go
    # Grouping (see gpuwarden.notify.grouping): incidents of one rule opened within
    # group_wait share one message; later changes go out at most every group_interval;
    # reminders every repeat while an incident is open and unacknowledged (0: never).
    group_wait: Seconds = Field(default=30.0, ge=0)
    group_interval: Seconds = Field(default=300.0, ge=0)
    repeat: Seconds = Field(default=3600.0, ge=0)
    # Drill and dry-run messages: at most this many per minute per target; the rest are
    # counted and summarised in one message.
    drill_rate: int = Field(default=10, ge=1, le=100_000)


def _refusing(problem: Callable[[_T], str | None]) -> AfterValidator:
    """A validator raising what ``problem`` finds wrong with a value."""

    def check(value: _T) -> _T:
        found = problem(value)
        if found is not None:
            raise ValueError(found)
        return value

    return AfterValidator(check)


def _aws_id(kind: str, prefix: str, note: str = "") -> Callable[[str], str | None]:
    def problem(value: str) -> str | None:
        if re.fullmatch(rf"{prefix}-[0-9A-Za-z]+", value):
            return None
        return f"{value!r} is not a {kind} id: write it as {prefix}-0123456789abcdef0{note}"

    return problem


SubnetId = Annotated[str, _refusing(_aws_id("subnet", "subnet"))]
SecurityGroupId = Annotated[
    str, _refusing(_aws_id("security group", "sg", " (group names are not accepted)"))
]
TagKey = Annotated[str, _refusing(cloud_tags.key_problem)]
TagValue = Annotated[str, _refusing(cloud_tags.value_problem)]
ProfileTags = Annotated[dict[TagKey, TagValue], _refusing(cloud_tags.room_problem)]
UserData = Annotated[
    str, _refusing(lambda t: "; ".join(cloud_tags.user_data_problems(t, shown=3)) or None)
]
Price = Annotated[float, Field(gt=0)]


def _repeats(values: tuple[str, ...]) -> list[str]:
    return sorted({v for v in values if values.count(v) > 1})


class CloudProfile(_Strict):
    """Where and how to burst to cloud GPUs; docs/cloud.md explains every field and the IAM
    policy gpuwarden needs.

    Exactly one of ``launch_template`` and ``ami`` says what to boot. ``max_instances``
    (across all incidents) and ``max_hourly_usd`` (with a price in ``prices`` for every
    instance type) cap what is launched; ``ttl`` is the hard maximum lifetime of an
    instance, ``linger`` how long it is kept after its incident resolved. ``user_data`` may
    name only ``${incident} ${rule} ${host} ${profile} ${instance_type} ${expires}``
    (``$$`` is a dollar). ``tags`` are added to gpuwarden's own ``gpuwarden:*`` tags."""

    provider: Literal["aws"] = "aws"
    region: str
    subnets: tuple[SubnetId, ...] = ()
    instance_types: tuple[str, ...] = Field(min_length=1)
    launch_template: str | None = None
    ami: str | None = None
    security_groups: tuple[SecurityGroupId, ...] = ()
    key_name: str | None = None
    market: Literal["on-demand", "spot"] = "on-demand"
    count: int = Field(default=1, ge=1, le=1_000)
    user_data: UserData | None = None
    tags: ProfileTags = Field(default_factory=dict)
    max_instances: int = Field(default=1, ge=1, le=1_000)
    max_hourly_usd: float | None = Field(default=None, gt=0)
    prices: dict[str, Price] = Field(default_factory=dict, validate_default=True)
    ttl: Seconds = Field(default=8 * 3600.0, gt=0)
    linger: Seconds = Field(default=1800.0, ge=0)
    endpoint_url: str | None = None

    @field_validator("instance_types", "subnets")
    @classmethod
    def _once_each(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        repeated = _repeats(value)
        if repeated:
            raise ValueError(f"listed more than once: {', '.join(repeated)}")
        return value

    @field_validator("prices")
    @classmethod
    def _priced(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        types = info.data.get("instance_types")
        if info.data.get("max_hourly_usd") is None or not types:
            return value
        missing = [t for t in types if t not in value]
        if missing:
            raise ValueError(
                f"max_hourly_usd needs the hourly price of every instance type; "
                f"prices has none for {', '.join(missing)}"
            )
        return value

    @model_validator(mode="after")
    def _what_to_boot(self) -> CloudProfile:
        if self.launch_template is None and self.ami is None:
            raise ValueError(
                "say what to boot: set launch_template (a template id lt-… or its name) "
                "or ami (an image id ami-…)"
            )
        if self.launch_template is not None and self.ami is not None:
            raise ValueError(
                "set launch_template or ami, not both: the launch template names its own "
                "image; remove ami, or remove launch_template and keep ami"
            )
        return self


class Cloud(_Strict):
    """Cloud profiles by name (``provision: <name>`` in a playbook), and how often the daemon
    runs the reaper that ends instances past their linger or ttl."""

    profiles: dict[str, CloudProfile] = Field(default_factory=dict)
    reap_interval: Seconds = Field(default=60.0, gt=0)


class Limit(_Strict):
    """At most ``actions`` destructive actions (one per process acted on) within ``window``."""

    actions: int = Field(ge=1, le=1_000_000)
    window: Seconds = Field(gt=0)


class Safety(_Strict):
    """Rails for destructive steps (suspend, kill, power_cap, exec, provision).

    ``per_rule`` and ``overall`` trim a step that would exceed them to the processes they have
    room for, in the planned order, and refuse it when there is none. Only actions carried
    out count. The ``breaker`` trips when that many destructive actions were carried out
    within its window: every destructive step is then refused until ``gpuwarden
    reset-breaker``, and the admin target is told."""

    per_rule: Limit = Limit(actions=5, window=600.0)
    overall: Limit = Limit(actions=20, window=600.0)
    breaker: Limit = Limit(actions=10, window=600.0)
    restore_on_exit: bool = True  # resume suspended jobs, restore nice and power at shutdown
    workers: int = Field(default=4, ge=1, le=64)  # steps running at once
    shutdown_grace: Seconds = 10.0  # how long a stop waits for running steps


class MetricsConfig(_Strict):
    """The Prometheus endpoint: off unless ``listen`` is set; on loopback unless told."""

    listen: str | None = None  # e.g. "127.0.0.1:9400" (dcgm-exporter's port)
    gpu_gauges: bool = True  # false where dcgm-exporter already exports the GPUs


class ExecConfig(_Strict):
    """How ``exec`` steps run their commands: as ``user`` (and ``group``, default the user's
    own), with no capabilities and no way to gain privileges (no_new_privs), unless a step
    says ``as_root: true``."""

    user: str = Field(default="nobody", min_length=1)
    group: str | None = None


class ReloadConfig(_Strict):
    """Hot reload of this file and the playbooks when they change on disk (and on SIGHUP)."""

    watch: bool = True
    poll: bool = False  # poll instead of inotify (NFS and other network file systems)
    debounce: Seconds = Field(default=0.3, ge=0)


class OperatorsConfig(_Strict):
    """Who may use the on-call commands without being root (docs/operations.md, "On call").

    With ``group`` set, the daemon makes its journal readable by that group (the views:
    ``incidents``, ``incident``, ``status``) and listens on ``socket`` (mode 0660, that
    group) for ``ack``, ``hold``, ``release``, ``abort`` and ``silence``, which it checks
    (the caller's uid and groups, from the kernel) and writes to the journal itself."""

    group: str | None = Field(default=None, min_length=1)
    socket: Path = Path("/run/gpuwarden/control.sock")

    @field_validator("socket")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError(
                f"{value} is not an absolute path; the default is /run/gpuwarden/control.sock"
            )
        return value


class Config(_Strict):
    host: str | None = None
    tick: Seconds = Field(default=2.0, gt=0)
    source: str = "nvml"
    events: tuple[str, ...] = ()
    playbooks: Path = Path("/etc/gpuwarden/playbooks")
    state_dir: Path = Path("/var/lib/gpuwarden")
    # Where jobs acknowledge checkpoint requests: root-owned, one directory per user in it
    # (docs/jobs.md). Jobs must see it at the same path (GPUWARDEN_ACK_DIR when not this).
    ack_spool: Path = Path("/run/gpuwarden/ack")
    dry_run: bool = False
    timezone: str = "UTC"
    priorities: Priorities = Priorities()
    protected: Protected = Protected()
    notify: Notify = Notify()
    cloud: Cloud = Cloud()
    safety: Safety = Safety()
    metrics: MetricsConfig = MetricsConfig()
    reload: ReloadConfig = ReloadConfig()
    exec: ExecConfig = ExecConfig()
    operators: OperatorsConfig = OperatorsConfig()

    @field_validator("ack_spool")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError(f"{value} is not an absolute path; the default is /run/gpuwarden/ack")
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r}; use an IANA name such as 'UTC' or 'Europe/Berlin'"
            ) from None
        return value

    @field_validator("events")
    @classmethod
    def _event_forms(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            scheme, sep, rest = item.partition(":")
            if not (scheme == "kmsg" or (scheme == "dmesg" and sep and rest)):
                raise ValueError(
                    f"unknown events {item!r}; use kmsg, kmsg:journal, kmsg:PATH or dmesg:FILE"
                )
        return value

    @model_validator(mode="after")
    def _references(self) -> Config:
        targets = self.notify.targets
        if self.notify.admin is not None and self.notify.admin not in targets:
            raise ValueError(
                f"notify.admin names an unknown target {self.notify.admin!r}; "
                f"targets: {sorted(targets)}"
            )
        for name, target in targets.items():
            if target.fallback is not None and target.fallback not in targets:
                raise ValueError(
                    f"notify target {name!r} falls back to an unknown target {target.fallback!r}"
                )
        unknown = [p for p in self.protected.priorities if p not in self.priorities.names]
        if unknown:
            raise ValueError(
                f"protected.priorities names unknown classes {unknown}; classes: "
                f"{list(self.priorities.names)}"
            )
        return self

    @property
    def tz(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)


def load(path: str | Path) -> Config:
    """Load and validate a config file; raises ``InputError`` with positions."""
    located = yamlfile.load(path)
    if located.data is None:
        return Config()
    if not isinstance(located.data, dict):
        raise located.error((), "the config must be a mapping", "keys such as priorities:")
    return yamlfile.validate(Config, located)
