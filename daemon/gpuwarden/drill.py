"""``gpuwarden drill``: run a recording through the real engine on a simulated clock.

The recording is a scenario, or an nvidia-smi log (no processes: steps that pick processes find
none), with kernel-log events beside it if asked (``--events dmesg:FILE``).

Nothing outside the process is touched: no job is spawned, signalled or killed, nobody is
notified, no cloud API is called. Each intent is completed at once with a simulated outcome, and
a kill makes its targets leave the scenario's later snapshots, so the drill shows what the
ladder would lead to. A provision step shows what its cloud profile would launch and what that
costs per hour, worked out from the config alone (``gpuwarden.cloud.plan``). A step that would
act on a target's Slurm job through Slurm says so (``via slurm job N``), from the job the
scenario gives the process and the config's ``slurm``.

``notify`` (``drill --notify``) really delivers the messages, marked ``[DRILL]``; ``cloud``
(``drill --cloud``) asks EC2 about each provision step with ``DryRun=True``, which checks the
credentials, the IAM permissions and the parameters and launches nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.actions import slurm
from gpuwarden.clock import SimClock
from gpuwarden.cloud import plan
from gpuwarden.config import Config
from gpuwarden.engine.engine import Engine
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
    scenario: str = ""  # the scenario's name, description and start (for reports)
    description: str = ""
    start: float = 0.0


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
    return record


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

    With ``notify`` (a journal file for the drill's own outbox) the messages the run would send
    are really delivered to the config's targets, marked ``[DRILL]``; otherwise nobody is told.
    With ``cloud`` (a journal file for the drill's own instance records) each provision step
    is put to EC2 as a ``DryRun`` launch, and its record's ``cloud.ec2`` says how EC2 answered.
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
        summary.start = source.start_time
        asker = None
        if cloud is not None and config.cloud.profiles:
            asker = _CloudAsker(config, cloud, config.host or source.host)
            closing.callback(asker.close)
        clock = SimClock(start=source.start_time + offset)
        told = None
        if notify is not None:
            from gpuwarden.notify.service import Notifications

            told = Notifications(
                config,
                notify,
                host=source.host,
                marker="[DRILL]",
                background=False,
                clock=clock,
                descriptions={r.name: r.spec.description for r in playbooks.rules},
                rules=[r.spec for r in playbooks.rules],
            )
        steps = int(max(0.0, source.duration - offset) / interval + 1e-9)
        for n in range(steps + 1):
            now = source.start_time + offset + n * interval
            clock.advance(now - clock.now())
            t = now - source.start_time
            snapshot = source.snapshot(now)
            if observe is not None:
                observe(snapshot, now)
            result = engine.step(snapshot, now)
            summary.ticks += 1
            if told is not None:
                told.observe(
                    result.records,
                    snapshot.gpus,
                    {i.id: i.gpu for i in engine.incidents},
                    now,
                    processes=snapshot.processes,
                )
            for item in result.records:
                if isinstance(item, RuleChange):
                    if item.kind == "firing":
                        summary.fired += 1
                    elif item.kind == "resolved":
                        summary.resolved += 1
                    yield _change_record(item, t)
                    continue
                intent = item
                record = _step_record(intent, t, source, config)
                if asker is not None and record.get("cloud") is not None:
                    record["cloud"]["ec2"] = asker.ask(intent, now)
                yield record
                for skipped in intent.skipped:
                    yield {
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
                summary.steps[intent.kind] = summary.steps.get(intent.kind, 0) + 1
                summary.targets.update(x.pid for x in intent.targets)
                if intent.kind in ENDING_KINDS and not intent.shadow:
                    for target in intent.targets:
                        source.vanish(target.pid)
                outcome = Outcome(ok=True, dry_run=True, detail="drill: simulated")
                engine.complete(intent.id, outcome)
                if told is not None:
                    told.observe_outcome(intent, outcome, now)
            if told is not None:
                told.flush(now)
        summary.simulated_s = steps * interval
        summary.open_at_end = [i.id for i in engine.incidents]
        if told is not None:
            told.flush(clock.now(), final=True)
            summary.notified = told.deliver_now() if deliver else 0
            summary.notify_queued = told.queued if deliver else 0
            told.close(clock.now())
    summary.wall_s = time.perf_counter() - began


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


def _money(usd: float | None) -> str:
    return "unpriced" if usd is None else f"${usd:,.2f}/h"


def _cloud_line(cloud: dict[str, Any] | None, profile: object) -> str:
    if cloud is None:
        return f"→ cloud profile {profile}"
    head = f"→ cloud profile {cloud['profile']}: would launch "
    if cloud["count"] <= 0:
        return head + f"nothing ({cloud.get('capped', 'capped')})"
    capped = f" (capped: {cloud['capped']})" if cloud.get("capped") else ""
    return (
        f"{head}{cloud['count']} x {cloud['instance_type']} ({cloud['market']}) in "
        f"{cloud['region']}, {_money(cloud['hourly_usd'])}{capped}"
    )


def _clock(t: float) -> str:
    whole = int(t)
    return f"+{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _who(target: dict[str, Any]) -> str:
    job = f" ({target['job']})" if target.get("job") else ""
    mib = target.get("gpu_memory_mib")
    memory = f", {mib} MiB" if mib is not None else ""
    via = f" via slurm job {target.get('slurm_job')}" if target.get("via") == "slurm" else ""
    who = f"{target.get('user') or '?'}/{target['priority']}"
    return f"pid {target['pid']}{job} {who}{memory}{via}"


def render_record(record: dict[str, Any]) -> str:
    """One timeline line for people (``--json`` prints the record itself)."""
    kind = record["kind"]
    head = f"{_clock(record['t'])}  {record['rule']}  {record.get('where') or record['scope']}"
    reason = record["reason"].replace("_", " ")
    if kind == "step":
        targets = record.get("targets") or []
        if "notify" in record:
            what = "→ " + ", ".join(record["notify"])
        elif "power_cap" in record:
            cap = record["power_cap"]
            limit = f"{cap['watts']:g} W" if cap["watts"] else f"{cap['percent']:g}% of default"
            what = f"→ GPU {cap['gpu']} limited to {limit}"
        elif "argv" in record:
            what = "→ " + " ".join(record["argv"])
        elif "profile" in record:
            what = _cloud_line(record.get("cloud"), record["profile"])
        elif targets:
            what = "→ " + "; ".join(_who(t) for t in targets)
        else:
            what = f"→ nobody ({reason})"
        shadow = " [shadow: not acted on]" if record.get("shadow") else ""
        line = f"{head}  STEP {record['step']} {what}{shadow}"
        ec2 = (record.get("cloud") or {}).get("ec2")
        if ec2 is not None:
            verdict = "ok" if ec2["ok"] else "NOT OK"
            line += f"\n{' ' * len(_clock(record['t']))}    EC2 DryRun {verdict}: {ec2['detail']}"
        return line
    if kind == "skip":
        return f"{' ' * len(_clock(record['t']))}    skip {_who(record['targets'][0])}: {reason}"
    detail = f" ({record['detail']})" if record.get("detail") else ""
    return f"{head}  {kind.upper()}: {reason}{detail}"


def render_summary(summary: Summary, scenario: str, rules: int) -> str:
    steps = ", ".join(f"{k} {v}" for k, v in sorted(summary.steps.items())) or "none"
    speed = summary.simulated_s / summary.wall_s if summary.wall_s > 0 else float("inf")
    lines = [
        f"summary: {scenario}: {rules} rule(s), {summary.ticks} ticks over "
        f"{summary.simulated_s:g}s simulated in {summary.wall_s:.2f}s ({speed:,.0f}x)",
        f"  incidents fired {summary.fired}, resolved {summary.resolved}, open at the end "
        f"{len(summary.open_at_end)}",
        f"  steps: {steps}; processes targeted: {len(summary.targets)}",
    ]
    if summary.notify_queued:
        lines.append(
            f"  notifications: {summary.notified} of {summary.notify_queued} "
            "[DRILL] message(s) delivered (the rest: `gpuwarden outbox`)"
        )
    return "\n".join(lines)
