"""The decision journal on real SQLite files: what goes in comes out, restarts resume without
repeating a step, bad files give clear errors, and secrets and hostile strings stay data."""

from __future__ import annotations

import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuwarden.errors import ExitCode, UsageError
from gpuwarden.journal.journal import Journal, JournalError
from gpuwarden.journal.records import REDACTED, redact, redact_text
from gpuwarden.journal.schema import MIGRATIONS, Access, Migration, ddl
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
from gpuwarden.playbook.schema import ExecParams, KillParams

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
INCIDENT = "20260101T000030Z-mem-gpu:0"


@dataclass
class Facts:
    """The engine's Incident as the journal reads it (severity, shadow, GPU)."""

    id: str
    severity: str = "critical"
    shadow: bool = False
    gpu: int | None = 0


def target(pid: int = 4242, command: str = "python sweep.py --trial 17", **kw) -> Target:
    base: dict[str, object] = {
        "pid": pid,
        "create_time": T0 - 3600 + pid / 1000,
        "gpu": 0,
        "user": "bob",
        "priority": "low",
        "gpu_memory_mib": 20480,
        "command": command,
    }
    base.update(kw)
    return Target(**base)  # type: ignore[arg-type]


def change(kind: Transition, t: float, incident: str | None = None, **kw) -> RuleChange:
    reason = {
        Transition.PENDING: Reason.CONDITION_MET,
        Transition.FIRING: Reason.FOR_ELAPSED,
        Transition.RESOLVED: Reason.RESOLVED,
        Transition.CANCELLED: Reason.CONDITION_CLEARED,
    }.get(kind, Reason.COOLDOWN)
    base: dict[str, object] = {"rule": "mem", "scope": "gpu:0", "where": "GPU 0", "reason": reason}
    base.update(kw)
    return RuleChange(kind, time=t, incident=incident, **base)  # type: ignore[arg-type]


def intent(step: int = 0, kind: str = "kill", incident: str = INCIDENT, **kw) -> Intent:
    base: dict[str, object] = {
        "id": f"{incident}/{step}",
        "incident": incident,
        "rule": "mem",
        "scope": "gpu:0",
        "step": step,
        "kind": kind,
        "label": kind,
        "time": T0 + 30 + step * 60,
        "reason": Reason.STEP_DUE,
        "severity": "critical",
        "targets": (target(),),
        "gpu": 0,
        "where": "GPU 0",
    }
    base.update(kw)
    return Intent(**base)  # type: ignore[arg-type]


def fired(journal: Journal, incident: str = INCIDENT, facts: Facts | None = None) -> None:
    journal.record_all(
        [change(Transition.PENDING, T0), change(Transition.FIRING, T0 + 30, incident)],
        T0 + 30,
        [facts or Facts(incident)],
    )


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.db"


@pytest.fixture
def journal(path: Path):
    j = Journal(path)
    yield j
    j.close()


# -- round trips --------------------------------------------------------------------------------


def test_a_ladder_round_trips_in_order(journal: Journal) -> None:
    fired(journal)
    kill = intent(skipped=(Skipped(target(4243, user="alice"), Reason.PROTECTED),))
    assert journal.record_all([kill], T0 + 31) == [kill]
    status = journal.finish(
        kill.id,
        Outcome(
            ok=True,
            detail="kill: 4242 killed",
            targets=(TargetResult(4242, kill.targets[0].create_time, True, "killed", "SIGTERM"),),
        ),
        T0 + 40,
    )
    journal.record(change(Transition.RESOLVED, T0 + 50, INCIDENT), T0 + 50)
    assert status == "done"
    [row] = journal.incidents()
    assert (row.id, row.severity, row.shadow, row.gpu) == (INCIDENT, "critical", False, 0)
    assert (row.pending_at, row.opened_at, row.resolved_at) == (T0, T0 + 30, T0 + 50)
    assert (row.resolve_reason, row.steps, row.steps_failed, row.open) == ("resolved", 1, 0, False)
    assert row.duration() == 20.0
    timeline = journal.timeline(INCIDENT)
    assert [(r.kind, r.reason) for r in timeline] == [
        ("pending", "condition_met"),
        ("firing", "for_elapsed"),
        ("step", "step_due"),
        ("skip", "protected"),
        ("finished", "done"),
        ("outcome", "killed"),
        ("resolved", "resolved"),
    ]
    step = timeline[2]
    assert step.intent == kill.id
    assert step.step == 0
    assert step.data["targets"][0]["pid"] == 4242
    assert step.data["targets"][0]["command"] == "python sweep.py --trial 17"
    assert timeline[3].data["target"]["user"] == "alice"
    assert timeline[5].data["detail"] == "SIGTERM"
    assert [r.seq for r in timeline] == sorted(r.seq for r in timeline)


