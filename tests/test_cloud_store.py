"""The instances table in a real journal file: launches are remembered once, kept across
restarts and readable from another connection; the journal's incidents say when to reap."""

from __future__ import annotations

import dataclasses
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest

from gpuwarden.cloud.instance import GONE, Managed
from gpuwarden.cloud.store import InstanceStore
from gpuwarden.journal.journal import Journal, JournalError
from gpuwarden.journal.schema import MIGRATIONS
from gpuwarden.model import Reason, RuleChange, Transition

T0 = 1_780_000_000.0
HOUR = 3600.0
INCIDENT = "20260528T202640Z-mem-gpu:0"


def managed(n: int = 1, **changes: object) -> Managed:
    fields: dict[str, object] = {
        "instance_id": f"i-{n:017x}",
        "profile": "burst",
        "region": "us-east-1",
        "instance_type": "g5.xlarge",
        "market": "on-demand",
        "state": "pending",
        "launched_at": T0 + n,
        "expires_at": T0 + n + 8 * HOUR,
        "host": "node-7",
        "incident": INCIDENT,
        "rule": "mem",
        "step": 1,
        "intent": f"{INCIDENT}/1",
        "subnet": "subnet-0a1b",
        "hourly_usd": 1.006,
    }
    fields.update(changes)
    return Managed(**fields)  # type: ignore[arg-type]


def fire(journal: Journal, incident: str, t: float) -> None:
    journal.record(
        RuleChange(Transition.FIRING, "mem", incident, t, Reason.FOR_ELAPSED, incident=incident),
        t,
    )


def resolve(journal: Journal, incident: str, t: float) -> None:
    journal.record(
        RuleChange(Transition.RESOLVED, "mem", incident, t, Reason.RESOLVED, incident=incident), t
    )


def version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.db"


@pytest.fixture
def store(path: Path):
    s = InstanceStore.open(path)
    yield s
    s.close()


# -- round trips --------------------------------------------------------------------------------


def test_an_instance_comes_back_as_it_went_in(path: Path) -> None:
    launched = managed(1)
    adopted = managed(
        2,
        incident=None,
        rule=None,
        step=None,
        intent=None,
        subnet=None,
        hourly_usd=None,
        state="running",
        market="spot",
        adopted=True,
        instance_type="p4d.24xlarge",
    )
    with InstanceStore.open(path) as store:
        assert store.add(launched, T0 + 1) is True
        assert store.add(adopted, T0 + 2) is True
        assert store.get(launched.instance_id) == launched
    with InstanceStore.open(path) as store:  # kept across a restart
        assert store.get(launched.instance_id) == launched
        got = store.get(adopted.instance_id)
        assert got == adopted
        assert got is not None
        assert (got.incident, got.step, got.hourly_usd, got.adopted) == (None, None, None, True)
        assert store.get("i-0000000000000dead") is None


def test_adding_a_known_instance_again_changes_nothing(store: InstanceStore) -> None:
    first = managed(1)
    assert store.add(first, T0) is True
    assert store.add(first, T0 + 5) is False
    assert store.add(dataclasses.replace(first, state="running", host="elsewhere"), T0 + 6) is False
    assert store.all() == [first]


def test_a_hostile_looking_id_is_data(store: InstanceStore) -> None:
    odd = managed(1, incident="x'); DROP TABLE instances; --", rule='r"; --')
    assert store.add(odd, T0)
    assert store.for_step("x'); DROP TABLE instances; --", 1) == [odd]
    assert store.all() == [odd]


def test_live_is_the_instances_that_still_cost_money(store: InstanceStore) -> None:
    rows = [
        managed(1, state="pending"),
        managed(2, state="running", profile="other"),
        managed(3, state="stopped"),
        managed(4, state="terminated"),
        managed(5, state="shutting-down"),
        managed(6, state=GONE),
        managed(7, state="stopping"),
    ]
    for row in reversed(rows):  # written in another order than launched
        store.add(row, T0)
    assert [m.instance_id for m in store.live()] == [
        rows[0].instance_id,
        rows[1].instance_id,
        rows[2].instance_id,
        rows[6].instance_id,
    ]
    assert [m.instance_id for m in store.live("burst")] == [
        rows[0].instance_id,
        rows[2].instance_id,
        rows[6].instance_id,
    ]
    assert [m.instance_id for m in store.live("other")] == [rows[1].instance_id]
    assert store.live("nowhere") == []


def test_for_step_is_what_one_step_launched_in_any_state(store: InstanceStore) -> None:
    ours = [managed(1), managed(2, state="terminated")]
    for row in ours:
        store.add(row, T0)
    store.add(managed(3, step=2), T0)
    store.add(managed(4, incident="20260528T210000Z-mem-gpu:1"), T0)
    store.add(managed(5, incident=None, step=None, adopted=True), T0)
    assert store.for_step(INCIDENT, 1) == ours
    assert [m.instance_id for m in store.for_step(INCIDENT, 2)] == [managed(3).instance_id]
    assert store.for_step(INCIDENT, 3) == []
    assert store.for_step("20260528T210000Z-mem-gpu:9", 1) == []


