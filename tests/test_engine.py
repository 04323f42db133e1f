"""The rule engine on a fake clock: the state machine of every rule kind and scope, the ladder,
shadow mode and history functions, with playbooks loaded from real files.

Each test plays a sequence of snapshots at chosen instants and compares the whole timeline the
engine records (``brief`` turns each record into a short tuple: kind, where, seconds from T0,
reason — or, for a step, its label, seconds and target PIDs).
"""

from __future__ import annotations

import datetime
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.config import Cloud, CloudProfile, Config, Notify, NotifyTarget
from gpuwarden.engine.engine import Engine
from gpuwarden.engine.incident import Tick
from gpuwarden.model import (
    Event,
    EventKind,
    GpuProcess,
    GpuState,
    Intent,
    Memory,
    Outcome,
    ProcessInfo,
    Reason,
    RuleChange,
    Snapshot,
    Transition,
)
from gpuwarden.playbook.loader import PlaybookSet, load

UTC = datetime.UTC
T0 = datetime.datetime(2026, 1, 5, 10, 0, tzinfo=UTC).timestamp()  # Monday 10:00 UTC
TOTAL_MIB = 100_000  # so that used_pct is used_mib / 1000
OK = Outcome(ok=True, detail="test")

# -- helpers shared with test_planner.py -------------------------------------------------------


def config(**overrides: Any) -> Config:
    target = NotifyTarget(urls=("json://127.0.0.1:9/hook",))
    profile = CloudProfile(
        region="us-east-1", instance_types=("p4d.24xlarge",), ami="ami-0123456789abcdef0"
    )
    values: dict[str, Any] = {
        "notify": Notify(targets={"oncall": target, "team": target}),
        "cloud": Cloud(profiles={"burst": profile}),
    }
    values.update(overrides)
    return Config(**values)


def playbooks(tmp_path: Path, text: str, cfg: Config | None = None) -> PlaybookSet:
    path = tmp_path / "rules.yaml"
    path.write_text(textwrap.dedent(text))
    return load([path], cfg or config())


def make_engine(
    tmp_path: Path, text: str, *, cfg: Config | None = None, self_pid: int | None = None
) -> Engine:
    cfg = cfg or config()
    return Engine(playbooks(tmp_path, text, cfg), cfg, self_pid=self_pid)


def gpu(index: int = 0, pct: float | None = 50.0, **fields: Any) -> GpuState:
    """A GPU of TOTAL_MIB with ``pct`` percent of its memory used (None: unknown)."""
    used = None if pct is None else round(pct * TOTAL_MIB / 100)
    free = None if used is None else TOTAL_MIB - used
    return GpuState(index=index, memory=Memory(TOTAL_MIB, used, free), **fields)


def proc(
    pid: int,
    *,
    gpu: int = 0,
    mib: int | None = 1000,
    priority: str = "normal",
    user: str | None = "alice",
    uid: int | None = 1000,
    created: float | None = T0 - 3600,
    name: str | None = "python3",
    status: str | None = "running",
    **info: Any,
) -> GpuProcess:
    details = ProcessInfo(
        pid=pid,
        name=name,
        user=user,
        uid=uid,
        create_time=created,
        status=status,
        priority=priority,
        **info,
    )
    return GpuProcess(pid=pid, gpu=gpu, gpu_memory_mib=mib, info=details)


def snap(
    *gpus: GpuState,
    procs: Sequence[GpuProcess] = (),
    events: Sequence[Event] = (),
    time: float = T0,
) -> Snapshot:
    return Snapshot("node-1", time, tuple(gpus), tuple(procs), tuple(events))


def xid(number: int, gpu_index: int | None = 0, at: float = T0) -> Event:
    return Event(EventKind.XID, at, gpu=gpu_index, xid=number)


def brief(record: RuleChange | Intent) -> tuple[Any, ...]:
    if isinstance(record, RuleChange):
        return (str(record.kind), record.where, record.time - T0, str(record.reason))
    return ("step", record.label, record.time - T0, tuple(t.pid for t in record.targets))


def drive(
    engine: Engine, frames: Iterable[tuple[float, Snapshot]], *, finish: bool = True
) -> list[tuple[Any, ...]]:
    """Step through ``(seconds from T0, snapshot)`` frames; with ``finish`` every intent is
    completed at once, as the drill does."""
    out: list[tuple[Any, ...]] = []
    for t, snapshot in frames:
        tick = engine.step(snapshot, T0 + t)
        out.extend(brief(r) for r in tick.records)
        if finish:
            for intent in tick.intents:
                engine.complete(intent.id, OK)
    return out


def series(values: Iterable[float | None], every: float = 10.0) -> list[tuple[float, Snapshot]]:
    """GPU 0 at ``values`` percent, one tick every ``every`` seconds from T0."""
    return [(i * every, snap(gpu(0, v))) for i, v in enumerate(values)]


# -- the state machine of a GPU rule -----------------------------------------------------------

MEM_RULE = """
rules:
  - name: mem
    when: gpu.memory.used_pct >= 95
{extra}
"""