def test_a_failed_step_counts_as_failed(journal: Journal) -> None:
    fired(journal)
    journal.record(intent(), T0 + 30)
    assert journal.finish(intent().id, Outcome(ok=False, recoverable=True), T0 + 31) == "failed"
    [row] = journal.incidents()
    assert (row.steps, row.steps_failed) == (1, 1)


def test_severity_comes_from_the_first_step_when_the_firing_had_no_facts(
    journal: Journal,
) -> None:
    journal.record(change(Transition.FIRING, T0 + 30, INCIDENT), T0 + 30)
    assert journal.incident(INCIDENT).severity is None  # type: ignore[union-attr]
    journal.record(intent(severity="warning", shadow=True, gpu=3), T0 + 30)
    row = journal.incident(INCIDENT)
    assert row is not None
    assert (row.severity, row.shadow, row.gpu) == ("warning", True, 3)


def test_an_intent_recorded_twice_is_refused_not_repeated(journal: Journal) -> None:
    fired(journal)
    assert journal.record(intent(), T0 + 30)
    assert journal.record_all([intent(), change(Transition.WAITING, T0 + 31, INCIDENT)], T0 + 31)
    assert journal.record(intent(), T0 + 32) is False
    kinds = [(r.kind, r.reason) for r in journal.timeline(INCIDENT)]
    assert kinds.count(("refused", "already_planned")) == 2
    assert ("waiting", "cooldown") in kinds  # the rest of the tick was still written
    assert journal.incident(INCIDENT).steps == 1  # type: ignore[union-attr]


def test_cancelled_pending_stays_outside_and_the_last_pending_joins(journal: Journal) -> None:
    journal.record_all(
        [
            change(Transition.PENDING, T0),
            change(Transition.CANCELLED, T0 + 5),
            change(Transition.PENDING, T0 + 10),
            change(Transition.FIRING, T0 + 40, INCIDENT),
        ],
        T0 + 40,
    )
    assert [(r.kind, r.time) for r in journal.timeline(INCIDENT)] == [
        ("pending", T0 + 10),
        ("firing", T0 + 40),
    ]
    assert journal.incident(INCIDENT).pending_at == T0 + 10  # type: ignore[union-attr]


def test_a_one_shot_incident_has_no_pending(journal: Journal) -> None:
    journal.record(change(Transition.PENDING, T0, rule="other"), T0)
    journal.record(change(Transition.FIRING, T0 + 1, INCIDENT, reason=Reason.EVENT), T0 + 1)
    assert journal.incident(INCIDENT).pending_at is None  # type: ignore[union-attr]


def test_finish_of_an_unknown_or_finished_intent_is_an_error(journal: Journal) -> None:
    with pytest.raises(JournalError, match="no intent 'nope'"):
        journal.finish("nope", Outcome(ok=True), T0)
    fired(journal)
    journal.record(intent(), T0 + 30)
    journal.finish(intent().id, Outcome(ok=True), T0 + 31)
    with pytest.raises(JournalError, match="already done"):
        journal.finish(intent().id, Outcome(ok=True), T0 + 32)


# -- restart ------------------------------------------------------------------------------------


