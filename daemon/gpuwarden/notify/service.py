"""Notifications as the run loop and the drill use them: the notifier (what to say), the
outbox in the journal file (nothing is lost) and the sender thread (delivery with retries).
Alertmanager targets get alerts instead of messages (``alerts.py``, posted by
``alertmanager.py``), through the same outbox and sender.

The loop calls ``observe`` with each tick's journaled records, ``observe_outcome`` as steps
finish, and ``flush`` at the end of each tick; ``close`` at shutdown hands everything still held
to the outbox (never a reminder), which a restarted daemon delivers. ``restore`` at start
rebuilds an open incident's group from the journal: its notify steps, and from the outbox what
was already said and when, so reminders keep their times across a restart.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpuwarden.clock import Clock, SystemClock
from gpuwarden.config import Config
from gpuwarden.journal.schema import Access
from gpuwarden.model import Intent, Outcome, Reason, RuleChange, Snapshot, Transition
from gpuwarden.notify import alertmanager
from gpuwarden.notify.alerts import AlertBook, labels_of, resend_of
from gpuwarden.notify.delivery import UrlResult, send_test
from gpuwarden.notify.facts import MessageFacts, OpenIncident, timings
from gpuwarden.notify.notifier import Notifier
from gpuwarden.notify.outbox import Outbox
from gpuwarden.notify.routing import owner_urls, resolve_urls, split_recipient
from gpuwarden.notify.sender import Sender
from gpuwarden.playbook.schema import NotifyParams, Rule

DRAIN_S = 5.0  # at a stop, how long deliveries that are due may still take


def resolver(config: Config) -> Any:
    """Target name → its apprise URLs, secrets read now (from files or the environment)."""

    def urls(name: str) -> list[str]:
        owner = split_recipient(config.notify, name)
        if owner is not None:  # one owner of an owner target: "owner:alice"
            spec = config.notify.targets[owner[0]]
            return owner_urls(spec, owner[1], os.environ, _read, name=owner[0])
        target = config.notify.targets[name]  # KeyError: not a target (the sender drops it)
        found = resolve_urls(target, os.environ, _read, name=name)
        if target.config is not None:
            found += config_urls(target.config, target.tags)
        return found

    return urls


def _resolvable(urls_of: Any, name: str) -> bool:
    """Whether a target's URLs can be read now (the start-up self-check reports one that
    cannot, with its reason; the sender then retries it quietly)."""
    try:
        return bool(urls_of(name))
    except (ValueError, OSError):
        return False


def _read(path: Path) -> str:
    return Path(path).read_text(encoding="utf-8")


def config_urls(path: Path, tags: Sequence[str]) -> list[str]:
    """The URLs of an apprise configuration file (text or YAML), only those carrying one of
    ``tags`` when tags are given (apprise's own tag filter)."""
    import apprise

    parsed = apprise.AppriseConfig()
    if not parsed.add(str(path)):
        raise ValueError(f"cannot read the apprise config {path}")
    services = apprise.Apprise()
    services.add(parsed)
    wanted = set(tags)
    found: list[str] = []
    for service in services:
        if not wanted or wanted & {str(t) for t in service.tags}:
            found.append(str(service.url(privacy=False)))  # type: ignore[no-untyped-call]
    if not found:
        raise ValueError(
            f"the apprise config {path} holds no URL"
            + (f" tagged {', '.join(sorted(wanted))}" if wanted else "")
        )
    return found


def test_target(config: Config, name: str, *, host: str) -> list[UrlResult]:
    """``gpuwarden notify-test``: one test message to each URL of the target (a test alert,
    for an Alertmanager target)."""
    spec = config.notify.targets.get(name)
    if spec is not None and spec.type == "alertmanager":
        return alertmanager.send_test(name, resolver(config), host=host)
    return send_test(name, resolver(config))


class Notifications:
    def __init__(
        self,
        config: Config,
        journal_path: Path,
        *,
        host: str,
        marker: str = "",
        descriptions: dict[str, str] | None = None,
        background: bool = True,
        clock: Clock | None = None,
        rules: Sequence[Rule] = (),
        access: Access = Access.OWN,
    ) -> None:
        """``access``: how the outbox opens ``journal_path`` (the daemon: ``WRITE``, its
        journal made the file; a drill's scratch file: ``OWN``)."""
        self.notifier = Notifier(
            config,
            host=host,
            marker=marker,
            descriptions=descriptions,
            timing=timings(config, rules),
        )
        self.outbox = Outbox(journal_path, access=access)
        targets = config.notify.targets
        self._target_names = [n for n, t in targets.items() if not t.for_owners]
        self.alerts = AlertBook(config, host=host, marker=marker, descriptions=descriptions)
        # A firing post's endsAt is counted on the real clock, the one Alertmanager reads.
        posting = alertmanager.Delivery(self.outbox)
        managers = set(self.alerts.targets())
        urls = resolver(config)
        self.sender = Sender(
            self.outbox,
            urls,
            clock=clock,
            fallback=lambda name: targets[name].fallback if name in targets else None,
            deliverers=lambda name: posting if name in managers else None,
            unresolved=[name for name in targets if not _resolvable(urls, name)],
        )
        watched = {n: functools.partial(urls, n) for n in managers if targets[n].ack_on_silence}
        poll = min([30.0, *(resend_of(targets[n]) for n in watched)])
        self.silences = alertmanager.SilenceWatch(watched, host, poll=poll)
        self.background = background
        self.clock: Clock = clock or SystemClock()
        self.queued = 0
        self._posted: dict[str, dict[str, str]] | None = None  # incident → its alert's labels
        self.facts = MessageFacts()
        if background:
            self.sender.start()
            self.silences.start()

    def observe(
        self,
        records: Sequence[RuleChange | Intent],
        snapshot: Snapshot,
        incidents: Iterable[OpenIncident],
        now: float,
    ) -> None:
        """One tick's journaled records; ``incidents``: the engine's open incidents, whose
        current values (and identity) their next messages show. Alertmanager targets take
        their alerts' labels from ``snapshot``."""
        self.alerts.observe(records, now, gpus=snapshot.gpus, processes=snapshot.processes)
        self.notifier.observe(records, now)
        wanted = self.notifier.grouper.knows  # only incidents a message may still show
        self.notifier.observe((), now, incidents=self.facts.of(snapshot, incidents, wanted))

    def restore(self, incident: Any, timeline: Sequence[Any], now: float) -> None:
        """Take back an incident a previous run left open: replay its firing and its notify
        steps so its group exists again (reminders, the resolve message). The messages this
        re-creates have the ids they had before, so the outbox does not send them twice."""
        records: list[RuleChange | Intent] = [
            RuleChange(
                Transition.FIRING,
                incident.rule,
                incident.scope,
                incident.opened_at,
                Reason.FOR_ELAPSED,
                incident.id,
                where=incident.label,
            )
        ]
        for row in timeline:
            params = row.data.get("params") or {}
            if row.kind != "step" or row.data.get("step_kind") != "notify" or row.step is None:
                continue
            records.append(
                Intent(
                    id=row.intent or f"{incident.id}/{row.step}",
                    incident=incident.id,
                    rule=incident.rule,
                    scope=incident.scope,
                    step=row.step,
                    kind="notify",
                    label=str(row.data.get("label") or "notify"),
                    time=row.time,
                    reason=Reason.STEP_DUE,
                    severity=incident.severity or "warning",
                    shadow=bool(row.data.get("shadow")),
                    gpu=incident.gpu,
                    params=NotifyParams(
                        targets=tuple(params.get("targets") or ()), message=params.get("message")
                    ),
                    where=incident.label,
                )
            )
        if len(records) > 1:
            self.notifier.observe(records, now)
            self._resume(incident.id, now)
            self.alerts.observe(records, now)
            labels = self._posted_labels().get(incident.id)
            if labels is not None:  # the labels it was posted with identify its alert
                self.alerts.restore(incident.id, labels)
        if incident.acked_at is not None:
            self.notifier.ack(incident.id, now)

    def _resume(self, incident: str, now: float) -> None:
        """What the outbox says the group of ``incident`` had already been told: whether it
        was announced, to whom, when last (the next reminder counts from there) and how many
        messages (new message ids start after them)."""
        rows = [
            r for r in self.outbox.about(incident) if r.target not in set(self.alerts.targets())
        ]
        if not rows:
            return  # never announced: the group announces itself as usual
        self.notifier.grouper.resume(
            incident,
            told=tuple(dict.fromkeys(r.target for r in rows)),
            last_sent=min(now, max(r.created for r in rows)),
            sequence=len(rows),  # each notice made at least one row
        )

    def _posted_labels(self) -> dict[str, dict[str, str]]:
        """The labels each incident's alert was last posted with (read from the outbox once,
        when the first incident is taken back)."""
        if self._posted is None:
            managers = set(self.alerts.targets())
            self._posted = {}
            for row in self.outbox.rows():  # oldest first: the last post wins
                if row.target in managers and len(row.incidents) == 1:
                    labels = labels_of(row.body)
                    if labels is not None:
                        self._posted[row.incidents[0]] = labels
        return self._posted

    def silenced(self) -> dict[str, str]:
        """Incidents whose alert a silence covers, not reported before (incident → who
        silenced it): for the loop to acknowledge (targets with ``ack_on_silence``)."""
        return self.silences.take()

    def observe_outcome(self, intent: Intent, outcome: Outcome, now: float) -> None:
        self.notifier.observe_outcome(intent, outcome, now)

    def set_shadow(self, shadow: bool) -> None:
        """A reload armed the daemon (``mode: enforce``) or put it in shadow: later messages
        carry the ``[DRY-RUN]`` marker exactly while nothing is acted on."""
        if self.notifier.marker in ("", "[DRY-RUN]"):
            self.notifier.marker = "[DRY-RUN]" if shadow else ""

    def ack(self, incident: str, now: float) -> bool:
        return self.notifier.ack(incident, now)

    def mute(self, incidents: Iterable[str]) -> None:
        self.notifier.mute(incidents)

    def tell(
        self,
        targets: Sequence[str],
        key: str,
        title: str,
        body: str,
        severity: str,
        now: float,
        *,
        route_as: str | None = None,
    ) -> int:
        return self.notifier.tell(targets, key, title, body, severity, now, route_as=route_as)

    def admin(self, title: str, body: str, now: float) -> None:
        self.notifier.admin(title, body, now, severity="critical")

    def flush(self, now: float, *, final: bool = False) -> int:
        """Write what is due to the outbox (before anything is sent) and wake the sender.
        ``final`` (at a stop): everything grouping still holds, and no reminder; a message
        waiting for quiet hours is queued for the hour they end."""
        due = self.notifier.drain(now) if final else [(now, m) for m in self.notifier.due(now)]
        due += [
            (now, m) for m in self.alerts.due(now)
        ]  # posted at their time: an alert's state is now's
        added = sum(1 for at, message in due if self.outbox.put(message, at))
        self.queued += added
        if added and self.background:
            self.sender.wake()
        return added

    def warm(self) -> None:
        """Once the daemon is ready: load the apprise plugins of the configured targets in
        the sender's thread, so that the first message pays no import (``notify/plugins.py``)."""
        if self.background:
            self.sender.warm(self._target_names)

    def deliver_now(self) -> int:
        """One delivery round in this thread (drills, which have no sender thread)."""
        return self.sender.deliver_due()

    def close(self, now: float) -> None:
        # Groups live in memory: at a stop, whatever they hold goes to the outbox now rather
        # than waiting for group_wait / group_interval and being lost.
        self.flush(now, final=True)
        if self.background:
            # Give what is due now a bounded chance to go out; whatever does not stays in
            # the outbox and is delivered by the next start.
            self.sender.wake()
            deadline = time.monotonic() + DRAIN_S
            while time.monotonic() < deadline:
                due = self.outbox.next_due()
                if due is None or due > self.clock.now():
                    break
                time.sleep(0.05)
            self.sender.stop()
        self.silences.stop()
        self.outbox.close()
