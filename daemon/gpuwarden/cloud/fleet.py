"""This host's part in the fleet budgets: which DynamoDB item each profile takes its slots
from, and the bookkeeping around a launch and a reap round (``budget.py`` is one item).

Profiles naming the same table, key, region and endpoint share one item. Before a launch the
service takes a reservation (``take``); the launch turns it into one holder per instance
(``settle``) or gives it back (``cancel``). When the reaper has terminated instances their
slots are given back (``release``), and every reap round renews this host's leases
(``renew``). Giving back and renewing never fail a step or a round: what could not be written
is logged, and the next round, or the lease's end, puts it right.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from gpuwarden.cloud import budget
from gpuwarden.cloud.budget import FleetBudget
from gpuwarden.cloud.ec2 import CloudError
from gpuwarden.cloud.slots import Grant, micro, reservation_key
from gpuwarden.cloud.store import InstanceStore
from gpuwarden.config import Cloud, CloudProfile

log = logging.getLogger("gpuwarden.cloud")
Ident = tuple[str, str, str, str]  # table, key, region, endpoint


def ident(name: str, profile: CloudProfile) -> Ident | None:
    """Which budget item a profile uses; None when it has no budget."""
    spec = profile.budget
    if spec is None:
        return None
    return (spec.table, spec.key or name, spec.region or profile.region, spec.endpoint_url or "")


class Fleet:
    """The budget items this host uses, connected on first use (not thread-safe: the cloud
    service calls it under its launch lock)."""

    def __init__(
        self,
        host: str,
        connect: Callable[[CloudProfile, str, str], FleetBudget] = budget.connect,
    ) -> None:
        self.host = host
        self._connect = connect
        self._items: dict[Ident, FleetBudget] = {}

    def clear(self) -> None:
        """A reload: connect again at the next use."""
        self._items.clear()

    def item(self, cloud: Cloud, name: str) -> FleetBudget | None:
        """The named profile's budget item; None when it has none."""
        profile = cloud.profiles[name]
        found = ident(name, profile)
        if found is None:
            return None
        if found not in self._items:
            self._items[found] = self._connect(profile, found[1], self.host)
        return self._items[found]

    def take(
        self,
        item: FleetBudget,
        want: int,
        price: float | None,
        now: float,
        *,
        incident: str,
        step: int,
        attempt: str,
        dry_run: bool,
    ) -> tuple[Grant, str | None]:
        """Slots for up to ``want`` instances at ``price`` an hour: (what was granted, the
        reservation holding them). A dry run takes nothing and says what would fit."""
        each = micro(price)
        if dry_run:
            return item.room(want, each, now), None
        holder = reservation_key(self.host, incident, step, attempt)
        return item.reserve(holder, want, each, now, incident=incident), holder

    def cancel(self, item: FleetBudget, holder: str) -> None:
        try:
            item.cancel(holder)
        except CloudError as exc:
            log.error("cloud budget: giving back %s: %s; its lease runs out", holder, exc)

    def settle(
        self,
        item: FleetBudget,
        holder: str,
        ids: Sequence[str],
        price: float | None,
        now: float,
        incident: str,
    ) -> None:
        try:
            item.settle(holder, {i: micro(price) for i in ids}, now, incident)
        except CloudError as exc:  # launched all the same: the next reap round counts them
            log.error("cloud budget: recording %s: %s", " ".join(ids), exc)

    def release(self, cloud: Cloud, name: str, instance_ids: Sequence[str]) -> None:
        """Instances of the named profile ended: give their slots back."""
        if not instance_ids or name not in cloud.profiles:
            return
        try:
            item = self.item(cloud, name)
            if item is not None:
                item.release(instance_ids)
        except CloudError as exc:
            log.error("cloud budget: releasing %s: %s", " ".join(instance_ids), exc)

    def renew(self, cloud: Cloud, store: InstanceStore, now: float) -> list[str]:
        """For each budget item: renew the leases of this host's live instances, hold slots
        for any it lacks, drop what this host no longer runs, free other hosts' expired
        slots. Call with no launch in flight. One line per item that could not be asked."""
        names_by_item: dict[Ident, list[str]] = {}
        for name, profile in sorted(cloud.profiles.items()):
            found = ident(name, profile)
            if found is not None:
                names_by_item.setdefault(found, []).append(name)
        problems: list[str] = []
        for names in names_by_item.values():
            live = {
                m.instance_id: (micro(m.hourly_usd), m.incident or "")
                for name in names
                for m in store.live(name)
            }
            try:
                item = self.item(cloud, names[0])
                if item is not None:
                    item.renew(live, now)
            except CloudError as exc:
                problems.append(f"{', '.join(names)}: {exc}")
                log.error(
                    "cloud budget of %s: %s; the leases are renewed at the next round",
                    ", ".join(names),
                    exc,
                )
        return problems
