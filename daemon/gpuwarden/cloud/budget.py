"""The fleet-wide burst budget: one DynamoDB item per budget, shared by every host.

The caps of a profile (``max_instances``, ``max_hourly_usd``) count what one host launched:
fifty hosts with ``max_instances: 2`` may run a hundred instances. A profile's ``budget`` caps
the fleet: every host naming the same table and key takes its slots from one item::

    {budget: KEY, instances: N, micro_usd: M,
     holders: {HOLDER: {host: …, n: …, micro: …, expires: …, incident: …}, …}}

``instances`` and ``micro_usd`` (millionths of a dollar per hour) are the sums over
``holders``. Every change is one ``UpdateItem`` whose ``ConditionExpression`` states what it
relies on, and DynamoDB applies each atomically: a take says ``instances <= max - n`` and
``micro_usd <= max - cost`` (two hosts can never overshoot: the later one's condition fails,
it reads again and finds less room), a release says "this holder still exists" (a slot is
never freed twice).

A holder is one instance (its id), or a reservation taken just before a launch
(``r:HOST:INCIDENT:STEP:ATTEMPT``) that becomes the instances the launch returned
(``settle``), or is given back when the launch failed (``cancel``). Every holder expires
``lease`` seconds ahead; each reap round renews this host's holders (``renew``, which also
adds an instance the item lacks and drops what this host no longer runs). A holder past its
expiry belongs to a host that stopped renewing (it died, or lost its network): any host may
remove it — on condition that its expiry is still the one it read — and its slots are free.

boto3 is imported lazily (``connect``), as for EC2. Every failure leaves as a ``CloudError``;
a launch whose slots cannot be taken launches nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuwarden.cloud.ec2 import NO_CREDENTIALS, CloudError, translate
from gpuwarden.cloud.slots import (
    CHUNK,
    COUNT,
    HOLDERS,
    KEY,
    MONEY,
    Caps,
    Grant,
    Holder,
    Renewal,
    State,
    Update,
    chunks,
    fits,
    holder_value,
    micro,
    parse_item,
)

if TYPE_CHECKING:
    from gpuwarden.config import Budget, CloudProfile

log = logging.getLogger("gpuwarden.cloud")

TRIES = 10  # reads and conditional writes before a take gives up (others kept changing it)


class _Conflict(Exception):
    """A condition did not hold: another host changed the item first."""


class FleetBudget:
    """One budget item, as this host uses it. ``client`` is a boto3 DynamoDB client."""

    def __init__(self, client: Any, budget: Budget, *, key: str, host: str) -> None:
        self.client = client
        self.table = budget.table
        self.key = key
        self.host = host
        limit = budget.max_dollars_per_hour
        self.label = f"fleet budget {key!r} (table {budget.table})"
        self.caps = Caps(budget.max_instances, None if limit is None else micro(limit), self.label)
        self.lease = budget.lease

    # -- calls -----------------------------------------------------------------------------

    def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response: dict[str, Any] = getattr(self.client, operation)(
                TableName=self.table, **params
            )
        except ClientError as error:
            code = str((error.response.get("Error") or {}).get("Code") or "")
            if code == "ConditionalCheckFailedException":
                raise _Conflict from None
            raise self._error(translate(error, operation, "DynamoDB")) from None
        except BotoCoreError as error:
            raise self._error(translate(error, operation, "DynamoDB")) from None
        return response

    def _error(self, exc: CloudError) -> CloudError:
        hint = ""
        if exc.code == "ResourceNotFoundException":
            hint = " (create the table: docs/fleet.md, 'A fleet-wide burst budget')"
        return CloudError(exc.kind, f"{self.label}: {exc.message}{hint}", code=exc.code)

    def _item_key(self) -> dict[str, Any]:
        return {KEY: {"S": self.key}}

    def _update(self, update: Update) -> None:
        self._call("update_item", Key=self._item_key(), **update.params())

    def read(self) -> State:
        """The item, read consistently (every take and release starts from it)."""
        item = self._call("get_item", Key=self._item_key(), ConsistentRead=True).get("Item")
        return State(exists=False) if item is None else parse_item(item)

    def _create(self) -> None:
        item = {
            KEY: {"S": self.key},
            COUNT: {"N": "0"},
            MONEY: {"N": "0"},
            HOLDERS: {"M": {}},
        }
        with contextlib.suppress(_Conflict):  # another host created it first
            self._call("put_item", Item=item, ConditionExpression=f"attribute_not_exists({KEY})")

    # -- deciding ----------------------------------------------------------------------------

    def room(self, want: int, each: int, now: float) -> Grant:
        """What a take would get now, taking nothing (dry-run): expired holders count as
        free, as a take would remove them."""
        state = self.read()
        live = {k: h for k, h in state.holders.items() if h.expires >= now}
        gone = [h for h in state.holders.values() if h.expires < now]
        left = State(
            state.count - sum(h.count for h in gone),
            state.micro - sum(h.micro for h in gone),
            live,
        )
        return fits(self.caps, left, want, each)

    # -- taking and giving back --------------------------------------------------------------

    def reserve(self, holder: str, want: int, each: int, now: float, *, incident: str) -> Grant:
        """Take up to ``want`` slots at ``each`` micro-dollars an hour for ``holder`` (a
        reservation): as many as fit, never more than the caps allow whatever other hosts
        do at the same time."""
        for _ in range(TRIES):
            state = self.read()
            if not state.exists:
                self._create()
                continue
            if holder in state.holders:  # left by an earlier try of this same launch
                self._drop(state.holders[holder])
                continue
            grant = fits(self.caps, state, want, each)
            if grant.count < want and self._sweep(state, now):
                continue  # expired holders freed slots: read again
            if grant.count <= 0:
                return grant
            update = Update()
            ref = update.name(holder)
            update.sets.append(
                f"#h.{ref} = "
                + update.value(
                    holder_value(
                        self.host, grant.count, grant.count * each, now + self.lease, incident
                    )
                )
            )
            update.count, update.micro = grant.count, grant.count * each
            update.conditions.append(f"attribute_not_exists(#h.{ref})")
            if self.caps.max_instances is not None:
                limit = self.caps.max_instances - grant.count
                update.conditions.append(f"#c <= {update.value({'N': str(limit)})}")
            if self.caps.max_micro is not None:
                limit = self.caps.max_micro - grant.count * each
                update.conditions.append(f"#m <= {update.value({'N': str(limit)})}")
            try:
                self._update(update)
            except _Conflict:
                continue  # another host took slots in between: read again
            log.info(
                "%s: host %s took %d slot(s) for %s: %d of %s held",
                self.label,
                self.host,
                grant.count,
                incident,
                state.count + grant.count,
                self.caps.max_instances if self.caps.max_instances is not None else "any",
            )
            return grant
        raise CloudError(
            "throttled", f"{self.label}: the item changed {TRIES} times while taking slots"
        )

    def settle(self, holder: str, launched: Mapping[str, int], now: float, incident: str) -> None:
        """A launch under reservation ``holder`` returned ``launched`` (instance id → its
        micro-dollars an hour): the reservation becomes one holder per instance, and the
        slots not used are free again, in one write."""
        for _ in range(TRIES):
            state = self.read()
            reserved = state.holders.get(holder)
            if reserved is None:  # it expired while EC2 took its time: count what runs
                self.add({k: (v, incident) for k, v in launched.items()}, now)
                return
            first = dict(list(launched.items())[:CHUNK])
            update = Update()
            ref = update.name(holder)
            update.removes.append(f"#h.{ref}")
            update.conditions.append(f"attribute_exists(#h.{ref})")
            self._put(update, {k: (v, incident) for k, v in first.items()}, now)
            update.count -= reserved.count
            update.micro -= reserved.micro
            try:
                self._update(update)
            except _Conflict:
                continue
            rest = {k: (v, incident) for k, v in launched.items() if k not in first}
            if rest:
                self.add(rest, now)
            return
        raise CloudError("throttled", f"{self.label}: the item changed {TRIES} times")

    def cancel(self, holder: str) -> None:
        """A reservation whose launch launched nothing: its slots are free again."""
        found = self.read().holders.get(holder)
        if found is not None:
            self._drop(found)

    def add(self, instances: Mapping[str, tuple[int, str]], now: float) -> list[str]:
        """Hold slots for instances that run (instance id → (micro-dollars an hour, its
        incident)), launched or adopted, whatever the caps say: the budget counts what is
        there. Returns the ids added (those the item lacked)."""
        added: list[str] = []
        pending = dict(instances)
        for _ in range(TRIES):
            if not pending:
                break
            state = self.read()
            if not state.exists:
                self._create()
                continue
            pending = {k: v for k, v in pending.items() if k not in state.holders}
            for chunk in chunks(list(pending.items())):
                update = Update()
                self._put(update, dict(chunk), now)
                try:
                    self._update(update)
                except _Conflict:
                    break  # one of them appeared meanwhile: read again
                added += [k for k, _ in chunk]
                for k, _ in chunk:
                    pending.pop(k)
        return added

    def _put(self, update: Update, instances: Mapping[str, tuple[int, str]], now: float) -> None:
        for instance_id, (amount, incident) in instances.items():
            ref = update.name(instance_id)
            value = holder_value(self.host, 1, amount, now + self.lease, incident)
            update.sets.append(f"#h.{ref} = {update.value(value)}")
            update.conditions.append(f"attribute_not_exists(#h.{ref})")
            update.count += 1
            update.micro += amount

    def release(self, instance_ids: Iterable[str]) -> list[str]:
        """Instances that ended: their slots are free again. Returns the ids released (an id
        the item does not hold was released before, or expired)."""
        wanted = set(instance_ids)
        released: list[str] = []
        for _ in range(TRIES):
            state = self.read()
            present = [state.holders[k] for k in sorted(wanted) if k in state.holders]
            if not present:
                break
            conflicted = False
            for chunk in chunks(present):
                try:
                    self._drop_many(chunk)
                except _Conflict:
                    conflicted = True
                    break
                released += [h.key for h in chunk]
                wanted -= {h.key for h in chunk}
            if not conflicted:
                break
        if released:
            log.info("%s: host %s released %s", self.label, self.host, " ".join(released))
        return released

    def _drop(self, holder: Holder, *, expired: bool = False) -> bool:
        try:
            self._drop_many([holder], expired=expired)
        except _Conflict:
            return False
        return True

    def _drop_many(self, holders: Sequence[Holder], *, expired: bool = False) -> None:
        """Remove ``holders`` and their slots in one write, on condition that each is still
        there (``expired``: still with the expiry read, so a host that renewed in between
        keeps its slots)."""
        update = Update()
        for holder in holders:
            ref = update.name(holder.key)
            update.removes.append(f"#h.{ref}")
            if expired:
                stamp = update.value({"N": f"{holder.expires:.3f}"})
                update.conditions.append(f"#h.{ref}.#e = {stamp}")
            else:
                update.conditions.append(f"attribute_exists(#h.{ref})")
            update.count -= holder.count
            update.micro -= holder.micro
        self._update(update)

    def _sweep(self, state: State, now: float) -> list[str]:
        """Remove every holder past its expiry; the ids removed."""
        removed = []
        for holder in state.holders.values():
            if holder.expires < now and self._drop(holder, expired=True):
                removed.append(holder.key)
                log.warning(
                    "%s: the lease of %s (host %s, %d slot(s)) ran out: its slots are free",
                    self.label,
                    holder.key,
                    holder.host,
                    holder.count,
                )
        return removed

    # -- the reap round ----------------------------------------------------------------------

    def renew(self, live: Mapping[str, tuple[int, str]], now: float) -> Renewal:
        """This host runs ``live`` (instance id → (micro-dollars an hour, incident)) and has
        no launch in flight: renew their leases, hold slots for any the item lacks, drop
        this host's other holders (ended instances, reservations left by a crash), and
        remove other hosts' holders whose lease ran out."""
        report = Renewal()
        state = self.read()
        if not state.exists:
            if not live:
                return report
            self._create()
            state = self.read()
        stale = [h for k, h in state.holders.items() if h.host == self.host and k not in live]
        for chunk in chunks(stale):
            try:
                self._drop_many(chunk)
                report.dropped += [h.key for h in chunk]
            except _Conflict:
                pass  # released or expired meanwhile; the next round looks again
        others = State(holders={k: h for k, h in state.holders.items() if h.host != self.host})
        report.expired = self._sweep(others, now)
        keep = [k for k in live if k in state.holders]
        for chunk in chunks(keep):
            update = Update()
            stamp = update.value({"N": f"{now + self.lease:.3f}"})
            for key in chunk:
                ref = update.name(key)
                update.sets.append(f"#h.{ref}.#e = {stamp}")
                update.conditions.append(f"attribute_exists(#h.{ref})")
            try:
                self._update(update)
                report.renewed += len(chunk)
            except _Conflict:
                pass  # one was removed meanwhile: the next round adds it again
        missing = {k: v for k, v in live.items() if k not in state.holders}
        if missing:
            report.added = self.add(missing, now)
        if report.added or report.dropped:
            log.info(
                "%s: host %s renewed %d, added %s, dropped %s",
                self.label,
                self.host,
                report.renewed,
                " ".join(report.added) or "none",
                " ".join(report.dropped) or "none",
            )
        return report


def connect(profile: CloudProfile, key: str, host: str) -> FleetBudget:
    """The profile's budget item, through a DynamoDB client for its region (the budget's
    own region and endpoint where it names them), with boto3's usual credential chain."""
    budget = profile.budget
    if budget is None:
        raise ValueError("the profile has no budget")
    try:
        import boto3.session
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError
    except ImportError:
        raise CloudError(
            "unavailable", "boto3 is not installed: pip install 'gpuwarden[cloud]'"
        ) from None
    region = budget.region or profile.region
    try:
        session = boto3.session.Session(region_name=region)
        if session.get_credentials() is None:
            raise CloudError("unavailable", f"DynamoDB in {region}: {NO_CREDENTIALS}")
        client = session.client(
            "dynamodb",
            endpoint_url=budget.endpoint_url,
            config=Config(
                connect_timeout=5,
                read_timeout=10,
                retries={"mode": "standard", "total_max_attempts": 2},
            ),
        )
    except BotoCoreError as error:
        raise translate(error, "connect", "DynamoDB") from None
    return FleetBudget(client, budget, key=key, host=host)
