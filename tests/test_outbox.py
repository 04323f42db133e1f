"""The outbox in the journal file: queued once, kept across restarts, marked as delivery goes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpuwarden.journal.journal import Journal, JournalError
from gpuwarden.journal.schema import MIGRATIONS
from gpuwarden.notify.messages import Message
from gpuwarden.notify.outbox import Outbox

T0 = 1_773_457_200.0


def message(n: int = 1, target: str = "oncall", **changes: object) -> Message:
    fields: dict[str, object] = {
        "id": f"msg-{n}",
        "target": target,
        "title": f"[gpuwarden] title {n}",
        "body": f"body {n}",
        "severity": "critical",
        "kind": "open",
        "incidents": ("inc-a", "inc-b"),
        "group": "mem@node",
        "created": T0 + n,
    }
    fields.update(changes)
    return Message(**fields)  # type: ignore[arg-type]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.db"


def test_a_message_is_queued_once_per_target(path: Path) -> None:
    with Outbox(path) as outbox:
        assert outbox.put(message(1)) is True
        assert outbox.put(message(1)) is False  # the same message again: a no-op
        assert outbox.put(message(1, title="changed")) is False
        assert outbox.put(message(1, target="chat")) is True
        [first, second] = outbox.pending()
    assert (first.message_id, first.target, first.title) == (
        "msg-1",
        "oncall",
        "[gpuwarden] title 1",
    )
    assert first.incidents == ("inc-a", "inc-b")
    assert (first.status, first.attempts, first.next_attempt_at) == ("pending", 0, T0 + 1)
    assert (first.severity, first.kind, first.body_format) == ("critical", "open", "text")
    assert second.target == "chat"


def test_due_claim_and_marks(path: Path) -> None:
    with Outbox(path) as outbox:
        for n in (1, 2, 3):
            outbox.put(message(n), T0)
        assert [r.message_id for r in outbox.due(T0, limit=2)] == ["msg-1", "msg-2"]
        assert outbox.due(T0 - 1) == []
        key = ("msg-1", "oncall")
        assert outbox.claim(key) is True
        assert outbox.claim(key) is False  # already sending
        outbox.mark_retry(key, "connection refused", T0 + 5)
        row = outbox.get(key)
        assert row is not None
        assert (row.status, row.attempts, row.last_error) == ("pending", 1, "connection refused")
        assert [r.message_id for r in outbox.due(T0)] == ["msg-2", "msg-3"]
        assert [r.message_id for r in outbox.due(T0 + 5)] == ["msg-2", "msg-3", "msg-1"]
        assert outbox.next_due() == T0
        outbox.claim(key)
        outbox.mark_sent(key, T0 + 6)
        outbox.claim(("msg-2", "oncall"))
        outbox.mark_failed(("msg-2", "oncall"), "HTTP 500")
        outbox.claim(("msg-3", "oncall"))
        outbox.mark_dropped(("msg-3", "oncall"), "no such target")
        assert outbox.counts() == {"pending": 0, "sending": 0, "sent": 1, "failed": 1, "dropped": 1}
        assert [r.message_id for r in outbox.failed()] == ["msg-2"]
        assert outbox.get(key).sent_at == T0 + 6  # type: ignore[union-attr]
        assert outbox.next_due() is None
        assert outbox.prune(T0 + 1) == 2  # sent and dropped go; failed stays
        assert outbox.counts()["failed"] == 1


def test_marking_an_unknown_message_is_an_error(path: Path) -> None:
    from gpuwarden.journal.schema import JournalError

    with Outbox(path) as outbox, pytest.raises(JournalError, match="no outbox message"):
        outbox.mark_sent(("nope", "oncall"), T0)


def test_messages_survive_a_restart_and_sending_goes_back_to_pending(path: Path) -> None:
    outbox = Outbox(path)
    outbox.put(message(1), T0)
    outbox.put(message(2), T0)
    outbox.claim(("msg-1", "oncall"))  # the daemon dies while sending this one
    outbox.close()
    with Outbox(path) as again:
        assert [r.status for r in again.pending()] == ["sending", "pending"]
        assert again.due(T0) == [again.get(("msg-2", "oncall"))]
        assert again.recover() == 1
        assert [r.message_id for r in again.due(T0)] == ["msg-1", "msg-2"]
        assert again.get(("msg-1", "oncall")).attempts == 1  # type: ignore[union-attr]


def test_a_v1_journal_migrates_forward_and_keeps_its_incidents(path: Path) -> None:
    with Journal(path, migrations=MIGRATIONS[:1]) as old:
        old.note_action("mem", "kill", 42, T0)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()
    with Outbox(path) as outbox:
        assert outbox.put(message(1)) is True
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) >= 2
    conn.close()
    with Journal(path) as journal, Outbox(path) as outbox:  # both open the same file at once
        assert journal.actions_since(T0) == 1
        journal.note_action("mem", "kill", 43, T0 + 1)
        assert outbox.put(message(2)) is True
        assert len(outbox.pending()) == 2


def test_stored_errors_are_redacted_and_bounded(path: Path) -> None:
    with Outbox(path) as outbox:
        outbox.put(message(1), T0)
        outbox.claim(("msg-1", "oncall"))
        outbox.mark_retry(
            ("msg-1", "oncall"),
            "POST https://bot:hunter2secret@x/y?token=abc123\n" + "x" * 5000,
            T0,
        )
        row = outbox.get(("msg-1", "oncall"))
    assert row is not None
    assert row.last_error is not None
    assert "hunter2secret" not in row.last_error
    assert "abc123" not in row.last_error
    assert "\n" not in row.last_error
    assert len(row.last_error) < 1200


def test_a_report_reads_the_messages_of_one_incident_and_writes_nothing(path: Path) -> None:
    with Outbox(path) as outbox:
        outbox.put(message(1))  # about inc-a and inc-b, grouped
        outbox.put(message(2, incidents=("inc-b",)))
        outbox.put(message(3, incidents=("inc_a",)))  # "_" is no wildcard
        outbox.put(message(4, incidents=()))
    with Outbox.open_readonly(path) as view:
        assert [r.message_id for r in view.about("inc-a")] == ["msg-1"]
        assert [r.message_id for r in view.about("inc-b")] == ["msg-1", "msg-2"]
        assert [r.message_id for r in view.about("inc_a")] == ["msg-3"]
        assert view.about("inc") == []
        with pytest.raises(JournalError, match="cannot write to the journal"):
            view.put(message(5))
