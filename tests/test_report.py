"""Reports (``gpuwarden report``, ``drill --html``) read back as documents: what the SVG draws
is checked against the data it was drawn from (thresholds at the right height, one marker per
journal step, bands where the incident was), hostile command lines arrive as text, and nothing
in a page can run or fetch anything."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuwarden.errors import ExitCode
from gpuwarden.journal.journal import Journal
from gpuwarden.journal.schema import MIGRATIONS
from gpuwarden.model import Intent, Outcome, Reason, RuleChange, Target, TargetResult, Transition
from gpuwarden.playbook.thresholds import thresholds
from gpuwarden.report import page
from gpuwarden.report.model import (
    IncidentView,
    NoticeView,
    Report,
    RuleView,
    StepView,
    TargetView,
)
from gpuwarden.report.series import METRICS
from tests.conftest import DrillReport, RunReport, drill_report
from tests.golden_pairs import PAIRS
from tests.report_dom import Node, expected_y, parse

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(2)>'
MIB = 1024 * 1024


def gpuwarden(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# -- what every page must be ------------------------------------------------------------------


def self_contained(doc: Node, text: str) -> None:
    """No script, no event handler, nothing that points outside the page."""
    assert not doc.find("script")
    assert not doc.find("iframe")
    assert not doc.find("img")
    assert not doc.find("object")
    for node in doc.walk():
        for name, value in node.attrs.items():
            assert not name.startswith("on"), (node.tag, name)
            if name in ("href", "src", "xlink:href", "action"):
                assert value.startswith("#"), (node.tag, name, value)
            for ref in re.findall(r"url\(([^)]*)\)", value):
                assert ref.startswith("#"), (node.tag, name, value)
    (policy,) = [m for m in doc.find("meta") if m.attrs.get("http-equiv")]
    assert "default-src 'none'" in policy.attrs["content"]
    assert "script-src" not in policy.attrs["content"]
    assert "@import" not in text


def thresholds_in_place(doc: Node) -> list[tuple[str, str, float]]:
    """Every threshold line at the height its panel gives its value; (field, role, value)."""
    found = []
    for panel in doc.find("g", "panel"):
        for group in panel.find("g", "threshold"):
            value = float(group.attrs["data-value"])
            (line,) = group.find("line")
            assert float(line.attrs["y1"]) == float(line.attrs["y2"])
            assert float(line.attrs["y1"]) == pytest.approx(expected_y(panel, value), abs=0.06)
            low, high = float(panel.attrs["data-min"]), float(panel.attrs["data-max"])
            assert low <= value <= high
            role = ({"when", "until"} & group.classes).pop()
            found.append((panel.attrs["data-field"], role, value))
    return found


def drawn_lines(rule: RuleView) -> set[tuple[str, str, float]]:
    lines = [("when", t) for t in thresholds(rule.when)]
    lines += [("until", t) for t in thresholds(rule.until)]
    return {(t.field, role, t.value) for role, t in lines if t.field in METRICS}


# -- every shipped drill ----------------------------------------------------------------------


@pytest.mark.parametrize("playbook", sorted(PAIRS))
def test_every_shipped_drill_draws_its_rule_and_one_marker_per_step(
    drill_reports: dict[str, DrillReport], playbook: str
) -> None:
    report = drill_reports[playbook]
    doc = parse(report.page)
    self_contained(doc, report.page)
    assert len(report.page.encode()) < MIB
    steps = [r for r in report.records if r["kind"] == "step"]
    markers = doc.find("g", "marker")
    assert len(markers) == len(steps) > 0
    assert sorted(int(m.attrs["data-step"]) for m in markers) == list(range(1, len(steps) + 1))
    start = float(doc.find("svg", "chart")[0].attrs["data-start"])
    assert sorted(float(m.attrs["data-time"]) - start for m in markers) == pytest.approx(
        sorted(float(s["t"]) for s in steps), abs=0.01
    )
    rows = doc.find("tr", "step")
    assert len(rows) == len(steps)
    for panel in doc.find("g", "panel"):
        assert panel.attrs["data-field"] in {*METRICS, "memory"}
    drawn = set(thresholds_in_place(doc))
    from gpuwarden import config
    from gpuwarden.playbook import loader

    cfg = config.load(ROOT / "config" / "gpuwarden.yaml")
    rules = loader.load([ROOT / "playbooks" / f"{playbook}.yaml"], cfg).rules
    fired = {r["rule"] for r in report.records if r["kind"] in ("pending", "firing")}
    expected: set[tuple[str, str, float]] = set()
    for rule in rules:
        if rule.name in fired:
            until = None if rule.until is None else rule.until.text
            expected |= drawn_lines(RuleView(rule.name, rule.when.text, until))
    assert drawn == expected


def test_the_memory_pressure_drill_draws_thresholds_bands_and_whose_memory_went(
    drill_reports: dict[str, DrillReport],
) -> None:
    report = drill_reports["memory-pressure"]
    doc = parse(report.page)
    (chart,) = doc.find("svg", "chart")
    (panel,) = [p for p in doc.find("g", "panel") if p.attrs["data-field"] == "gpu.memory.used_pct"]
    lines = {
        (group.attrs["data-value"], ({"when", "until"} & group.classes).pop()): group
        for group in panel.find("g", "threshold")
    }
    assert set(lines) == {("95", "when"), ("85", "until")}
    y95 = float(lines["95", "when"].find("line")[0].attrs["y1"])
    y85 = float(lines["85", "until"].find("line")[0].attrs["y1"])
    assert y95 < y85  # higher values are drawn higher up
    assert (
        lines["95", "when"].find("line")[0].attrs["stroke-dasharray"]
        != (lines["85", "until"].find("line")[0].attrs["stroke-dasharray"])
    )
    assert "gpu.memory.used_pct >= 95" in lines["95", "when"].all_text()
    # the bands sit where the drill says the rule was pending and firing
    start, end = float(chart.attrs["data-start"]), float(chart.attrs["data-end"])
    left, width = float(chart.attrs["data-left"]), float(chart.attrs["data-width"])
    origin = start

    def x(t: float) -> float:
        return left + (origin + t - start) / (end - start) * width

    times = {r["kind"]: float(r["t"]) for r in report.records if r["kind"] != "step"}
    (pending,) = panel.find("rect", "pending")
    (firing,) = panel.find("rect", "firing")
    assert float(pending.attrs["x"]) == pytest.approx(x(times["pending"]), abs=0.06)
    assert float(firing.attrs["x"]) == pytest.approx(x(times["firing"]), abs=0.06)
    right = float(firing.attrs["x"]) + float(firing.attrs["width"])
    assert right == pytest.approx(x(times["resolved"]), abs=0.1)
    # the killed sweep's memory is a band of its own, named in the legend
    (kill,) = [r for r in report.records if r["kind"] == "step" and r["step"] == "kill"]
    (victim,) = kill["targets"]
    bands = [p for p in doc.find("path", "proc") if p.attrs["data-pid"] == str(victim["pid"])]
    assert len(bands) == 1
    assert "sweep.py --trial 17" in bands[0].all_text()
    # the kill's marker says whom it hit and what the GPU read then
    (marker,) = [m for m in doc.find("g", "marker") if m.attrs["data-kind"] == "kill"]
    title = marker.find("title")[0].all_text()
    assert f"target pid {victim['pid']} bob/low, 28,900 MiB" in title
    assert "memory used" in title
    assert "of 81,920 MiB in use" in title
    # why not: the trainer was a candidate the kill left out
    (row,) = [r for r in doc.find("tr", "step") if "kill" in r.all_text()]
    assert "why not" in row.all_text()
    assert "not selected" in row.all_text()
    # the messages the drill composed, not sent
    notices = doc.find("table", "notices")[0].all_text()
    assert "[DRILL] [CRITICAL] GPU memory pressure" in notices
    assert "not delivered (drill)" in notices


def test_a_drill_of_a_day_stays_under_one_mebibyte(tmp_path: Path) -> None:
    """24 hours of two GPUs with a dozen incidents: the curves are thinned for drawing (at
    most two points per pixel column, whatever the tick), so the page stays small. A 10 s
    tick keeps the test quick and still gives ten times more readings than columns; the
    8-GPU day at 1 Hz is measured in docs/performance.md."""
    scenario = tmp_path / "day.yaml"
    scenario.write_text(yaml.safe_dump(day_scenario()), encoding="utf-8")
    report = drill_report("memory-pressure", scenario, tmp_path / "day.html", "--tick", "10s")
    size = len(report.page.encode())
    assert size < MIB, size
    doc = parse(report.page)
    steps = [r for r in report.records if r["kind"] == "step"]
    fired = [r for r in report.records if r["kind"] == "firing"]
    assert len(fired) >= 10
    assert len(doc.find("g", "marker")) == len(steps)
    (curve,) = doc.find("path", "metric")
    points = curve.attrs["d"].count("L") + curve.attrs["d"].count("M")
    assert points <= 2 * 864 + 2  # at most two points per pixel column
    assert {v for _, _, v in thresholds_in_place(doc)} == {95.0, 85.0}


def day_scenario() -> dict[str, object]:
    """A day on a two-GPU node: GPU 0 fills up every two hours as a new low-priority sweep
    grows next to a training run; the temperature drifts with the hour."""
    jobs: list[dict[str, object]] = [
        {"id": "trainer", "cmdline": "python train.py", "user": "alice",
         "env": {"GPUWARDEN_PRIORITY": "high", "GPUWARDEN_CHECKPOINT_SIGNAL": "SIGUSR1"}},
        {"id": "serve", "cmdline": "python serve.py", "user": "svc",
         "env": {"GPUWARDEN_PRIORITY": "normal"}},
    ]  # fmt: skip
    timeline: list[dict[str, object]] = [
        {"at": 0, "gpus": {0: {"temperature_c": 60, "power_w": 300, "other_mib": 600,
                               "jobs": {"trainer": 52000}},
                           1: {"temperature_c": 55, "jobs": {"serve": 30000}}}},
    ]  # fmt: skip
    for k in range(12):
        sweep = f"sweep-{k}"
        jobs.append(
            {"id": sweep, "cmdline": f"python sweep.py --trial {k}", "user": "bob",
             "env": {"GPUWARDEN_PRIORITY": "low"}}
        )  # fmt: skip
        at = k * 7200
        timeline += [
            {"at": at + 600, "gpus": {0: {"jobs": {"trainer": 52000}}}},
            {"at": at + 1200, "ramp": True,
             "gpus": {0: {"temperature_c": 60 + k, "jobs": {"trainer": 52000, sweep: 28900}}}},
            {"at": at + 4800, "ramp": True, "gpus": {0: {"temperature_c": 58, "power_w": 280}}},
        ]  # fmt: skip
    timeline.append({"at": 86400, "end": True})
    return {
        "version": 1,
        "name": "day-of-squeezes",
        "host": "gpu-node-09",
        "start": "2026-03-16T00:00:00Z",
        "gpus": [
            {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920},
            {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920},
        ],
        "jobs": jobs,
        "timeline": timeline,
    }


# -- a real incident ----------------------------------------------------------------------------


def test_a_real_incident_has_one_marker_per_journal_step(run_report: RunReport) -> None:
    doc = parse(run_report.page)
    self_contained(doc, run_report.page)
    with Journal.open_readonly(run_report.state / "journal.db") as journal:
        (incident,) = journal.incidents()
        timeline = journal.timeline(incident.id)
        samples, _ = journal.samples(0, 2e9)
    steps = [row for row in timeline if row.kind == "step"]
    assert [s.data["step_kind"] for s in steps] == ["notify", "checkpoint", "kill"]
    markers = doc.find("g", "marker")
    assert len(markers) == len(steps)
    assert sorted(float(m.attrs["data-time"]) for m in markers) == pytest.approx(
        sorted(s.time for s in steps), abs=0.001
    )
    assert [m.attrs["data-kind"] for m in markers] == ["notify", "checkpoint", "kill"]
    assert set(thresholds_in_place(doc)) == {
        ("gpu.memory.used_pct", "when", 95.0),
        ("gpu.memory.used_pct", "until", 85.0),
    }
    # readings from before it went pending until after it resolved
    assert incident.pending_at is not None
    assert incident.resolved_at is not None
    assert samples[0].time < incident.pending_at
    assert samples[-1].time > incident.resolved_at
    (chart,) = doc.find("svg", "chart")
    assert float(chart.attrs["data-start"]) <= samples[0].time + 0.001
    # the checkpoint was acknowledged and the kill waited for it: both have a bar to the end
    (checkpoint,) = [m for m in markers if m.attrs["data-kind"] == "checkpoint"]
    assert "acknowledged" in checkpoint.find("title")[0].all_text()
    # the notification went out, and the page says so
    assert run_report.received, "the receiver got nothing"
    notices = doc.find("table", "notices")[0].all_text()
    assert "GPU memory pressure on demo-node: GPU 0" in notices
    assert "sent" in notices


def test_a_hostile_command_line_arrives_as_text(run_report: RunReport) -> None:
    text = run_report.page
    assert SCRIPT not in text
    assert "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in text
    doc = parse(text)
    assert not doc.find("script")
    assert not doc.find("img")
    # the kill's target, the legend and the marker title all carry it, as text
    with Journal.open_readonly(run_report.state / "journal.db") as journal:
        (incident,) = journal.incidents()
        timeline = journal.timeline(incident.id)
        (kill,) = [r for r in timeline if r.kind == "step" and r.data["step_kind"] == "kill"]
    (victim,) = kill.data["targets"]
    assert SCRIPT in victim["command"]
    (row,) = [r for r in doc.find("tr", "step") if "kill" in r.all_text()]
    assert SCRIPT in row.all_text()
    assert IMG in row.all_text()
    legend = " ".join(g.all_text() for g in doc.find("g", "legend"))
    assert SCRIPT in legend
    (band,) = [p for p in doc.find("path", "proc") if p.attrs["data-pid"] == str(victim["pid"])]
    assert IMG in band.all_text()


def test_report_of_an_unknown_incident_or_an_unwritable_file(
    run_report: RunReport, tmp_path: Path
) -> None:
    state = str(run_report.state)
    missing = gpuwarden("report", "nope", "--state-dir", state, "--out", tmp_path / "x.html")
    assert missing.returncode == ExitCode.BAD_INPUT
    assert "no incident 'nope'" in missing.stderr
    assert "Traceback" not in missing.stderr
    blocked = gpuwarden("report", "last", "--state-dir", state, "--out", tmp_path / "no" / "x.html")
    assert blocked.returncode == ExitCode.BAD_INPUT
    assert "cannot write the report" in blocked.stderr
    assert "hint:" in blocked.stderr
    assert not (tmp_path / "no").exists()
    none = gpuwarden("report", "last", "--state-dir", tmp_path / "empty")
    assert none.returncode != 0
    assert "no journal at" in none.stderr
    to_stdout = gpuwarden("report", "last", "--state-dir", state, "--out", "-")
    assert to_stdout.returncode == 0
    assert to_stdout.stdout.startswith("<!DOCTYPE html>")
    assert "report:" not in to_stdout.stdout


def test_a_drill_page_goes_to_a_file() -> None:
    refused = gpuwarden(
        "drill", "scenarios/memory-pressure-low-priority.yaml", "--config", "config/demo.yaml",
        "--playbooks", "playbooks/memory-pressure.yaml", "--html", "-",
    )  # fmt: skip
    assert refused.returncode == ExitCode.BAD_INPUT
    assert "--html needs a file name" in refused.stderr
    assert refused.stdout == ""


def test_an_incident_from_before_reports_still_gets_a_page(tmp_path: Path) -> None:
    """A journal written before readings were kept (schema 3), migrated: no curve, the rule
    from the playbooks as they are now, and the page says so."""
    state = tmp_path / "state"
    path = state / "journal.db"
    target = Target(4242, 1.0, 0, "bob", "low", 28900, command="python sweep.py")
    with Journal(path, migrations=MIGRATIONS[:3]) as old:
        t = 1_773_457_200.0
        incident = "20260314T030000Z-gpu-memory-pressure-gpu:0"
        firing = RuleChange(
            Transition.FIRING, "gpu-memory-pressure", "gpu:0", t, Reason.FOR_ELAPSED, incident,
            where="GPU 0",
        )  # fmt: skip
        kill = Intent(
            f"{incident}/2", incident, "gpu-memory-pressure", "gpu:0", 2, "kill", "kill",
            t + 120, Reason.STEP_DUE, "critical", targets=(target,), gpu=0, where="GPU 0",
        )  # fmt: skip
        old.record_all([firing, kill], t)
        result = TargetResult(4242, 1.0, True, "terminated", "exited on SIGTERM")
        old.finish(kill.id, Outcome(ok=True, targets=(result,)), t + 121)
        resolved = RuleChange(
            Transition.RESOLVED, "gpu-memory-pressure", "gpu:0", t + 125, Reason.UNTIL_MET,
            incident, where="GPU 0",
        )  # fmt: skip
        old.record(resolved, t + 125)
    Journal(path).close()  # the daemon starts once: schema 4
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    out = tmp_path / "old.html"
    made = gpuwarden(
        "report", "last", "--state-dir", state, "--out", out, "--config", "config/demo.yaml",
        "--playbooks", "playbooks/memory-pressure.yaml",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    doc = parse(out.read_text(encoding="utf-8"))
    remarks = doc.find("div", "remarks")[0].all_text()
    assert "No GPU readings were kept" in remarks
    assert "thresholds drawn are those of the rule as the playbooks define it now" in remarks
    assert len(doc.find("g", "marker")) == 1
    assert {v for _, _, v in thresholds_in_place(doc)} == {95.0, 85.0}
    assert doc.find("text", "nodata")


def test_every_string_is_escaped_wherever_it_lands() -> None:
    """Hostile text in every field a person or a process controls: user names, command lines,
    details, messages, the scope's label."""
    evil = f"{SCRIPT}{IMG}\u202e&amp;"
    target = TargetView(7, evil, "low", 100, evil, 0, evil)
    step = StepView(
        1, "i", "r", 0, 0, "kill", evil, 10.0, evil, (target,), ((target, evil),),
        "failed", 12.0, evil, what=evil,
    )  # fmt: skip
    report = Report(
        kind="incident", title=evil, subtitle=evil, host=evil, start=0.0, end=60.0, origin=0.0,
        incidents=[IncidentView("i", "r", "gpu:0", evil, 0, evil, 1.0, 5.0, 40.0, evil)],
        rules={"r": RuleView("r", "gpu.memory.used_pct >= 95", None, 0.0, evil)},
        steps=[step], remarks=[evil],
        notices=[NoticeView(3.0, evil, evil, evil, evil, evil, evil, 1, evil)],
    )  # fmt: skip
    text = page.render(report)
    assert SCRIPT not in text
    assert "<img" not in text
    assert "\u202e" not in text
    doc = parse(text)
    assert not doc.find("script")
    assert not doc.find("img")
    self_contained(doc, text)
    assert text.count("&lt;script&gt;") >= 10
    assert "&amp;amp;" in text  # an entity in the input is text, not markup


def test_every_step_kind_has_its_own_marker_shape() -> None:
    """Read in black and white, a marker's shape is what tells the kinds apart."""
    from gpuwarden.playbook.schema import STEP_KINDS
    from gpuwarden.report.svg import SHAPE_NAMES, shape

    shapes = {kind: shape(kind, 50.0, 20.0) for kind in STEP_KINDS}
    assert len(set(shapes.values())) == len(STEP_KINDS)
    assert set(SHAPE_NAMES) == set(STEP_KINDS)
    assert len(set(SHAPE_NAMES.values())) == len(STEP_KINDS)
    for kind, drawn in shapes.items():
        (node,) = parse(drawn).children
        assert node.tag in ("circle", "polygon", "rect", "path"), kind
