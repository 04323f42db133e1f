"""``incidents`` and ``incident ID`` views: a real engine run recorded in a real journal reads
back as the timeline an on-call person needs, as text and as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuwarden import config
from gpuwarden.engine.engine import Engine
from gpuwarden.journal.journal import IncidentRow, Journal
from gpuwarden.journal.view import (
    from_firing,
    incidents_json,
    render_incidents,
    render_timeline,
    timeline_json,
)
from gpuwarden.model import (
    Intent,
    Outcome,
    Reason,
    RuleChange,
    Skipped,
    Target,
    TargetResult,
    Transition,
    Undo,
)
from gpuwarden.playbook import loader
from gpuwarden.sources.scenario import ScenarioSource

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _outcome(intent: Intent) -> Outcome:
    """What the executors would report, without touching anything."""
    state = {"kill": "killed", "checkpoint": "acknowledged"}.get(intent.kind, "done")
    results = tuple(
        TargetResult(t.pid, t.create_time, True, state, "exited after SIGTERM")
        for t in intent.targets
    )
    undo = tuple(Undo("resume", t.pid, t.create_time) for t in intent.targets)
    return Outcome(
        ok=True,
        detail=f"{intent.kind}: {len(results)} target(s)",
        targets=results,
        undo=undo if intent.kind == "checkpoint" else (),
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The memory-pressure playbook over its scenario, every record in a journal."""
    path = tmp_path_factory.mktemp("state") / "journal.db"
    cfg = config.load(ROOT / "config" / "gpuwarden.yaml")
    playbooks = loader.load([ROOT / "playbooks" / "memory-pressure.yaml"], cfg)
    scenario = ROOT / "scenarios" / "memory-pressure-low-priority.yaml"
    with (
        Journal(path) as journal,
        ScenarioSource.open(scenario, priorities=cfg.priorities, spawn=False) as source,
    ):
        engine = Engine(playbooks, cfg)
        n = 0
        while n * 2.0 <= source.duration:
            now = source.start_time + n * 2.0
            tick = engine.step(source.snapshot(now), now)
            written = journal.record_all(tick.records, now, engine.incidents)
            for intent in (r for r in written if isinstance(r, Intent)):
                outcome = _outcome(intent)
                if intent.kind == "kill":
                    for t in intent.targets:
                        source.vanish(t.pid)
                journal.finish(intent.id, outcome, now + 1)
                engine.complete(intent.id, outcome)
            n += 1
        [incident] = journal.incidents()
        for undo in journal.pending_undos(incident.id):
            journal.undo_done(undo.id, (incident.resolved_at or now) + 5)
    return path


def test_the_recorded_ladder_reads_as_a_timeline(recorded: Path) -> None:
    with Journal.open_readonly(recorded) as journal:
        [incident] = journal.incidents()
        text = render_timeline(incident, journal.timeline(incident.id))
    lines = text.splitlines()
    assert lines[0] == f"incident {incident.id}"
    assert "  rule      gpu-memory-pressure (critical) on GPU 0" in lines
    assert "after 2m02s: until met" in text
    events = [line for line in lines if line[:4] == "2026"]
    # the golden drill: pending at 1:34, firing 30 s later, notify + checkpoint, kill at +2:00
    assert [e[22:] for e in events] == [
        " -0:30  PENDING   condition met (gpu.memory.used_pct = 95.02)",
        " +0:00  FIRING    for elapsed (gpu.memory.used_pct = 99.49)",
        " +0:00  STEP 0: notify (step due) → oncall",
        " +0:00  STEP 1: checkpoint (step due)",
        " +0:01  DONE 0: notify: notify: 0 target(s)",
        " +0:01  DONE 1: checkpoint: checkpoint: 1 target(s)",
        " +0:01  UNDO      resume pid 4195304 when the incident ends",
        " +2:00  STEP 2: kill (step due)",
        " +2:01  DONE 2: kill: kill: 1 target(s)",
        " +2:02  RESOLVED  until met (gpu.memory.used_pct = 64.21)",
        " +2:07  UNDONE    resume pid 4195304: done",
    ]
    assert any(
        "target  pid 4195305 bob/low, 28900 MiB, GPU 0: python sweep.py --trial 17" in line
        for line in lines
    )
    assert any("skip    pid 4195305 bob/low" in line and "not selected" in line for line in lines)
    assert any("pid 4195305  killed — exited after SIGTERM" in line for line in lines)
    assert lines[-2:] == ["undo", "  #1 resume pid 4195304: done 2026-03-14T03:02:11Z (done)"]


