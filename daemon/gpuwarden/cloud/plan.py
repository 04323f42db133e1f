"""The decisions of cloud bursting, as pure functions of what is known and of ``now``.

Which launches to try and in what order (``attempts``), how many instances the caps still
allow (``allowance``), which instances to terminate (``reap_plan``), and how the journal's
record of the instances and EC2's view of them combine (``merge``). No I/O, no clock, no
boto3: the service gathers the facts and carries out the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpuwarden.cloud.instance import Managed
from gpuwarden.cloud.tags import format_expires
from gpuwarden.units import format_duration

if TYPE_CHECKING:
    from gpuwarden.config import CloudProfile

# Money is compared in millionths of a dollar, so that 0.1 + 0.2 fits a budget of 0.3.
_MICRO = 1_000_000


@dataclass(frozen=True, slots=True)
class Attempt:
    """One launch try: an instance type in one subnet (None: the default subnet)."""

    instance_type: str
    subnet: str | None

    @property
    def key(self) -> str:
        """A stable name for the try, e.g. ``p4d.24xlarge@subnet-0abc`` (for the token)."""
        return f"{self.instance_type}@{self.subnet or 'default'}"


@dataclass(frozen=True, slots=True)
class Allowance:
    """How many instances may be launched now, and what capped it ("" when nothing did)."""

    count: int
    why: str


@dataclass(frozen=True, slots=True)
class ReapDecision:
    """Terminate ``instance_id``: ``reason`` is ``ttl`` or ``linger``; ``detail`` says why."""

    instance_id: str
    reason: str
    detail: str


def attempts(profile: CloudProfile) -> list[Attempt]:
    """The launches to try in order: each instance type in order of preference, and for
    each type every subnet in the given order (the default subnet when none are given)."""
    subnets: tuple[str | None, ...] = profile.subnets or (None,)
    return [Attempt(t, s) for t in profile.instance_types for s in subnets]


def price(profile: CloudProfile, instance_type: str) -> float | None:
    """The hourly price of ``instance_type`` from the profile's table; None when absent."""
    return profile.prices.get(instance_type)


def _micro(usd: float) -> int:
    return round(usd * _MICRO)


def _live(owned: Sequence[Managed], profile_name: str) -> list[Managed]:
    seen: set[str] = set()
    live: list[Managed] = []
    for instance in owned:
        if instance.profile != profile_name or not instance.live:
            continue
        if instance.instance_id in seen:
            continue
        seen.add(instance.instance_id)
        live.append(instance)
    return live


def _usd(micro: int) -> str:
    return f"{micro / _MICRO:.2f}"