def test_all_lists_the_newest_launch_first(store: InstanceStore) -> None:
    store.add(managed(2), T0)
    store.add(managed(9, state="terminated"), T0)
    store.add(managed(5), T0)
    assert [m.launched_at for m in store.all()] == [T0 + 9, T0 + 5, T0 + 2]
    store.add(managed(3, launched_at=T0 + 9), T0)  # the same launch time: the later row first
    assert [m.instance_id for m in store.all()[:2]] == [
        managed(3).instance_id,
        managed(9).instance_id,
    ]


def test_empty_store_reads_empty(store: InstanceStore) -> None:
    assert store.all() == []
    assert store.live() == []
    assert store.resolved_at([]) == {}


# -- state changes ------------------------------------------------------------------------------


def test_set_state_follows_ec2(path: Path, store: InstanceStore) -> None:
    row = managed(1)
    store.add(row, T0)
    store.set_state(row.instance_id, "running", T0 + 40)
    assert store.get(row.instance_id) == dataclasses.replace(row, state="running")
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT state, state_at FROM instances").fetchall() == [
        ("running", T0 + 40)
    ]
    conn.close()
    store.set_state(row.instance_id, "stopped", T0 + 50)
    assert [m.state for m in store.live()] == ["stopped"]  # stopped still costs: still live


def test_set_state_of_an_unknown_instance_is_an_error(store: InstanceStore) -> None:
    with pytest.raises(JournalError, match="no instance 'i-0000000000000dead'"):
        store.set_state("i-0000000000000dead", "running", T0)
    with pytest.raises(JournalError, match="no instance"):
        store.ended("i-0000000000000dead", "terminated", T0, "ttl")


def test_a_state_ec2_does_not_have_is_refused(store: InstanceStore) -> None:
    row = managed(1)
    store.add(row, T0)
    with pytest.raises(ValueError, match="unknown instance state 'exploded'"):
        store.set_state(row.instance_id, "exploded", T0)
    with pytest.raises(ValueError, match="unknown instance state"):
        store.add(managed(2, state="Running"), T0)
    with pytest.raises(ValueError, match="'running' is not an ended state"):
        store.ended(row.instance_id, "running", T0, "ttl")
    assert store.get(row.instance_id) == row
    assert len(store.all()) == 1


def test_ended_records_when_and_why_once(store: InstanceStore) -> None:
    row = managed(1, state="running")
    other = managed(2, state="running")
    store.add(row, T0)
    store.add(other, T0)
    store.ended(row.instance_id, "shutting-down", T0 + HOUR, "linger")
    got = store.get(row.instance_id)
    assert got == dataclasses.replace(
        row, state="shutting-down", terminated_at=T0 + HOUR, end_reason="linger"
    )
    assert got is not None
    assert got.cost_so_far(T0 + 10 * HOUR) == pytest.approx(1.006 * (HOUR - 1) / HOUR)
    assert store.live() == [other]
    # EC2 later reports it terminated, then not at all: the first end stays
    store.set_state(row.instance_id, "terminated", T0 + HOUR + 60)
    store.ended(row.instance_id, GONE, T0 + 2 * HOUR, "gone")
    again = store.get(row.instance_id)
    assert again is not None
    assert (again.state, again.terminated_at, again.end_reason) == (GONE, T0 + HOUR, "linger")
    assert store.get(other.instance_id) == other


# -- the journal's incidents --------------------------------------------------------------------


def test_resolved_at_reads_the_journals_incidents(path: Path) -> None:
    resolved, still_open = INCIDENT, "20260528T210000Z-mem-gpu:1"
    with Journal(path) as journal, InstanceStore.open(path) as store:
        fire(journal, resolved, T0)
        fire(journal, still_open, T0 + 10)
        assert store.resolved_at([resolved, still_open]) == {}
        resolve(journal, resolved, T0 + 600)
        assert store.resolved_at([resolved, still_open, "never-seen"]) == {resolved: T0 + 600}
        assert store.resolved_at(iter([resolved, resolved])) == {resolved: T0 + 600}
        assert store.resolved_at([still_open]) == {}


def test_resolved_at_of_many_incidents(path: Path) -> None:
    ids = [f"20260528T2100{n:04d}Z-mem-gpu:{n}" for n in range(1200)]
    with Journal(path) as journal:
        for n, incident in enumerate(ids):
            fire(journal, incident, T0 + n)
            if n % 3 == 0:
                resolve(journal, incident, T0 + 5000 + n)
    with InstanceStore.open_readonly(path) as store:
        found = store.resolved_at(ids)
    assert found == {i: T0 + 5000 + n for n, i in enumerate(ids) if n % 3 == 0}


# -- the file -----------------------------------------------------------------------------------


