"""The notification coordinator: what the engine decided in, messages for the outbox out. Pure.

Each tick the run loop hands over the tick's records (``observe``) and, as they arrive, the
outcomes of destructive steps (``observe_outcome``); ``due(now)`` then returns the messages to
write to the outbox, one per target, each exactly once.

- A notify step is the rule saying "tell these targets"; without one, a rule's incidents are
  not announced at all. Firing and resolved changes, and destructive steps with their
  outcomes, update the incident's group (``grouping.py``).
- Shadow-mode records are never announced: a shadow rule is being tried out, not enforced.
- Owner targets (``owners``/``owner_mail`` in the config) named by a notify step are not
  group targets: each later checkpoint, suspend, renice and kill tells the owner of each
  process it acted on what happened, why and how to avoid it (``messages.owner_message``).
- Routing (``routing.py``): ``min_severity`` decides at the group's opening who is told;
  non-critical messages created in a target's quiet hours wait until they end.
- With a ``marker`` (``[DRILL]``, ``[DRY-RUN]``) every title starts with it, and each target
  gets at most ``notify.drill_rate`` messages a minute; the rest are counted and one summary
  message says how many were held back.
"""

from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence

from gpuwarden.config import Config
from gpuwarden.model import Intent, Outcome, Reason, RuleChange, Transition
from gpuwarden.notify import routing
from gpuwarden.notify.grouping import Grouper, Notice, Timing
from gpuwarden.notify.messages import (
    MARKERS,
    Message,
    clean,
    compose,
    escape,
    guard_mentions,
    message_id,
)
from gpuwarden.notify.owner import OWNER_ACTS, owner_message
from gpuwarden.playbook.schema import DESTRUCTIVE_KINDS, NotifyParams

RATE_WINDOW = 60.0
# What a step did to a process that its owner is told about (a step that found the process
# gone, or was refused, did nothing to it). A checkpoint that timed out was still asked.
ACTED = frozenset({"acknowledged", "timed_out", "suspended", "reniced", "terminated", "killed"})
Facts = Mapping[str, str]


