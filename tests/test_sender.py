"""The sender against real receivers: an HTTP server for ``json://``, aiosmtpd for ``mailto://``."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuwarden.clock import SimClock
from gpuwarden.notify.delivery import send_test
from gpuwarden.notify.messages import Message
from gpuwarden.notify.outbox import Outbox
from gpuwarden.notify.sender import RetryPolicy, Sender
from tests.notify_receivers import JsonReceiver, SmtpReceiver

TOKEN = "s3cr3tT0kenXYZ"


def msg(n: int, target: str = "oncall", created: float = 0.0, **changes: object) -> Message:
    fields: dict[str, object] = {
        "id": f"m{n}",
        "target": target,
        "title": f"title m{n}",
        "body": f"body of m{n}",
        "severity": "critical",
        "kind": "open",
        "incidents": ("inc-1",),
        "group": "g",
        "created": created,
    }
    fields.update(changes)
    return Message(**fields)  # type: ignore[arg-type]


def wait_for(check: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


@pytest.fixture
def receiver() -> Iterator[JsonReceiver]:
    r = JsonReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


def urls_of(table: dict[str, list[str]]) -> Callable[[str], list[str]]:
    return lambda target: table[target]


FAST = RetryPolicy(base=0.02, cap=0.1, jitter=0.0, max_attempts=1000, max_age=600)


def test_delivers_to_a_json_receiver(path: Path, receiver: JsonReceiver) -> None:
    clock = SimClock()
    with Outbox(path) as outbox:
        outbox.put(msg(1, created=clock.now()))
        outbox.put(msg(2, created=clock.now(), kind="resolve", severity="info", title="done"))
        sender = Sender(outbox, urls_of({"oncall": [receiver.url()]}), clock=clock)
        assert sender.deliver_due() == 2
        assert outbox.counts()["sent"] == 2
        assert outbox.get(("m1", "oncall")).sent_at == clock.now()  # type: ignore[union-attr]
    [first, second] = receiver.received
    assert (first["title"], first["message"], first["type"]) == (
        "title m1",
        "body of m1",
        "failure",
    )
    assert (second["title"], second["type"]) == ("done", "success")
    assert sender.sent == 2


def test_delivers_email_to_an_smtp_receiver(path: Path) -> None:
    smtp = SmtpReceiver().start()
    try:
        with Outbox(path) as outbox:
            outbox.put(msg(1, target="mail"))
            sender = Sender(outbox, urls_of({"mail": [smtp.url()]}))
            sender.deliver_due()
            assert outbox.counts()["sent"] == 1
        [mail] = smtp.messages
    finally:
        smtp.stop()
    assert mail["Subject"] == "title m1"
    assert mail["To"] == "oncall@example.org"
    assert "body of m1" in str(mail.get_payload(decode=False))


def test_backoff_doubles_up_to_the_cap_with_jitter_below(
    path: Path, receiver: JsonReceiver
) -> None:
    receiver.status = 500
    clock = SimClock()
    policy = RetryPolicy(base=5, cap=40, jitter=0.0, max_attempts=100, max_age=10_000)
    with Outbox(path) as outbox:
        outbox.put(msg(1, created=clock.now()))
        sender = Sender(outbox, urls_of({"oncall": [receiver.url()]}), clock=clock, policy=policy)
        delays = []
        for _ in range(6):
            assert sender.deliver_due() == 1
            row = outbox.get(("m1", "oncall"))
            assert row is not None
            delays.append(row.next_attempt_at - clock.now())
            assert sender.deliver_due() == 0  # not due yet: nothing is tried
            clock.advance(row.next_attempt_at - clock.now())
        assert delays == [5, 10, 20, 40, 40, 40]
        assert row is not None
        assert row.status == "pending"
        assert row.attempts == 6
        assert "500" in (row.last_error or "")
    jittered = RetryPolicy(base=5, cap=600, jitter=0.2)
    rng = random.Random(7)
    for attempt, plain in ((1, 5.0), (3, 20.0), (12, 600.0)):
        for _ in range(50):
            assert plain * 0.8 <= jittered.delay(attempt, rng) <= plain


def test_after_the_budget_the_fallback_is_tried_once(path: Path, receiver: JsonReceiver) -> None:
    dead = JsonReceiver().start()
    dead.stop()  # nothing listens on its port now
    clock = SimClock()
    policy = RetryPolicy(base=1, cap=1, jitter=0.0, max_attempts=3, max_age=10_000)
    table = {"chat": [dead.url()], "pager": [receiver.url()], "loop": [dead.url()]}
    fallbacks = {"chat": "pager", "pager": "chat", "loop": "chat"}
    with Outbox(path) as outbox:
        outbox.put(msg(1, target="chat", created=clock.now()))
        sender = Sender(outbox, urls_of(table), fallback=fallbacks.get, clock=clock, policy=policy)
        for _ in range(3):
            sender.deliver_due()
            clock.advance(1)
        failed = outbox.get(("m1", "chat"))
        assert failed is not None
        assert (failed.status, failed.attempts) == ("failed", 3)
        assert "connection" in (failed.last_error or "").lower()
        sender.deliver_due()  # the copy for the fallback target
        copy = outbox.get(("m1", "pager"))
        assert copy is not None
        assert (copy.status, copy.fallback_of) == ("sent", "chat")
        assert receiver.titles() == ["title m1"]
        assert sender.failed == 1
        # a fallback copy that fails too is not passed on again (no loops)
        outbox.put(msg(2, target="loop", created=clock.now()))
        for _ in range(10):
            sender.deliver_due()
            clock.advance(1)
        assert outbox.get(("m2", "chat")).status == "failed"  # type: ignore[union-attr]
        assert outbox.get(("m2", "chat")).fallback_of == "loop"  # type: ignore[union-attr]
        assert outbox.get(("m2", "pager")) is None
        assert outbox.counts()["pending"] == 0


def test_the_time_budget_also_ends_retries(path: Path, receiver: JsonReceiver) -> None:
    receiver.status = 500
    clock = SimClock()
    policy = RetryPolicy(base=10, cap=10, jitter=0.0, max_attempts=100, max_age=25)
    with Outbox(path) as outbox:
        outbox.put(msg(1, created=clock.now()))
        sender = Sender(outbox, urls_of({"oncall": [receiver.url()]}), clock=clock, policy=policy)
        for _ in range(4):
            sender.deliver_due()
            clock.advance(10)
        row = outbox.get(("m1", "oncall"))
        assert row is not None
        # tried at 0, 10, 20 (age < 25: retry), 30 (age >= 25: the budget is spent)
        assert (row.status, row.attempts) == ("failed", 4)


def test_an_outage_across_a_restart_loses_nothing_and_duplicates_nothing(
    path: Path, receiver: JsonReceiver
) -> None:
    receiver.stop()  # the chat service goes down
    table = {"oncall": [receiver.url()]}
    outbox = Outbox(path)
    sender = Sender(outbox, urls_of(table), policy=FAST, poll=0.05)
    sender.start()
    for n in range(10):
        outbox.put(msg(n, created=time.time()))
        sender.wake()
    wait_for(lambda: sender.retried >= 3)
    assert sender.stop(timeout=5)
    outbox.close()  # the daemon stops while the service is still down

    outbox = Outbox(path)  # ... and starts again
    assert len(outbox.pending()) == 10
    assert outbox.counts()["sent"] == 0
    for n in range(10):
        assert (
            outbox.put(msg(n, created=time.time())) is False
        )  # the restarted run loop makes the same messages
    sender = Sender(outbox, urls_of(table), policy=FAST, poll=0.05)
    sender.start()
    time.sleep(0.1)
    receiver.start()  # the service is back, on the same port
    try:
        wait_for(lambda: outbox.counts()["sent"] == 10)
        time.sleep(0.2)  # anything that would arrive twice has time to
    finally:
        assert sender.stop(timeout=5)
        outbox.close()
    titles = receiver.titles()
    assert sorted(titles) == sorted(f"title m{n}" for n in range(10))
    assert len(titles) == len(set(titles))


def test_a_message_in_flight_at_a_crash_is_sent_after_restart(
    path: Path, receiver: JsonReceiver
) -> None:
    with Outbox(path) as outbox:
        outbox.put(msg(1))
        outbox.claim(("m1", "oncall"))  # SIGKILL while sending
    with Outbox(path) as outbox:
        sender = Sender(outbox, urls_of({"oncall": [receiver.url()]}), poll=0.05)
        sender.start()
        wait_for(lambda: outbox.counts()["sent"] == 1)
        sender.stop()
    assert receiver.titles() == ["title m1"]


def test_a_sent_message_put_again_is_not_sent_again(path: Path, receiver: JsonReceiver) -> None:
    with Outbox(path) as outbox:
        sender = Sender(outbox, urls_of({"oncall": [receiver.url()]}))
        outbox.put(msg(1))
        sender.deliver_due()
        assert outbox.put(msg(1)) is False
        assert sender.deliver_due() == 0
    assert receiver.titles() == ["title m1"]


def test_a_target_that_hangs_does_not_hold_back_the_others(
    path: Path, receiver: JsonReceiver
) -> None:
    release = threading.Event()

    def resolve(target: str) -> list[str]:
        if target == "stuck":
            release.wait(10)  # as slow as a service that never answers
        return [receiver.url(target)]

    with Outbox(path) as outbox:
        sender = Sender(outbox, resolve, poll=0.05)
        sender.start()
        outbox.put(msg(1, target="stuck"))
        sender.wake()
        time.sleep(0.1)
        for n in (2, 3):
            outbox.put(msg(n, target="fine"))
        sender.wake()
        wait_for(lambda: outbox.counts()["sent"] == 2)
        assert outbox.get(("m1", "stuck")).status == "sending"  # type: ignore[union-attr]
        release.set()
        wait_for(lambda: outbox.counts()["sent"] == 3)
        assert sender.stop()
    assert sorted(d["path"] for d in receiver.received) == ["/fine", "/fine", "/stuck"]


def test_a_target_gone_from_the_config_drops_its_messages(path: Path) -> None:
    with Outbox(path) as outbox:
        outbox.put(msg(1, target="removed"))
        sender = Sender(outbox, urls_of({}))
        sender.deliver_due()
        row = outbox.get(("m1", "removed"))
    assert row is not None
    assert row.status == "dropped"
    assert "no notify target 'removed'" in (row.last_error or "")


def test_a_token_never_reaches_logs_errors_or_the_file(
    path: Path, receiver: JsonReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    dead = JsonReceiver().start()
    dead.stop()
    table = {
        "oncall": [f"json://bot:{TOKEN}@127.0.0.1:{dead.port}/hooks/{TOKEN}?x={TOKEN}"],
        "ok": [f"json://127.0.0.1:{receiver.port}/hooks/{TOKEN}"],
    }
    clock = SimClock()
    policy = RetryPolicy(base=1, cap=1, jitter=0.0, max_attempts=2)
    with Outbox(path) as outbox:
        outbox.put(msg(1, created=clock.now()))
        outbox.put(msg(2, target="ok", created=clock.now()))
        sender = Sender(outbox, urls_of(table), clock=clock, policy=policy)
        for _ in range(3):
            sender.deliver_due()
            clock.advance(1)
        row = outbox.get(("m1", "oncall"))
        assert row is not None
        assert row.status == "failed"
        assert outbox.get(("m2", "ok")).status == "sent"  # type: ignore[union-attr]
    assert row.last_error
    assert TOKEN not in row.last_error
    assert caplog.records  # the sender did log what happened
    assert any("notify failed" in r.getMessage() for r in caplog.records)
    assert all(TOKEN not in r.getMessage() for r in caplog.records)
    assert TOKEN not in caplog.text
    for file in path.parent.iterdir():
        assert TOKEN.encode() not in file.read_bytes(), file.name
    assert receiver.received[0]["path"] == f"/hooks/{TOKEN}"  # it did use the real URL


def test_send_test_reports_each_url(receiver: JsonReceiver) -> None:
    dead = JsonReceiver().start()
    dead.stop()
    table = {"oncall": [receiver.url(), f"json://127.0.0.1:{dead.port}/{TOKEN}", "nope://x"]}
    live, down, bad = send_test("oncall", urls_of(table), timeout=5)
    assert live == (f"json://127.0.0.1:{receiver.port}/***", True, "sent")
    assert down.url == f"json://127.0.0.1:{dead.port}/***"
    assert down.ok is False
    assert "connection" in down.detail.lower()
    assert TOKEN not in down.detail
    assert "Traceback" not in down.detail
    assert bad.ok is False
    assert "not a valid apprise URL" in bad.detail
    assert len(receiver.received) == 1
    [missing] = send_test("nobody", urls_of(table))
    assert missing.ok is False
    assert "no notify target 'nobody'" in missing.detail


def test_a_target_without_its_secret_is_said_once_then_retried_quietly(
    path: Path,
    receiver: JsonReceiver,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuwarden.notify.delivery import SCRUBBER
    from gpuwarden.notify.routing import SecretError

    # The process-wide scrubber masks every URL part it has seen; an earlier test's receiver
    # path (".../oncall") would mask the target's name in the line this test reads.
    monkeypatch.setattr(SCRUBBER, "_secrets", set())

    secret: dict[str, str] = {}

    def urls(target: str) -> list[str]:
        if "url" not in secret:
            raise SecretError(f"notify target {target!r} URL 1: environment variable X is not set")
        return [secret["url"]]

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    caplog.set_level(logging.DEBUG, logger="gpuwarden.notify.sender")
    clock = SimClock()
    with Outbox(path) as outbox:
        outbox.put(msg(1, created=clock.now()))
        sender = Sender(outbox, urls, clock=clock, policy=FAST)
        for _ in range(4):
            sender.deliver_due()
            clock.advance(1)
        assert warnings() == [
            "notify target=oncall is not configured: cannot read the target's URLs: notify "
            "target 'oncall' URL 1: environment variable X is not set; its messages wait in "
            "the outbox and are retried quietly until it is"
        ]
        assert sum("notify retry" in r.getMessage() for r in caplog.records) == 4  # at debug
        secret["url"] = receiver.url()  # the secret is put in place: delivered at the next try
        sender.deliver_due()
        assert outbox.counts()["sent"] == 1
    assert receiver.titles() == ["title m1"]


def test_a_target_reported_unresolved_at_start_is_not_warned_about_again(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gpuwarden.notify.routing import SecretError

    def urls(target: str) -> list[str]:
        raise SecretError("missing")

    caplog.set_level(logging.DEBUG, logger="gpuwarden.notify.sender")
    clock = SimClock()
    with Outbox(path) as outbox:
        outbox.put(msg(1, created=clock.now()))
        sender = Sender(outbox, urls, clock=clock, policy=FAST, unresolved=["oncall"])
        for _ in range(3):
            sender.deliver_due()
            clock.advance(1)
        assert outbox.get(("m1", "oncall")).attempts == 3  # type: ignore[union-attr]
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