G = "GPU 0"
STATE_MACHINE: list[tuple[str, str, list[float | None], list[tuple[Any, ...]]]] = [
    (
        "fires exactly when for has elapsed",
        "for: 30s",
        [96, 96, 96, 96, 96],
        [("pending", G, 0, "condition_met"), ("firing", G, 30, "for_elapsed")],
    ),
    (
        "for that falls between ticks fires on the first tick after it",
        "for: 25s",
        [96, 96, 96, 96],
        [("pending", G, 0, "condition_met"), ("firing", G, 30, "for_elapsed")],
    ),
    (
        "cleared before for: cancelled, and for starts over",
        "for: 30s",
        [96, 96, 94, 96, 96, 96, 96],
        [
            ("pending", G, 0, "condition_met"),
            ("cancelled", G, 20, "condition_cleared"),
            ("pending", G, 30, "condition_met"),
            ("firing", G, 60, "for_elapsed"),
        ],
    ),
    (
        "no for: pending and firing on the same tick",
        "",
        [94, 96],
        [("pending", G, 10, "condition_met"), ("firing", G, 10, "for_elapsed")],
    ),
    (
        "without until it resolves as soon as when is false",
        "for: 10s",
        [96, 96, 96, 94.9, 94],
        [
            ("pending", G, 0, "condition_met"),
            ("firing", G, 10, "for_elapsed"),
            ("resolved", G, 30, "resolved"),
        ],
    ),
    (
        "until: stays open between the until and when thresholds",
        "until: gpu.memory.used_pct < 85",
        [96, 90, 86, 85, 94, 84.9, 90],
        [
            ("pending", G, 0, "condition_met"),
            ("firing", G, 0, "for_elapsed"),
            ("resolved", G, 50, "until_met"),
        ],
    ),
    (
        "cooldown: one record however the condition flaps, refire once it is over",
        "cooldown: 60s",
        [96, 50, 96, 96, 50, 96, 96, 96, 50],
        [
            ("pending", G, 0, "condition_met"),
            ("firing", G, 0, "for_elapsed"),
            ("resolved", G, 10, "resolved"),
            ("cooldown", G, 20, "cooldown"),
            ("pending", G, 70, "condition_met"),
            ("firing", G, 70, "for_elapsed"),
            ("resolved", G, 80, "resolved"),
        ],
    ),
    (
        "after the cooldown the rule waits for `for` again",
        "cooldown: 30s\nfor: 20s",
        [96, 96, 96, 94, 96, 96, 96, 96, 96],
        [
            ("pending", G, 0, "condition_met"),
            ("firing", G, 20, "for_elapsed"),
            ("resolved", G, 30, "resolved"),
            ("cooldown", G, 40, "cooldown"),
            ("pending", G, 60, "condition_met"),
            ("firing", G, 80, "for_elapsed"),
        ],
    ),
    (
        "an unknown value is not a match",
        "",
        [None, None],
        [],
    ),
]


@pytest.mark.parametrize(
    ("extra", "values", "expected"),
    [case[1:] for case in STATE_MACHINE],
    ids=[case[0] for case in STATE_MACHINE],
)
def test_gpu_rule_state_machine(
    tmp_path: Path, extra: str, values: list[float | None], expected: list[tuple[Any, ...]]
) -> None:
    engine = make_engine(tmp_path, MEM_RULE.format(extra=textwrap.indent(extra, "    ")))
    assert drive(engine, series(values)) == expected


def test_for_is_not_met_a_moment_early(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, MEM_RULE.format(extra="    for: 30s"))
    frames = [(t, snap(gpu(0, 96))) for t in (0.0, 29.5, 29.999, 30.0)]
    assert drive(engine, frames) == [
        ("pending", G, 0, "condition_met"),
        ("firing", G, 30, "for_elapsed"),
    ]


def test_default_cooldown_is_five_minutes(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, MEM_RULE.format(extra=""))
    frames = [(t, snap(gpu(0, v))) for t, v in [(0, 96), (10, 50), (20, 96), (309, 96), (310, 96)]]
    assert drive(engine, frames) == [
        ("pending", G, 0, "condition_met"),
        ("firing", G, 0, "for_elapsed"),
        ("resolved", G, 10, "resolved"),
        ("cooldown", G, 20, "cooldown"),
        ("pending", G, 310, "condition_met"),
        ("firing", G, 310, "for_elapsed"),
    ]


def test_each_gpu_is_its_own_scope(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, MEM_RULE.format(extra="    for: 10s"))
    frames = [
        (0, snap(gpu(0, 96), gpu(1, 50))),
        (10, snap(gpu(0, 96), gpu(1, 97))),
        (20, snap(gpu(0, 50), gpu(1, 97))),
    ]
    assert drive(engine, frames) == [
        ("pending", "GPU 0", 0, "condition_met"),
        ("firing", "GPU 0", 10, "for_elapsed"),
        ("pending", "GPU 1", 10, "condition_met"),
        ("firing", "GPU 1", 20, "for_elapsed"),
        ("resolved", "GPU 0", 20, "resolved"),
    ]
    assert [(i.rule, i.scope) for i in engine.incidents] == [("mem", "gpu:1")]


