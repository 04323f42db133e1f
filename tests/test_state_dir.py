"""The state directory shared by a running daemon and the commands people run beside it.

A real daemon (a subprocess on a scenario with real stand-in jobs) is asked every question an
on-call person would ask during an incident, fifty times each, and told to `ack` and
`reset-breaker` as often; then it is SIGKILLed and started again on the same directory. What
must hold: no command ever unlinks the daemon's write-ahead log, the daemon's later writes stay
visible and survive the kill, the restarted daemon repeats no step, a second daemon on the same
directory is refused, a stop sends no reminder, and an exec hook sees none of the daemon's
secrets.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuwarden.cli.main import main
from gpuwarden.errors import ExitCode
from gpuwarden.journal.lock import LOCK_NAME, StateLock, StateLocked
from tests.notify_receivers import JsonReceiver

ROOT = Path(__file__).resolve().parent.parent
SECRET = "hunter2-not-for-hooks"
RUNS = 50  # each command, against the running daemon

SCENARIO = """version: 1
name: squeeze
host: test-node
gpus:
  - {index: 0, name: NVIDIA A100-SXM4-80GB, memory_total_mib: 81920}
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
  - at: 2h
    end: true
"""

# Fires at once and stays open (the GPU never gets that empty): the kill is its step 1.
SQUEEZE = """rules:
  - name: squeeze
    for_each: gpu
    when: gpu.memory.used_pct >= 95
    until: gpu.memory.used_pct < 10
    severity: critical
    repeat: 1h
    steps:
      - notify: oncall
      - after: 1s
        kill: {select: process.priority <= low, grace: 1s, settle: 0s}
"""

# Added by a reload once the commands have run: the daemon's writes after them must be seen.
# The hook keeps root only to write into the test's private directory; its environment is
# the same minimal one either way.
HALF_FULL = """  - name: half-full
    for_each: gpu
    when: gpu.memory.used_pct >= 50
    until: gpu.memory.used_pct < 10
    severity: warning
    steps:
      - notify: oncall
      - exec: {{argv: [{python}, -c, "{dump}", {out}], as_root: true}}
"""
DUMP_ENV = (
    "import json, os, sys; open(sys.argv[1], 'a').write(json.dumps(dict(os.environ)) + chr(10))"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(what: str, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


class Daemon:
    """``gpuwarden run`` on the squeeze scenario, in ``tmp_path``."""

    def __init__(self, tmp_path: Path, receiver: JsonReceiver) -> None:
        self.tmp = tmp_path
        self.state = tmp_path / "state"
        self.journal = self.state / "journal.db"
        self.playbooks = tmp_path / "playbooks"
        self.playbooks.mkdir()
        (self.playbooks / "squeeze.yaml").write_text(SQUEEZE)
        self.scenario = tmp_path / "scenario.yaml"
        self.scenario.write_text(SCENARIO)
        self.hook_out = tmp_path / "hook-env.jsonl"
        self.port = free_port()
        self.config = tmp_path / "gpuwarden.yaml"
        self.config.write_text(
            "host: test-node\ntick: 200ms\ntimezone: UTC\n"
            "protected: {root: false, users: []}\n"  # the stand-ins run as whoever runs tests
            "notify:\n  group_wait: 0s\n  group_interval: 1s\n"
            "  targets:\n    oncall:\n      urls: [{env: TEST_ONCALL_URL}]\n"
            f"metrics: {{listen: '127.0.0.1:{self.port}'}}\n"
            "reload: {debounce: 100ms}\n"
        )
        self.env = {
            **os.environ,
            "TEST_ONCALL_URL": receiver.url("oncall"),
            "TEST_SECRET_TOKEN": SECRET,
            "AWS_SECRET_ACCESS_KEY": SECRET,
        }
        self.logs: list[Path] = []
        self.orphans: list[psutil.Process] = []

    def args(self, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gpuwarden",
            "run",
            "--config",
            str(self.config),
            "--playbooks",
            str(self.playbooks),
            "--source",
            f"scenario:{self.scenario}",
            "--state-dir",
            str(self.state),
            *extra,
        ]

    def start(self) -> subprocess.Popen[bytes]:
        log = self.tmp / f"daemon-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            return subprocess.Popen(
                self.args(), cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )

    def log(self, index: int = -1) -> str:
        return self.logs[index].read_text(errors="replace")

    def ticks(self) -> float:
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return 0.0
        for line in text.splitlines():
            if line.startswith("gpuwarden_tick_duration_seconds_count"):
                return float(line.split()[-1])
        return 0.0

    def rows(self, query: str, *args: object) -> list[tuple[Any, ...]]:
        """A fresh read-only look, as any new reader would see the journal now."""
        conn = sqlite3.connect(f"{self.journal.as_uri()}?mode=ro", uri=True, timeout=10)
        try:
            return list(conn.execute(query, args))
        finally:
            conn.close()

    def has(self, query: str) -> bool:
        """Whether ``query`` finds a row (False while the daemon is still creating the file)."""
        try:
            return self.journal.exists() and bool(self.rows(query))
        except sqlite3.OperationalError:
            return False

    def deleted_files(self, pid: int) -> list[str]:
        """The daemon's descriptors of journal files that are gone from the directory."""
        found = []
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if str(self.state) in target and target.endswith("(deleted)"):
                    found.append(target)
        return found


