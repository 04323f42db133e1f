"""Grouping, as Alertmanager does it, driven by an injected ``now``. Pure.

A group is one rule on this host. Its first incident that the rule wants people told about
(a notify step) opens the group; every incident of the same rule notified within
``group_wait`` of that joins it, and the group's first message — kind ``open`` — names them
all: "GPU memory pressure on gpu-node-07: GPUs 0, 3, 5". After that, changes (an incident
joining, a destructive step and its outcome, an incident resolving, a notify step with its own
message) are batched and go out at most once every ``group_interval`` as one ``step``
message. When the last incident of the group has resolved, one ``resolve`` message closes the
group (still no sooner than ``group_interval`` after the previous message); the next incident
of the rule starts a new group. While an incident of an announced group is open and not
acknowledged nor silenced (``muted``), a ``reminder`` goes out every ``repeat`` seconds after
the group's last message (``repeat`` 0: never).

A destructive step's change waits for its outcome (so the message says what happened), but
no longer than ``group_interval``; after that it goes out as "in progress".

A target named by a later notify step that has not had the group's ``open`` message gets it
at the next flush, without waiting for ``group_interval``: it is that target's first message.

At a stop, ``flush(now, final=True)`` says everything a group still holds without waiting for
``group_wait`` or ``group_interval``, and never a reminder: a stop is not news. A restarted
daemon rebuilds its groups from the journal and ``resume`` tells each what it had already
said (from the outbox), so the next reminder is due ``repeat`` after the last message that
really went out, and no message id of the earlier run is used again.

``flush(now)`` returns ``Notice`` values (what to say and to whom); ``messages.py`` and
``notifier.py`` turn each into one message per target.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gpuwarden.model import Intent, Outcome


@dataclass(frozen=True, slots=True)
class Timing:
    group_wait: float = 30.0
    group_interval: float = 300.0
    repeat: float = 3600.0


@dataclass(frozen=True, slots=True)
class Member:
    """One incident of a group as a message sees it."""

    incident: str
    where: str
    opened: float
    facts: tuple[tuple[str, str], ...] = ()
    acked: bool = False
    resolved: float | None = None
    # Closed because its ladder ran (an event or scheduled rule), not because the condition
    # cleared: a fatal XID is handled, not resolved, and no message may say otherwise.
    handled: bool = False


@dataclass(frozen=True, slots=True)
class StepNote:
    intent: Intent
    outcome: Outcome | None


@dataclass(frozen=True, slots=True)
class Notice:
    """One thing to tell the targets of a group; ``sequence`` numbers a group's notices."""

    kind: str  # open | step | resolve | reminder
    group: str
    sequence: int
    rule: str
    severity: str
    time: float
    targets: tuple[str, ...]
    members: tuple[Member, ...]  # every incident of the group, open or resolved
    joined: tuple[str, ...] = ()  # incident ids new since the previous notice
    resolved: tuple[str, ...] = ()  # incident ids resolved since the previous notice
    steps: tuple[StepNote, ...] = ()
    template: str | None = None  # a notify step's own message, if it gave one

    @property
    def incidents(self) -> tuple[str, ...]:
        return tuple(m.incident for m in self.members)

    @property
    def open_members(self) -> tuple[Member, ...]:
        return tuple(m for m in self.members if m.resolved is None)


@dataclass
class _Step:
    intent: Intent
    outcome: Outcome | None
    seen: float


@dataclass
class _Group:
    key: str
    rule: str
    severity: str
    created: float
    members: dict[str, Member] = field(default_factory=dict)
    targets: list[str] = field(default_factory=list)
    told: set[str] = field(default_factory=set)  # targets that had the open message
    announced: bool = False
    sequence: int = 0
    last_sent: float = 0.0
    joined: list[str] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)
    steps: list[_Step] = field(default_factory=list)
    # Steps already told as "in progress": their outcome is told in a later message.
    in_progress: set[str] = field(default_factory=set)
    notes: list[tuple[tuple[str, ...], str]] = field(default_factory=list)  # targets, template
    template: str | None = None