def test_the_recorded_ladder_as_json(recorded: Path) -> None:
    with Journal.open_readonly(recorded) as journal:
        [incident] = journal.incidents()
        doc = timeline_json(incident, journal.timeline(incident.id))
    assert json.loads(json.dumps(doc)) == doc
    assert doc["version"] == 1
    head = doc["incident"]
    assert head["pending_at"] == "2026-03-14T02:59:34Z"
    assert head["opened_at"] == "2026-03-14T03:00:04Z"
    assert head["resolved_at"] == "2026-03-14T03:02:06Z"
    assert (head["resolve_reason"], head["duration_s"], head["open"]) == ("until_met", 122.0, False)
    steps = doc["steps"]
    assert [(s["index"], s["kind"], s["status"], s["from_firing"]) for s in steps] == [
        (0, "notify", "done", "+0:00"),
        (1, "checkpoint", "done", "+0:00"),
        (2, "kill", "done", "+2:00"),
    ]
    assert steps[0]["params"]["targets"] == ["oncall"]
    kill = steps[2]
    assert [t["pid"] for t in kill["targets"]] == [4195305]
    assert kill["targets"][0]["priority"] == "low"
    assert [(s["target"]["pid"], s["reason"]) for s in kill["skipped"]] == [
        (4195304, "not_selected")
    ]
    assert kill["results"] == [
        {
            "pid": 4195305,
            "create_time": kill["targets"][0]["create_time"],
            "ok": True,
            "state": "killed",
            "detail": "exited after SIGTERM",
        }
    ]
    assert kill["outcome"]["ok"] is True
    assert [u["kind"] for u in doc["undos"]] == ["resume"]
    assert doc["undos"][0]["done"] is True
    kinds = [e["kind"] for e in doc["events"]]
    assert kinds[:2] == ["pending", "firing"]
    assert kinds[-2:] == ["resolved", "undone"]
    assert [e["from_firing_s"] for e in doc["events"]][:2] == [-30.0, 0.0]


def test_the_recorded_incident_in_the_list(recorded: Path) -> None:
    with Journal.open_readonly(recorded) as journal:
        rows = journal.incidents()
    table = render_incidents(rows, now=0.0).splitlines()
    assert table[0].split() == [
        "ID",
        "RULE",
        "WHERE",
        "SEVERITY",
        "FIRED",
        "DURATION",
        "STEPS",
        "RESOLVED",
    ]
    assert table[1].split() == [
        rows[0].id,
        "gpu-memory-pressure",
        "GPU",
        "0",
        "critical",
        "2026-03-14T03:00:04Z",
        "2m02s",
        "3",
        "until",
        "met",
    ]


# -- hand-made journals -------------------------------------------------------------------------


def _row(**kw: Any) -> IncidentRow:
    base: dict[str, Any] = {
        "id": "inc-1",
        "rule": "mem",
        "scope": "gpu:0",
        "label": "GPU 0",
        "severity": "critical",
        "shadow": False,
        "gpu": 0,
        "opened_at": T0,
    }
    base.update(kw)
    return IncidentRow(**base)


def test_the_list_shows_open_incidents_failures_and_shadow_mode() -> None:
    rows = [
        _row(resolved_at=T0 + 90, resolve_reason="resolved", steps=2, steps_failed=1),
        _row(id="inc-2", shadow=True, severity=None, opened_at=T0 + 100),
    ]
    lines = render_incidents(rows, now=T0 + 400).splitlines()
    assert "1m30s" in lines[1]
    assert "2 (1 failed)" in lines[1]
    assert lines[1].rstrip().endswith("resolved")
    assert "mem [shadow]" in lines[2]
    assert "open 5m" in lines[2]
    assert " ? " in lines[2]
    assert lines[2].rstrip().endswith("-")
    assert render_incidents([], now=T0) == "no incidents"


def test_incidents_json_shape() -> None:
    [doc] = incidents_json(
        [_row(pending_at=T0 - 30, acked_at=T0 + 5, acked_by="alice", ack_comment="on it")]
    )
    assert doc == {
        "id": "inc-1",
        "rule": "mem",
        "scope": "gpu:0",
        "where": "GPU 0",
        "severity": "critical",
        "shadow": False,
        "gpu": 0,
        "pending_at": "2025-12-31T23:59:30Z",
        "opened_at": "2026-01-01T00:00:00Z",
        "resolved_at": None,
        "resolve_reason": None,
        "acked_at": "2026-01-01T00:00:05Z",
        "acked_by": "alice",
        "ack_comment": "on it",
        "abort_at": None,
        "abort_by": None,
        "open": True,
        "duration_s": None,
        "steps": 0,
        "steps_failed": 0,
    }


