"""The on-call night: `ack --by`, `hold`, `release`, `abort` and `silence` said to a running
loop over real stand-in jobs, and "what next" for an open incident.

The loop is the daemon's own (``Runtime``, its journal, its notifications and a real HTTP
receiver), ticked by hand on a simulated clock, so that "applied at the next tick" is exact:
each command is run as `gpuwarden` runs it, then one tick, then what the loop did is read
back from the journal and from the jobs themselves (their state in /proc, the signals they
received). tests/test_oncall_daemon.py does the same with a real `gpuwarden run` and a
non-root operator.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden import config as config_mod
from gpuwarden.cli.main import main
from gpuwarden.clock import SimClock
from gpuwarden.errors import ExitCode
from gpuwarden.journal.journal import Journal
from gpuwarden.journal.schema import Access
from gpuwarden.notify.service import Notifications
from gpuwarden.playbook import loader
from gpuwarden.runtime import Runtime
from gpuwarden.sources.procs import Attributor
from gpuwarden.sources.scenario import ScenarioSource
from tests.notify_receivers import JsonReceiver
from tests.signal_targets import session_spool

SCENARIO = """version: 1
name: squeeze
host: test-node
gpus:
  - {index: 0, name: NVIDIA A100-SXM4-80GB, memory_total_mib: 81920}
  - {index: 1, name: NVIDIA A100-SXM4-80GB, memory_total_mib: 81920}
jobs:
  - id: trainer
    user: alice
    cmdline: python train.py --resume
    env: {GPUWARDEN_PRIORITY: high}
    spawn: true
  - id: sweep
    user: bob
    cmdline: python sweep.py --trial 17
    env: {GPUWARDEN_PRIORITY: low}
    spawn: true
timeline:
  - at: 0s
    gpus:
      0: {utilization_pct: 97, jobs: {trainer: {memory_mib: 50000}, sweep: {memory_mib: 30000}}}
      1: {utilization_pct: 10, temperature_c: 91}
  - at: 2h
    end: true
"""

# Fires at the first tick and stays open: suspend at +1:00, kill at +2:00.
SQUEEZE = """rules:
  - name: squeeze
    for_each: gpu
    when: gpu.memory.used_pct >= 95
    until: gpu.memory.used_pct < 10
    severity: critical
    steps:
      - notify: oncall
      - after: 1m
        suspend: {select: process.priority <= low}
      - after: 2m
        kill: {select: process.priority <= low, grace: 1s, settle: 0s}
"""

# Another rule on another GPU, never silenced here: proof that the receiver does receive.
HOT = """  - name: hot
    for_each: gpu
    when: gpu.temperature_c >= 90
    severity: warning
    steps:
      - notify: oncall