@pytest.fixture
def receiver() -> Iterator[JsonReceiver]:
    r = JsonReceiver().start()
    yield r
    r.stop()


def command(*argv: str) -> tuple[int, str, str]:
    """One command, run the way ``gpuwarden`` runs it, in this process (not the daemon's)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def snapshot(daemon: Daemon) -> dict[str, Any]:
    return {
        "records": daemon.rows("SELECT seq, incident, kind, reason, step, intent FROM records"),
        "intents": dict(daemon.rows("SELECT id, status FROM intents")),
        "incidents": dict(daemon.rows("SELECT id, acked_at FROM incidents")),
        "outbox": daemon.rows("SELECT message_id, target, kind FROM outbox"),
    }


def children(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return list(psutil.Process(pid).children(recursive=True))
    return []


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_commands_beside_a_running_daemon_break_nothing_and_survive_a_kill(
    tmp_path: Path, receiver: JsonReceiver
) -> None:
    daemon = Daemon(tmp_path, receiver)
    first = daemon.start()
    second: subprocess.Popen[bytes] | None = None
    orphans: list[psutil.Process] = []
    try:
        until(
            "the kill step is done",
            lambda: daemon.has("SELECT 1 FROM intents WHERE kind = 'kill' AND status = 'done'"),
        )
        (incident,) = (r[0] for r in daemon.rows("SELECT id FROM incidents"))
        assert daemon.deleted_files(first.pid) == []

        # A second daemon on the same directory is refused before it touches anything.
        refused = subprocess.run(
            daemon.args("--once"),
            cwd=ROOT,
            env=daemon.env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode == ExitCode.LOCKED, refused.stderr
        message = refused.stderr.decode()
        assert f"gpuwarden: {daemon.state} is locked: another gpuwarden daemon (pid " in message
        assert f"(pid {first.pid}) uses this state_dir" in message
        assert "Traceback" not in message
        assert first.poll() is None

        s = str(daemon.state)
        views = [
            ["incidents", "--state-dir", s],
            ["incidents", "--state-dir", s, "--json", "--open"],
            ["incident", "last", "--state-dir", s, "--json"],
            ["incident", incident[:8], "--state-dir", s],
            ["outbox", "--state-dir", s, "--json"],
            ["cloud", "--offline", "--state-dir", s, "--config", str(daemon.config)],
        ]
        writers = [["ack", "last", "--state-dir", s], ["reset-breaker", "--state-dir", s]]
        # Each as a real `gpuwarden` process once, then fifty times in this process.
        for argv in views + writers:
            done = subprocess.run(
                [sys.executable, "-m", "gpuwarden", *argv],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, (argv, done.stderr)
            assert daemon.deleted_files(first.pid) == [], argv
        for argv in views + writers:
            for _ in range(RUNS):
                code, out, err = command(*argv)
                assert code == 0, (argv, err)
                assert daemon.deleted_files(first.pid) == [], argv
                assert (daemon.state / "journal.db-wal").exists(), argv
        code, out, _err = command("incident", incident, "--state-dir", s, "--json")
        kinds = [e["kind"] for e in json.loads(out)["events"]]
        assert kinds.count("ack") == 1  # fifty acks, one acknowledgement
        assert "outcome" in kinds  # the kill, as the daemon wrote it

        # The daemon writes on: a reload adds a rule that fires at once, notifies and runs a
        # hook. A reader that opens the journal now must see all of it.
        hook = HALF_FULL.format(
            python=json.dumps(sys.executable), dump=DUMP_ENV, out=json.dumps(str(daemon.hook_out))
        )
        edited = daemon.playbooks / "squeeze.yaml.new"
        edited.write_text(SQUEEZE + hook)
        edited.replace(daemon.playbooks / "squeeze.yaml")
        first.send_signal(signal.SIGHUP)
        until(
            "the new rule's hook has run",
            lambda: bool(
                daemon.rows(
                    "SELECT 1 FROM intents WHERE kind = 'exec' AND status = 'done'"
                    " AND rule = 'half-full'"
                )
            ),
        )
        until(
            "its message is in the outbox",
            lambda: len({r[0] for r in daemon.rows("SELECT DISTINCT incident FROM outbox")}) == 2,
        )
        before = snapshot(daemon)
        assert daemon.deleted_files(first.pid) == []

        orphans = children(first.pid)  # the stand-ins live on (own sessions) after a SIGKILL
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        killed = snapshot(daemon)  # nothing the daemon wrote was lost with it
        assert set(before["records"]) <= set(killed["records"])
        assert before["intents"].items() <= killed["intents"].items()
        assert before["incidents"] == killed["incidents"]
        assert set(before["outbox"]) <= set(killed["outbox"])

        second = daemon.start()
        until("the restarted daemon has ticked a few times", lambda: daemon.ticks() >= 5)
        sweep = [p for p in children(second.pid) if "sweep.py" in " ".join(p.cmdline())]
        assert len(sweep) == 1
        assert sweep[0].is_running()
        stop(second)
        assert second.returncode == 0, daemon.log()
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        for orphan in orphans:
            with contextlib.suppress(psutil.NoSuchProcess):
                orphan.kill()

    restarted = daemon.log()
    assert restarted.count("resumed incident") == 2, restarted
    assert "action=kill" not in restarted
    assert "action=exec" not in restarted
    assert "0 step(s) (0 not ok, 0 refused)" in restarted
    after = snapshot(daemon)
    assert set(killed["records"]) <= set(after["records"])
    assert killed["incidents"] == after["incidents"]  # the acks kept, nothing reopened
    assert set(killed["outbox"]) <= set(after["outbox"])
    assert killed["intents"] == after["intents"]  # every step as it was, none added
    # One kill, one hook: each step once across both runs.
    steps = daemon.rows(
        "SELECT incident, step, count(*) FROM records WHERE kind = 'step' GROUP BY 1, 2"
    )
    assert steps
    assert all(count == 1 for _incident, _step, count in steps)
    (hook_env,) = [json.loads(line) for line in daemon.hook_out.read_text().splitlines()]
    assert SECRET not in json.dumps(hook_env)
    assert set(hook_env) - {"LC_CTYPE"} == {
        "PATH",
        "LANG",
        "GPUWARDEN_INCIDENT",
        "GPUWARDEN_RULE",
        "GPUWARDEN_SEVERITY",
        "GPUWARDEN_HOST",
        "GPUWARDEN_SCOPE",
        "GPUWARDEN_STEP",
        "GPUWARDEN_GPU",
        "GPUWARDEN_DRY_RUN",
    }
    # Two stops with incidents open and `repeat: 1h` on one: not one reminder.
    assert [k for (_m, _t, k) in after["outbox"] if k == "reminder"] == []
    assert not any("REMINDER" in t for t in receiver.titles())


def test_the_lock_refuses_a_second_holder_and_goes_with_its_holder(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with StateLock(state) as held:
        assert held.held
        assert (state / LOCK_NAME).stat().st_mode & 0o777 == 0o600
        with pytest.raises(StateLocked) as caught:
            StateLock(state).acquire()  # another open file description: refused, not waited
        assert caught.value.exit_code == ExitCode.LOCKED
        assert f"pid {os.getpid()}" in caught.value.render()
        assert "hint: stop it first" in caught.value.render()
    again = StateLock(state).acquire()  # released with its holder
    again.release()
    assert not again.held


# -- who opens the journal, and how -------------------------------------------------------------

STORES = {"Journal", "Outbox", "InstanceStore"}
OPENERS = {*STORES, "connect", "open_readonly", "open_writer"}


def _calls(path: Path) -> Iterator[tuple[str, ast.Call]]:
    """(enclosing function, call) for every call in a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Call):
                    yield function.name, node


