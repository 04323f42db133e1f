"""Routing: severity floors, quiet hours, fallbacks, secrets read through injected I/O, and
URLs shown without their secrets."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwarden.config import Config, Notify, NotifyTarget, Secret
from gpuwarden.notify import routing
from gpuwarden.notify.notifier import Notifier

UTC = datetime.UTC


def at(day: int, hour: int, minute: int = 0) -> float:
    """2026-03-{day} hh:mm UTC (the 9th is a Monday)."""
    return datetime.datetime(2026, 3, day, hour, minute, tzinfo=UTC).timestamp()


def notify(**targets: NotifyTarget) -> Notify:
    return Notify(targets=targets)


URL = ("json://127.0.0.1:9/hook",)


def test_min_severity() -> None:
    cfg = notify(pager=NotifyTarget(urls=URL, min_severity="critical"), chat=NotifyTarget(urls=URL))
    assert routing.accepts(cfg, "pager", "critical")
    assert not routing.accepts(cfg, "pager", "warning")
    assert routing.accepts(cfg, "chat", "info")
    assert not routing.accepts(cfg, "nobody", "critical")


def test_quiet_hours_defer_non_critical_until_they_end() -> None:
    target = NotifyTarget(urls=URL, quiet_hours="Mon-Fri 22:00-07:00")
    monday_night = at(9, 23, 30)
    assert routing.release_time(target, "warning", monday_night, UTC) == at(10, 7)
    assert routing.release_time(target, "critical", monday_night, UTC) == monday_night
    tuesday_noon = at(10, 12)
    assert routing.release_time(target, "info", tuesday_noon, UTC) == tuesday_noon


def test_quiet_hours_are_read_in_the_configured_zone() -> None:
    target = NotifyTarget(urls=URL, quiet_hours="22:00-07:00")
    zone = Config(timezone="Europe/Berlin").tz
    # 21:30 UTC is 22:30 in Berlin (CET): quiet there, not in UTC.
    assert routing.release_time(target, "warning", at(9, 21, 30), UTC) == at(9, 21, 30)
    assert routing.release_time(target, "warning", at(9, 21, 30), zone) == at(10, 6)


def test_bad_quiet_hours_are_a_config_error() -> None:
    with pytest.raises(ValueError, match="unknown day"):
        NotifyTarget(urls=URL, quiet_hours="Mon-Fry 22:00-07:00")


def test_the_notifier_holds_deferred_messages_until_release() -> None:
    cfg = Config(
        notify=Notify(
            admin="chat",
            targets={"chat": NotifyTarget(urls=URL, quiet_hours="Mon-Fri 22:00-07:00")},
        )
    )
    notifier = Notifier(cfg, host="node")
    # admin messages are never deferred; route() is what defers group messages
    routes = routing.route(cfg.notify, ("chat", "gone"), severity="warning", now=at(9, 23), tz=UTC)
    assert routes == [routing.Route("chat", at(10, 7))]
    assert notifier.admin("reload failed", "x", at(9, 23))
    assert len(notifier.due(at(9, 23))) == 1


def test_fallback_chain_stops_at_loops() -> None:
    cfg = notify(
        a=NotifyTarget(urls=URL, fallback="b"),
        b=NotifyTarget(urls=URL, fallback="c"),
        c=NotifyTarget(urls=URL, fallback="a"),
        d=NotifyTarget(urls=URL),
    )
    assert routing.fallback_chain(cfg, "a") == ["b", "c"]
    assert routing.fallback(cfg, "a") == "b"
    assert routing.fallback(cfg, "d") is None
    assert routing.fallback(cfg, "missing") is None


# -- secrets ----------------------------------------------------------------------------------

TOKEN = "xoxb-1234-SECRET-TOKEN"


def files(contents: dict[str, str | Exception]) -> Callable[[Path], str]:
    def read(path: Path) -> str:
        value = contents.get(str(path), FileNotFoundError(str(path)))
        if isinstance(value, Exception):
            raise value
        return value

    return read


def test_resolve_urls_reads_values_env_and_files() -> None:
    target = NotifyTarget(
        urls=(
            "json://127.0.0.1:9/a",
            Secret(env="CHAT_URL"),
            Secret(file=Path("/etc/gpuwarden/secrets/chat.url")),
        )
    )
    read = files({"/etc/gpuwarden/secrets/chat.url": "# chat\nslack://a/b/c\n\nntfy://h/t\n"})
    urls = routing.resolve_urls(target, {"CHAT_URL": f"slack://{TOKEN}"}, read, name="chat")
    assert urls == ["json://127.0.0.1:9/a", f"slack://{TOKEN}", "slack://a/b/c", "ntfy://h/t"]


@pytest.mark.parametrize(
    ("secret", "environ", "contents", "expected"),
    [
        (Secret(env="X_URL"), {}, {}, "'pager' URL 1: environment variable X_URL is not set"),
        (Secret(file=Path("/s/u")), {}, {}, "'pager' URL 1: file '/s/u' does not exist"),
        (Secret(file=Path("/s/u")), {}, {"/s/u": PermissionError()}, "permission denied"),
        (Secret(file=Path("/s/u")), {}, {"/s/u": "# nothing\n"}, "file '/s/u' holds no URL"),
        (Secret(env="X_URL"), {"X_URL": "  "}, {}, "environment variable X_URL holds no URL"),
    ],
)
def test_resolve_urls_errors_name_the_target_and_never_the_secret(
    secret: Secret, environ: dict[str, str], contents: dict[str, str | Exception], expected: str
) -> None:
    target = NotifyTarget(urls=(secret,))
    with pytest.raises(routing.SecretError, match=expected) as info:
        routing.resolve_urls(target, environ, files(contents), name="pager")
    assert TOKEN not in str(info.value)


# -- redaction --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("json://127.0.0.1:8080/hook", "json://127.0.0.1:8080/***"),
        ("jsons://user:pa55@example.com/hook?token=abc&x=1", "jsons://***@example.com/***?token=***&x=***"),
        (f"slack://{TOKEN}/B0/C0/#alerts", "slack://***"),
        ("tgram://123456:ABC-DEF/987654", "tgram://***"),
        ("discord://4174216298/JHMHI8qBe7bk2ZwO5U711o3dV_js", "discord://***"),
        ("pagerduty://integration@apikey/", "pagerduty://***"),
        ("ntfys://ntfy.example.com/secret-topic?token=tk_123", "ntfys://ntfy.example.com/***?token=***"),
        ("mailto://bob:hunter2@gmail.com", "mailto://***@gmail.com"),
        ("https://hooks.example.com/services/T/B/X?key=k", "https://hooks.example.com/***?key=***"),
        ("json://host?token=abc", "json://host?token=***"),
        ("json://we!rd host/x", "json://***"),
        ("not a url", "***"),
        ("", "***"),
    ],
)  # fmt: skip
def test_redact_url(url: str, shown: str) -> None:
    out = routing.redact_url(url)
    assert out == shown
    for secret in (
        TOKEN,
        "pa55",
        "hunter2",
        "abc",
        "tk_123",
        "ABC-DEF",
        "JHMHI8qBe7bk2ZwO5U711o3dV_js",
    ):
        assert secret not in out