def allowance(
    profile: CloudProfile,
    profile_name: str,
    owned: Sequence[Managed],
    want: int,
    instance_type: str,
) -> Allowance:
    """How many of ``want`` instances of ``instance_type`` the profile's caps allow now.

    ``owned`` are the instances gpuwarden owns (only the live ones of ``profile_name`` count,
    each id once). The count is the least of ``want``, the room under ``max_instances`` and,
    with ``max_hourly_usd``, how many more at the type's price fit the budget beside what
    the live instances cost. Under a budget, an unpriced type, or a live instance whose
    price is unknown, allows nothing: the spend could not be checked."""
    live = _live(owned, profile_name)
    count = max(0, want)
    why = ""
    room = profile.max_instances - len(live)
    if room < count:
        count = max(0, room)
        why = (
            f"max_instances {profile.max_instances} reached: {len(live)} live"
            if count == 0
            else f"max_instances {profile.max_instances} leaves room for {count}: {len(live)} live"
        )
    if profile.max_hourly_usd is None or count == 0:
        return Allowance(count, why)
    each = price(profile, instance_type)
    if each is None or each <= 0:
        return Allowance(0, f"no price for {instance_type} in the profile")
    spent = 0
    unpriced: list[str] = []
    for instance in live:
        hourly = instance.hourly_usd
        if hourly is None:
            hourly = price(profile, instance.instance_type)
        if hourly is None:
            unpriced.append(f"{instance.instance_id} ({instance.instance_type})")
        else:
            spent += _micro(hourly)
    if unpriced:
        return Allowance(
            0, f"max_hourly_usd cannot be checked: no price for live {', '.join(unpriced)}"
        )
    budget = _micro(profile.max_hourly_usd)
    fits = max(0, (budget - spent) // _micro(each))
    if fits < count:
        count = fits
        why = (
            f"max_hourly_usd {_usd(budget)} leaves room for {fits}: {_usd(spent)}/h live, "
            f"{instance_type} costs {_usd(_micro(each))}/h"
        )
    return Allowance(count, why)


def reap_plan(
    instances: Sequence[Managed],
    resolved_at: Mapping[str, float],
    now: float,
    linger: Mapping[str, float],
) -> list[ReapDecision]:
    """Which live instances to terminate now, each once, in the order given.

    ``ttl``: ``now`` has reached the instance's ``expires_at``, incident or not. ``linger``:
    its incident resolved (``resolved_at``) at least ``linger[profile]`` ago. An instance
    without an incident is reaped at its ttl only; one whose profile is no longer in
    ``linger`` is reaped as soon as its incident has resolved."""
    decisions: list[ReapDecision] = []
    seen: set[str] = set()
    for instance in instances:
        if not instance.live or instance.instance_id in seen:
            continue
        decision = _reap_one(instance, resolved_at, now, linger)
        if decision is not None:
            seen.add(instance.instance_id)
            decisions.append(decision)
    return decisions


def _reap_one(
    instance: Managed, resolved_at: Mapping[str, float], now: float, linger: Mapping[str, float]
) -> ReapDecision | None:
    if now >= instance.expires_at:
        detail = f"past its ttl: expired {format_expires(instance.expires_at)}"
        return ReapDecision(instance.instance_id, "ttl", detail)
    if instance.incident is None or instance.incident not in resolved_at:
        return None
    resolved = resolved_at[instance.incident]
    wait = linger.get(instance.profile)
    since = now - resolved
    if wait is None:
        detail = (
            f"incident {instance.incident} resolved {format_duration(max(0.0, since))} ago "
            f"and profile {instance.profile} is no longer configured"
        )
        return ReapDecision(instance.instance_id, "linger", detail) if since >= 0 else None
    if since < wait:
        return None
    detail = (
        f"incident {instance.incident} resolved {format_duration(since)} ago "
        f"(linger {format_duration(wait)})"
    )
    return ReapDecision(instance.instance_id, "linger", detail)


def merge(journal: Sequence[Managed], seen: Sequence[Managed]) -> list[Managed]:
    """The journal's instances and those EC2 reports, one per instance id.

    An instance in both keeps the journal's record (its clock's times, its incident) with
    EC2's state, and takes from EC2 what the journal lacks (subnet, incident, rule, step);
    one EC2 reports live is not ended, whatever the journal says. Journal order first,
    then the instances only EC2 knows, in its order."""
    from_ec2: dict[str, Managed] = {}
    for instance in seen:
        from_ec2.setdefault(instance.instance_id, instance)
    merged: dict[str, Managed] = {}
    for record in journal:
        if record.instance_id in merged:
            continue
        other = from_ec2.get(record.instance_id)
        merged[record.instance_id] = record if other is None else _combine(record, other)
    for instance_id, instance in from_ec2.items():
        merged.setdefault(instance_id, instance)
    return list(merged.values())


def _combine(record: Managed, ec2: Managed) -> Managed:
    combined = replace(
        record,
        state=ec2.state,
        subnet=record.subnet if record.subnet is not None else ec2.subnet,
        incident=record.incident if record.incident is not None else ec2.incident,
        rule=record.rule if record.rule is not None else ec2.rule,
        step=record.step if record.step is not None else ec2.step,
        hourly_usd=record.hourly_usd if record.hourly_usd is not None else ec2.hourly_usd,
    )
    if combined.live and combined.terminated_at is not None:
        combined = replace(combined, terminated_at=None, end_reason=None)
    return combined