def test_the_store_creates_a_private_journal_the_journal_can_open(path: Path) -> None:
    InstanceStore.open(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert version(path) == len(MIGRATIONS) == 5
    with Journal(path) as journal:
        assert journal.incidents() == []


def test_a_journal_and_a_store_write_the_same_file_from_two_threads(path: Path) -> None:
    journal = Journal(path)
    store = InstanceStore.open(path)
    failures: list[BaseException] = []
    start = threading.Barrier(2)

    def launches() -> None:
        try:
            start.wait()
            for n in range(60):
                assert store.add(managed(n), T0 + n)
                store.set_state(managed(n).instance_id, "running", T0 + n + 1)
        except BaseException as exc:
            failures.append(exc)

    def incidents() -> None:
        try:
            start.wait()
            for n in range(60):
                fire(journal, f"inc-{n}", T0 + n)
                resolve(journal, f"inc-{n}", T0 + n + 30)
                journal.note_action("mem", "kill", n, T0 + n)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=launches), threading.Thread(target=incidents)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert failures == []
        assert len(store.live()) == 60
        assert {m.state for m in store.all()} == {"running"}
        assert len(journal.incidents()) == 60
        assert journal.actions_since(T0) == 60
        assert store.resolved_at(f"inc-{n}" for n in range(60)) == {
            f"inc-{n}": T0 + n + 30 for n in range(60)
        }
    finally:
        store.close()
        journal.close()


def test_readonly_reads_while_the_daemon_writes_and_refuses_writes(path: Path) -> None:
    with InstanceStore.open(path) as daemon:
        daemon.add(managed(1), T0)
        view = InstanceStore.open_readonly(path)
        try:
            assert view.all() == [managed(1)]
            daemon.set_state(managed(1).instance_id, "running", T0 + 30)
            assert [m.state for m in view.live()] == ["running"]
            with pytest.raises(JournalError, match="cannot write to the journal"):
                view.add(managed(2), T0)
            with pytest.raises(JournalError, match="cannot write to the journal"):
                view.ended(managed(1).instance_id, "terminated", T0, "manual")
            assert view.get(managed(1).instance_id) == dataclasses.replace(
                managed(1), state="running"
            )
        finally:
            view.close()


def test_readonly_of_a_missing_journal_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(JournalError) as caught:
        InstanceStore.open_readonly(tmp_path / "nowhere" / "journal.db")
    assert "no journal at" in caught.value.render()
    assert "hint:" in caught.value.render()
    assert not (tmp_path / "nowhere").exists()


def test_a_version_2_journal_migrates_to_the_newest_and_keeps_its_rows(path: Path) -> None:
    with Journal(path, migrations=MIGRATIONS[:2]) as old:
        fire(old, INCIDENT, T0)
        resolve(old, INCIDENT, T0 + 60)
        old.note_action("mem", "kill", 42, T0)
    assert version(path) == 2
    with pytest.raises(JournalError, match="start the daemon once"):
        InstanceStore.open_readonly(path)  # a view never migrates
    assert version(path) == 2
    with InstanceStore.open(path) as store:
        assert store.all() == []
        assert store.resolved_at([INCIDENT]) == {INCIDENT: T0 + 60}
        assert store.add(managed(1), T0 + 1)
    assert version(path) == len(MIGRATIONS)
    with Journal(path) as journal, InstanceStore.open_readonly(path) as view:
        assert [i.id for i in journal.incidents()] == [INCIDENT]
        assert journal.actions_since(T0) == 1
        assert view.all() == [managed(1)]


def test_a_journal_from_a_newer_gpuwarden_is_refused(path: Path) -> None:
    InstanceStore.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    for opening in (InstanceStore.open, InstanceStore.open_readonly):
        with pytest.raises(JournalError) as caught:
            opening(path)
        text = caught.value.render()
        assert (
            f"{path} was written by a newer gpuwarden (journal schema version "
            f"{len(MIGRATIONS) + 1}; this gpuwarden knows up to {len(MIGRATIONS)})" in text
        )
        assert "hint: upgrade gpuwarden on this host" in text
    assert version(path) == len(MIGRATIONS) + 1  # left as it was


def test_another_file_is_not_a_journal(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database\n" * 300)
    with pytest.raises(JournalError, match="is not a gpuwarden journal"):
        InstanceStore.open(path)
    with pytest.raises(JournalError, match="is not a gpuwarden journal"):
        InstanceStore.open_readonly(path)
    empty = path.with_name("empty.db")
    empty.write_bytes(b"")
    with pytest.raises(JournalError, match=r"not a gpuwarden journal \(an empty file\)"):
        InstanceStore.open_readonly(empty)


def test_a_locked_journal_fails_after_the_timeout(path: Path) -> None:
    store = InstanceStore.open(path, timeout=0.2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        began = time.monotonic()
        with pytest.raises(JournalError) as caught:
            store.add(managed(1), T0)
        assert time.monotonic() - began < 3
        assert f"{path} is locked by another process" in caught.value.render()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.add(managed(1), T0)  # the lock is gone: written now
    assert store.get(managed(1).instance_id) == managed(1)
    store.close()


def test_an_unwritable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(JournalError, match="cannot create the journal"):
        InstanceStore.open(blocker / "journal.db")