class Grouper:
    """Collects what happened to incidents and decides when to say it.

    ``accepts(target, severity)`` decides at notify time whether a target takes messages of a
    severity at all (its ``min_severity``); a target that does not is never told about the
    group, so its resolve does not reach it either. ``timing(rule)`` gives a rule's timing.
    """

    def __init__(
        self,
        host: str,
        *,
        timing: Callable[[str], Timing] = lambda rule: Timing(),
        accepts: Callable[[str, str], bool] = lambda target, severity: True,
    ) -> None:
        self.host = host
        self._timing = timing
        self._accepts = accepts
        self._groups: dict[str, _Group] = {}  # rule -> its open group
        self._member_of: dict[str, _Group] = {}  # incident id -> group
        self._seen: dict[str, Member] = {}  # fired incidents not (yet) in a group
        self.muted: frozenset[str] = frozenset()  # incidents under a silence: no reminders

    # -- what happened ----------------------------------------------------------------------

    def fired(self, incident: str, rule: str, where: str, now: float) -> None:
        if incident not in self._member_of:
            self._seen.setdefault(incident, Member(incident, where, now))

    def facts(self, incident: str, facts: Mapping[str, str]) -> None:
        """The latest values of an incident (shown in the next message about it)."""
        items = tuple((str(k), str(v)) for k, v in facts.items())
        group = self._member_of.get(incident)
        if group is not None and incident in group.members:
            member = group.members[incident]
            if member.facts != items:  # most ticks show the values the last one did
                group.members[incident] = replace(member, facts=items)
        elif incident in self._seen and self._seen[incident].facts != items:
            self._seen[incident] = replace(self._seen[incident], facts=items)

    def notify(
        self, intent: Intent, targets: tuple[str, ...], template: str | None, now: float
    ) -> None:
        """A notify step: the rule wants ``targets`` told about ``intent.incident``."""
        wanted = [t for t in dict.fromkeys(targets) if self._accepts(t, intent.severity)]
        group = self._member_of.get(intent.incident) or self._groups.get(intent.rule)
        if group is None:
            key = f"{self.host}/{intent.rule}/{intent.incident}"
            group = _Group(key, intent.rule, intent.severity, now, template=template)
            self._groups[intent.rule] = group
        if intent.incident not in group.members:
            seen = self._seen.pop(intent.incident, None)
            group.members[intent.incident] = seen or Member(intent.incident, intent.where, now)
            self._member_of[intent.incident] = group
            if group.announced:
                group.joined.append(intent.incident)
        fresh = [t for t in wanted if t not in group.targets]
        group.targets.extend(fresh)
        if template is not None and group.announced:
            told = tuple(t for t in wanted if t in group.told)
            if told:
                group.notes.append((told, template))

    def step(self, intent: Intent, now: float) -> None:
        """A destructive step of an incident (its outcome follows through ``outcome``)."""
        group = self._member_of.get(intent.incident)
        if group is not None:
            group.steps.append(_Step(intent, None, now))

    def outcome(self, intent: Intent, outcome: Outcome) -> None:
        group = self._member_of.get(intent.incident)
        if group is None:
            return
        for step in group.steps:
            if step.intent.id == intent.id:
                step.outcome = outcome
                return
        if intent.id in group.in_progress:  # told while running: how it ended comes next
            group.in_progress.discard(intent.id)
            group.steps.append(_Step(intent, outcome, intent.time))

    def resolved(self, incident: str, now: float, *, handled: bool = False) -> None:
        """An incident closed; ``handled``: because its ladder ran (a one-shot rule), so its
        messages never call it resolved."""
        self._seen.pop(incident, None)
        group = self._member_of.get(incident)
        if group is None or incident not in group.members:
            return
        member = group.members[incident]
        if member.resolved is None:
            group.members[incident] = replace(member, resolved=now, handled=handled)
            group.resolved.append(incident)

    def ack(self, incident: str) -> bool:
        """Stop reminders about an incident; False when no group holds it."""
        group = self._member_of.get(incident)
        if group is None or incident not in group.members:
            return False
        group.members[incident] = replace(group.members[incident], acked=True)
        return True

    def resume(
        self, incident: str, *, told: tuple[str, ...], last_sent: float, sequence: int
    ) -> bool:
        """A restarted daemon's group of ``incident`` had already been announced before the
        restart: to ``told``, last at ``last_sent``, with ``sequence`` notices (at least) made.
        False when no group holds the incident."""
        group = self._member_of.get(incident)
        if group is None:
            return False
        group.announced = True
        group.told.update(t for t in told if t in group.targets)
        group.last_sent = max(group.last_sent, last_sent)
        group.sequence = max(group.sequence, sequence)
        return True

    def knows(self, incident: str) -> bool:
        """Whether a message may still show this incident (so its facts are worth reading)."""
        return incident in self._member_of or incident in self._seen

    @property
    def idle(self) -> bool:
        """No group is open: nothing can be due."""
        return not self._groups

    def facts_of(self, incident: str) -> tuple[tuple[str, str], ...]:
        """The latest facts of an incident (its GPU's values, who it is about)."""
        group = self._member_of.get(incident)
        if group is not None and incident in group.members:
            return group.members[incident].facts
        seen = self._seen.get(incident)
        return seen.facts if seen is not None else ()

    def open_incidents(self) -> tuple[str, ...]:
        return tuple(
            m.incident
            for g in self._groups.values()
            for m in g.members.values()
            if m.resolved is None
        )

    # -- what to say ------------------------------------------------------------------------

    def flush(self, now: float, *, final: bool = False) -> list[Notice]:
        """What to say now. ``final`` (a stop): everything held, at once, and no reminder."""
        notices: list[Notice] = []
        for rule, group in list(self._groups.items()):
            timing = self._timing(rule)
            notices.extend(self._flush_group(group, timing, now, final))
            pending = group.joined or group.resolved or group.steps or group.notes
            done = all(m.resolved is not None for m in group.members.values())
            if group.announced and done and not pending:
                self._close(rule, group)
        return notices

    def _close(self, rule: str, group: _Group) -> None:
        del self._groups[rule]
        for incident in group.members:
            self._member_of.pop(incident, None)

    def _flush_group(self, group: _Group, timing: Timing, now: float, final: bool) -> list[Notice]:
        if not group.targets:
            return []
        done = all(m.resolved is not None for m in group.members.values())
        # Every incident closed because its ladder ran: what happened is news, not a recovery.
        handled = done and all(m.handled for m in group.members.values())
        if not group.announced:
            if not final and now < group.created + timing.group_wait:
                return []
            group.announced = True
            group.told.update(group.targets)
            kind = "resolve" if done and not handled else "open"
            steps = self._take_steps(group, now, timing, everything=done or final)
            return [self._notice(group, kind, now, tuple(group.targets), steps, group.template)]
        out: list[Notice] = []
        new = tuple(t for t in group.targets if t not in group.told)
        if new and not done:
            group.told.update(new)
            out.append(self._notice(group, "open", now, new, (), group.template, quiet=True))
        if not final and now < group.last_sent + timing.group_interval:
            return out
        told = tuple(t for t in group.targets if t in group.told)
        for targets, template in group.notes:
            out.append(self._notice(group, "step", now, targets, (), template, quiet=True))
        group.notes.clear()
        steps = self._take_steps(group, now, timing, everything=done or final)
        if done:
            out.append(
                self._notice(group, "step" if handled else "resolve", now, told, steps, None)
            )
        elif steps or group.joined or group.resolved:
            out.append(self._notice(group, "step", now, told, steps, None))
        elif out:
            group.last_sent = now
        elif (
            not final
            and timing.repeat > 0
            and now >= group.last_sent + timing.repeat
            and any(
                m.resolved is None and not m.acked and m.incident not in self.muted
                for m in group.members.values()
            )
        ):
            out.append(self._notice(group, "reminder", now, told, (), None))
        return out

    def _take_steps(
        self, group: _Group, now: float, timing: Timing, *, everything: bool
    ) -> tuple[StepNote, ...]:
        ready = [
            s
            for s in group.steps
            if everything or s.outcome is not None or now >= s.seen + timing.group_interval
        ]
        group.steps = [s for s in group.steps if s not in ready]
        group.in_progress.update(s.intent.id for s in ready if s.outcome is None)
        return tuple(StepNote(s.intent, s.outcome) for s in ready)

    def _notice(
        self,
        group: _Group,
        kind: str,
        now: float,
        targets: tuple[str, ...],
        steps: tuple[StepNote, ...],
        template: str | None,
        *,
        quiet: bool = False,
    ) -> Notice:
        """``quiet``: a notice to only some targets; the group's batch is left alone."""
        notice = Notice(
            kind=kind,
            group=group.key,
            sequence=group.sequence,
            rule=group.rule,
            severity=group.severity,
            time=now,
            targets=targets,
            members=tuple(group.members.values()),
            joined=() if quiet else tuple(group.joined),
            resolved=() if quiet else tuple(group.resolved),
            steps=steps,
            template=template,
        )
        group.sequence += 1
        if not quiet:
            group.joined.clear()
            group.resolved.clear()
            group.last_sent = now
        return notice