def test_a_gpu_that_leaves_the_snapshot_is_a_scope_gone(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, MEM_RULE.format(extra="    for: 10s"))
    frames = [
        (0, snap(gpu(0, 96), gpu(1, 96))),
        (10, snap(gpu(0, 96), gpu(1, 96))),
        (20, snap(gpu(1, 96))),
    ]
    assert drive(engine, frames)[-1] == ("resolved", "GPU 0", 20, "scope_gone")
    assert [i.scope for i in engine.incidents] == ["gpu:1"]


def test_records_carry_the_incident_and_the_tick_splits_them(tmp_path: Path) -> None:
    engine = make_engine(
        tmp_path,
        MEM_RULE.format(extra="    severity: critical\n    steps:\n      - notify: oncall"),
    )
    tick: Tick = engine.step(snap(gpu(0, 96)), T0)
    pending, firing = tick.changes
    (intent,) = tick.intents
    assert [type(r) for r in tick.records] == [RuleChange, RuleChange, Intent]
    assert pending.incident is None
    assert firing.incident == intent.incident == engine.incidents[0].id
    assert intent.id.startswith(intent.incident)
    assert (intent.rule, intent.scope, intent.gpu, intent.kind) == ("mem", "gpu:0", 0, "notify")
    assert (intent.severity, intent.reason, intent.shadow) == ("critical", Reason.STEP_DUE, False)
    assert intent.params is not None
    assert getattr(intent.params, "targets", None) == ("oncall",)


# -- process scopes ----------------------------------------------------------------------------

PROC_RULE = """
rules:
  - name: big
    for_each: process
    when: process.gpu_memory_mib >= 1000
    for: 20s
"""
P = "pid 4242 on GPU 0"


def test_a_process_that_leaves_while_pending_is_cancelled(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, PROC_RULE)
    frames = [(0, snap(gpu(0), procs=[proc(4242)])), (10, snap(gpu(0)))]
    assert drive(engine, frames) == [
        ("pending", P, 0, "condition_met"),
        ("cancelled", P, 10, "scope_gone"),
    ]


def test_a_process_that_leaves_while_firing_resolves(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, PROC_RULE)
    frames = [(t, snap(gpu(0), procs=[proc(4242)])) for t in (0, 10, 20)]
    frames.append((30, snap(gpu(0), procs=[proc(5000)])))
    assert drive(engine, frames) == [
        ("pending", P, 0, "condition_met"),
        ("firing", P, 20, "for_elapsed"),
        ("pending", "pid 5000 on GPU 0", 30, "condition_met"),
        ("resolved", P, 30, "scope_gone"),
    ]
    assert engine.incidents == []


def test_a_reused_pid_is_a_new_scope(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, PROC_RULE)
    first, second = proc(4242, created=T0 - 100), proc(4242, created=T0 + 25)
    frames = [(t, snap(gpu(0), procs=[first])) for t in (0, 10, 20)]
    frames += [(t, snap(gpu(0), procs=[second])) for t in (30, 40, 50)]
    records: list[RuleChange] = []
    for t, snapshot in frames:
        records.extend(engine.step(snapshot, T0 + t).changes)
    timeline = [(str(r.kind), r.scope, r.time - T0, str(r.reason)) for r in records]
    old, new = "gpu:0/pid:4242@" + f"{T0 - 100:.2f}", "gpu:0/pid:4242@" + f"{T0 + 25:.2f}"
    assert timeline == [
        ("pending", old, 0, "condition_met"),
        ("firing", old, 20, "for_elapsed"),
        ("pending", new, 30, "condition_met"),
        ("resolved", old, 30, "scope_gone"),
        ("firing", new, 50, "for_elapsed"),
    ]


def test_one_process_on_two_gpus_is_two_scopes(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, PROC_RULE.replace("for: 20s", "for: 0s"))
    tick = engine.step(snap(gpu(0), gpu(1), procs=[proc(7, gpu=0), proc(7, gpu=1)]), T0)
    assert [(str(c.kind), c.where) for c in tick.changes] == [
        ("pending", "pid 7 on GPU 0"),
        ("firing", "pid 7 on GPU 0"),
        ("pending", "pid 7 on GPU 1"),
        ("firing", "pid 7 on GPU 1"),
    ]


# -- active windows ----------------------------------------------------------------------------

WINDOW_RULE = """
rules:
  - name: mem
    when: gpu.memory.used_pct >= 95
    for: 5m
    active: "Mon-Fri 08:00-20:00"
"""
HOUR = 3600.0


