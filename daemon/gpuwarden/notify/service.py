"""Notifications as the run loop and the drill use them: the notifier (what to say), the
outbox in the journal file (nothing is lost) and the sender thread (delivery with retries).

The loop calls ``observe`` with each tick's journaled records, ``observe_outcome`` as steps
finish, and ``flush`` at the end of each tick; ``close`` at shutdown hands everything still held
to the outbox (never a reminder), which a restarted daemon delivers. ``restore`` at start
rebuilds an open incident's group from the journal: its notify steps, and from the outbox what
was already said and when, so reminders keep their times across a restart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gpuwarden.clock import Clock, SystemClock
from gpuwarden.config import Config
from gpuwarden.journal.schema import Access
from gpuwarden.model import GpuState, Intent, Outcome, Reason, RuleChange, Transition
from gpuwarden.notify.delivery import UrlResult, send_test
from gpuwarden.notify.grouping import Timing
from gpuwarden.notify.messages import gpu_facts
from gpuwarden.notify.notifier import Notifier
from gpuwarden.notify.outbox import Outbox
from gpuwarden.notify.routing import resolve_urls
from gpuwarden.notify.sender import Sender
from gpuwarden.playbook.schema import NotifyParams, Rule

DRAIN_S = 5.0  # at a stop, how long deliveries that are due may still take


def timings(config: Config, rules: Sequence[Rule]) -> Callable[[str], Timing]:
    """Each rule's grouping: its own group_wait / group_interval / repeat where it gives one,
    the config's notify section otherwise."""
    notify = config.notify
    default = Timing(notify.group_wait, notify.group_interval, notify.repeat)
    own = {
        r.name: Timing(
            default.group_wait if r.group_wait is None else r.group_wait,
            default.group_interval if r.group_interval is None else r.group_interval,
            default.repeat if r.repeat is None else r.repeat,
        )
        for r in rules
    }
    return lambda rule: own.get(rule, default)


def resolver(config: Config) -> Any:
    """Target name → its apprise URLs, secrets read now (from files or the environment)."""

    def urls(name: str) -> list[str]:
        target = config.notify.targets[name]  # KeyError: not a target (the sender drops it)
        found = resolve_urls(
            target, os.environ, lambda p: Path(p).read_text(encoding="utf-8"), name=name
        )
        if target.config is not None:
            found += config_urls(target.config, target.tags)
        return found

    return urls


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


def test_target(config: Config, name: str) -> list[UrlResult]:
    """``gpuwarden notify-test``: one test message to each URL of the target."""
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
        self.sender = Sender(
            self.outbox,
            resolver(config),
            clock=clock,
            fallback=lambda name: targets[name].fallback if name in targets else None,
        )
        self.background = background
        self.clock: Clock = clock or SystemClock()
        self.queued = 0
        if background:
            self.sender.start()

    def observe(
        self,
        records: Sequence[RuleChange | Intent],
        gpus: Iterable[GpuState],
        incident_gpus: dict[str, int | None],
        now: float,
    ) -> None:
        by_index = {g.index: g for g in gpus}
        facts = {
            incident: gpu_facts(by_index[index])
            for incident, index in incident_gpus.items()
            if index is not None and index in by_index
        }
        self.notifier.observe(records, now, incidents=facts)

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
        if incident.acked_at is not None:
            self.notifier.ack(incident.id, now)

    def _resume(self, incident: str, now: float) -> None:
        """What the outbox says the group of ``incident`` had already been told: whether it
        was announced, to whom, when last (the next reminder counts from there) and how many
        messages (new message ids start after them)."""
        rows = self.outbox.about(incident)
        if not rows:
            return  # never announced: the group announces itself as usual
        self.notifier.grouper.resume(
            incident,
            told=tuple(dict.fromkeys(r.target for r in rows)),
            last_sent=min(now, max(r.created for r in rows)),
            sequence=len(rows),  # each notice made at least one row
        )

    def observe_outcome(self, intent: Intent, outcome: Outcome, now: float) -> None:
        self.notifier.observe_outcome(intent, outcome, now)

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
        added = sum(1 for at, message in due if self.outbox.put(message, at))
        self.queued += added
        if added and self.background:
            self.sender.wake()
        return added

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
        self.outbox.close()
