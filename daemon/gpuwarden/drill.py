"""``gpuwarden drill``: run a recording through the real engine on a simulated clock.

The recording is a scenario, or an nvidia-smi log (no processes: steps that pick processes find
none), with kernel-log events beside it if asked (``--events dmesg:FILE``).

Nothing outside the process is touched: no job is spawned, signalled or killed, no cloud API is
called, and nobody is notified — the messages the run would send are composed by the daemon's
own notifier and yielded with their text, marked ``[DRILL]``. Each intent is completed at once
with a simulated outcome, and a kill makes its targets leave the scenario's later snapshots, so
the drill shows what the ladder would lead to. A provision step shows what its cloud profile
would launch and what that costs per hour, worked out from the config alone
(``gpuwarden.cloud.plan``). A step that would act on a target's Slurm job through Slurm says so
(``via slurm job N``), from the job the scenario gives the process and the config's ``slurm``.
How the timeline reads for people is ``drill_text.py``.

``notify`` (``drill --notify``) really delivers the messages (never an owner's); ``cloud``
(``drill --cloud``) asks EC2 about each provision step with ``DryRun=True``, which checks the
credentials, the IAM permissions and the parameters and launches nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.actions import slurm
from gpuwarden.clock import SimClock
from gpuwarden.cloud import plan
from gpuwarden.config import Config
from gpuwarden.engine.engine import Engine
from gpuwarden.engine.quiet import candidate, decide_stretch
from gpuwarden.model import Intent, Outcome, RuleChange, Snapshot, Target
from gpuwarden.playbook.loader import PlaybookSet
from gpuwarden.playbook.schema import ENDING_KINDS
from gpuwarden.sources.select import Options, SourceSpec, open_source

# What a drill needs of its source: a ScenarioSource or an SmiCsvSource (maybe with events).
DrillSource = Any


@dataclass
class Summary:
    simulated_s: float = 0.0
    wall_s: float = 0.0
    ticks: int = 0
    fired: int = 0
    resolved: int = 0
    steps: dict[str, int] = field(default_factory=dict)
    targets: set[int] = field(default_factory=set)
    open_at_end: list[str] = field(default_factory=list)
    notified: int = 0  # messages delivered (drill --notify)
    notify_queued: int = 0
    messages: int = 0  # messages the run would send (shown in the timeline)
    scenario: str = ""  # the scenario's name, description and start (for reports)
    description: str = ""
    start: float = 0.0  # the scenario's start, and the time zone its wall-clock times use
    zone: dt.tzinfo = dt.UTC


def _target(target: Target, source: DrillSource) -> dict[str, Any]:
    return {
        "pid": target.pid,
        "job": source.job_of(target.pid),
        "user": target.user,
        "priority": target.priority,
        "gpu": target.gpu,
        "gpu_memory_mib": target.gpu_memory_mib,
    }


def cloud_plan(config: Config, profile_name: str, count: int | None) -> dict[str, Any] | None:
    """What a provision step would launch, from the config alone: the first instance type of
    the profile, as many as asked (or the profile's count) within its caps on an empty fleet,
    and the hourly cost (None: the type has no price). None for an unknown profile."""
    profile = config.cloud.profiles.get(profile_name)
    if profile is None:
        return None
    first = profile.instance_types[0]
    room = plan.allowance(profile, profile_name, (), count or profile.count, first)
    price = plan.price(profile, first)
    record: dict[str, Any] = {
        "profile": profile_name,
        "instance_type": first,
        "count": room.count,
        "market": profile.market,
        "region": profile.region,
        "hourly_usd": None if price is None else round(price * room.count, 6),
    }
    if room.why:
        record["capped"] = room.why
    return record


def _step_record(intent: Intent, t: float, source: DrillSource, config: Config) -> dict[str, Any]:
    record: dict[str, Any] = {
        "t": round(t, 3),
        "kind": "step",
        "rule": intent.rule,
        "scope": intent.scope,
        "where": intent.where,
        "incident": intent.incident,
        "step": intent.label,
        "index": intent.step,
        "targets": [_target(x, source) for x in intent.targets],
        "reason": str(intent.reason),
    }
    params = intent.params
    via = getattr(params, "via", None)
    for target, shown in zip(intent.targets, record["targets"], strict=True):
        if slurm.via_for(intent.kind, via, target.slurm_job, config.slurm.enabled) == "slurm":
            shown["via"] = "slurm"
            shown["slurm_job"] = target.slurm_job
    if intent.kind == "notify":
        record["notify"] = list(getattr(params, "targets", ()))
    elif intent.kind == "power_cap":
        watts, percent = getattr(params, "watts", None), getattr(params, "percent", None)
        record["power_cap"] = {"gpu": intent.gpu, "watts": watts, "percent": percent}
    elif intent.kind == "exec":
        record["argv"] = list(getattr(params, "argv", ()))
    elif intent.kind == "provision":
        name = getattr(params, "profile", None)
        record["profile"] = name
        if isinstance(name, str):
            record["cloud"] = cloud_plan(config, name, getattr(params, "count", None))
    if intent.shadow:
        record["shadow"] = True
    return record


def _change_record(change: RuleChange, t: float) -> dict[str, Any]:
    record: dict[str, Any] = {
        "t": round(t, 3),
        "kind": str(change.kind),
        "rule": change.rule,
        "scope": change.scope,
        "where": change.where,
        "reason": str(change.reason),
    }
    if change.incident:
        record["incident"] = change.incident
    if change.detail:
        record["detail"] = change.detail
    if change.values:
        record["values"] = {name: _plain(value) for name, value in change.values}
    return record


def _plain(value: object) -> object:
    """A value as JSON holds it (a list field is a tuple in the engine)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def run(
    scenario: Path | SourceSpec,
    config: Config,
    playbooks: PlaybookSet,
    *,
    options: Options | None = None,
    tick: float | None = None,
    summary: Summary | None = None,
    notify: Path | None = None,
    cloud: Path | None = None,
    deliver: bool = True,
    observe: Callable[[Snapshot, float], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the drill's timeline, one record at a time (see docs/playbooks.md, "Drills").

    ``scenario`` is a scenario file, or a replayed source (``scenario:`` or ``smi-csv:``,
    from its ``@TIME`` or ``@#N`` on); ``options`` how to read it and the kernel-log events
    beside it.

    Every record carries ``t`` (seconds from the scenario's start) and ``at`` (that instant
    on the wall clock, in the time zone of the scenario's ``start``; UTC for a log). The
    messages the run would send come as ``message`` records with the text they would carry,
    marked ``[DRILL]``; with ``notify`` (a journal file for the drill's own outbox) they are
    really delivered to the config's targets, otherwise nobody is told. With ``cloud`` (a
    journal file for the drill's own instance records) each provision step is put to EC2 as
    a ``DryRun`` launch, and its record's ``cloud.ec2`` says how EC2 answered.
    ``deliver=False`` composes the messages into the outbox of ``notify`` and sends none (a
    report shows what would have gone out). ``observe`` sees every snapshot played, with its
    instant (a report draws them).
    """
    interval = tick or config.tick
    summary = summary if summary is not None else Summary()
    began = time.perf_counter()
    spec = scenario if isinstance(scenario, SourceSpec) else SourceSpec("scenario", str(scenario))
    with contextlib.ExitStack() as closing:
        source: DrillSource = open_source(spec, config, options, drill=True)
        closing.callback(source.close)
        offset = spec.at or 0.0
        if spec.sample is not None:
            offset = source.sample_offset(spec.sample)
        engine = Engine(playbooks, config)
        described = getattr(source, "scenario", None)  # a scenario's own name; a log has none
        summary.scenario = described.name if described is not None else source.name
        summary.description = described.description if described is not None else ""
        begins = described.start if described is not None else None
        zone: dt.tzinfo = begins.tzinfo if begins and begins.tzinfo else dt.UTC
        summary.start, summary.zone = source.start_time, zone
        asker = None
        if cloud is not None and config.cloud.profiles:
            asker = _CloudAsker(config, cloud, config.host or source.host)
            closing.callback(asker.close)
        clock = SimClock(start=source.start_time + offset)
        messages = _Messages(config, playbooks, source.host, clock, notify)
        closing.callback(messages.close)
        steps = int(max(0.0, source.duration - offset) / interval + 1e-9)
        now = source.start_time + offset

        def stamp(record: dict[str, Any]) -> dict[str, Any]:
            record["at"] = _wall(now, zone)
            return record

        ahead = _Ahead(source, engine, playbooks, source.start_time + offset, interval, steps)
        for n in range(steps + 1):
            now = source.start_time + offset + n * interval
            clock.advance(now - clock.now())
            t = now - source.start_time
            quiet = ahead.quiet(n)
            snapshot = source.snapshot(now)
            if observe is not None:
                observe(snapshot, now)
            result = engine.step(snapshot, now, quiet=quiet, still=ahead.still(n))
            if result.records:
                ahead.forget()  # a step may change what plays next (a killed job vanishes)
            summary.ticks += 1
            messages.observe(result.records, snapshot, engine.incidents, now)
            for item in result.records:
                if isinstance(item, RuleChange):
                    if item.kind == "firing":
                        summary.fired += 1
                    elif item.kind == "resolved":
                        summary.resolved += 1
                    yield stamp(_change_record(item, t))
                    continue
                intent = item
                record = _step_record(intent, t, source, config)
                if asker is not None and record.get("cloud") is not None:
                    record["cloud"]["ec2"] = asker.ask(intent, now)
                yield stamp(record)
                for skipped in intent.skipped:
                    yield stamp(
                        {
                            "t": round(t, 3),
                            "kind": "skip",
                            "rule": intent.rule,
                            "scope": intent.scope,
                            "where": intent.where,
                            "incident": intent.incident,
                            "step": intent.label,
                            "targets": [_target(skipped.target, source)],
                            "reason": str(skipped.reason),
                        }
                    )
                summary.steps[intent.kind] = summary.steps.get(intent.kind, 0) + 1
                summary.targets.update(x.pid for x in intent.targets)
                if intent.kind in ENDING_KINDS and not intent.shadow:
                    for target in intent.targets:
                        source.vanish(target.pid)
                outcome = Outcome(ok=True, dry_run=True, detail="drill: simulated")
                engine.complete(intent.id, outcome)
                messages.outcome(intent, outcome, now)
            for message in messages.due(now):
                summary.messages += 1
                yield stamp(_message_record(message, t))
        summary.simulated_s = steps * interval
        summary.open_at_end = [i.id for i in engine.incidents]
        # What grouping still holds when the scenario ends goes out within a group interval:
        # shown at the time it would go.
        end = now
        while (now := now + interval) <= end + messages.longest_interval + 1e-9:
            clock.advance(now - clock.now())
            for message in messages.due(now):
                summary.messages += 1
                yield stamp(_message_record(message, now - source.start_time))
        notified, queued = messages.deliver(clock.now(), send=deliver)
        summary.notified, summary.notify_queued = (notified, queued) if deliver else (0, 0)
    summary.wall_s = time.perf_counter() - began


class _Ahead:
    """The drill's fast-forward: for each stretch of ticks the source promises bounds for
    (``ScenarioSource.stretch``), the rules that cannot hold anywhere in it, worked out once
    from the snapshots at its first and last tick (engine/quiet.py) and handed to every
    ``Engine.step`` of the stretch, which then skips those without state. Records are the
    same as without it; only the time differs."""

    def __init__(
        self,
        source: DrillSource,
        engine: Engine,
        playbooks: PlaybookSet,
        first: float,
        interval: float,
        steps: int,
    ) -> None:
        stretch = getattr(source, "stretch", None)
        self._stretch: Callable[[float], object] | None = (
            stretch if callable(stretch) and any(map(candidate, playbooks.rules)) else None
        )
        self._source = source
        self._engine = engine
        self._playbooks = playbooks
        self._first = first
        self._interval = interval
        self._steps = steps
        self._rules: frozenset[str] = frozenset()
        self._still: frozenset[int] = frozenset()  # held series unchanged over the stretch
        self._start = self._last = -1  # the stretch (its ticks) the rules are known for

    def _at(self, n: int) -> float:
        return self._first + n * self._interval  # as the drill's loop computes it

    def forget(self) -> None:
        self._start = self._last = -1

    def still(self, n: int) -> frozenset[int]:
        """The held series that tick ``n`` need not record again (``Engine.step``'s
        ``still``): those unchanged over the stretch, at its ticks after the first (the
        first may differ from the tick before it)."""
        return self._still if self._start < n <= self._last else frozenset()

    def quiet(self, n: int) -> frozenset[str]:
        if n <= self._last:
            return self._rules
        self._rules, self._still, self._start, self._last = frozenset(), frozenset(), n, n
        stretch = self._stretch
        if stretch is None:
            return self._rules
        key = stretch(self._at(n))
        if key is None:
            return self._rules
        # A stretch's ticks follow one another, and one never comes back after another:
        # its last tick is found by bisection.
        last, beyond = n, self._steps + 1
        while beyond - last > 1:
            middle = (last + beyond) // 2
            if stretch(self._at(middle)) == key:
                last = middle
            else:
                beyond = middle
        if last == n:
            return self._rules
        peek = self._source.peek
        ticks = [self._at(k) for k in range(n, last + 1)]
        ends = [(peek(t), t) for t in (ticks[0], ticks[-1])]
        self._rules, self._still = decide_stretch(
            self._playbooks,
            ends[0],
            ends[1],
            self._engine.tz,
            history=self._engine.history,
            ticks=ticks,
        )
        self._last = last
        return self._rules


class _Messages:
    """The notifications of a drill: composed by the daemon's own notifier (marked
    ``[DRILL]``), and with ``notify`` also written to the drill's outbox and delivered."""

    def __init__(
        self,
        config: Config,
        playbooks: PlaybookSet,
        host: str,
        clock: SimClock,
        notify: Path | None,
    ) -> None:
        from gpuwarden.notify.facts import MessageFacts, timings
        from gpuwarden.notify.notifier import Notifier

        rules = [r.spec for r in playbooks.rules]
        descriptions = {r.name: r.spec.description for r in playbooks.rules}
        self.told = None
        if notify is not None:
            from gpuwarden.notify.service import Notifications

            self.told = Notifications(
                config,
                notify,
                host=host,
                marker="[DRILL]",
                background=False,
                clock=clock,
                descriptions=descriptions,
                rules=rules,
            )
            self.notifier = self.told.notifier
        else:
            self.notifier = Notifier(
                config,
                host=host,
                marker="[DRILL]",
                descriptions=descriptions,
                timing=timings(config, rules),
            )
        self.facts = MessageFacts()
        self._quiet = False  # the last tick had no records and no open incident
        self.longest_interval = max(
            [config.notify.group_interval, *(r.group_interval or 0.0 for r in rules)]
        )
        self._clock = clock

    def observe(
        self, records: Sequence[Any], snapshot: Snapshot, incidents: Sequence[Any], now: float
    ) -> None:
        if self.told is not None:  # the notifier's, and alerts for Alertmanager targets
            self.told.observe(records, snapshot, incidents, now)
            return
        if not records and not incidents:
            if self._quiet:  # nothing to tell, and the first quiet tick forgot the rest
                return
            self._quiet = True
        else:
            self._quiet = False
        self.notifier.observe(records, now)
        wanted = self.notifier.grouper.knows  # only incidents a message may still show
        self.notifier.observe((), now, incidents=self.facts.of(snapshot, incidents, wanted))

    def outcome(self, intent: Intent, outcome: Outcome, now: float) -> None:
        self.notifier.observe_outcome(intent, outcome, now)

    def due(self, now: float) -> list[Any]:
        due = self.notifier.due(now)
        if self.told is not None:  # a drill never writes to job owners: shown, not sent
            sent = [m for m in due if m.kind != "owner"] + self.told.alerts.due(now)
            self.told.queued += sum(1 for m in sent if self.told.outbox.put(m, now))
        return due

    def deliver(self, now: float, *, send: bool = True) -> tuple[int, int]:
        """With ``notify``: what grouping still holds goes to the outbox as at a stop (no
        reminder; a message held by quiet hours at the hour they end), then, with ``send``,
        the outbox is delivered; (delivered, queued)."""
        if self.told is None:
            return 0, 0
        held = [(at, m) for at, m in self.notifier.drain(now) if m.kind != "owner"]
        held += [(now, m) for m in self.told.alerts.due(now)]
        self.told.queued += sum(1 for at, m in held if self.told.outbox.put(m, at))
        if not send:
            return 0, self.told.queued
        self.told.deliver_now()
        # What arrived, not what was tried: a target that is down keeps its messages queued.
        return self.told.outbox.counts()["sent"], self.told.queued

    def close(self) -> None:
        if self.told is not None:
            self.told.close(self._clock.now())


def _message_record(message: Any, t: float) -> dict[str, Any]:
    return {
        "t": round(t, 3),
        "kind": "message",
        "target": message.target,
        "message": message.kind,
        "severity": message.severity,
        "incidents": list(message.incidents),
        "title": message.title,
        "body": message.body,
    }


def _wall(now: float, zone: dt.tzinfo) -> str:
    return dt.datetime.fromtimestamp(now, zone).isoformat(timespec="seconds")


class _Pause:
    """How the drill waits between retries of a throttled EC2 call: really, and briefly."""

    def wait(self, seconds: float) -> bool:
        time.sleep(min(max(0.0, seconds), 2.0))
        return True


class _CloudAsker:
    """Provision steps put to EC2 with ``DryRun=True`` through the daemon's own cloud service,
    over a journal of the drill's own (nothing is launched, so nothing is recorded in it)."""

    def __init__(self, config: Config, journal: Path, host: str) -> None:
        from gpuwarden.cloud.service import CloudService
        from gpuwarden.cloud.store import InstanceStore

        self.store = InstanceStore.open(journal)
        self.service = CloudService(config.cloud, self.store, host=host)

    def ask(self, intent: Intent, now: float) -> dict[str, Any]:
        params = intent.params
        outcome = self.service.provision(
            intent,
            str(getattr(params, "profile", "")),
            getattr(params, "count", None),
            dry_run=True,
            now=now,
            waiter=_Pause(),
        )
        return {"ok": outcome.ok, "detail": outcome.detail}

    def close(self) -> None:
        self.store.close()