"""


class Night:
    """A running loop over the squeeze scenario, in ``tmp_path``; ``tick`` runs one tick and
    waits for the steps it started."""

    def __init__(
        self, tmp_path: Path, receiver: JsonReceiver, playbook: str = SQUEEZE + HOT
    ) -> None:
        self.state = tmp_path / "state"
        (tmp_path / "playbooks").mkdir()
        (tmp_path / "playbooks" / "night.yaml").write_text(playbook)
        scenario = tmp_path / "scenario.yaml"
        scenario.write_text(SCENARIO)
        self.config_path = tmp_path / "gpuwarden.yaml"
        self.config_path.write_text(
            "host: test-node\ntick: 1s\ntimezone: UTC\n"
            f"playbooks: {tmp_path / 'playbooks'}\nstate_dir: {self.state}\n"
            f"ack_spool: {session_spool()}\n"
            "protected: {root: false, users: []}\n"  # the stand-ins run as the test's user
            "notify:\n  group_wait: 0s\n  group_interval: 1s\n  repeat: 0s\n"
            f"  targets:\n    oncall:\n      urls: ['{receiver.url('oncall')}']\n"
        )
        cfg = config_mod.load(self.config_path)
        playbooks = loader.load([tmp_path / "playbooks"], cfg)
        self.source = ScenarioSource.open(
            scenario,
            priorities=cfg.priorities,
            attributor=Attributor(cfg.priorities),
            workdir=tmp_path / "jobs",
            ack_spool=cfg.ack_spool,
        )
        # The commands stamp what they write with the wall clock: start there.
        self.clock = SimClock(start=float(int(time.time()) + 1))
        self.source.start_time = self.clock.now()
        journal = Journal(self.state / "journal.db")
        self.notifications = Notifications(
            cfg,
            journal.path,
            host="test-node",
            background=False,
            clock=self.clock,
            rules=[r.spec for r in playbooks.rules],
            access=Access.WRITE,
        )
        self.runtime = Runtime(
            cfg,
            self.source,
            playbooks,
            journal,
            clock=self.clock,
            host="test-node",
            notifications=self.notifications,
        )
        self.runtime.recover()
        self.sweep = self.source.standins["sweep"]
        self.trainer = self.source.standins["trainer"]

    def tick(self, advance: float = 0.0) -> None:
        self.clock.advance(advance)
        self.runtime.tick()
        self.runtime.steps.settle(30.0)
        self.notifications.deliver_now()

    def cli(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([*argv, "--config", str(self.config_path)])
        # The command stamped what it wrote with the wall clock; a daemon runs on that clock,
        # so it never sees a request from its future. A loaded machine can leave the simulated
        # clock behind the wall: catch up, or a silence would start after the next tick.
        self.clock.advance(max(0.0, time.time() - self.clock.now()))
        return code, out.getvalue(), err.getvalue()

    def ok(self, *argv: str) -> str:
        code, out, err = self.cli(*argv)
        assert code == 0, (argv, err)
        assert "Traceback" not in err
        return out

    def incident(self, rule: str = "squeeze") -> str:
        with Journal.open_readonly(self.state / "journal.db") as journal:
            (found,) = [i.id for i in journal.incidents() if i.rule == rule]
            return found

    def timeline(self, rule: str = "squeeze") -> list[Any]:
        with Journal.open_readonly(self.state / "journal.db") as journal:
            return journal.timeline(self.incident(rule))

    def kinds(self, rule: str = "squeeze") -> list[tuple[str, str]]:
        return [(r.kind, r.reason) for r in self.timeline(rule)]

    def steps(self, rule: str = "squeeze") -> list[str]:
        return [str(r.data.get("step_kind")) for r in self.timeline(rule) if r.kind == "step"]

    def close(self) -> None:
        self.runtime.shutdown()


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def receiver() -> Iterator[JsonReceiver]:
    r = JsonReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def night(tmp_path: Path, receiver: JsonReceiver) -> Iterator[Night]:
    n = Night(tmp_path, receiver)
    try:
        yield n
    finally:
        n.close()


def test_a_held_ladder_runs_nothing_until_released_then_goes_on_at_the_next_tick(
    night: Night,
) -> None:
    night.tick()
    incident = night.incident()
    out = night.ok("hold", incident[:20], "--by", "carol", "--reason", "asking bob first")
    assert f"{incident} on hold until released (by carol)" in out
    assert f"gpuwarden release {incident}" in out

    night.tick(advance=150)  # suspend (+1:00) and kill (+2:00) are both due now
    assert night.steps() == ["notify"]
    assert ("waiting", "held") in night.kinds()
    (waiting,) = [r for r in night.timeline() if r.kind == "waiting"]
    assert waiting.data["detail"] == "by carol until released: asking bob first"
    for _ in range(3):
        night.tick(advance=30)
    assert night.steps() == ["notify"]  # still held, noted once
    assert [k for k in night.kinds() if k == ("waiting", "held")] == [("waiting", "held")]
    assert proc_state(night.sweep.pid) != "T"
    assert "signal SIGSTOP" not in night.sweep.signals()

    # "what next" says so, with the target the suspend would choose now
    out = night.ok("incident", incident)
    (line,) = [x for x in out.splitlines() if x.startswith("  next ")]
    # (the view counts "in M:SS" on the wall clock; this loop runs ahead of it)
    assert line.startswith("  next      suspend at +1:00 (")
    assert (
        "ON HOLD by carol until released: asking bob first, "
        f"would target pid {night.sweep.pid} (" in line
    )
    assert "low, 29.3 GiB)" in line

    out = night.ok("release", incident, "--by", "carol")
    assert f"released {incident} (held by carol)" in out
    night.tick()  # the very next tick runs the suspend
    assert night.steps() == ["notify", "suspend"]
    assert proc_state(night.sweep.pid) == "T"
    assert ("release", "released") in night.kinds()

    # Held again before the kill: it does not run while held, and runs after release.
    night.ok("hold", incident, "--by", "carol")
    night.tick(advance=5)
    night.tick(advance=5)
    assert night.steps() == ["notify", "suspend"]
    assert night.sweep.alive()
    night.ok("release", incident)
    night.tick()
    assert night.steps() == ["notify", "suspend", "kill"]
    assert not night.sweep.alive()
    assert night.trainer.alive()
    out = night.ok("abort", incident)
    assert f"cannot be undone: the kill of pid {night.sweep.pid} (" in out


def test_a_hold_for_a_while_expires_by_itself(night: Night) -> None:
    night.tick()
    incident = night.incident()
    out = night.ok("hold", incident, "--for", "90s")
    assert "on hold until " in out
    night.tick(advance=61)  # the suspend is due, the hold still holds
    assert night.steps() == ["notify"]
    night.tick(advance=40)  # past the hold: the suspend runs at this tick
    assert night.steps() == ["notify", "suspend"]
    assert ("release", "expired") in night.kinds()
    assert "hold by" in night.ok("incident", incident)  # "the hold by … expired"


def test_abort_ends_the_incident_resumes_the_suspended_job_and_does_not_refire(
    night: Night, receiver: JsonReceiver
) -> None:
    night.tick()
    incident = night.incident()
    night.tick(advance=61)
    assert proc_state(night.sweep.pid) == "T"

    out = night.ok("abort", incident, "--by", "dave", "--reason", "bob freed it by hand")
    assert f"abort of {incident} asked (by dave)" in out
    assert f"  resume pid {night.sweep.pid}" in out
    assert "fires again for GPU 0 only after its condition has cleared" in out
    night.tick()  # the next tick ends it and puts the job back
    assert proc_state(night.sweep.pid) != "T"
    assert "signal SIGCONT" in night.sweep.signals()
    with Journal.open_readonly(night.state / "journal.db") as journal:
        row = journal.incident(incident)
        assert row is not None
        assert row.resolve_reason == "aborted"
        assert journal.pending_undos(incident) == []
    kinds = night.kinds()
    assert ("abort", "requested") in kinds
    assert ("resolved", "aborted") in kinds
    assert ("undone", "resumed") in kinds

    # The GPU is as full as before, but the rule stands down until its condition clears.
    for _ in range(3):
        night.tick(advance=120)
    with Journal.open_readonly(night.state / "journal.db") as journal:
        assert [i.id for i in journal.incidents() if i.rule == "squeeze"] == [incident]
    assert night.sweep.alive()
    assert night.steps() == ["notify", "suspend"]  # the kill never ran
    timeline = night.ok("incident", incident)
    assert "ABORT     by dave: bob freed it by hand" in timeline
    assert "RESOLVED  aborted (by dave: bob freed it by hand)" in timeline
    code, _out, err = night.cli("abort", incident)
    assert code == ExitCode.BAD_INPUT
    assert f"{incident} resolved at " in err
    assert "nothing to abort" in err


def test_a_silenced_rule_records_as_silenced_and_neither_acts_nor_pages(
    night: Night, receiver: JsonReceiver
) -> None:
    out = night.ok(
        "silence", "--rule", "squeeze", "--for", "2h", "--reason", "driver update", "--by", "erin"
    )
    assert "silence #1 (rule squeeze) until " in out
    assert "by erin: driver update" in out
    night.tick()  # the first tick after it: firing, recorded as silenced
    for _ in range(4):
        night.tick(advance=45)
    assert night.steps() == ["notify", "suspend", "kill"]  # the ladder ran, on paper
    for row in night.timeline():
        if row.kind == "step":
            assert row.data["shadow"] is True
            assert row.data["silenced"].startswith("#1 (rule squeeze) by erin until ")
    (firing,) = [r for r in night.timeline() if r.kind == "firing"]
    assert firing.data["detail"].startswith("silenced: #1 (rule squeeze)")
    assert proc_state(night.sweep.pid) != "T"
    assert night.sweep.alive()
    assert [s for s in night.sweep.signals() if not s.startswith("ready")] == []
    # The other rule is not silenced: its page arrives, the silenced rule's never does.
    titles = receiver.titles()
    assert any("hot" in t.lower() or "GPU 1" in t for t in titles), titles
    assert not any("squeeze" in t.lower() for t in titles), titles
    timeline = night.ok("incident", night.incident())
    assert "[silenced #1 (rule squeeze) by erin until " in timeline

    listed = night.ok("silence", "--list")
    assert "#1  rule squeeze  erin" in listed
    assert "in force" in listed
    ended = night.ok("silence", "--end", "1")
    assert "silence #1 (rule squeeze) ended" in ended
    assert night.ok("silence", "--list") == "no silences\n"
    assert "ended early" in night.ok("silence", "--list", "--all")


def test_a_silence_of_a_gpu_leaves_the_other_gpus_alone(night: Night) -> None:
    night.ok("silence", "--gpu", "1", "--for", "1h", "--reason", "reseating GPU 1")
    night.tick()
    night.tick(advance=61)
    assert night.steps() == ["notify", "suspend"]
    assert proc_state(night.sweep.pid) == "T"  # GPU 0's incident acts
    assert all(not r.data.get("silenced") for r in night.timeline())
    hot = [r for r in night.timeline("hot") if r.kind == "step"]
    assert hot
    assert all(r.data["silenced"].startswith("#1 (GPU 1)") for r in hot)


def test_silence_refuses_what_would_silence_nothing_or_forever(night: Night) -> None:
    cases = [
        (["silence", "--for", "1h", "--reason", "x"], "say what to silence"),
        (["silence", "--host", "--reason", "x"], "needs --for"),
        (["silence", "--host", "--for", "1h"], "needs --reason"),
        (["silence", "--host", "--rule", "squeeze", "--for", "1h", "--reason", "x"], "--host"),
        (["silence", "--rule", "squeez", "--for", "1h", "--reason", "x"], "did you mean 'squeeze'"),
        (["silence", "--end", "9"], "no silence #9 in force"),
        (["silence", "--host", "--for", "400d", "--reason", "x"], "at most a year"),
        (["silence", "--gpu", "-1", "--for", "1h", "--reason", "x"], "not a GPU index"),
        (["hold", "last", "--for", "0s"], "positive duration"),
    ]
    night.tick()
    for argv, expected in cases:
        code, out, err = night.cli(*argv)
        assert code == ExitCode.BAD_INPUT, (argv, out, err)
        assert expected in err, (argv, err)
        assert "Traceback" not in err
    assert night.ok("silence", "--list") == "no silences\n"


def test_ack_records_who_and_why_and_says_the_ladder_goes_on(
    night: Night, monkeypatch: pytest.MonkeyPatch
) -> None:
    night.tick()
    incident = night.incident()
    monkeypatch.setenv("SUDO_USER", "frank")
    out = night.ok("ack", incident, "--comment", "on it")
    assert f"acknowledged {incident} (by frank): no more reminders about it." in out
    assert "The ladder CONTINUES: next suspend at +1:00 (in " in out
    assert f"would target pid {night.sweep.pid} (" in out
    assert f"To stop it: gpuwarden hold {incident}" in out
    with Journal.open_readonly(night.state / "journal.db") as journal:
        row = journal.incident(incident)
        assert row is not None
        assert (row.acked_by, row.ack_comment) == ("frank", "on it")
    (ack,) = [r for r in night.timeline() if r.kind == "ack"]
    assert ack.data == {"by": "frank", "comment": "on it"}
    night.tick(advance=61)
    assert night.steps() == ["notify", "suspend"]  # it did go on
    again = night.ok("ack", incident, "--by", "grace")
    assert "was already acknowledged by frank at " in again


def test_ack_says_the_ladder_stops_when_the_rule_pauses_on_ack(
    tmp_path: Path, receiver: JsonReceiver
) -> None:
    paused = SQUEEZE.replace(
        "    severity: critical\n", "    severity: critical\n    pause_on_ack: true\n"
    )
    night = Night(tmp_path, receiver, paused)
    try:
        night.tick()
        out = night.ok("ack", "last", "--by", "heidi")
        assert "The ladder stops here: rule squeeze pauses on ack" in out
        night.tick(advance=61)
        assert night.steps() == ["notify"]
        assert ("waiting", "acknowledged") in night.kinds()
        assert proc_state(night.sweep.pid) != "T"
    finally:
        night.close()


def test_what_next_in_incidents_incident_and_status(night: Night) -> None:
    night.tick()
    incident = night.incident()
    out = night.ok("incidents", "--open")
    assert f"{incident}\n  next: suspend at +1:00 (in " in out
    assert f"), would target pid {night.sweep.pid} (" in out
    doc = json.loads(night.ok("incidents", "--open", "--json"))
    squeeze = next(d for d in doc["incidents"] if d["rule"] == "squeeze")
    nxt = squeeze["next"]
    assert (nxt["step"], nxt["kind"], nxt["state"], nxt["due_from_firing"]) == (
        1,
        "suspend",
        "scheduled",
        "+1:00",
    )
    assert [t["pid"] for t in nxt["targets"]] == [night.sweep.pid]
    night.tick(advance=61)
    doc = json.loads(night.ok("incident", incident, "--json"))
    assert doc["next"]["kind"] == "kill"
    assert doc["next"]["due_from_firing"] == "+2:00"
    night.tick(advance=61)
    last = night.ok("incident", incident)
    assert "next      none: every step has run; open until its condition clears" in last

    # status: the GPUs, then the open incidents under them (this journal, read only)
    scenario = night.state.parent / "quiet.yaml"
    scenario.write_text(SCENARIO.replace("    spawn: true\n", ""))
    status = night.ok("status", "--source", f"scenario:{scenario}")
    gpus, _, below = status.partition("open incidents (2)")
    assert "[0] A100-SXM4-80GB" in gpus
    assert f"  {incident}  critical  GPU 0  open " in below
    assert "    next: none: every step has run" in below
    assert all(len(line) <= 80 for line in status.splitlines())
    doc = json.loads(night.ok("status", "--source", f"scenario:{scenario}", "--json"))
    assert {i["id"] for i in doc["incidents"]} >= {incident}


def test_the_control_socket_answers_bad_requests_and_keeps_serving(night: Night) -> None:
    import grp
    import socket

    from gpuwarden.control import ControlServer

    night.tick()
    path = night.state.parent / "control.sock"
    server = ControlServer(path, grp.getgrgid(os.getgid()).gr_name, night.state / "journal.db")
    server.start()
    try:
        assert stat_mode(path) == 0o660

        def send(raw: bytes) -> dict[str, Any]:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(10)
                conn.connect(str(path))
                conn.sendall(raw + b"\n")
                answer = b""
                while not answer.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            doc: dict[str, Any] = json.loads(answer)
            return doc

        bad = [
            (b"not json", "not JSON"),
            (b"[1, 2]", "not a JSON object"),
            (b'{"op": "reboot", "by": "x"}', "unknown request 'reboot'"),
            (
                b'{"op": "hold", "by": "x", "incident": "last", "shell": "rm"}',
                "unknown request fields",
            ),
            (b'{"op": "hold", "by": 7, "incident": "last"}', "wrong type"),
            (b'{"op": "hold", "by": "x", "incident": "last", "for_s": NaN}', "at most a year"),
            (
                b'{"op": "silence", "by": "x", "host": true, "for_s": 1e300, "reason": "r"}',
                "at most a year",
            ),
            (b'{"op": "end-silence", "by": "x", "silence": 99999999999999999999}', "no silence #"),
            (b'{"op": "hold", "incident": "last"}', "who asks"),
        ]
        for raw, expected in bad:
            answer = send(raw)
            assert answer["ok"] is False, raw
            assert answer["exit"] == ExitCode.BAD_INPUT, (raw, answer)
            assert expected in f"{answer['error']} {answer.get('hint')}", (raw, answer)
        hold = {"op": "hold", "by": "ivan", "incident": night.incident(), "reason": "socket"}
        good = send(json.dumps(hold).encode())
        assert good["ok"] is True, good
        assert "on hold until released (by " in good["message"]
        assert server.served == 1
    finally:
        server.stop()
    assert not path.exists()
    night.tick(advance=61)
    assert night.steps() == ["notify"]  # held through the socket: the suspend waits


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_journal_is_shared_with_the_group_only_in_a_directory_of_its_own(
    tmp_path: Path,
) -> None:
    from gpuwarden.control import share_journal

    own = tmp_path / "state"
    Journal(own / "journal.db").close()
    (own / "journal.lock").write_text("")
    (own / "journal.lock").chmod(0o600)
    gid = os.getgid()
    changed = share_journal(own, gid)
    assert own in changed
    assert stat_mode(own) == 0o750
    assert stat_mode(own / "journal.db") == 0o640
    assert stat_mode(own / "journal.lock") == 0o600  # the lock stays private

    shared = tmp_path / "var-lib"
    shared.mkdir(mode=0o755)
    Journal(shared / "journal.db").close()
    (shared / "someone-elses.db").write_text("")
    changed = share_journal(shared, gid)
    assert shared not in changed  # a directory gpuwarden does not own alone keeps its mode
    assert stat_mode(shared) == 0o755
    assert stat_mode(shared / "journal.db") == 0o640


def test_a_client_that_drips_its_request_is_dropped(night: Night) -> None:
    import grp
    import socket

    from gpuwarden import control

    night.tick()
    path = night.state.parent / "control.sock"
    server = control.ControlServer(
        path, grp.getgrgid(os.getgid()).gr_name, night.state / "journal.db"
    )
    server.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
            slow.connect(str(path))
            slow.settimeout(30)
            slow.sendall(b'{"op": "ack"')  # and never the rest
            answer = slow.recv(4096)
        assert b"did not arrive in time" in answer
        assert server.served == 0
    finally:
        server.stop()