class Notifier:
    def __init__(
        self,
        config: Config,
        *,
        host: str,
        marker: str = "",
        descriptions: Mapping[str, str] | None = None,
        timing: Callable[[str], Timing] | None = None,
    ) -> None:
        if marker not in MARKERS:
            raise ValueError(f"marker must be one of {MARKERS}, not {marker!r}")
        self.config = config
        self.notify = config.notify
        self.host = host
        self.marker = marker
        self.tz: dt.tzinfo = config.tz
        # Rule name -> the rule's description (shown in its messages); replace on reload.
        self.descriptions: dict[str, str] = dict(descriptions or {})
        default = Timing(
            group_wait=self.notify.group_wait,
            group_interval=self.notify.group_interval,
            repeat=self.notify.repeat,
        )
        self.grouper = Grouper(
            host,
            timing=timing or (lambda rule: default),
            accepts=self._accepts,
        )
        self._deferred: list[tuple[float, Message]] = []
        self._extra: list[Message] = []
        self._recent: dict[str, collections.deque[float]] = collections.defaultdict(
            collections.deque
        )
        self._held: dict[str, int] = collections.Counter()
        self._summaries = 0
        self.held_total = 0  # drill/dry-run messages counted and not sent, all targets
        # Incident id -> the owner targets its rule named in a notify step: the owners of the
        # processes its later steps act on are told (``owner_message``).
        self._owners: dict[str, list[str]] = {}

    def _accepts(self, target: str, severity: str) -> bool:
        """A target that takes messages of ``severity``. Alertmanager targets take alerts,
        not messages: ``alerts.AlertBook`` tells them."""
        spec = self.notify.targets.get(target)
        if spec is None or spec.type == "alertmanager":
            return False
        return routing.accepts(self.notify, target, severity)

    # -- in ---------------------------------------------------------------------------------

    def observe(
        self,
        records: Sequence[RuleChange | Intent],
        now: float,
        *,
        incidents: Mapping[str, Facts] | None = None,
    ) -> None:
        """One tick's records, in order; ``incidents``: the current values of open incidents
        by id (``messages.gpu_facts`` makes them from a GPU), shown in their next message."""
        for record in records:
            if isinstance(record, RuleChange):
                if record.incident is None:
                    continue
                if record.kind == Transition.FIRING:
                    self.grouper.fired(record.incident, record.rule, record.where, record.time)
                elif record.kind == Transition.RESOLVED:
                    handled = record.reason == Reason.LADDER_DONE
                    self.grouper.resolved(record.incident, record.time, handled=handled)
                    self._owners.pop(record.incident, None)
            elif record.shadow:
                continue
            elif record.kind == "notify" and isinstance(record.params, NotifyParams):
                params = record.params
                owners = [t for t in params.targets if self._for_owners(t)]
                people = tuple(t for t in params.targets if t not in owners)
                if owners:
                    told = self._owners.setdefault(record.incident, [])
                    told.extend(t for t in owners if t not in told)
                self.grouper.notify(record, people, params.message, record.time)
            elif record.kind in DESTRUCTIVE_KINDS:
                self.grouper.step(record, record.time)
        for incident, facts in (incidents or {}).items():
            self.grouper.facts(incident, facts)

    def observe_outcome(self, intent: Intent, outcome: Outcome, now: float) -> None:
        if not intent.shadow and intent.kind in DESTRUCTIVE_KINDS:
            self.grouper.outcome(intent, outcome)
        if not intent.shadow and intent.kind in OWNER_ACTS and intent.incident in self._owners:
            self._tell_owners(intent, outcome, now)

    def _for_owners(self, target: str) -> bool:
        spec = self.notify.targets.get(target)
        return spec is not None and spec.for_owners

    def _tell_owners(self, intent: Intent, outcome: Outcome, now: float) -> None:
        """One message to the owner of each process the step acted on. Only what happened is
        told: a dry run or a shadow rule tells no owner (a drill shows what they would read)."""
        if outcome.dry_run and self.marker != "[DRILL]":
            return
        results = {(r.pid, r.create_time): r for r in outcome.targets}
        for target in intent.targets:
            result = results.get((target.pid, target.create_time))
            if result is not None and result.state not in ACTED:
                continue
            said = (result.detail or result.state) if result is not None else "drill: simulated"
            for name in self._owners[intent.incident]:
                spec = self.notify.targets[name]
                if not spec.reaches(target.user) or not routing.accepts(
                    self.notify, name, intent.severity
                ):
                    continue
                assert target.user is not None
                message = owner_message(
                    intent,
                    target,
                    said,
                    to=routing.recipient(name, target.user),
                    host=self.host,
                    tz=self.tz,
                    now=now,
                    marker=self.marker,
                    description=self.descriptions.get(intent.rule, ""),
                    facts=dict(self.grouper.facts_of(intent.incident)),
                    advice=spec.advice_for(intent.kind),
                    body_format=spec.body_format,
                )
                at = routing.release_time(spec, intent.severity, now, self.tz)
                if at <= now:
                    self._extra.append(message)
                else:
                    self._defer(at, message)

    def ack(self, incident: str, now: float) -> bool:
        """A person took over ``incident``: no more reminders about it. False: not known."""
        return self.grouper.ack(incident)

    def mute(self, incidents: Iterable[str]) -> None:
        """The incidents a silence covers now: no reminders about them (replaces the set)."""
        self.grouper.muted = frozenset(incidents)

    def admin(self, title: str, body: str, now: float, *, severity: str = "warning") -> bool:
        """A message to the admin target (reload failures, breaker trips); False: none set."""
        target = self.notify.admin
        if target is None or target not in self.notify.targets:
            return False
        key = f"{self.host}/admin/{clean(title)}/{now:.3f}"
        self._extra.append(self._plain(target, "admin", key, title, body, severity, now))
        return True

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
        """A plain message (not about an open incident: the reaper's terminations) to each of
        ``targets`` that exists and takes ``route_as`` (default: ``severity``) — like a
        resolve message, a follow-up reaches whoever heard of the incident; how many were
        queued."""
        told = 0
        routed = route_as or severity
        for target in dict.fromkeys(targets):
            if self._accepts(target, routed):
                self._extra.append(self._plain(target, "note", key, title, body, severity, now))
                told += 1
        return told

    def test_message(self, target: str, now: float) -> Message:
        """The message ``gpuwarden notify-test TARGET`` sends (never rate-limited or held)."""
        body = f"A test message from gpuwarden on {self.host}. If you read this, {target} works."
        key = f"{self.host}/test/{now:.6f}"
        return self._plain(target, "test", key, f"gpuwarden test: {self.host}", body, "info", now)

    # -- out --------------------------------------------------------------------------------

    def due(self, now: float) -> list[Message]:
        """The messages to write to the outbox now, oldest first, one per target."""
        if self.grouper.idle and not (self._extra or self._deferred or any(self._held.values())):
            return []  # the common tick: nothing open, nothing waiting
        return self._ready(now, self._fresh(now, final=False))

    def drain(self, now: float) -> list[tuple[float, Message]]:
        """At a stop: every message still held, each with when it may be sent — grouping's
        batches now (``Grouper.flush(final=True)``: no reminder, a stop is not news), and
        messages waiting for a target's quiet hours at the hour they end."""
        ready = self._ready(now, self._fresh(now, final=True))
        later = sorted(self._deferred, key=lambda item: item[0])
        self._deferred = []
        return [(now, m) for m in ready] + later

    def _fresh(self, now: float, *, final: bool) -> list[Message]:
        """The plain messages and grouping's notices made now; those a target's quiet hours
        hold back are deferred."""
        fresh: list[Message] = list(self._extra)
        self._extra.clear()
        for notice in self.grouper.flush(now, final=final):
            for message, at in self._messages(notice, now):
                if at <= now:
                    fresh.append(message)
                else:
                    self._defer(at, message)
        return fresh

    def _ready(self, now: float, fresh: list[Message]) -> list[Message]:
        ready = [m for at, m in self._deferred if at <= now]
        self._deferred = [(at, m) for at, m in self._deferred if at > now]
        ready.extend(fresh)
        ready.sort(key=lambda m: m.created)
        return self._limit(ready, now) if self.marker else ready

    @property
    def deferred(self) -> tuple[tuple[float, Message], ...]:
        """Messages waiting for a target's quiet hours to end: (release time, message)."""
        return tuple(self._deferred)

    def _messages(self, notice: Notice, now: float) -> list[tuple[Message, float]]:
        out = []
        for route in routing.route(
            self.notify, notice.targets, severity=notice.severity, now=now, tz=self.tz
        ):
            spec = self.notify.targets[route.target]
            message = compose(
                notice,
                route.target,
                host=self.host,
                tz=self.tz,
                marker=self.marker,
                description=self.descriptions.get(notice.rule, ""),
                body_format=spec.body_format,
            )
            out.append((message, route.at))
        return out

    def _defer(self, at: float, message: Message) -> None:
        if message.kind == "reminder":
            self._deferred = [
                (t, m)
                for t, m in self._deferred
                if not (
                    m.kind == "reminder" and m.group == message.group and m.target == message.target
                )
            ]
        self._deferred.append((at, message))

    def _plain(
        self, target: str, kind: str, key: str, title: str, body: str, severity: str, now: float
    ) -> Message:
        spec = self.notify.targets.get(target)
        body_format = spec.body_format if spec is not None else "text"
        prefix = f"{self.marker} " if self.marker else ""
        return Message(
            id=message_id(key, kind, 0, target),
            target=target,
            title=guard_mentions(clean(prefix + title, 250)),
            body=escape(body, body_format, limit=4000),
            severity=severity,
            kind=kind,
            incidents=(),
            group=key,
            created=now,
            marker=self.marker,
            body_format=body_format,
        )

    def _limit(self, messages: list[Message], now: float) -> list[Message]:
        """At most ``drill_rate`` marked messages a minute per target; one summary for the
        rest once the target has room again."""
        rate = self.notify.drill_rate
        out = []
        for message in messages:
            if self._room(message.target, now, rate):
                self._recent[message.target].append(now)
                out.append(message)
            else:
                self._held[message.target] += 1
                self.held_total += 1
        for target, count in list(self._held.items()):
            if count and self._room(target, now, rate):
                self._recent[target].append(now)
                self._held[target] = 0
                self._summaries += 1
                title = f"{count} more messages held back"
                body = (
                    f"{count} {self.marker} messages to {target} were counted and not sent: "
                    f"at most {rate} a minute go to one target during a drill or dry run."
                )
                key = f"{self.host}/held/{self._summaries}"
                out.append(self._plain(target, "admin", key, title, body, "info", now))
        return out

    def _room(self, target: str, now: float, rate: int) -> bool:
        recent = self._recent[target]
        while recent and recent[0] <= now - RATE_WINDOW:
            recent.popleft()
        return len(recent) < rate
