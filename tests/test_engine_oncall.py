"""The engine's side of the on-call commands, on a fake clock: holds and silences given as
data, an abort, and the preview of each open incident's next step (which changes nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwarden.engine.engine import Engine
from gpuwarden.model import Silence, Snapshot
from tests.test_engine import OK, T0, brief, gpu, make_engine, proc, snap

LADDER = """
rules:
  - name: mem
    when: gpu.memory.used_pct >= 95
    steps:
      - notify: oncall
      - after: 1m
        suspend: {select: process.priority <= low}
      - after: 2m
        kill: {select: process.priority <= low}
"""

G = "GPU 0"


def full(*, pct: float = 98.0, index: int = 0) -> Snapshot:
    procs = [
        proc(10, gpu=index, mib=60_000, priority="high"),
        proc(11, gpu=index, mib=30_000, priority="low", user="bob"),
    ]
    return snap(gpu(index, pct), procs=procs)


def run(engine: Engine, t: float, pct: float = 98.0) -> list[tuple[Any, ...]]:
    """One tick at ``T0 + t``; every step it starts finishes at once."""
    tick = engine.step(full(pct=pct), T0 + t)
    for intent in tick.intents:
        engine.complete(intent.id, OK)
    return [brief(r) for r in tick.records]


def test_a_hold_keeps_due_steps_waiting_once_and_release_runs_them(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, LADDER)
    assert run(engine, 0)[-1] == ("step", "notify", 0, ())
    (incident,) = engine.incidents
    engine.hold(incident.id, note="by carol until released")
    assert run(engine, 70) == [("waiting", G, 70, "held")]
    assert run(engine, 80) == []  # noted once
    engine.release(incident.id)
    assert run(engine, 90) == [("step", "suspend", 90, (11,))]


def test_a_hold_with_an_end_ends_by_itself(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, LADDER)
    run(engine, 0)
    (incident,) = engine.incidents
    engine.hold(incident.id, until=T0 + 100)
    assert run(engine, 70) == [("waiting", G, 70, "held")]
    assert run(engine, 100) == [("step", "suspend", 100, (11,))]


def test_a_silence_records_steps_as_shadow_steps_and_matches_rule_and_gpu(
    tmp_path: Path,
) -> None:
    engine = make_engine(tmp_path, LADDER)
    other_gpu = Silence(1, T0, T0 + 3600, rule="mem", gpu=1, by="erin")
    engine.silence([other_gpu])
    tick = engine.step(full(), T0)
    assert [i.silenced for i in tick.intents] == [""]  # GPU 0: not silenced
    engine = make_engine(tmp_path, LADDER)
    this_gpu = Silence(2, T0, T0 + 90, rule="mem", gpu=0, by="erin", reason="reseat")
    engine.silence([this_gpu])
    tick = engine.step(full(), T0)
    (firing,) = [c for c in tick.changes if c.kind == "firing"]
    assert firing.detail.startswith("silenced: #2 (rule mem on GPU 0) by erin until ")
    (notify,) = tick.intents
    assert notify.shadow
    assert notify.silenced.endswith(": reseat")
    engine.complete(notify.id, OK)
    (suspend,) = engine.step(full(), T0 + 60).intents
    assert suspend.shadow  # still silenced: recorded with its target, not acted on
    assert [t.pid for t in suspend.targets] == [11]
    engine.complete(suspend.id, OK)
    (kill,) = engine.step(full(), T0 + 120).intents  # the silence ended at +1:30
    assert not kill.shadow
    assert kill.silenced == ""
    assert [t.pid for t in kill.targets] == [11]  # a silenced kill chose no one for good


def test_abort_resolves_and_stands_down_until_the_condition_clears(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, LADDER)
    run(engine, 0)
    (incident,) = engine.incidents
    change = engine.abort(incident.id, T0 + 30, "by dave: false alarm")
    assert change is not None
    assert brief(change) == ("resolved", G, 30, "aborted")
    assert change.detail == "by dave: false alarm"
    assert engine.incidents == []
    assert engine.abort(incident.id, T0 + 31) is None
    assert run(engine, 400) == []  # still full: no new incident
    assert run(engine, 410, pct=50) == []  # cleared: re-armed
    assert run(engine, 420)[:2] == [
        ("pending", G, 420, "condition_met"),
        ("firing", G, 420, "for_elapsed"),
    ]


def test_an_abort_stands_down_until_cleared_even_while_cooling_down(tmp_path: Path) -> None:
    """Cleared once during the cooldown the abort started, the scope is re-armed: holding
    again before the cooldown ends it is cooling down (not standing down), then fires."""
    engine = make_engine(tmp_path, LADDER.replace("    steps:", "    cooldown: 5m\n    steps:", 1))
    run(engine, 0)
    (incident,) = engine.incidents
    engine.abort(incident.id, T0 + 30, "by dave")
    assert run(engine, 40) == []  # still full: standing down
    assert run(engine, 50, pct=50) == []  # cleared: re-armed, still cooling down
    assert run(engine, 60) == [("cooldown", G, 60, "cooldown")]
    assert run(engine, 400)[:2] == [
        ("pending", G, 400, "condition_met"),
        ("firing", G, 400, "for_elapsed"),
    ]


def test_preview_says_what_comes_next_without_changing_anything(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, LADDER)
    run(engine, 0)
    (first,) = engine.next_steps(T0 + 10)
    assert (first.step, first.kind, first.due, first.state) == (1, "suspend", T0 + 60, "scheduled")
    assert [t.pid for t in first.targets] == [11]
    assert engine.next_steps(T0 + 10) == [first]  # asked twice, the same
    tick = engine.step(full(), T0 + 60)
    (suspend,) = tick.intents
    assert [t.pid for t in suspend.targets] == [11]  # preview did not use the target up
    (running,) = engine.next_steps(T0 + 61)
    assert (running.kind, running.state, running.detail) == (
        "kill",
        "after_previous",
        "step 1 is still running",
    )
    engine.complete(suspend.id, OK)
    (incident,) = engine.incidents
    engine.hold(incident.id, note="by carol until released")
    (held,) = engine.next_steps(T0 + 62)
    assert (held.state, held.detail) == ("held", "by carol until released")
    engine.release(incident.id)
    engine.silence([Silence(1, T0, T0 + 600, host=True)])
    (quiet,) = engine.next_steps(T0 + 62)
    assert quiet.state == "silenced"
    assert quiet.detail.startswith("#1 (host)")