def test_pending_is_cancelled_when_the_window_closes(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, WINDOW_RULE)
    # Monday 19:58, 19:59, 20:00, 20:01 ... Tuesday 07:59, 08:00, 08:05.
    times = [9 * HOUR + 58 * 60, 9 * HOUR + 59 * 60, 10 * HOUR, 10 * HOUR + 60, 11 * HOUR]
    times += [21 * HOUR + 59 * 60, 22 * HOUR, 22 * HOUR + 300]
    assert drive(engine, [(t, snap(gpu(0, 99))) for t in times]) == [
        ("pending", G, 9 * HOUR + 58 * 60, "condition_met"),
        ("cancelled", G, 10 * HOUR, "inactive_window"),
        ("pending", G, 22 * HOUR, "condition_met"),
        ("firing", G, 22 * HOUR + 300, "for_elapsed"),
    ]


def test_nothing_happens_outside_the_window(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, WINDOW_RULE)
    saturday = 5 * 24 * HOUR
    frames = [(saturday + n * 600.0, snap(gpu(0, 99))) for n in range(6 * 24 * 2)]  # to Monday
    records = drive(engine, frames)
    monday_8 = 7 * 24 * HOUR - 2 * HOUR
    assert records == [
        ("pending", G, monday_8, "condition_met"),
        ("firing", G, monday_8 + 600, "for_elapsed"),
    ]


@pytest.mark.parametrize(
    ("zone", "pending"),
    [("UTC", [1.5 * HOUR]), ("America/New_York", [3 * HOUR]), ("Asia/Tokyo", [])],
)
def test_windows_read_the_configured_time_zone(
    tmp_path: Path, zone: str, pending: list[float]
) -> None:
    # The GPU fills at Monday 11:30 UTC: 06:30 in New York (the window opens at 13:00 UTC)
    # and 20:30 in Tokyo (closed since 11:00 UTC, until Tuesday 08:00 there).
    engine = make_engine(tmp_path, WINDOW_RULE, cfg=config(timezone=zone))
    frames = [(n * 300.0, snap(gpu(0, 99 if n * 300 >= 1.5 * HOUR else 50))) for n in range(48)]
    assert [r[2] for r in drive(engine, frames) if r[0] == "pending"] == pending


# -- scheduled rules (every) -------------------------------------------------------------------

SCHEDULED = """
rules:
  - name: check
    for_each: host
    every: {every}
    when: host.memory_used_pct >= 50
    cooldown: 0s
    steps:
      - notify: oncall
"""
H = "node-1"


def scheduled_runs(records: list[tuple[Any, ...]]) -> list[float]:
    return [r[2] for r in records if r[0] == "firing"]


def test_an_interval_counts_from_the_first_tick(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, SCHEDULED.format(every="1h"))
    frames = [(n * 600.0, snap(gpu(0, 60))) for n in range(19)]  # 0 .. 3h
    records = drive(engine, frames)
    assert records[:3] == [
        ("firing", H, 3600.0, "scheduled"),
        ("step", "notify", 3600.0, ()),
        ("resolved", H, 3600.0, "ladder_done"),
    ]
    assert scheduled_runs(records) == [3600.0, 7200.0, 10800.0]


def test_an_interval_does_not_drift_with_ticks_that_miss_its_instants(tmp_path: Path) -> None:
    # Due at 10, 20, 30, 40 s from the first tick; ticks come every 3 s.
    engine = make_engine(tmp_path, SCHEDULED.format(every="10s"))
    records = drive(engine, [(n * 3.0, snap(gpu(0, 60))) for n in range(15)])
    assert scheduled_runs(records) == [12.0, 21.0, 30.0, 42.0]


def test_a_weekly_check_runs_at_its_instant_once(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, SCHEDULED.format(every='"Mon 11:00"'))
    frames = [(n * 900.0, snap(gpu(0, 60))) for n in range(4 * 24 * 8)]  # 8 days, every 15m
    assert scheduled_runs(drive(engine, frames)) == [HOUR, 7 * 24 * HOUR + HOUR]


def test_a_schedule_whose_instant_passed_before_the_first_tick_waits_a_week(
    tmp_path: Path,
) -> None:
    engine = make_engine(tmp_path, SCHEDULED.format(every='"Mon 09:00"'))
    frames = [(n * 900.0, snap(gpu(0, 60))) for n in range(4 * 24 * 8)]  # from Monday 10:00
    assert scheduled_runs(drive(engine, frames)) == [7 * 24 * HOUR - HOUR]


def test_a_scheduled_rule_whose_condition_fails_at_its_instant_waits_for_the_next(
    tmp_path: Path,
) -> None:
    engine = make_engine(tmp_path, SCHEDULED.format(every="1m"))
    values = [60, 60, 60, 60, 30, 60, 60, 60, 60]  # every 15 s: false at 60 s only
    frames = [(n * 15.0, snap(gpu(0, v))) for n, v in enumerate(values)]
    assert scheduled_runs(drive(engine, frames)) == [120.0]


def test_a_scheduled_gpu_rule_fires_per_gpu_that_matches(tmp_path: Path) -> None:
    text = SCHEDULED.format(every="1m").replace("for_each: host", "for_each: gpu")
    text = text.replace("host.memory_used_pct", "gpu.memory.used_pct")
    engine = make_engine(tmp_path, text)
    frames = [(t, snap(gpu(0, 60), gpu(1, 10), gpu(2, 70))) for t in (0.0, 30.0, 60.0)]
    assert [r[:2] for r in drive(engine, frames) if r[0] == "firing"] == [
        ("firing", "GPU 0"),
        ("firing", "GPU 2"),
    ]


