"""The daemon's configuration file (``gpuwarden.yaml``): who is who on this machine.

This module holds what telemetry needs: the host name and the priority classes with the rules
that put a process in one. Later sections (playbooks, protected processes, notification targets,
cloud profiles) join it as they are built. Unknown keys are errors, with file:line:col.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuwarden import yamlfile

DEFAULT_PATH = Path("/etc/gpuwarden/gpuwarden.yaml")
DEFAULT_CLASSES = ("critical", "high", "normal", "low", "scavenger")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Names = Annotated[tuple[str, ...], Field()]


class MatchRule(_Strict):
    """One way to recognise a process. All given conditions must hold (AND); lists are any-of."""

    user: Names = ()
    group: Names = ()
    cmdline: str | None = None
    cgroup: str | None = None
    unit: str | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("user", "group", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("cmdline", "cgroup", "unit")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from None
        return value

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


class Config(_Strict):
    host: str | None = None
    priorities: Priorities = Priorities()


def load(path: str | Path) -> Config:
    """Load and validate a config file; raises ``InputError`` with positions."""
    located = yamlfile.load(path)
    if located.data is None:
        return Config()
    if not isinstance(located.data, dict):
        raise located.error((), "the config must be a mapping", "keys such as priorities:")
    return yamlfile.validate(Config, located)
