"""The daemon's configuration file (``gpuwarden.yaml``): how it runs and who is who.

Playbooks say *what* to do; this file says how often to look, where playbooks and state live,
whether anything may really be done (``dry_run``), which processes matter how much (priority
classes), which must never be touched (protected), who to tell (notification targets) and
where to burst (cloud profiles). Unknown keys are errors, reported as file:line:col.
Secrets (webhook URLs with tokens, keys) can always come from a file or an environment
variable instead of standing in this file.
"""

from __future__ import annotations

import os
import re
import socket
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
from gpuwarden.config_notify import (
    ALERT_LINK_NAMES,
    ALERT_OWN_LABELS,
    Notify,
    NotifyTarget,
    OwnerMail,
    Secret,
)
from gpuwarden.units import parse_duration

# The notify section's models live in config_notify.py and are exported here too.
__all__ = [
    "ALERT_LINK_NAMES",
    "ALERT_OWN_LABELS",
    "DEFAULT_CLASSES",
    "DEFAULT_PATH",
    "Cloud",
    "CloudProfile",
    "Config",
    "Limit",
    "MatchRule",
    "MetricsConfig",
    "Notify",
    "NotifyTarget",
    "OwnerMail",
    "Priorities",
    "PriorityClass",
    "Protected",
    "ReloadConfig",
    "Safety",
    "Secret",
    "load",
]

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
FAST_SAMPLE_MIN = 0.05  # fast_sample: 20 readings a second at most
MAX_PID = 4_194_304  # the kernel's largest pid_max