def test_a_scheduled_incident_with_a_running_step_closes_when_it_completes(
    tmp_path: Path,
) -> None:
    text = SCHEDULED.format(every="1m").replace("- notify: oncall", "- exec: [/bin/true]")
    engine = make_engine(tmp_path, text)
    assert drive(engine, [(0, snap(gpu(0, 60)))]) == []
    tick = engine.step(snap(gpu(0, 60)), T0 + 60)
    assert [brief(r) for r in tick.records] == [
        ("firing", H, 60, "scheduled"),
        ("step", "exec", 60, ()),
    ]
    assert drive(engine, [(70, snap(gpu(0, 60)))]) == []  # still running
    engine.complete(tick.intents[0].id, OK)
    assert drive(engine, [(80, snap(gpu(0, 60)))]) == [("resolved", H, 80, "ladder_done")]


# -- event rules -------------------------------------------------------------------------------

EVENT_RULE = """
rules:
  - name: fatal
    for_each: event
    when: event.kind == "xid" and event.xid in [48, 79]
    cooldown: {cooldown}
    steps:
{steps}
"""


def event_engine(tmp_path: Path, steps: str = "- notify: oncall", cooldown: str = "0s") -> Engine:
    text = EVENT_RULE.format(steps=textwrap.indent(steps, "      "), cooldown=cooldown)
    return make_engine(tmp_path, text)


def test_an_event_rule_fires_on_the_event_tick_and_closes_with_its_ladder(
    tmp_path: Path,
) -> None:
    engine = event_engine(tmp_path)
    frames = [
        (0, snap(gpu(0))),
        (10, snap(gpu(0), events=[xid(13)])),  # not a fatal XID
        (20, snap(gpu(0), events=[xid(79)])),
        (30, snap(gpu(0))),
    ]
    assert drive(engine, frames) == [
        ("firing", G, 20, "event"),
        ("step", "notify", 20, ()),
        ("resolved", G, 20, "ladder_done"),
    ]


def test_several_events_in_one_tick_open_one_incident_per_gpu(tmp_path: Path) -> None:
    engine = event_engine(tmp_path)
    events = [xid(13, 0), xid(79, 0), xid(48, 0), xid(79, 1), xid(79, None)]
    records = drive(engine, [(0, snap(gpu(0), gpu(1), events=events))])
    assert [r[:2] for r in records if r[0] == "firing"] == [
        ("firing", "GPU 0"),
        ("firing", "GPU 1"),
        ("firing", "host"),
    ]
    assert len([r for r in records if r[0] == "step"]) == 3


def test_an_event_incident_waits_for_its_running_steps(tmp_path: Path) -> None:
    engine = event_engine(tmp_path, "- notify: oncall\n- kill: {}\n- after: 1m\n  notify: team")
    tick = engine.step(snap(gpu(0), procs=[proc(4242)], events=[xid(79)]), T0)
    assert [brief(r) for r in tick.records] == [
        ("firing", G, 0, "event"),
        ("step", "notify", 0, ()),
        ("step", "kill", 0, (4242,)),
    ]
    assert drive(engine, [(30, snap(gpu(0)))], finish=False) == []
    engine.complete(tick.intents[1].id, OK)
    assert drive(engine, [(40, snap(gpu(0))), (60, snap(gpu(0)))]) == [
        ("step", "notify", 60, ()),
        ("resolved", G, 60, "ladder_done"),
    ]


def test_an_event_rule_with_until_stays_open_until_it_holds(tmp_path: Path) -> None:
    text = EVENT_RULE.format(steps="      - notify: oncall", cooldown="0s")
    text = text.replace("    steps:", "    until: gpu.temperature_c < 80\n    steps:")
    engine = make_engine(tmp_path, text)
    frames = [
        (0, snap(gpu(0, temperature_c=95), events=[xid(79)])),
        (10, snap(gpu(0, temperature_c=90))),
        (20, snap(gpu(0, temperature_c=79))),
    ]
    assert drive(engine, frames) == [
        ("firing", G, 0, "event"),
        ("step", "notify", 0, ()),
        ("resolved", G, 20, "until_met"),
    ]


def test_an_event_in_cooldown_is_recorded_once(tmp_path: Path) -> None:
    engine = event_engine(tmp_path, cooldown="5m")
    frames = [(t, snap(gpu(0), events=[xid(79)])) for t in (0, 60, 120, 300)]
    assert drive(engine, frames) == [
        ("firing", G, 0, "event"),
        ("step", "notify", 0, ()),
        ("resolved", G, 0, "ladder_done"),
        ("cooldown", G, 60, "cooldown"),
        ("firing", G, 300, "event"),
        ("step", "notify", 300, ()),
        ("resolved", G, 300, "ladder_done"),
    ]


# -- the ladder --------------------------------------------------------------------------------