def test_a_restart_finds_the_interrupted_intents_and_what_each_incident_did(path: Path) -> None:
    with Journal(path) as first:
        fired(first)
        first.record_all([intent(0, "notify", targets=()), intent(1, "suspend")], T0 + 30)
        first.finish(intent(0).id, Outcome(ok=True), T0 + 31)
        # the daemon dies here: step 1 is still planned
    with Journal(path) as second:
        [lost] = second.interrupted()
        assert (lost.id, lost.kind, lost.status, lost.step) == (
            intent(1).id,
            "suspend",
            "planned",
            1,
        )
        assert lost.targets == (target(),)
        second.record(intent(2, "kill", targets=(target(7),)), T0 + 200)
        assert [i.id for i in second.interrupted()] == [lost.id]  # not this run's own
        assert second.mark_interrupted(lost.id, T0 + 300)
        assert not second.mark_interrupted(lost.id, T0 + 301)
        assert second.interrupted() == []
        [state] = second.open_incidents()
        assert state.incident.id == INCIDENT
        assert dict(state.steps) == {0: "done", 1: "interrupted", 2: "planned"}
        assert state.next_step == 3
        created = target().create_time
        assert state.targeted == {("suspend", 4242, created), ("kill", 7, target(7).create_time)}
        with pytest.raises(JournalError, match="already interrupted"):
            second.finish(lost.id, Outcome(ok=True), T0 + 302)
        assert ("interrupted", "daemon_stopped") in [
            (r.kind, r.reason) for r in second.timeline(INCIDENT)
        ]


def test_resolved_incidents_are_not_resumed(journal: Journal) -> None:
    fired(journal)
    fired(journal, "other", Facts("other"))
    journal.record(change(Transition.RESOLVED, T0 + 60, INCIDENT), T0 + 60)
    assert [s.incident.id for s in journal.open_incidents()] == ["other"]


CHILD = """
import sys, time
from pathlib import Path
from gpuwarden.journal.journal import Journal
from gpuwarden.model import Intent, Reason, RuleChange, Target, Transition
j = Journal(Path(sys.argv[1]))
t = Target(4242, 1.5, 0, "bob", "low", 100)
j.record_all([
    RuleChange(Transition.FIRING, "mem", "gpu:0", 10.0, Reason.FOR_ELAPSED, "inc"),
    Intent("inc/0", "inc", "mem", "gpu:0", 0, "kill", "kill", 10.0, Reason.STEP_DUE,
           "critical", targets=(t,)),
], 10.0)
print("written", flush=True)
time.sleep(60)
"""


