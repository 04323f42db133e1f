"""The daemon's cloud rounds: every ``cloud.reap_interval``, reconcile the journal with EC2,
reap and renew the fleet budget leases, in a worker thread (a slow cloud API never delays a
tick), one round at a time; and the notes that tell people what the reaper ended and what it
cost.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from concurrent.futures import Executor, Future, wait
from typing import TYPE_CHECKING

from gpuwarden.cloud import reaper
from gpuwarden.cloud.reaper import Reaped
from gpuwarden.units import format_duration

if TYPE_CHECKING:
    from gpuwarden.clock import Clock
    from gpuwarden.cloud.service import CloudService
    from gpuwarden.playbook.loader import PlaybookSet

log = logging.getLogger("gpuwarden.cloud")


class Rounds:
    def __init__(self, service: CloudService, pool: Executor, clock: Clock) -> None:
        self.service = service
        self.pool = pool
        self.clock = clock
        self.running: Future[None] | None = None
        # Clock time of the next round: the first tick starts one, so a restarted daemon
        # adopts what carries its tags and reaps what is overdue at once.
        self.due = 0.0
        self._reaped: queue.Queue[list[Reaped]] = queue.Queue()  # from the rounds' thread

    def tick(
        self, now: float, *, interval: float, dry_run: bool, needed: Callable[[], bool]
    ) -> None:
        """Start a round when one is due and none is running. ``needed``: whether there is
        anything to look after (a rule that provisions, a live instance); without, EC2 is
        not called at all."""
        if now < self.due or (self.running is not None and not self.running.done()):
            return
        self.due = now + interval
        if needed():
            self.running = self.pool.submit(self._round, dry_run)

    def _round(self, dry_run: bool) -> None:
        try:
            report = reaper.reconcile(self.service, self.clock.now())
            reaped = reaper.reap(self.service, self.clock.now(), dry_run=dry_run, seen=report)
            if reaped and not dry_run:
                self._reaped.put(reaped)
            if not dry_run:
                self.service.renew_budgets(self.clock.now())
        except Exception:  # a cloud bug must not take the daemon down; next round tries again
            log.exception("cloud reconcile/reap failed")

    def reaped(self) -> list[Reaped]:
        """What the rounds finished since the last call terminated."""
        ended: list[Reaped] = []
        while True:
            try:
                ended += self._reaped.get_nowait()
            except queue.Empty:
                return ended

    def wait(self, timeout: float) -> None:
        """Let a round in flight finish (it records what it terminated), within ``timeout``."""
        if self.running is not None:
            wait([self.running], timeout=timeout)


def reaped_notes(
    service: CloudService, playbooks: PlaybookSet, reaped: list[Reaped], now: float
) -> list[tuple[str, list[str], list[str], str]]:
    """(rule, one line per instance, the rule's notify targets, the rule's severity) for the
    instances the reaper terminated, grouped by the rule that launched them."""
    by_rule: dict[str, list[str]] = {}
    for one in reaped:
        row = service.store.get(one.instance_id)
        rule = (row.rule if row is not None else None) or "(adopted)"
        what, ran, spent = "", "", ""
        if row is not None:
            what = f"{row.instance_type}, "
            ran = f", ran {format_duration(max(0.0, now - row.launched_at))}"
            cost = row.cost_so_far(now)
            spent = "" if cost is None else f", about ${cost:,.2f}"
        by_rule.setdefault(rule, []).append(
            f"{one.instance_id} ({what}{one.profile}): {one.reason} — {one.detail}{ran}{spent}"
        )
    notes: list[tuple[str, list[str], list[str], str]] = []
    for rule, lines in by_rule.items():
        found = playbooks.rule(rule)
        targets = [
            target
            for step in (found.steps if found is not None else ())
            if step.kind == "notify"
            for target in getattr(step.spec.params, "targets", ())
        ]
        severity = str(found.spec.severity) if found is not None else "info"
        notes.append((rule, lines, targets, severity))
    return notes