class MatchRule(_Strict):
    """One way to recognise a process. All given conditions must hold (AND); lists are any-of.

    How far a rule may move a process depends on who can forge its conditions
    (``gpuwarden.sources.priority``, docs/security.md): ``user``, ``group``, ``exe`` and
    ``unit``/``cgroup`` on a root-owned cgroup place a process in the class; ``env`` only up to
    ``declared_max``; ``cmdline`` (and a cgroup the job's owner made) only lowers."""

    user: Names = ()
    group: Names = ()
    exe: Regex | None = None
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
        given = (self.user, self.group, self.exe, self.cmdline, self.cgroup, self.unit, self.env)
        if not any(given):
            raise ValueError(
                "a match rule needs at least one of user, group, exe, cmdline, cgroup, unit, env"
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
    """Processes no step ever acts on. PID 1 and 2 and gpuwarden itself are always protected.

    Only what a job's owner cannot forge protects (docs/security.md): the uid (``root``,
    ``users``), the groups, the executable's real path (``exes``), a unit whose cgroup is
    owned by root outside ``user@UID.service`` (``units``), a priority class, a PID. Process
    names and command lines are the owner's to choose: ``names`` and ``cmdline`` are refused."""

    root: bool = True
    users: Names = ("root",)
    groups: Names = ()
    exes: tuple[Regex, ...] = ()
    units: tuple[Regex, ...] = ()
    priorities: Names = ()
    pids: tuple[Annotated[int, Field(ge=1, le=MAX_PID)], ...] = ()
    # No longer protect; accepted only empty, so that an old config says what to change.
    names: Names = ()
    cmdline: tuple[Regex, ...] = ()

    @field_validator("users", "groups", "names", "priorities", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("names", "cmdline")
    @classmethod
    def _forgeable(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if value:
            what = "process names" if info.field_name == "names" else "command lines"
            raise ValueError(
                f"{what} cannot protect: the process's owner chooses them (exec -a, "
                "prctl). Protect by users, groups, exes (the executable's real path, e.g. "
                "'/usr/bin/nvidia-persistenced') or units instead; see docs/security.md"
            )
        return value


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


class Budget(_Strict):
    """A burst budget shared by the fleet: every host whose profile names the same DynamoDB
    ``table`` and ``key`` takes its slots from one item there, with conditional writes, so
    together the hosts never run more than ``max_instances`` instances or spend more than
    ``max_dollars_per_hour`` (docs/fleet.md). A host that dies keeps its slots until its
    ``lease`` runs out; a live host renews its leases at every reap round."""

    table: str
    key: str | None = Field(default=None, min_length=1, max_length=256)  # default: the profile
    max_instances: int | None = Field(default=None, ge=1)
    max_dollars_per_hour: float | None = Field(default=None, gt=0)
    lease: Seconds = Field(default=600.0, gt=0)
    region: str | None = None  # default: the profile's region
    endpoint_url: str | None = None  # another DynamoDB endpoint (a VPC endpoint, a test server)

    @field_validator("table")
    @classmethod
    def _table_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{3,255}", value):
            raise ValueError(
                f"{value!r} is not a DynamoDB table name: 3 to 255 letters, digits, '_', '.' or '-'"
            )
        return value

    @model_validator(mode="after")
    def _capped(self) -> Budget:
        if self.max_instances is None and self.max_dollars_per_hour is None:
            raise ValueError(
                "a budget caps something: set max_instances, max_dollars_per_hour or both"
            )
        return self


class CloudProfile(_Strict):
    """Where and how to burst to cloud GPUs; docs/cloud.md explains every field and the IAM
    policy gpuwarden needs.

    Exactly one of ``launch_template`` and ``ami`` says what to boot. ``max_instances``
    (across all incidents) and ``max_hourly_usd`` (with a price in ``prices`` for every
    instance type) cap what is launched; ``ttl`` is the hard maximum lifetime of an
    instance, ``linger`` how long it is kept after its incident resolved. ``user_data`` may
    name only ``${incident} ${rule} ${host} ${profile} ${instance_type} ${expires}``
    (``$$`` is a dollar). ``tags`` are added to gpuwarden's own ``gpuwarden:*`` tags.
    ``budget`` caps the whole fleet's instances of it (docs/fleet.md)."""

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
    budget: Budget | None = None  # the fleet-wide cap (docs/fleet.md)

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
    def _budget_priced(self) -> CloudProfile:
        if self.budget is None or self.budget.max_dollars_per_hour is None:
            return self
        missing = [t for t in self.instance_types if t not in self.prices]
        if missing:
            raise ValueError(
                f"budget.max_dollars_per_hour needs the hourly price of every instance type; "
                f"prices has none for {', '.join(missing)}"
            )
        return self

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

    @model_validator(mode="after")
    def _leases_outlast_rounds(self) -> Cloud:
        for name, profile in self.profiles.items():
            budget = profile.budget
            if budget is not None and budget.lease < 2 * self.reap_interval:
                raise ValueError(
                    f"profile {name!r}: budget.lease ({budget.lease:g}s) must be at least twice "
                    f"reap_interval ({self.reap_interval:g}s): leases are renewed at each reap "
                    "round, and one late round must not free the slots of a live host"
                )
        return self


class Limit(_Strict):
    """At most ``actions`` destructive actions (one per process acted on) within ``window``."""

    actions: int = Field(ge=1, le=1_000_000)
    window: Seconds = Field(gt=0)


class Safety(_Strict):
    """Rails for destructive steps (suspend, kill, requeue, power_cap, exec, provision).

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


class SlurmConfig(_Strict):
    """How steps act on a process that belongs to a Slurm job (docs/fleet.md, "Slurm").

    With ``enabled`` and Slurm's commands installed, ``checkpoint``, ``suspend``, ``resume``,
    ``kill`` and ``requeue`` act on the whole job through ``scancel`` and ``scontrol``, so
    that Slurm knows what happened to it. ``signal_to`` is where a checkpoint signal goes:
    ``full`` (``scancel --full``: the batch script and every step, with all their processes;
    a batch script that does not trap the signal dies of it), ``batch`` (the batch script
    alone), ``steps`` (the steps ``srun`` started, not the batch script) or ``auto``: ``steps``
    for a process in a numbered step, ``full`` for one in the batch script's step or in a step
    its cgroup does not name. ``fallback`` says what a step with
    ``via: auto`` does when slurmctld does not answer: ``signal`` the processes as if there
    were no Slurm, or ``fail`` (the step is journaled as failed)."""

    enabled: bool = True
    bin_dir: Path | None = None  # where scontrol and scancel are (default: the PATH)
    conf: Path | None = None  # SLURM_CONF for the commands (default: Slurm's own)
    timeout: Seconds = Field(default=15.0, gt=0)  # each command
    signal_to: Literal["auto", "full", "batch", "steps"] = "auto"
    fallback: Literal["signal", "fail"] = "signal"


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
    # Between ticks, the cheap GPU fields (memory, utilization, temperature, power) that a
    # rule with `for` reads are sampled this often, so that its pending clock starts at the
    # sample that crossed and not at the next tick (docs/operations.md). 0: only at ticks.
    fast_sample: Seconds = 0.2
    source: str = "nvml"
    events: tuple[str, ...] = ()
    playbooks: Path = Path("/etc/gpuwarden/playbooks")
    state_dir: Path = Path("/var/lib/gpuwarden")
    # Where jobs acknowledge checkpoint requests: root-owned, one directory per user in it
    # (docs/jobs.md). Jobs must see it at the same path (GPUWARDEN_ACK_DIR when not this).
    ack_spool: Path = Path("/run/gpuwarden/ack")
    # shadow: every step is decided, recorded and notified (marked [DRY-RUN]) and nothing is
    # acted on; enforce: steps act. ``dry_run: true`` is the older spelling of shadow.
    mode: Literal["enforce", "shadow"] | None = None
    dry_run: bool = False
    timezone: str = "UTC"
    priorities: Priorities = Priorities()
    protected: Protected = Protected()
    notify: Notify = Notify()
    cloud: Cloud = Cloud()
    slurm: SlurmConfig = SlurmConfig()
    safety: Safety = Safety()
    metrics: MetricsConfig = MetricsConfig()
    reload: ReloadConfig = ReloadConfig()
    exec: ExecConfig = ExecConfig()
    operators: OperatorsConfig = OperatorsConfig()

    @field_validator("fast_sample")
    @classmethod
    def _fast_sample(cls, value: float, info: ValidationInfo) -> float:
        if value == 0:
            return value
        if value < FAST_SAMPLE_MIN:
            raise ValueError(
                f"{value * 1000:g}ms is too often; use at least "
                f"{FAST_SAMPLE_MIN * 1000:g}ms, or 0 to sample only at ticks"
            )
        tick = info.data.get("tick")
        if isinstance(tick, float) and value >= tick:
            raise ValueError(
                f"{value:g}s is not shorter than the tick ({tick:g}s); use less than the tick, "
                "or 0 to sample only at ticks"
            )
        return value

    @field_validator("ack_spool")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError(f"{value} is not an absolute path; the default is /run/gpuwarden/ack")
        return value

    @field_validator("dry_run")
    @classmethod
    def _one_mode(cls, value: bool, info: ValidationInfo) -> bool:
        mode = info.data.get("mode")
        if mode is not None and (mode == "shadow") != value:
            raise ValueError(
                f"{str(value).lower()} contradicts mode: {mode} (dry_run: true is the older "
                "spelling of mode: shadow); keep mode and remove dry_run"
            )
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
            if target.fallback is not None and targets[target.fallback].type != "apprise":
                raise ValueError(
                    f"notify target {name!r} falls back to {target.fallback!r}, an "
                    "alertmanager target: a fallback receives messages, not alerts"
                )
        admin = targets.get(self.notify.admin or "")
        if admin is not None and admin.type != "apprise":
            raise ValueError(
                f"notify.admin {self.notify.admin!r} is an alertmanager target: the admin "
                "target receives messages (reload failures, breaker trips), not alerts"
            )
        if admin is not None and admin.for_owners:
            raise ValueError(
                f"notify.admin names the owner target {self.notify.admin!r}; the admin target "
                "needs urls"
            )
        unknown = [p for p in self.protected.priorities if p not in self.priorities.names]
        if unknown:
            raise ValueError(
                f"protected.priorities names unknown classes {unknown}; classes: "
                f"{list(self.priorities.names)}"
            )
        return self

    @property
    def shadow(self) -> bool:
        """Whether nothing is acted on: ``mode: shadow`` (or the older ``dry_run: true``)."""
        return self.mode == "shadow" if self.mode is not None else self.dry_run

    @property
    def mode_name(self) -> str:
        return "shadow" if self.shadow else "enforce"

    @property
    def tz(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)


def host_name(cfg: Config) -> str:
    """The name this server goes by in snapshots, messages, alerts and cloud tags: the
    config's ``host``, else $GPUWARDEN_HOST (the Kubernetes DaemonSet sets it to the node's
    name), else the machine's host name."""
    return cfg.host or os.environ.get("GPUWARDEN_HOST") or socket.gethostname()


def load(path: str | Path) -> Config:
    """Load and validate a config file; raises ``InputError`` with positions."""
    located = yamlfile.load(path)
    if located.data is None:
        return Config()
    if not isinstance(located.data, dict):
        raise located.error((), "the config must be a mapping", "keys such as priorities:")
    return yamlfile.validate(Config, located)
