"""The config's ``notify`` section: who messages go to. Targets are apprise URLs (or secrets
holding them: a file or an environment variable, never a value in the config); an owner
target reaches the owner of each process a step acts on; an alertmanager target posts each
incident to Alertmanager as an alert (docs/fleet.md). ``config.py`` holds the rest of the
file; docs/notifications.md explains every field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from gpuwarden.timewindow import parse_active
from gpuwarden.units import parse_duration


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Names = Annotated[tuple[str, ...], Field()]
Seconds = Annotated[float, BeforeValidator(parse_duration)]  # at most units.MAX_DURATION


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


# A user name as an owner target may be told about it (and as an e-mail address's local part).
USER_NAME = r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$"


class OwnerMail(_Strict):
    """Mail to ``USER@domain`` for the owners the ``owners`` table does not list: ``url`` is
    an apprise ``mailto://`` or ``mailtos://`` URL of the mail server and sender, without
    ``to=`` (gpuwarden adds it), e.g. ``mailtos://gpuwarden:PASSWORD@smtp.example.com?from=
    gpuwarden@example.com`` — or a secret holding one."""

    url: str | Secret
    domain: str = Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")

    @field_validator("url")
    @classmethod
    def _mail_url(cls, value: str | Secret) -> str | Secret:
        if isinstance(value, str):
            scheme = value.partition("://")[0].lower()
            if scheme not in ("mailto", "mailtos"):
                raise ValueError(
                    f"an owner mail url starts mailto:// or mailtos://, not {scheme}://"
                )
            if re.search(r"[?&]to=", value):
                raise ValueError("leave to= out of the url: each owner's address is added to it")
        return value


ALERT_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ALERT_OWN_LABELS = ("alertname", "severity", "host", "gpu", "uuid", "job", "mode")
ALERT_LINK_NAMES = ("host", "incident", "rule")


# The step kinds an owner is told about (``notify/owner.py``).
OwnerStepKind = Literal["checkpoint", "suspend", "renice", "kill", "requeue"]


class NotifyTarget(_Strict):
    """A named destination for messages: apprise URLs (or a secret holding them); or, with
    ``owners`` or ``owner_mail``, the owner of each process a step acted on; or, with
    ``type: alertmanager``, Alertmanager's base URLs, to which each incident is posted as an
    alert (docs/fleet.md)."""

    type: Literal["apprise", "alertmanager"] = "apprise"
    urls: tuple[str | Secret, ...] = ()
    config: Path | None = None
    tags: Names = ()
    min_severity: Literal["info", "warning", "critical"] = "info"
    quiet_hours: str | None = None
    fallback: str | None = None
    # How message bodies are written for this target; facts are escaped for it.
    body_format: Literal["text", "markdown", "html"] = "text"
    # An owner target: user name -> apprise URL (or a secret), and mail for everyone else.
    owners: dict[Annotated[str, Field(pattern=USER_NAME)], str | Secret] = Field(
        default_factory=dict
    )
    owner_mail: OwnerMail | None = None
    # How an owner can avoid it next time (site words: a partition, a channel to ask in):
    # one text, or one per step kind (the others keep gpuwarden's own words).
    advice: str | dict[OwnerStepKind, str] | None = None
    # type alertmanager: re-post an open incident's alert this often; extra labels on every
    # alert; a link to the incident (${host} ${incident} ${rule}); a matching silence
    # acknowledges the incident.
    resend: Seconds | None = Field(default=None, gt=0)
    labels: dict[str, str] = Field(default_factory=dict)
    link: str | None = None
    ack_on_silence: bool = False

    def advice_for(self, kind: str) -> str | None:
        if isinstance(self.advice, dict):
            return next((text for k, text in self.advice.items() if k == kind), None)
        return self.advice

    @property
    def for_owners(self) -> bool:
        return bool(self.owners) or self.owner_mail is not None

    def reaches(self, user: str | None) -> bool:
        """Whether this owner target has an address for ``user``."""
        if user is None or not re.fullmatch(USER_NAME, user):
            return False
        return user in self.owners or self.owner_mail is not None

    @field_validator("labels")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not ALERT_LABEL.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a label name: letters, digits and '_', not starting "
                    "with a digit"
                )
            if name in ALERT_OWN_LABELS:
                raise ValueError(
                    f"label {name!r} is gpuwarden's own ({', '.join(ALERT_OWN_LABELS)}); "
                    "choose another name"
                )
        return value

    @field_validator("link")
    @classmethod
    def _link_names(cls, value: str | None) -> str | None:
        if value is None:
            return value
        unknown = sorted(set(re.findall(r"\$\{(\w+)\}", value)) - set(ALERT_LINK_NAMES))
        if unknown:
            raise ValueError(
                f"unknown placeholder ${{{unknown[0]}}}: a link may use "
                + ", ".join(f"${{{n}}}" for n in ALERT_LINK_NAMES)
            )
        return value

    @model_validator(mode="after")
    def _fits_its_type(self) -> NotifyTarget:
        if self.type == "apprise":
            given = [
                k
                for k in ("resend", "labels", "link", "ack_on_silence")
                if getattr(self, k) not in (None, {}, False)
            ]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: only for a target of type alertmanager; "
                    "add type: alertmanager or remove them"
                )
            return self
        given = [
            k
            for k in ("config", "tags", "quiet_hours", "fallback")
            if getattr(self, k) not in (None, ())
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)}: not for a target of type alertmanager (Alertmanager's "
                "own routes, time intervals and receivers do that); remove them"
            )
        if self.for_owners or self.advice is not None:
            raise ValueError(
                "owners, owner_mail, advice: not for a target of type alertmanager (an owner "
                "target tells each process's owner); make those another target"
            )
        if not self.urls:
            raise ValueError(
                "an alertmanager target needs urls: Alertmanager's base URL, one per "
                "instance of a cluster, e.g. http://alertmanager:9093"
            )
        for url in self.urls:
            if isinstance(url, str) and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", url):
                raise ValueError(
                    f"{url!r} is not an Alertmanager URL: write its base URL, "
                    "e.g. http://alertmanager:9093"
                )
        return self

    @field_validator("quiet_hours")
    @classmethod
    def _window(cls, value: str | None) -> str | None:
        if value is not None:
            parse_active(value)  # raises ValueError saying what was expected
        return value

    @model_validator(mode="after")
    def _has_destination(self) -> NotifyTarget:
        if self.for_owners:
            if self.urls or self.config is not None:
                raise ValueError(
                    "an owner target (owners, owner_mail) tells each process's owner: it takes "
                    "no urls or config; make those another target"
                )
            return self
        if self.advice is not None:
            raise ValueError("advice is for owner targets (with owners or owner_mail)")
        if not self.urls and self.config is None:
            raise ValueError("a target needs urls, an apprise config file, or owners")
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
