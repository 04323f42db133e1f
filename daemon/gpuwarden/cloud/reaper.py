"""Keeping the journal and EC2 in agreement, and ending instances that are no longer needed.

``reconcile`` reads what EC2 reports under this host's tags: it adopts instances the journal
does not know (a launch whose answer was lost, a journal restored from a backup), records
state changes, and marks rows EC2 no longer knows as gone. ``reap`` terminates what lingered
long enough after its incident resolved and anything past its ttl; each instance is confirmed
as ours by its tags in EC2 just before, and one that ended behind our back is recorded, not
terminated again; the fleet budget's slots of what ended are given back. The daemon runs
both every ``cloud.reap_interval`` in a worker thread, then renews its fleet budget leases
(``CloudService.renew_budgets``); ``gpuwarden cloud reap`` runs them at once. Both take the
``CloudService`` whose clients, lock and store they use; the service knows nothing of them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

from gpuwarden.cloud import plan, tags
from gpuwarden.cloud.ec2 import CloudError, Seen
from gpuwarden.cloud.instance import ENDED_STATES, GONE, LIVE_STATES
from gpuwarden.cloud.service import CloudService
from gpuwarden.config import CloudProfile

log = logging.getLogger("gpuwarden.cloud")


@dataclass(frozen=True)
class Reaped:
    """One instance the reaper ended (or, in dry-run, would end)."""

    instance_id: str
    profile: str
    reason: str  # linger | ttl
    state: str  # the state EC2 reported after the call; "would" in dry-run
    detail: str


@dataclass
class Reconciled:
    """What a comparison of the journal with EC2 found; each list holds one line per instance."""

    adopted: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # our tags, a profile not configured
    errors: list[str] = field(default_factory=list)
    # What EC2 reported under this host's tags, by profile asked (id -> instance): the
    # reaper of the same round confirms ownership against it instead of asking again.
    seen: dict[str, dict[str, Seen]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return (
            [f"adopted {x}" for x in self.adopted]
            + [f"updated {x}" for x in self.updated]
            + [f"gone {x}" for x in self.gone]
            + [f"not configured {x}" for x in self.foreign]
            + [f"error {x}" for x in self.errors]
        )


def reconcile(service: CloudService, now: float) -> Reconciled:
    """Bring the journal in line with EC2: adopt instances that carry this host's tags but
    are not in the journal, update states, and mark what EC2 no longer knows as gone.
    Read-only towards EC2; what is past its time is the reaper's."""
    report = Reconciled()
    seen_ids: set[str] = set()
    foreign: set[str] = set()
    asked: set[str] = set()  # profiles whose view of EC2 we have
    for name, profile in sorted(service.cloud.profiles.items()):
        try:
            described = service.described(name, states=LIVE_STATES + ENDED_STATES)
        except CloudError as exc:
            report.errors.append(f"{name}: {exc}")
            continue
        asked.add(name)
        report.seen[name] = {s.instance_id: s for s in described}
        for seen in described:
            seen_ids.add(seen.instance_id)
            tagged = seen.tags.get(tags.PROFILE, name)
            if tagged in service.cloud.profiles:
                # Two profiles in one region see each other's instances: each profile's
                # pass handles its own, and every pass counts what it saw as known.
                if tagged == name:
                    _reconcile_one(service, seen, name, profile, now, report)
            elif seen.instance_id not in foreign and seen.state in LIVE_STATES:
                # reported once, however many profiles' passes see it
                foreign.add(seen.instance_id)
                report.foreign.append(f"{seen.instance_id} (profile {tagged})")
    for row in service.store.live():
        if row.profile in asked and row.instance_id not in seen_ids:
            service.store.ended(row.instance_id, GONE, now, "gone")
            report.gone.append(f"{row.instance_id} ({row.profile})")
    for line in report.lines():
        log.info("cloud reconcile: %s", line)
    return report


