"""The fleet budget's item and the decisions on it, as pure functions (no I/O, no boto3).

``budget.py`` reads and writes the item; this module says what the item holds (``State``,
``Holder``), how many instances fit (``fits``) and how one conditional ``UpdateItem`` is
written (``Update``). Money is counted in millionths of a dollar an hour, so sums are exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KEY = "budget"  # the table's partition key (a string)
COUNT = "instances"
MONEY = "micro_usd"
HOLDERS = "holders"
MICRO = 1_000_000
CHUNK = 20  # holders one UpdateItem changes: its expression stays far below DynamoDB's 4 KB


def micro(usd: float | None) -> int:
    """Dollars per hour in millionths (exact sums: 0.1 + 0.2 fits a budget of 0.3)."""
    return 0 if usd is None else round(usd * MICRO)


def dollars(amount: int) -> str:
    return f"${amount / MICRO:,.2f}"


def reservation_key(host: str, incident: str, step: int, attempt: str) -> str:
    """The holder of the slots one launch attempt takes before it calls EC2."""
    return f"r:{host}:{incident}:{step}:{attempt}"


@dataclass(frozen=True, slots=True)
class Holder:
    key: str
    host: str
    count: int
    micro: int
    expires: float
    incident: str = ""

    @property
    def reservation(self) -> bool:
        return self.key.startswith("r:")


@dataclass(frozen=True, slots=True)
class State:
    """The item as read (``exists`` False: no host has used the budget yet)."""

    count: int = 0
    micro: int = 0
    holders: dict[str, Holder] = field(default_factory=dict)
    exists: bool = True

    @property
    def hosts(self) -> set[str]:
        return {h.host for h in self.holders.values()}


@dataclass(frozen=True, slots=True)
class Grant:
    """How many instances the fleet budget allows (taken, or in dry-run: would allow), and
    what capped it ("" when nothing did)."""

    count: int
    why: str = ""


@dataclass
class Renewal:
    """What one renewal round did to the item (one entry per holder)."""

    renewed: int = 0
    added: list[str] = field(default_factory=list)  # instances the item lacked
    dropped: list[str] = field(default_factory=list)  # this host's holders it no longer runs
    expired: list[str] = field(default_factory=list)  # other hosts' holders past their lease


def _number(value: Any) -> float:
    return float((value or {}).get("N", "0"))


def parse_item(item: Mapping[str, Any]) -> State:
    holders: dict[str, Holder] = {}
    for key, raw in ((item.get(HOLDERS) or {}).get("M") or {}).items():
        fields = raw.get("M") or {}
        holders[key] = Holder(
            key=key,
            host=str((fields.get("host") or {}).get("S", "")),
            count=int(_number(fields.get("n"))),
            micro=int(_number(fields.get("micro"))),
            expires=_number(fields.get("expires")),
            incident=str((fields.get("incident") or {}).get("S", "")),
        )
    return State(int(_number(item.get(COUNT))), int(_number(item.get(MONEY))), holders)


def holder_value(host: str, count: int, amount: int, expires: float, incident: str) -> Any:
    value = {
        "host": {"S": host},
        "n": {"N": str(count)},
        "micro": {"N": str(amount)},
        "expires": {"N": f"{expires:.3f}"},
    }
    if incident:
        value["incident"] = {"S": incident}
    return {"M": value}


def chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


_BASE_NAMES = {"#h": HOLDERS, "#c": COUNT, "#m": MONEY, "#e": "expires"}


class Update:
    """One UpdateItem, built up: SET, REMOVE and ADD clauses and the conditions, with every
    holder key and value bound as a placeholder (holder keys hold ``:`` and ``/``)."""

    def __init__(self) -> None:
        self.sets: list[str] = []
        self.removes: list[str] = []
        self.count = 0
        self.micro = 0
        self.conditions: list[str] = []
        self.names: dict[str, str] = {}  # #k0, #k1, ...: holder keys
        self.values: dict[str, Any] = {}

    def name(self, key: str) -> str:
        ref = f"#k{len(self.names)}"
        self.names[ref] = key
        return ref

    def value(self, value: Any) -> str:
        ref = f":v{len(self.values)}"
        self.values[ref] = value
        return ref

    def params(self) -> dict[str, Any]:
        clauses = []
        if self.sets:
            clauses.append("SET " + ", ".join(self.sets))
        if self.removes:
            clauses.append("REMOVE " + ", ".join(self.removes))
        adds = []
        if self.count:
            adds.append(f"#c {self.value({'N': str(self.count)})}")
        if self.micro:
            adds.append(f"#m {self.value({'N': str(self.micro)})}")
        if adds:
            clauses.append("ADD " + ", ".join(adds))
        text = " ".join([*clauses, *self.conditions])
        names = {k: v for k, v in _BASE_NAMES.items() if re.search(rf"{k}\b", text)}
        params: dict[str, Any] = {
            "UpdateExpression": " ".join(clauses),
            "ExpressionAttributeNames": names | self.names,
        }
        if self.conditions:
            params["ConditionExpression"] = " AND ".join(self.conditions)
        if self.values:
            params["ExpressionAttributeValues"] = self.values
        return params


@dataclass(frozen=True, slots=True)
class Caps:
    """What a budget allows (None: no cap of that kind); ``label`` names it in reasons."""

    max_instances: int | None
    max_micro: int | None
    label: str


def fits(caps: Caps, state: State, want: int, each: int) -> Grant:
    """How many of ``want`` instances at ``each`` micro-dollars an hour fit beside what
    ``state`` holds."""
    count = max(0, want)
    why = ""
    if caps.max_instances is not None:
        room = caps.max_instances - state.count
        if room < count:
            count = max(0, room)
            said = "reached" if count == 0 else f"leaves room for {count}"
            why = (
                f"{caps.label}: max_instances {caps.max_instances} {said}: "
                f"{state.count} held across the fleet"
            )
    if caps.max_micro is not None and count > 0:
        if each <= 0:
            return Grant(0, f"{caps.label}: the instance type has no price")
        room = max(0, (caps.max_micro - state.micro) // each)
        if room < count:
            count = room
            why = (
                f"{caps.label}: max_dollars_per_hour {dollars(caps.max_micro)} leaves room "
                f"for {room}: {dollars(state.micro)}/h held across the fleet, "
                f"{dollars(each)}/h each"
            )
    return Grant(count, why)