LADDER = """
rules:
  - name: mem
    when: gpu.memory.used_pct >= 95
    until: gpu.memory.used_pct < 85
    cooldown: 1h
    steps:
{steps}
"""


def ladder_engine(tmp_path: Path, steps: str, **kwargs: Any) -> Engine:
    return make_engine(tmp_path, LADDER.format(steps=textwrap.indent(steps, "      ")), **kwargs)


def steps_of(records: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [r for r in records if r[0] == "step"]


def test_each_step_runs_once_per_incident(tmp_path: Path) -> None:
    engine = ladder_engine(tmp_path, "- notify: oncall\n- kill: {}\n- exec: [/bin/true]")
    frames = [(t * 10.0, snap(gpu(0, 99), procs=[proc(10)])) for t in range(20)]
    assert steps_of(drive(engine, frames)) == [
        ("step", "notify", 0, ()),
        ("step", "kill", 0, (10,)),
        ("step", "exec", 10, ()),
    ]


def test_after_is_counted_from_firing(tmp_path: Path) -> None:
    engine = ladder_engine(tmp_path, "- notify: oncall\n- after: 2m\n  notify: team")
    frames = [(0.0, snap(gpu(0, 90)))] + [(t, snap(gpu(0, 99))) for t in (30.0, 60, 119, 150, 180)]
    assert drive(engine, frames) == [
        ("pending", G, 30, "condition_met"),
        ("firing", G, 30, "for_elapsed"),
        ("step", "notify", 30, ()),
        ("step", "notify", 150, ()),
    ]


def test_a_blocking_step_with_targets_holds_the_next_until_complete(tmp_path: Path) -> None:
    engine = ladder_engine(
        tmp_path, "- checkpoint: {signal: SIGUSR1}\n- notify: oncall\n- after: 5s\n  kill: {}"
    )
    frame = snap(gpu(0, 99), procs=[proc(10)])
    first = engine.step(frame, T0)
    assert steps_of([brief(r) for r in first.records]) == [("step", "checkpoint", 0, (10,))]
    assert drive(engine, [(10, frame), (20, frame)], finish=False) == []
    engine.complete("unknown-intent", OK)  # ignored
    assert drive(engine, [(30, frame)], finish=False) == []
    engine.complete(first.intents[0].id, OK)
    engine.complete(first.intents[0].id, OK)  # twice: harmless
    assert drive(engine, [(40, frame)]) == [
        ("step", "notify", 40, ()),
        ("step", "kill", 40, (10,)),
    ]


@pytest.mark.parametrize(
    ("first", "holds"),
    [
        ("- notify: oncall", False),
        ("- kill: {select: process.user == 'nobody'}", False),  # chose nobody: nothing to wait for
        ("- checkpoint: {}", False),  # nobody opted in: nothing to wait for
        ("- kill: {}", True),
        ("- checkpoint: {signal: SIGUSR2}", True),
        ("- renice: {}", True),
        ("- suspend: {}", True),
        ("- resume: {}", True),
        ("- exec: [/bin/true]", True),
        ("- provision: burst", True),
        ("- power_cap: {percent: 70}", True),
    ],
)
def test_which_steps_hold_the_ladder(tmp_path: Path, first: str, holds: bool) -> None:
    engine = ladder_engine(tmp_path, f"{first}\n- {{name: next, notify: team}}")
    frame = snap(gpu(0, 99), procs=[proc(10)])
    tick = engine.step(frame, T0)
    kind = tick.intents[0].kind
    assert [i.label for i in tick.intents] == ([kind] if holds else [kind, "next"])
    engine.complete(tick.intents[0].id, OK)
    later = engine.step(frame, T0 + 1)
    assert [i.label for i in later.intents] == (["next"] if holds else [])


def test_a_due_step_waits_while_when_is_false_then_runs(tmp_path: Path) -> None:
    engine = ladder_engine(tmp_path, "- notify: oncall\n- after: 30s\n  notify: team")
    values = [99, 90, 90, 90, 90, 90, 99, 99]
    assert drive(engine, series(values)) == [
        ("pending", G, 0, "condition_met"),
        ("firing", G, 0, "for_elapsed"),
        ("step", "notify", 0, ()),
        ("waiting", G, 30, "condition_not_holding"),
        ("step", "notify", 60, ()),
    ]


def test_a_resolved_incident_runs_no_further_step(tmp_path: Path) -> None:
    engine = ladder_engine(tmp_path, "- notify: oncall\n- after: 30s\n  notify: team")
    values = [99, 90, 80, 99, 99, 99, 99]  # resolved at 20; in cooldown after
    assert drive(engine, series(values)) == [
        ("pending", G, 0, "condition_met"),
        ("firing", G, 0, "for_elapsed"),
        ("step", "notify", 0, ()),
        ("resolved", G, 20, "until_met"),
        ("cooldown", G, 30, "cooldown"),
    ]
    assert engine.incidents == []


def test_a_running_step_of_a_resolved_incident_is_forgotten(tmp_path: Path) -> None:
    engine = ladder_engine(tmp_path, "- exec: [/bin/true]\n- notify: oncall")
    tick = engine.step(snap(gpu(0, 99)), T0)
    assert drive(engine, [(10, snap(gpu(0, 50)))]) == [("resolved", G, 10, "until_met")]
    engine.complete(tick.intents[0].id, OK)  # the executor finishes late: nothing moves
    assert drive(engine, [(20, snap(gpu(0, 50)))]) == []


def test_steps_due_in_the_same_tick_run_in_order(tmp_path: Path) -> None:
    steps = "\n".join(
        [
            "- {after: 1m, name: first, notify: oncall}",
            "- {after: 1m, name: second, kill: {select: process.pid == 0}}",
            "- {after: 30s, name: third, notify: team}",
            "- {after: 1m, name: fourth, exec: [/bin/true]}",
            "- {name: fifth, notify: team}",
        ]
    )
    engine = ladder_engine(tmp_path, steps)
    records = drive(engine, [(t, snap(gpu(0, 99), procs=[proc(10)])) for t in (0, 30, 60, 61)])
    assert steps_of(records) == [
        ("step", "first", 60, ()),
        ("step", "second", 60, ()),
        ("step", "third", 60, ()),
        ("step", "fourth", 60, ()),
        ("step", "fifth", 61, ()),
    ]


def test_the_next_incident_runs_the_ladder_again(tmp_path: Path) -> None:
    engine = make_engine(
        tmp_path,
        LADDER.format(steps="      - notify: oncall").replace("cooldown: 1h", "cooldown: 0s"),
    )
    records = drive(engine, series([99, 50, 99]))
    assert steps_of(records) == [("step", "notify", 0, ()), ("step", "notify", 20, ())]
    incidents = [r for r in records if r[0] == "firing"]
    assert len(incidents) == 2


# -- shadow mode -------------------------------------------------------------------------------

TWO_KILLERS = """
rules:
  - name: first
    mode: {mode}
    when: gpu.memory.used_pct >= 95
    steps:
      - kill: {{}}
  - name: second
    when: gpu.memory.used_pct >= 90
    steps:
      - kill: {{}}
"""


@pytest.mark.parametrize("mode", ["shadow", "enforce"])
def test_a_shadow_kill_leaves_the_process_to_other_rules(tmp_path: Path, mode: str) -> None:
    engine = make_engine(tmp_path, TWO_KILLERS.format(mode=mode))
    tick = engine.step(snap(gpu(0, 99), procs=[proc(10)]), T0)
    first, second = tick.intents
    assert (first.rule, first.shadow, [t.pid for t in first.targets]) == (
        "first",
        mode == "shadow",
        [10],
    )
    assert (second.rule, second.shadow) == ("second", False)
    if mode == "shadow":
        assert [t.pid for t in second.targets] == [10]
        assert second.skipped == ()
    else:
        assert second.targets == ()
        assert [(s.target.pid, s.reason) for s in second.skipped] == [(10, Reason.ALREADY_TARGETED)]
        assert second.reason == Reason.NO_CANDIDATES


def test_a_shadow_rule_records_everything_an_enforcing_one_does(tmp_path: Path) -> None:
    text = LADDER.format(steps="      - notify: oncall\n      - kill: {}")
    enforce = drive(make_engine(tmp_path, text), series([99, 99, 80]))
    shadow_text = text.replace("    steps:", "    mode: shadow\n    steps:")
    shadow_engine = make_engine(tmp_path, shadow_text)
    shadow = drive(shadow_engine, series([99, 99, 80]))
    assert shadow == enforce
    tick = make_engine(tmp_path, shadow_text).step(snap(gpu(0, 99), procs=[proc(3)]), T0)
    assert [i.shadow for i in tick.intents] == [True, True]


# -- history functions in `when` ---------------------------------------------------------------


def test_avg_over_a_window(tmp_path: Path) -> None:
    engine = make_engine(
        tmp_path,
        MEM_RULE.replace("gpu.memory.used_pct >= 95", "avg(gpu.memory.used_pct, 30s) >= 95").format(
            extra=""
        ),
    )
    # avg over [now-30s, now]: 80, 90, 93.3, 95, 100, 95, 90
    records = drive(engine, series([80, 100, 100, 100, 100, 80, 80]))
    assert records == [
        ("pending", G, 30, "condition_met"),
        ("firing", G, 30, "for_elapsed"),
        ("resolved", G, 60, "resolved"),
    ]


def test_predict_fires_once_the_line_reaches_the_threshold(tmp_path: Path) -> None:
    text = MEM_RULE.replace(
        "gpu.memory.used_pct >= 95", "predict(gpu.memory.used_pct, 10m) >= 99.5"
    ).format(extra="")
    engine = make_engine(tmp_path, text)
    # One percent more every minute from 50 %: predicted 10 minutes ahead is 60 + t/60.
    records = drive(engine, series([50 + n for n in range(45)], every=60.0))
    assert records[:2] == [
        ("pending", G, 2400, "condition_met"),
        ("firing", G, 2400, "for_elapsed"),
    ]


def test_held_for_restarts_after_a_break(tmp_path: Path) -> None:
    text = """
    rules:
      - name: idle
        when: held_for(gpu.utilization_pct == 0) >= 60
    """
    engine = make_engine(tmp_path, text)
    utilization = [0, 0, 50, 0, 0, 0, 0, 0]  # every 20 s; the break at 40 s
    frames = [(n * 20.0, snap(gpu(0, utilization_pct=u))) for n, u in enumerate(utilization)]
    assert drive(engine, frames) == [
        ("pending", G, 120, "condition_met"),
        ("firing", G, 120, "for_elapsed"),
    ]


def test_a_process_rule_reads_its_gpus_history(tmp_path: Path) -> None:
    text = """
    rules:
      - name: hog
        for_each: process
        when: avg(gpu.memory.used_pct, 20s) >= 95 and process.gpu_memory_mib > 5000
    """
    engine = make_engine(tmp_path, text)
    small, big = proc(10, mib=1000), proc(11, mib=9000)
    frames = [
        (n * 10.0, snap(gpu(0, v), gpu(1, 99), procs=[small, big, proc(12, gpu=1, mib=100)]))
        for n, v in enumerate([90, 99, 99, 99])
    ]
    assert [r[:3] for r in drive(engine, frames)] == [
        ("pending", "pid 11 on GPU 0", 20),
        ("firing", "pid 11 on GPU 0", 20),
    ]


def test_incidents_opened_within_one_second_have_distinct_ids(tmp_path: Path) -> None:
    engine = make_engine(
        tmp_path,
        LADDER.format(steps="      - exec: [/bin/true]").replace("cooldown: 1h", "cooldown: 0s"),
    )
    fired: list[str] = []
    intent_ids: list[str] = []
    for t, pct in [(0.0, 99), (0.25, 50), (0.5, 99), (0.75, 50), (1.0, 99)]:
        tick = engine.step(snap(gpu(0, pct)), T0 + t)
        fired += [c.incident or "" for c in tick.changes if c.kind == "firing"]
        intent_ids += [i.id for i in tick.intents]
    assert len(fired) == 3
    assert len(set(fired)) == 3
    assert len(set(intent_ids)) == 3
    assert [i.id for i in engine.incidents] == [fired[-1]]


def test_pause_on_ack_holds_the_ladder_but_not_resolution(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "rules:\n"
        "  - name: paused\n"
        "    for_each: gpu\n"
        "    when: gpu.memory.used_pct >= 95\n"
        "    pause_on_ack: true\n"
        "    steps:\n"
        "      - notify: oncall\n"
        "      - {after: 1m, notify: oncall}\n"
    )
    cfg = Config.model_validate({"notify": {"targets": {"oncall": {"urls": ["json://x"]}}}})
    engine = Engine(load([tmp_path / "p.yaml"], cfg), cfg)
    first = engine.step(snap(gpu(0, 96)), T0)
    (incident,) = engine.incidents
    assert [i.step for i in first.intents] == [0]
    engine.ack(incident.id)
    held = engine.step(snap(gpu(0, 96)), T0 + 120)
    assert held.intents == ()
    assert [(c.kind, c.reason) for c in held.changes] == [(Transition.WAITING, Reason.ACKNOWLEDGED)]
    done = engine.step(snap(gpu(0, 50)), T0 + 130)
    assert [c.kind for c in done.changes] == [Transition.RESOLVED]


def test_a_reload_keeps_incidents_of_rules_that_remain(tmp_path: Path) -> None:
    rules = (
        "rules:\n"
        "  - {name: kept, for_each: gpu, when: gpu.memory.used_pct >= 90}\n"
        "  - {name: dropped, for_each: gpu, when: gpu.memory.used_pct >= 90}\n"
    )
    (tmp_path / "a.yaml").write_text(rules)
    cfg = Config()
    engine = Engine(load([tmp_path / "a.yaml"], cfg), cfg)
    engine.step(snap(gpu(0, 96)), T0)
    before = {i.rule: i.id for i in engine.incidents}
    assert set(before) == {"kept", "dropped"}
    (tmp_path / "a.yaml").write_text(
        "rules:\n  - {name: kept, for_each: gpu, when: gpu.memory.used_pct >= 92}\n"
    )
    closed = engine.replace(load([tmp_path / "a.yaml"], cfg), cfg, T0 + 1)
    assert [(c.rule, c.kind, c.reason, c.incident) for c in closed] == [
        ("dropped", Transition.RESOLVED, Reason.RULE_REMOVED, before["dropped"])
    ]
    assert [(i.rule, i.id) for i in engine.incidents] == [("kept", before["kept"])]
    tick = engine.step(snap(gpu(0, 96)), T0 + 2)
    assert tick.changes == ()  # still firing: not opened again
    resolved = engine.step(snap(gpu(0, 91)), T0 + 3)  # below the new threshold
    assert [(c.rule, c.kind) for c in resolved.changes] == [("kept", Transition.RESOLVED)]