def test_an_intent_written_before_acting_survives_sigkill(path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "written"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    with Journal(path) as journal:
        [lost] = journal.interrupted()
        assert (lost.id, lost.targets[0].pid, lost.targets[0].create_time) == ("inc/0", 4242, 1.5)


# -- undo ---------------------------------------------------------------------------------------


def test_undos_are_kept_until_done(path: Path) -> None:
    with Journal(path) as journal:
        fired(journal)
        fired(journal, "other", Facts("other"))
        journal.record_all([intent(0, "suspend"), intent(0, "renice", incident="other")], T0 + 30)
        created = target().create_time
        journal.finish(
            intent(0).id, Outcome(ok=True, undo=(Undo("resume", 4242, created),)), T0 + 31
        )
        renice = Undo("renice", 4242, created, value=0, ionice="best-effort:4")
        power = Undo("power_limit", gpu=1, value=287.5)
        journal.finish(
            intent(0, incident="other").id, Outcome(ok=True, undo=(renice, power)), T0 + 32
        )
    with Journal(path) as journal:
        undos = journal.pending_undos()
        assert [(u.incident, u.kind) for u in undos] == [
            (INCIDENT, "resume"),
            ("other", "renice"),
            ("other", "power_limit"),
        ]
        assert undos[0].undo() == Undo("resume", 4242, created)
        assert undos[1].value == 0
        assert isinstance(undos[1].value, int)
        assert undos[2].value == 287.5
        assert undos[2].gpu == 1
        assert [u.kind for u in journal.pending_undos("other")] == ["renice", "power_limit"]
        journal.undo_done(undos[0].id, T0 + 60)
        journal.undo_done(undos[1].id, T0 + 61, "gone")
        assert [u.kind for u in journal.pending_undos()] == ["power_limit"]
        with pytest.raises(JournalError, match="no pending undo"):
            journal.undo_done(undos[0].id, T0 + 62)
        other = [(r.kind, r.reason) for r in journal.timeline("other")]
        assert ("undo", "renice") in other
        assert ("undone", "gone") in other


def test_a_dry_run_keeps_nothing_to_undo(journal: Journal) -> None:
    fired(journal)
    journal.record(intent(0, "suspend"), T0 + 30)
    undo = (Undo("resume", 4242, target().create_time),)
    journal.finish(intent(0).id, Outcome(ok=True, dry_run=True, undo=undo), T0 + 31)
    assert journal.pending_undos() == []


# -- safety rails -------------------------------------------------------------------------------


def test_rate_limit_counts_over_windows(journal: Journal) -> None:
    for i, (rule, kind) in enumerate(
        [("mem", "kill"), ("mem", "kill"), ("mem", "suspend"), ("heat", "kill"), ("mem", "kill")]
    ):
        journal.note_action(rule, kind, 100 + i, T0 + i * 60)
    assert journal.actions_since(T0) == 5
    assert journal.actions_since(T0 + 60) == 4
    assert journal.actions_since(T0 + 240) == 1
    assert journal.actions_since(T0 + 241) == 0
    assert journal.actions_since(T0, rule="mem") == 4
    assert journal.actions_since(T0, kinds=["kill"]) == 4
    assert journal.actions_since(T0, rule="mem", kinds=("suspend", "renice")) == 1
    assert journal.actions_since(T0, kinds=[]) == 0


def test_actions_from_several_threads_are_all_counted(journal: Journal) -> None:
    def note(n: int) -> None:
        for i in range(25):
            journal.note_action("mem", "kill", n * 100 + i, T0 + i)

    threads = [threading.Thread(target=note, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert journal.actions_since(T0) == 100


def test_the_breaker_trips_once_and_survives_a_restart(path: Path) -> None:
    with Journal(path) as journal:
        assert journal.breaker() is None
        first = journal.trip_breaker("5 destructive actions in 10m", T0)
        assert journal.trip_breaker("again", T0 + 5) == first
    with Journal(path) as journal:
        state = journal.breaker()
        assert state is not None
        assert (state.tripped_at, state.reason) == (T0, "5 destructive actions in 10m")
        assert journal.reset_breaker(T0 + 100)
        assert not journal.reset_breaker(T0 + 101)
    with Journal(path) as journal:
        assert journal.breaker() is None
        assert journal.trip_breaker("later", T0 + 200).tripped_at == T0 + 200


# -- the file -----------------------------------------------------------------------------------


def test_the_file_is_private(path: Path) -> None:
    Journal(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    conn.close()


def test_a_garbage_file_is_not_a_journal(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a database at all\n" * 200)
    with pytest.raises(JournalError) as caught:
        Journal(path)
    text = caught.value.render()
    assert f"{path} is not a gpuwarden journal (file is not a database)" in text
    assert "move it aside and restart" in text
    assert "hint: `mv " in text
    assert caught.value.exit_code == ExitCode.FAILURE
    assert path.read_bytes().startswith(b"this is not a database")  # left as it was


def test_a_damaged_journal_is_found_when_the_daemon_starts(path: Path) -> None:
    with Journal(path) as journal:
        for i in range(200):
            journal.note_action("mem", "kill", i, T0 + i)
    data = bytearray(path.read_bytes())
    data[4096:] = b"\xa5" * (len(data) - 4096)  # every page but the first
    path.write_bytes(bytes(data))
    with pytest.raises(JournalError) as caught:
        Journal(path)
    assert f"{path} is corrupt (" in caught.value.render()
    assert ".recover" in caught.value.render()


def test_another_programs_database_is_not_a_journal(path: Path) -> None:
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE songs (title TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(JournalError, match="a SQLite database of another program"):
        Journal(path)
    with pytest.raises(JournalError, match="not a gpuwarden journal"):
        Journal.open_readonly(path)


def test_a_locked_journal_fails_after_the_timeout(path: Path) -> None:
    Journal(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        began = time.monotonic()
        with pytest.raises(JournalError) as caught:
            Journal(path, timeout=0.2)
        assert time.monotonic() - began < 3
        assert f"{path} is locked by another process" in caught.value.render()
        assert "another gpuwarden" in caught.value.render()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_write_to_a_locked_journal_is_an_error_not_a_lost_record(path: Path) -> None:
    journal = Journal(path, timeout=0.2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(JournalError, match="locked"):
            journal.record(intent(), T0)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert journal.record(intent(), T0)  # the lock is gone: it is written now
    assert [i.id for i in journal.incidents()] == [INCIDENT]
    journal.close()


def test_a_journal_from_a_newer_gpuwarden_is_refused(path: Path) -> None:
    Journal(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 7")
    conn.close()
    for opening in (Journal, Journal.open_readonly):
        with pytest.raises(JournalError) as caught:
            opening(path)
        text = caught.value.render()
        assert (
            "newer gpuwarden (journal schema version 7; this gpuwarden knows up to "
            f"{len(MIGRATIONS)})" in text
        )
        assert "upgrade gpuwarden" in text


def _v2(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE incidents ADD COLUMN ticket TEXT")
    conn.execute("UPDATE incidents SET ticket = 'unknown' WHERE acked_at IS NOT NULL")


def test_a_v1_journal_migrates_forward(path: Path) -> None:
    with Journal(path) as journal:
        fired(journal)
        journal.ack(INCIDENT, T0 + 40)
    following = len(MIGRATIONS) + 1
    later = (*MIGRATIONS, Migration(following, "incidents remember their ticket", _v2))
    with Journal(path, migrations=later) as journal:
        assert [i.id for i in journal.incidents()] == [INCIDENT]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == following
    assert conn.execute("SELECT ticket FROM incidents").fetchall() == [("unknown",)]
    conn.close()
    with pytest.raises(JournalError, match=f"schema version {following}"):
        Journal(path)  # this build does not know that version


def test_a_failed_migration_leaves_the_file_as_it_was(path: Path) -> None:
    Journal(path).close()
    broken = (
        *MIGRATIONS,
        Migration(len(MIGRATIONS) + 1, "broken", ddl("ALTER TABLE nope ADD COLUMN x")),
    )
    with pytest.raises(JournalError, match="no such table: nope"):
        Journal(path, migrations=broken)
    with Journal(path) as journal:  # still at the version before, still usable
        assert journal.incidents() == []


def test_migrations_must_be_numbered_in_order(path: Path) -> None:
    with pytest.raises(ValueError, match="out of order"):
        Journal(path, migrations=(Migration(2, "skips one", ddl()),))  # no version 1


def test_readonly_reads_while_the_daemon_writes_and_refuses_writes(path: Path) -> None:
    with Journal(path) as daemon:
        fired(daemon)
        view = Journal.open_readonly(path)
        assert [i.id for i in view.incidents()] == [INCIDENT]
        daemon.record(change(Transition.RESOLVED, T0 + 60, INCIDENT), T0 + 60)
        assert view.incidents(open_only=True) == []
        with pytest.raises(JournalError, match="cannot write to the journal"):
            view.ack(INCIDENT, T0)
        view.close()


def test_readonly_of_a_missing_journal_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(JournalError) as caught:
        Journal.open_readonly(tmp_path / "nowhere" / "journal.db")
    assert "no journal at" in caught.value.render()
    assert "hint:" in caught.value.render()
    assert not (tmp_path / "nowhere").exists()


def test_readonly_of_an_older_journal_asks_to_start_the_daemon(path: Path) -> None:
    Journal(path).close()
    later = (*MIGRATIONS, Migration(len(MIGRATIONS) + 1, "later", ddl("CREATE TABLE later (x)")))
    with pytest.raises(JournalError, match="start the daemon once"):
        Journal(path, migrations=later, access=Access.READ)


def test_an_unwritable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(JournalError, match="cannot create the journal"):
        Journal(blocker / "journal.db")


# -- what may be stored -------------------------------------------------------------------------


def test_secret_keys_are_dropped_at_any_depth() -> None:
    params = {
        "argv": ["notify-send", "hi"],
        "token": "abc",
        "env": {"API_KEY": "k1", "SMTP_PASSWORD": "p", "smtp_pass": "p2", "HOME": "/root"},
        "nested": [{"client_secret": "s", "name": "ok"}],
        "Authorization": "Basic Zm9vOmJhcg==",
    }
    out = redact(params)
    assert out["token"] == REDACTED
    assert out["env"] == {
        "API_KEY": REDACTED,
        "SMTP_PASSWORD": REDACTED,
        "smtp_pass": REDACTED,
        "HOME": "/root",
    }
    assert out["nested"] == [{"client_secret": REDACTED, "name": "ok"}]
    assert out["Authorization"] == REDACTED
    assert out["argv"] == ["notify-send", "hi"]


@pytest.mark.parametrize(
    ("text", "kept", "gone"),
    [
        ("mailto://alice:hunter2@smtp.example.com", "mailto://alice:", "hunter2"),
        ("json://u:p4ss@127.0.0.1:8080/hook", "127.0.0.1:8080/hook", "p4ss"),
        ("https://hooks.example.com/x?token=s3cr3t&room=5", "room=5", "s3cr3t"),
        ("ntfy://host/topic?auth=abcdef&priority=high", "priority=high", "abcdef"),
        ("curl -H 'Authorization: Bearer eyJhbGciOi.xyz' url", "curl -H", "eyJhbGciOi"),
        ("train.py --api-key=sk-123456 --lr 3e-4", "--lr 3e-4", "sk-123456"),
        ("PASSWORD=letmein ./run.sh", "./run.sh", "letmein"),
        ("python train.py --hf-token hf_abc123 --lr 1", "--lr 1", "hf_abc123"),
        ('{"secret": "classified"}', '{"secret"', "classified"),
    ],
)
def test_credentials_in_text_are_masked(text: str, kept: str, gone: str) -> None:
    out = redact_text(text)
    assert gone not in out
    assert kept in out
    assert REDACTED in out


def test_a_flag_naming_a_secret_hides_the_next_argument() -> None:
    argv = ["deploy", "--token", "abc123", "--region", "eu", "-p", "x"]
    assert redact(argv) == ["deploy", "--token", REDACTED, "--region", "eu", "-p", "x"]


def test_step_parameters_are_stored_redacted(journal: Journal) -> None:
    exec_params = ExecParams(
        argv=("/usr/local/bin/page", "--password", "pw1", "https://u:pw2@pager.example/hook"),
        env={"PAGER_TOKEN": "pw3", "TEAM": "ml"},
    )
    fired(journal)
    journal.record(intent(0, "exec", targets=(), params=exec_params), T0 + 30)
    journal.record(intent(1, "kill", params=KillParams(select="process.priority == low")), T0 + 30)
    journal.finish(intent(0).id, Outcome(ok=True, detail="output: token=pw4 sent"), T0 + 31)
    dump = sqlite3.connect(journal.path).iterdump()
    text = "\n".join(dump)
    for secret in ("pw1", "pw2", "pw3", "pw4"):
        assert secret not in text
    step = journal.timeline(INCIDENT)[2]
    assert step.data["params"]["env"] == {"PAGER_TOKEN": REDACTED, "TEAM": "ml"}
    assert step.data["params"]["argv"][0] == "/usr/local/bin/page"
    kill = journal.timeline(INCIDENT)[3]
    assert kill.data["params"]["select"] == "process.priority == low"
    assert kill.data["params"]["grace"] == 30.0


HOSTILE = (
    "python x.py \n\r\x00\x1b[2J\x1b[31mroot\x07 $(touch /tmp/gpuwarden-pwned) `id` "
    "'; DROP TABLE incidents; -- \u202eevil " + "A" * 10_000
)


def test_hostile_strings_are_stored_as_data(journal: Journal, tmp_path: Path) -> None:
    evil = target(command=HOSTILE, user="mallory\n\x1b[0m", ack_dir="/tmp/$(id)")
    fired(journal)
    kill = intent(targets=(evil,), skipped=(Skipped(evil, Reason.ZOMBIE),))
    journal.record(kill, T0 + 30)
    result = TargetResult(4242, None, False, "gone", HOSTILE)
    journal.finish(kill.id, Outcome(ok=False, detail=HOSTILE, targets=(result,)), T0 + 31)
    journal.close()
    with Journal(journal.path) as again:
        [row] = again.incidents()
        assert row.id == INCIDENT
        timeline = again.timeline(INCIDENT)
        assert timeline[2].data["targets"][0]["command"] == HOSTILE
        assert timeline[2].data["targets"][0]["user"] == "mallory\n\x1b[0m"
        assert timeline[3].data["target"]["command"] == HOSTILE
        assert timeline[4].data["detail"] == HOSTILE
        assert timeline[5].data["detail"] == HOSTILE
    assert not Path("/tmp/gpuwarden-pwned").exists()


def test_very_long_strings_are_cut_with_a_marker(journal: Journal) -> None:
    fired(journal)
    journal.record(intent(targets=(target(command="x" * 50_000),)), T0 + 30)
    command = journal.timeline(INCIDENT)[2].data["targets"][0]["command"]
    assert command.startswith("x" * 16_384)
    assert command.endswith("…[33616 more characters]")


# -- listing ------------------------------------------------------------------------------------


def _three(journal: Journal) -> None:
    for n, opened in enumerate((T0, T0 + 3600, T0 + 7200)):
        incident = f"inc-{n}"
        journal.record(change(Transition.FIRING, opened, incident, scope=f"gpu:{n}"), opened)
    journal.record(change(Transition.RESOLVED, T0 + 600, "inc-0", scope="gpu:0"), T0 + 600)
    journal.record(change(Transition.RESOLVED, T0 + 5000, "inc-1", scope="gpu:1"), T0 + 5000)


def test_incidents_filters(journal: Journal) -> None:
    _three(journal)
    assert [i.id for i in journal.incidents()] == ["inc-0", "inc-1", "inc-2"]
    assert [i.id for i in journal.incidents(open_only=True)] == ["inc-2"]
    # since: every incident open at any time since then
    assert [i.id for i in journal.incidents(since=T0 + 601)] == ["inc-1", "inc-2"]
    assert [i.id for i in journal.incidents(since=T0 + 5001)] == ["inc-2"]
    assert [i.id for i in journal.incidents(since=T0 + 600)] == ["inc-0", "inc-1", "inc-2"]
    assert journal.incidents(since=T0 + 9999, open_only=True)[0].id == "inc-2"


def test_find_incident_by_id_or_unique_prefix(journal: Journal) -> None:
    _three(journal)
    journal.record(change(Transition.FIRING, T0, "other-1"), T0)
    assert journal.find_incident("inc-1").id == "inc-1"
    assert journal.find_incident("oth").id == "other-1"
    with pytest.raises(UsageError, match="3 incidents start with 'inc'"):
        journal.find_incident("inc")
    with pytest.raises(UsageError, match="no incident"):
        journal.find_incident("zzz")
    with pytest.raises(UsageError, match="no incident"):
        journal.find_incident("%")  # wildcards are literal
    with pytest.raises(UsageError, match="no incident"):
        journal.find_incident("inc_")


def test_ack_once(journal: Journal) -> None:
    fired(journal)
    assert journal.ack(INCIDENT, T0 + 100)
    assert not journal.ack(INCIDENT, T0 + 200)
    assert not journal.ack("unknown", T0 + 200)
    assert journal.incident(INCIDENT).acked_at == T0 + 100  # type: ignore[union-attr]
    assert journal.timeline(INCIDENT)[-1].kind == "ack"


def test_prune_forgets_old_resolved_incidents_but_not_pending_undos(journal: Journal) -> None:
    _three(journal)
    journal.record(intent(0, "suspend", incident="inc-1", scope="gpu:1"), T0 + 3700)
    undo = (Undo("resume", 4242, target().create_time),)
    journal.finish(intent(0, incident="inc-1").id, Outcome(ok=True, undo=undo), T0 + 3701)
    journal.record(change(Transition.PENDING, T0 + 10, scope="gpu:9"), T0 + 10)
    journal.note_action("mem", "kill", 1, T0)
    assert journal.prune(T0 + 6000) == 1  # inc-1 still has something to put back
    assert [i.id for i in journal.incidents()] == ["inc-1", "inc-2"]
    assert journal.timeline("inc-0") == []
    assert journal.actions_since(0) == 0
    [pending] = journal.pending_undos()
    journal.undo_done(pending.id, T0 + 6001)
    journal.record(change(Transition.RESOLVED, T0 + 9000, "inc-2", scope="gpu:2"), T0 + 9000)
    assert journal.prune(T0 + 10_000) == 2
    assert journal.incidents() == []
