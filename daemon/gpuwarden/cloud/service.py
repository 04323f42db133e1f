"""The cloud side of the daemon: launch within the caps; reconciling and reaping live in
``gpuwarden.cloud.reaper``.

Every decision that spends money is taken under one lock, so two incidents that fire in the
same tick cannot both see room for the last allowed instance. Before launching, a step looks
for what it already launched — in the journal, then in EC2 by its tags, because a launch whose
answer was lost (a crash, a timeout) is only visible there — and launches with a ClientToken
derived from the incident and the step, so a retry cannot double-launch on real EC2 either.

Caps count the instances this host owns: the journal's live rows and EC2's view by tag, merged.
If EC2 cannot be asked, nothing is launched (a cap that cannot be checked is not a cap). A
profile with a ``budget`` also takes its slots from the fleet's DynamoDB item before each
launch (``budget.py``); if DynamoDB cannot be asked, nothing is launched either.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from gpuwarden.actions.base import Waiter
from gpuwarden.cloud import budget, ec2, plan, tags
from gpuwarden.cloud.budget import FleetBudget
from gpuwarden.cloud.ec2 import CloudError, Ec2, LaunchRequest, Seen
from gpuwarden.cloud.fleet import Fleet
from gpuwarden.cloud.instance import ENDED_STATES, LIVE_STATES, Managed
from gpuwarden.cloud.store import InstanceStore
from gpuwarden.config import Cloud, CloudProfile
from gpuwarden.model import Intent, Outcome

log = logging.getLogger("gpuwarden.cloud")
T = TypeVar("T")


def _pause(seconds: float) -> bool:
    """The wait between retries of a reconcile or reap round (a worker thread or the CLI)."""
    time.sleep(seconds)
    return True


def _money(usd: float | None) -> str:
    return "unpriced" if usd is None else f"${usd:,.2f}"


class CloudService:
    def __init__(
        self,
        cloud: Cloud,
        store: InstanceStore,
        *,
        host: str,
        connect: Callable[[CloudProfile], Ec2] = ec2.connect,
        connect_budget: Callable[[CloudProfile, str, str], FleetBudget] = budget.connect,
    ) -> None:
        self.cloud = cloud
        self.store = store
        self.host = host
        self._connect = connect
        self.fleet = Fleet(host, connect_budget)
        self._clients: dict[str, Ec2] = {}
        self._lock = threading.RLock()

    def update(self, cloud: Cloud) -> None:
        """A reload: new profiles apply to the next step; connections are made again."""
        with self._lock:
            self.cloud = cloud
            self._clients.clear()
            self.fleet.clear()

    def described(
        self, name: str, *, sleep: Callable[[float], bool] = _pause, **filters: Any
    ) -> list[Seen]:
        """This host's instances as EC2 describes them, through the named profile's client
        (``Ec2.managed`` filters), retried with backoff while EC2 throttles."""
        call = partial(self.client(name).managed, host=self.host, **filters)
        return self.retrying(call, sleep=sleep)

    def retrying(self, call: Callable[[], T], *, sleep: Callable[[float], bool] = _pause) -> T:
        """``call()``, retried with backoff while EC2 throttles. ``sleep``: how to wait (a
        step waits on its context, which a stopping daemon cancels; reconcile and reap rounds
        run in a worker thread or the CLI and simply sleep)."""
        return ec2.with_backoff(call, sleep=sleep)

    def client(self, name: str) -> Ec2:
        with self._lock:
            if name not in self._clients:
                self._clients[name] = self._connect(self.cloud.profiles[name])
            return self._clients[name]

    # -- the fleet budget -----------------------------------------------------------------------

    def release(self, name: str, instance_ids: Sequence[str]) -> None:
        """Instances of the named profile ended: give their fleet slots back (logged when
        it fails; the next round drops them, or their lease runs out)."""
        with self._lock:
            self.fleet.release(self.cloud, name, instance_ids)

    def renew_budgets(self, now: float) -> list[str]:
        """The reap round's part in the fleet budgets (``Fleet.renew``), under the launch
        lock: no reservation of this host is in flight. One line per budget not reached."""
        with self._lock:
            return self.fleet.renew(self.cloud, self.store, now)

    # -- launching ------------------------------------------------------------------------------

    def provision(
        self,
        intent: Intent,
        profile_name: str,
        count: int | None,
        *,
        dry_run: bool,
        now: float,
        waiter: Waiter,
    ) -> Outcome:
        profile = self.cloud.profiles.get(profile_name)
        if profile is None:
            return Outcome(
                ok=False,
                detail=f"cloud profile {profile_name} is not configured (any more)",
                dry_run=dry_run,
            )
        want = count or profile.count
        try:
            client = self.client(profile_name)
            with self._lock:
                return self._provision(
                    intent, profile_name, profile, client, want, dry_run, now, waiter
                )
        except CloudError as exc:
            return Outcome(
                ok=False,
                recoverable=exc.kind in {"throttled", "unavailable", "other"},
                detail=f"nothing launched: {exc}",
                dry_run=dry_run,
            )

    def _provision(
        self,
        intent: Intent,
        name: str,
        profile: CloudProfile,
        client: Ec2,
        want: int,
        dry_run: bool,
        now: float,
        waiter: Waiter,
    ) -> Outcome:
        # 1. What this step launched already: the journal, then EC2 by tag. Incident ids
        # name a rule, a scope and a second, not a host: another host's incident of the same
        # id is not this one.
        mine = [m for m in self.store.for_step(intent.incident, intent.step) if m.live]
        seen = self.described(name, sleep=waiter.wait, incident=intent.incident, step=intent.step)
        already = plan.merge(mine, [self.from_seen(s, name, profile, now) for s in seen])
        already = [m for m in already if m.live]
        if already and not dry_run:
            for instance in already:
                self.store.add(replace(instance, intent=instance.intent or intent.id), now)
            ids = ", ".join(m.instance_id for m in already)
            log.info(
                "provision incident=%s step=%d already launched: %s",
                intent.incident,
                intent.step,
                ids,
            )
            return Outcome(ok=True, detail=f"already launched for this step: {ids}")

        # 2. The caps, against everything this host owns in this profile.
        owned = plan.merge(
            self.store.live(name),
            [
                self.from_seen(s, name, profile, now)
                for s in self.described(name, sleep=waiter.wait, profile=name)
            ],
        )
        owned = [m for m in owned if m.live]
        remaining = want
        launched: list[Managed] = []
        planned: list[Managed] = []  # dry-run: what would be launched counts against the caps
        would: list[str] = []
        why: list[str] = []
        for attempt in plan.attempts(profile):
            if remaining <= 0:
                break
            room = plan.allowance(
                profile, name, owned + launched + planned, remaining, attempt.instance_type
            )
            if room.count <= 0:
                why.append(room.why)
                continue
            price = plan.price(profile, attempt.instance_type)
            count = room.count
            # The fleet's budget, after this host's own caps: slots taken before the launch.
            holder = None
            fleet = self.fleet.item(self.cloud, name)
            if fleet is not None:
                try:
                    grant, holder = self.fleet.take(
                        fleet,
                        count,
                        price,
                        now,
                        incident=intent.incident,
                        step=intent.step,
                        attempt=attempt.key,
                        dry_run=dry_run,
                    )
                except CloudError as exc:
                    if launched:
                        why.append(str(exc))
                        break
                    raise
                if grant.why:
                    why.append(grant.why)
                if grant.count <= 0:
                    continue
                count = grant.count
            where = f"{profile.region}" + (f"/{attempt.subnet}" if attempt.subnet else "")
            # From the step's planned time, not now: a retry sends the very same request (real
            # EC2 answers IdempotentParameterMismatch to a token reused with other tags).
            expires_at = intent.time + profile.ttl
            request = self._request(intent, name, profile, attempt, count, expires_at)
            try:
                got = self.retrying(
                    partial(client.launch, request, dry_run=dry_run), sleep=waiter.wait
                )
            except CloudError as exc:
                if fleet is not None and holder is not None:
                    self.fleet.cancel(fleet, holder)
                if exc.kind == "capacity":
                    why.append(f"{attempt.instance_type} in {where}: {exc.code}")
                    log.warning(
                        "provision %s: %s in %s: %s, trying the next choice",
                        name,
                        attempt.instance_type,
                        where,
                        exc.code,
                    )
                    continue
                if launched:
                    why.append(str(exc))
                    break
                raise
            hourly = None if price is None else price * count
            # What one instance of this launch is, in the journal's terms.
            one_of = Managed(
                instance_id="",
                profile=name,
                region=profile.region,
                instance_type=attempt.instance_type,
                market=profile.market,
                state="pending",
                launched_at=now,
                expires_at=expires_at,
                host=self.host,
                incident=intent.incident,
                rule=intent.rule,
                step=intent.step,
                intent=intent.id,
                subnet=attempt.subnet,
                hourly_usd=price,
            )
            if dry_run:
                would.append(
                    f"{count} x {attempt.instance_type} ({profile.market}) in {where} "
                    f"at {_money(hourly)}/h"
                )
                remaining -= count
                planned += [
                    replace(one_of, instance_id=f"(would {len(planned) + n})") for n in range(count)
                ]
                continue
            for one in got:
                managed = replace(
                    one_of,
                    instance_id=one.instance_id,
                    state=one.state or "pending",
                    subnet=one.subnet or attempt.subnet,
                )
                self.store.add(managed, now)
                launched.append(managed)
            remaining -= len(got)
            if fleet is not None and holder is not None:
                got_ids = [g.instance_id for g in got]
                self.fleet.settle(fleet, holder, got_ids, price, now, intent.incident)
            log.info(
                "provision incident=%s profile=%s launched %s x %s in %s: %s",
                intent.incident,
                name,
                len(got),
                attempt.instance_type,
                where,
                " ".join(i.instance_id for i in got),
            )
        return self._outcome(profile, want, want - remaining, launched, would, why, dry_run)

    def _outcome(
        self,
        profile: CloudProfile,
        want: int,
        done: int,
        launched: Sequence[Managed],
        would: Sequence[str],
        why: Sequence[str],
        dry_run: bool,
    ) -> Outcome:
        reasons = "; ".join(dict.fromkeys(why))  # a cap says the same for every attempt
        if not reasons:
            capped = ""
        elif done < want:
            capped = f" (not all: {reasons})"
        else:
            capped = f" (tried first: {reasons})"
        if dry_run:
            if not would:
                return Outcome(ok=False, detail=f"would launch nothing: {reasons}", dry_run=True)
            return Outcome(
                ok=True,
                dry_run=True,
                detail="would launch " + ", ".join(would) + "; EC2 accepted the request "
                "(DryRun): credentials and permissions work" + capped,
            )
        if not launched:
            return Outcome(ok=False, detail=f"nothing launched: {reasons}")
        hourly = [m.hourly_usd for m in launched]
        total = None if any(h is None for h in hourly) else sum(h for h in hourly if h)
        ids = ", ".join(m.instance_id for m in launched)
        expiry = tags.format_expires(launched[0].expires_at)
        more = f" of {want}" if len(launched) < want else ""
        return Outcome(
            ok=True,
            detail=f"launched {len(launched)}{more} in {profile.region}: {ids}; "
            f"{_money(total)}/h; terminated by {expiry} at the latest{capped}",
        )

    def _request(
        self,
        intent: Intent,
        name: str,
        profile: CloudProfile,
        attempt: plan.Attempt,
        count: int,
        expires_at: float,
    ) -> LaunchRequest:
        values = {
            "incident": intent.incident,
            "rule": intent.rule,
            "host": self.host,
            "profile": name,
            "instance_type": attempt.instance_type,
            "expires": tags.format_expires(expires_at),
        }
        user_data = None
        if profile.user_data is not None:
            user_data = tags.render_user_data(profile.user_data, values)
        return LaunchRequest(
            instance_type=attempt.instance_type,
            count=count,
            # The host is part of the attempt: a token is unique per account and region, and
            # two hosts can fire an incident of the same id.
            client_token=tags.client_token(
                intent.incident, intent.step, f"{self.host}/{attempt.key}"
            ),
            tags=tags.instance_tags(
                profile_name=name,
                profile_tags=profile.tags,
                incident=intent.incident,
                rule=intent.rule,
                host=self.host,
                step=intent.step,
                expires_at=expires_at,
            ),
            image_id=profile.ami,
            launch_template=profile.launch_template,
            subnet=attempt.subnet,
            security_groups=profile.security_groups,
            key_name=profile.key_name,
            market=profile.market,
            user_data=user_data,
        )

    def from_seen(self, seen: Seen, name: str, profile: CloudProfile, now: float) -> Managed:
        """An instance as EC2 describes it, in the journal's terms (times from its tags)."""
        found = seen.tags
        launched_at = seen.launch_time if seen.launch_time is not None else now
        expires_at = tags.parse_expires(found.get(tags.EXPIRES, ""))
        step = found.get(tags.STEP, "")
        return Managed(
            instance_id=seen.instance_id,
            profile=found.get(tags.PROFILE, name),
            region=profile.region,
            instance_type=seen.instance_type,
            market=profile.market,
            state=seen.state,
            launched_at=launched_at,
            expires_at=expires_at if expires_at is not None else launched_at + profile.ttl,
            host=found.get(tags.HOST, self.host),
            incident=found.get(tags.INCIDENT) or None,
            rule=found.get(tags.RULE) or None,
            step=int(step) if step.isdigit() else None,
            subnet=seen.subnet,
            hourly_usd=plan.price(profile, seen.instance_type),
            adopted=True,
        )

    # -- views ----------------------------------------------------------------------------------

    def instances(self, now: float, *, live: bool = True) -> tuple[list[Managed], list[str]]:
        """Every instance the journal knows, newest first, with EC2's current state where it
        can be asked (nothing is written); and what could not be asked."""
        rows = self.store.all()
        if not live:
            return rows, []
        problems: list[str] = []
        states: dict[str, str] = {}
        extra: list[Managed] = []
        known = {m.instance_id for m in rows}
        for name, profile in sorted(self.cloud.profiles.items()):
            try:
                described = self.described(name, states=LIVE_STATES + ENDED_STATES)
            except CloudError as exc:
                problems.append(f"{name}: {exc}")
                continue
            for seen in described:
                states[seen.instance_id] = seen.state
                if seen.instance_id not in known and seen.state in LIVE_STATES:
                    known.add(seen.instance_id)
                    extra.append(self.from_seen(seen, name, profile, now))
        merged = [
            replace(m, state=states[m.instance_id]) if m.instance_id in states else m for m in rows
        ]
        return extra + merged, problems

    def totals(self, now: float) -> tuple[int, float]:
        """Live instances in the journal, and the estimated spend of every instance it knows."""
        rows = self.store.all()
        spend = sum(m.cost_so_far(now) or 0.0 for m in rows)
        return sum(1 for m in rows if m.live), spend
