"""The playbook file format: rules and their escalation ladders (reference: docs/playbooks.md).

This module only describes the shape of a playbook file; ``loader.py`` compiles its
expressions, checks its references and reports every problem as file:line:col.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gpuwarden.units import parse_duration

# What editors are told a duration looks like (the JSON Schema; parse_duration decides).
_DURATION_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": r"^ *(([0-9]+(\.[0-9]+)? *(ms|s|m|h|d) *)+|[0-9.]+ *)$"},
    ],
    "description": "a duration: seconds, or a text such as 30s, 2m, 1h30m (at most 3650d)",
}
# Infinite and NaN values are refused by every model below (allow_inf_nan=False).
Seconds = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(_DURATION_SCHEMA)]
# Numbers are bounded where they are read, so a typo is a file:line:col at `check` and never an
# overflow at run time (durations: units.MAX_DURATION).
MAX_TARGETS = 10_000  # processes one step may choose (`limit`)
MAX_WATTS = 10_000.0  # a power limit (`power_cap.watts`); the device clamps it further
MAX_INSTANCES = 1_000  # instances one provision step may launch (`count`)
_STRING: dict[str, Any] = {"type": "string"}
_STRINGS: dict[str, Any] = {"type": "array", "items": _STRING, "minItems": 1}


def _shorthands(**forms: list[dict[str, Any]]) -> Callable[[dict[str, Any]], None]:
    """Add to a model's JSON Schema the short forms its validators expand (``notify: oncall``
    for ``notify: {targets: [oncall]}``), so editors accept what the loader accepts."""

    def add(schema: dict[str, Any]) -> None:
        for name, extra in forms.items():
            prop = schema["properties"][name]
            kept = ("default", "title", "description")
            options = prop.pop("anyOf", None) or [
                {k: prop.pop(k) for k in list(prop) if k not in kept}
            ]
            prop["anyOf"] = [*extra, *options]

    return add


Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


def _names(value: object) -> object:
    return (value,) if isinstance(value, str) else value


class Selection(_Strict):
    """How a step chooses its target processes among the incident's candidates.

    ``select`` filters (default: every candidate), ``order`` sorts (default: lowest priority
    first, then most GPU memory, then youngest), ``limit`` caps how many, and ``free_until``
    stops choosing once the projected state (with the chosen processes' memory freed) holds.
    """

    model_config = ConfigDict(json_schema_extra=_shorthands(order=[_STRING]))

    select: str | None = None
    order: tuple[str, ...] | None = None
    limit: int | None = Field(default=None, ge=1, le=MAX_TARGETS)
    free_until: str | None = None

    @field_validator("order", mode="before")
    @classmethod
    def _order_list(cls, value: object) -> object:
        return _names(value)


class NotifyParams(_Strict):
    model_config = ConfigDict(json_schema_extra=_shorthands(targets=[_STRING]))

    targets: Annotated[tuple[str, ...], BeforeValidator(_names)] = Field(min_length=1)
    message: str | None = None


# How a step reaches a process that belongs to a Slurm job: ``auto`` through Slurm (scancel,
# scontrol) when the config's ``slurm`` allows and the process is in a job, else by signals;
# ``signal`` always by signals; ``slurm`` only through Slurm (a process in no job is not acted on).
Via = Literal["auto", "signal", "slurm"]


class CheckpointParams(Selection):
    wait: Seconds = 120.0
    signal: str | None = None  # default: the job's GPUWARDEN_CHECKPOINT_SIGNAL, else SIGUSR1
    via: Via = "auto"


class SuspendParams(Selection):
    resume_on_resolve: bool = True
    via: Via = "auto"


class ResumeParams(Selection):
    via: Via = "auto"


class ReniceParams(Selection):
    nice: int = Field(default=19, ge=-20, le=19)
    ionice: Literal["idle", "best-effort", "unchanged"] = "idle"
    restore: bool = True


class KillParams(Selection):
    grace: Seconds = 30.0
    signal: str = "SIGTERM"
    process_group: bool = False
    settle: Seconds = 5.0
    via: Via = "auto"


class RequeueParams(Selection):
    """Put the chosen processes' Slurm jobs back in the queue (``scontrol requeue``); with
    ``hold``, held there until someone releases them (``scontrol requeuehold``)."""

    hold: bool = False
    grace: Seconds = 30.0  # how long the job's processes have to exit before SIGKILL
    via: Literal["auto", "slurm"] = "auto"


class PowerCapParams(_Strict):
    watts: float | None = Field(default=None, gt=0, le=MAX_WATTS)
    percent: float | None = Field(default=None, gt=0, le=100)
    restore: bool = True

    @model_validator(mode="after")
    def _one_limit(self) -> PowerCapParams:
        if (self.watts is None) == (self.percent is None):
            raise ValueError(
                "give exactly one of watts (a limit in W) or percent (of the "
                "device's default limit)"
            )
        return self


class ExecParams(_Strict):
    argv: tuple[str, ...] = Field(min_length=1)
    timeout: Seconds = 30.0
    env: dict[str, str] = Field(default_factory=dict)
    # Run as root, with the daemon's capabilities, instead of the config's exec.user.
    as_root: bool = False


class ProvisionParams(_Strict):
    profile: str
    count: int | None = Field(default=None, ge=1, le=MAX_INSTANCES)


def _shorthand(key: str) -> Any:
    """``notify: oncall`` / ``exec: [argv]`` / ``provision: name`` / ``kill:`` (empty)."""

    def expand(value: object) -> object:
        if value is None:
            return {}
        if key == "targets" and isinstance(value, str | list):
            return {"targets": value}
        if key == "argv" and isinstance(value, list):
            return {"argv": value}
        if key == "profile" and isinstance(value, str):
            return {"profile": value}
        return value

    return BeforeValidator(expand)


STEP_KINDS: tuple[str, ...] = (
    "notify",
    "checkpoint",
    "suspend",
    "resume",
    "renice",
    "kill",
    "requeue",
    "power_cap",
    "exec",
    "provision",
)
SELECTING_KINDS = frozenset({"checkpoint", "suspend", "resume", "renice", "kill", "requeue"})
DESTRUCTIVE_KINDS = frozenset({"suspend", "kill", "requeue", "power_cap", "exec", "provision"})
# Steps after which their targets are gone: never chosen again by any step of any incident.
ENDING_KINDS = frozenset({"kill", "requeue"})
# Steps that act on a Slurm job as a whole when their target belongs to one (``via``).
SLURM_KINDS = frozenset({"checkpoint", "suspend", "resume", "kill", "requeue"})

StepParams = (
    NotifyParams
    | CheckpointParams
    | SuspendParams
    | ResumeParams
    | ReniceParams
    | KillParams
    | RequeueParams
    | PowerCapParams
    | ExecParams
    | ProvisionParams
)


class Step(_Strict):
    """One rung of the ladder: ``after`` (from firing) plus exactly one step kind."""

    model_config = ConfigDict(
        json_schema_extra=_shorthands(
            notify=[_STRING, _STRINGS], exec=[_STRINGS], provision=[_STRING]
        )
    )

    # How an unknown key of a step is reported (yamlfile_keys: "unknown step kind 'kil'").
    KEY_NOUN: ClassVar[str] = "step kind"
    KEY_ORDER: ClassVar[tuple[str, ...]] = STEP_KINDS

    after: Seconds = 0.0
    name: str | None = None
    notify: Annotated[NotifyParams | None, _shorthand("targets")] = None
    checkpoint: Annotated[CheckpointParams | None, _shorthand("")] = None
    suspend: Annotated[SuspendParams | None, _shorthand("")] = None
    resume: Annotated[ResumeParams | None, _shorthand("")] = None
    renice: Annotated[ReniceParams | None, _shorthand("")] = None
    kill: Annotated[KillParams | None, _shorthand("")] = None
    requeue: Annotated[RequeueParams | None, _shorthand("")] = None
    power_cap: Annotated[PowerCapParams | None, _shorthand("")] = None
    exec: Annotated[ExecParams | None, _shorthand("argv")] = None
    provision: Annotated[ProvisionParams | None, _shorthand("profile")] = None

    @model_validator(mode="before")
    @classmethod
    def _empty_kind(cls, data: Any) -> Any:
        # ``- kill:`` with nothing after it means "kill with the defaults".
        if isinstance(data, dict):
            return {k: ({} if k in STEP_KINDS and v is None else v) for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> Step:
        kinds = [k for k in STEP_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            found = ", ".join(kinds) if kinds else "none"
            raise ValueError(
                f"a step has exactly one kind (found: {found}); kinds: {', '.join(STEP_KINDS)}"
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in STEP_KINDS if getattr(self, k) is not None)

    @property
    def params(self) -> StepParams:
        value: StepParams = getattr(self, self.kind)
        return value

    @property
    def label(self) -> str:
        return self.name or self.kind


class Rule(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    for_each: Literal["gpu", "process", "host", "event"] = "gpu"
    when: str
    for_: Seconds = Field(default=0.0, alias="for")
    until: str | None = None
    active: str | tuple[str, ...] | None = None
    every: str | float | None = None
    cooldown: Seconds = 300.0
    severity: Severity = "warning"
    labels: dict[str, str] = Field(default_factory=dict)
    mode: Literal["enforce", "shadow"] = "enforce"
    pause_on_ack: bool = False  # once a person acknowledges the incident, run no further step
    # Notification grouping for this rule (default: the config's notify section).
    group_wait: Seconds | None = None
    group_interval: Seconds | None = None
    repeat: Seconds | None = None
    steps: tuple[Step, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> Rule:
        if self.for_each == "event" and self.for_ > 0:
            raise ValueError("an event rule fires on the event itself: it takes no `for`")
        if self.every is not None and self.for_ > 0:
            raise ValueError(
                "a scheduled rule (`every`) is checked at its times: it takes no `for`"
            )
        return self


class PlaybookFile(_Strict):
    version: Literal[1] = 1
    rules: tuple[Rule, ...] = ()