def _name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _opens_journal(call: ast.Call) -> bool:
    """``Journal(...)``, ``Outbox.open_readonly(...)``, ``InstanceStore.open(...)``, ..."""
    func = call.func
    on_store = (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in STORES
    )
    return _name(call) in OPENERS or on_store


def test_commands_open_the_journal_only_through_common_and_say_when_they_write() -> None:
    cli = ROOT / "daemon" / "gpuwarden" / "cli"
    stray = [
        f"{path.name}:{call.lineno} {function}() calls {_name(call)}"
        for path in sorted(cli.glob("*.py"))
        if path.name not in ("common.py", "run.py")  # run: the daemon owns the journal
        for function, call in _calls(path)
        if _opens_journal(call)
    ]
    assert stray == [], "open the journal with cli.common.journal/outbox/instances:\n" + "\n".join(
        stray
    )
    writers = {
        function
        for path in sorted(cli.glob("*.py"))
        for function, call in _calls(path)
        if _name(call) in ("journal", "outbox", "instances")
        and any(k.arg == "write" for k in call.keywords)
    }
    # docs/operations.md ("The journal and the lock") lists these commands as the writers.
    # _carry_out: ack, hold, release, abort and silence (cli/oncall.py).
    assert writers == {"_carry_out", "cmd_reset_breaker", "_reap"}