def _reconcile_one(
    service: CloudService,
    seen: Seen,
    name: str,
    profile: CloudProfile,
    now: float,
    report: Reconciled,
) -> None:
    known = service.store.get(seen.instance_id)
    if known is None:
        if seen.state in LIVE_STATES:
            service.store.add(service.from_seen(seen, name, profile, now), now)
            report.adopted.append(f"{seen.instance_id} ({seen.instance_type}, {seen.state})")
        return
    if known.state == seen.state:
        return
    if seen.state in ENDED_STATES:
        # The first end keeps its time and reason; shutting-down -> terminated after our
        # own terminate is the normal course, not news.
        service.store.ended(seen.instance_id, seen.state, now, "external")
        if known.live:
            report.updated.append(f"{seen.instance_id} {known.state} -> {seen.state}")
        return
    service.store.set_state(seen.instance_id, seen.state, now)
    report.updated.append(f"{seen.instance_id} {known.state} -> {seen.state}")


def reap(
    service: CloudService,
    now: float,
    *,
    dry_run: bool,
    seen: Reconciled | None = None,
) -> list[Reaped]:
    """Terminate what has lingered long enough after its incident, and anything past its
    ttl. Each instance is confirmed as ours by its tags in EC2 just before: in ``seen`` (the
    same round's reconcile, whose view of EC2 is kept by profile), or by asking EC2."""
    live = service.store.live()
    incidents = {m.incident for m in live if m.incident}
    resolved = service.store.resolved_at(incidents)
    linger = {name: p.linger for name, p in service.cloud.profiles.items()}
    decisions = plan.reap_plan(live, resolved, now, linger)
    by_id = {m.instance_id: m for m in live}
    results: list[Reaped] = []
    for name in sorted({by_id[d.instance_id].profile for d in decisions}):
        batch = [d for d in decisions if by_id[d.instance_id].profile == name]
        if name not in service.cloud.profiles:
            for d in batch:
                log.error(
                    "cloud reap: %s (%s) is due but profile %s is not configured any more; "
                    "terminate it by hand",
                    d.instance_id,
                    d.reason,
                    name,
                )
            continue
        view = None if seen is None else seen.seen.get(name)
        results += _reap_batch(service, name, batch, now, dry_run, view)
    return results


def _reap_batch(
    service: CloudService,
    name: str,
    decisions: Iterable[plan.ReapDecision],
    now: float,
    dry_run: bool,
    ours: Mapping[str, Seen] | None,
) -> list[Reaped]:
    try:
        if ours is None:
            described = service.described(name, states=LIVE_STATES + ENDED_STATES)
            ours = {s.instance_id: s for s in described}
        client = service.client(name)
    except CloudError as exc:
        log.error("cloud reap: %s: %s; tried again at the next round", name, exc)
        return []
    due: list[plan.ReapDecision] = []
    ended: list[str] = []
    for d in decisions:
        seen = ours.get(d.instance_id)
        if seen is None or seen.state in ENDED_STATES:
            # ended behind our back (or forgotten by EC2): recorded, not terminated again
            if not dry_run:
                if seen is None:
                    service.store.ended(d.instance_id, GONE, now, "gone")
                else:
                    service.store.ended(d.instance_id, seen.state, now, "external")
                ended.append(d.instance_id)
            continue
        due.append(d)
    service.release(name, ended)
    if not due:
        return []
    try:
        states = service.retrying(
            partial(client.terminate, [d.instance_id for d in due], dry_run=dry_run)
        )
    except CloudError as exc:
        log.error("cloud reap: terminating %s: %s", ", ".join(d.instance_id for d in due), exc)
        return []
    results = []
    for d in due:
        state = "would" if dry_run else states.get(d.instance_id, "")
        if not dry_run and state not in ENDED_STATES:
            state = "shutting-down"  # asked to terminate; the next reconcile reads the truth
        if not dry_run:
            service.store.ended(d.instance_id, state, now, d.reason)
        log.info(
            "cloud reap: %s %s (%s): %s%s",
            "would terminate" if dry_run else "terminated",
            d.instance_id,
            d.reason,
            d.detail,
            "" if dry_run else f" -> {state}",
        )
        results.append(Reaped(d.instance_id, name, d.reason, state, d.detail))
    if not dry_run:
        service.release(name, [r.instance_id for r in results])
    return results