@pytest.mark.parametrize(
    ("t", "expected"),
    [(T0 - 30, "-0:30"), (T0, "+0:00"), (T0 + 65.4, "+1:05"), (T0 + 3723, "+62:03")],
)
def test_from_firing(t: float, expected: str) -> None:
    assert from_firing(t, T0) == expected


def _intent(step: int, kind: str, t: float, **kw: Any) -> Intent:
    base: dict[str, Any] = {"label": kind, "severity": "critical"} | kw
    return Intent(
        f"inc-1/{step}", "inc-1", "mem", "gpu:0", step, kind, time=t, reason=Reason.STEP_DUE, **base
    )


EVIL = "python x.py\n\x1b[2J\x1b[31mroot\x07\x00 $(reboot) \u202eevil " + "B" * 10_000


def _evil_journal(path: Path) -> tuple[IncidentRow, Journal]:
    journal = Journal(path)
    evil = Target(4242, T0 - 10, 0, "mallory\n\x1b[0m", "low", 100, command=EVIL)
    journal.record_all(
        [
            RuleChange(Transition.FIRING, "mem", "gpu:0", T0, Reason.FOR_ELAPSED, "inc-1"),
            _intent(0, "kill", T0, targets=(evil,), skipped=(Skipped(evil, Reason.PROTECTED),)),
            _intent(1, "suspend", T0 + 60, shadow=True),
        ],
        T0,
    )
    result = TargetResult(4242, T0 - 10, False, "gone\x1b[5m", EVIL)
    journal.finish("inc-1/0", Outcome(ok=False, detail=EVIL, targets=(result,)), T0 + 5)
    row = journal.incident("inc-1")
    assert row is not None
    return row, journal


def test_hostile_strings_cannot_reach_the_terminal(tmp_path: Path) -> None:
    incident, journal = _evil_journal(tmp_path / "journal.db")
    text = render_timeline(incident, journal.timeline("inc-1"), now=T0 + 120)
    journal.close()
    for bad in ("\x1b", "\x07", "\x00", "\u202e", "\r"):
        assert bad not in text
    assert "B" * 200 not in text  # commands are cut for the terminal
    assert "?[2J?[31mroot" in text
    for line in text.splitlines():
        # every line is one of ours: a header, an event with its time, or an indented detail
        assert line == "" or line.startswith(("incident ", "  ", "2026-", " " * 22, "undo"))
    assert "FAILED 0: kill" in text
    assert "STEP 1: suspend (step due) [shadow: not acted on]" in text
    assert "resolved  no, still open (2m)" in text
    assert "  rule      mem (critical) on gpu:0" in text  # no label recorded: the scope


def test_hostile_strings_stay_whole_in_json(tmp_path: Path) -> None:
    incident, journal = _evil_journal(tmp_path / "journal.db")
    doc = timeline_json(incident, journal.timeline("inc-1"))
    journal.close()
    step = doc["steps"][0]
    assert step["targets"][0]["command"] == EVIL
    assert step["status"] == "failed"
    assert step["results"][0]["state"] == "gone\x1b[5m"
    assert "\x1b" not in json.dumps(doc)  # escaped by JSON, never raw
    assert doc["steps"][1]["shadow"] is True
    assert doc["steps"][1]["status"] == "planned"


def test_interrupted_and_refused_steps_and_undos_not_done(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    step = _intent(
        0, "suspend", T0, label="pause", targets=(Target(7, T0 - 1, 0, "bob", "low", 10),)
    )
    with Journal(path) as first:
        first.record(
            RuleChange(Transition.FIRING, "mem", "gpu:0", T0, Reason.FOR_ELAPSED, "inc-1"), T0
        )
        first.record(step, T0)
    with Journal(path) as second:
        [lost] = second.interrupted()
        second.mark_interrupted(lost.id, T0 + 30)
        second.record(step, T0 + 31)
        power = _intent(1, "power_cap", T0 + 40, label="cap", gpu=0)
        second.record(power, T0 + 40)
        undo = Undo("power_limit", gpu=0, value=300.0)
        second.finish(power.id, Outcome(ok=True, undo=(undo,)), T0 + 41)
        incident = second.incident("inc-1")
        assert incident is not None
        rows = second.timeline("inc-1")
    text = render_timeline(incident, rows)
    assert "INTERRUPTED 0: pause (the daemon stopped while it ran)" in text
    assert "REFUSED 0: pause (already interrupted: never run twice)" in text
    assert "UNDO      power limit GPU 0 to 300.0 when the incident ends" in text
    assert text.splitlines()[-1] == "  #1 power_limit GPU 0: NOT DONE"
    doc = timeline_json(incident, rows)
    assert [s["status"] for s in doc["steps"]] == ["interrupted", "done"]
    assert doc["undos"][0]["done"] is False
