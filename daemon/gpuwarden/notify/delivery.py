"""One delivery with apprise, and keeping the URLs' secrets out of everything it says.

``deliver`` sends one message to a target's URLs with one ``Apprise`` and returns (ok, a
redacted detail); ``send_test`` is ``gpuwarden notify-test``, one message per URL. The sender
(``sender.py``) calls ``deliver`` from its workers and decides what a failure means (retry,
fallback). URLs are never stored or logged: apprise's own logger is kept out of ours (its
debug lines carry URLs), urllib3's request lines are scrubbed (``SCRUBBER`` learns the secret
pieces of every URL used), and every error is redacted (``clean_detail``) before it is logged
or stored.
"""

from __future__ import annotations

import logging
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

from gpuwarden.journal.records import redact_text
from gpuwarden.notify.outbox import clean_error
from gpuwarden.notify.routing import redact_url

if TYPE_CHECKING:
    import apprise

Resolver = Callable[[str], list[str]]
"""Target name → its apprise URLs; raises ``KeyError`` for a target not in the config."""

REDACTED = "***"
_HOST = re.compile(r"(?i)^(localhost|[0-9.]+|\[[0-9a-f:.]+\]|(?:[a-z0-9-]+\.)+[a-z]{2,})$")


# -- redaction --------------------------------------------------------------------------------


def secret_parts(url: str) -> set[str]:
    """The pieces of ``url`` that may be secret (user, password, a host that is no host name,
    path segments, query values), each as written and percent-decoded."""
    found: set[str] = set()
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:
        return {url}
    userinfo, _, hostport = parts.netloc.rpartition("@")
    found.update(userinfo.split(":"))
    if not _HOST.match(hostport.partition(":")[0]):
        found.add(hostport)
        found.update(hostport.split(":"))
    found.update(parts.path.split("/"))
    found.update(v for _, v in urllib.parse.parse_qsl(parts.query))
    decoded = {urllib.parse.unquote(p) for p in found}
    return {p for p in found | decoded if len(p) >= 6}


class Scrubber(logging.Filter):
    """Masks the secret pieces of every URL the sender has used in log records (installed on
    apprise's logger and on urllib3's request logger, whose debug lines name the request path,
    where webhook tokens live). It never drops a record: apprise reads its own records back
    to report what went wrong."""

    def __init__(self) -> None:
        super().__init__()
        self._secrets: set[str] = set()
        self._lock = threading.Lock()

    def learn(self, urls: Iterable[str]) -> None:
        with self._lock:
            for url in urls:
                self._secrets |= secret_parts(url)

    def scrub(self, text: str) -> str:
        with self._lock:
            secrets = sorted(self._secrets, key=len, reverse=True)
        for secret in secrets:
            text = text.replace(secret, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        clean = redact_text(self.scrub(text))
        if clean != text:
            record.msg, record.args = clean, None
        return True


SCRUBBER = Scrubber()
_quiet = threading.Lock()
_QUIETED = threading.Event()


def quiet_apprise() -> None:
    """Keep apprise's log lines (they print URLs) out of ours, and scrub the secrets out of
    them and out of urllib3's (for handlers attached to those loggers directly); idempotent.
    What apprise says about a failure still reaches us through its result, redacted."""
    with _quiet:
        if _QUIETED.is_set():
            return
        quiet = logging.getLogger("apprise")
        quiet.propagate = False
        quiet.addHandler(logging.NullHandler())
        quiet.addFilter(SCRUBBER)  # for any handler attached to apprise's logger directly
        logging.getLogger("urllib3.connectionpool").addFilter(SCRUBBER)
        _QUIETED.set()


# -- one delivery -----------------------------------------------------------------------------


class UrlResult(NamedTuple):
    url: str  # redacted
    ok: bool
    detail: str


def notify_type(severity: str, kind: str) -> str:
    if kind.startswith("resolve"):
        return "success"
    return {"critical": "failure", "warning": "warning"}.get(severity, "info")


def _detail(result: apprise.AppriseResult, urls: Iterable[str]) -> str:
    said = [e.message for e in result.logs() if e.level in ("WARNING", "ERROR", "CRITICAL")]
    text = "; ".join(dict.fromkeys(said)) or f"apprise: {result.status.name.lower()}"
    return clean_detail(text, urls)


def clean_detail(text: str, urls: Iterable[str]) -> str:
    """``text`` with each of ``urls`` redacted and every secret piece masked, fit to store."""
    pieces: set[str] = set()
    for url in urls:
        pieces |= secret_parts(url)
        text = text.replace(url, redact_url(url))
    for piece in sorted(pieces, key=len, reverse=True):
        text = text.replace(piece, REDACTED)
    return clean_error(SCRUBBER.scrub(text))


def deliver(
    urls: list[str], title: str, body: str, kind: str, body_format: str, timeout: float
) -> tuple[bool, str]:
    """Send one message to all of ``urls`` with one ``Apprise``; (ok, redacted detail)."""
    quiet_apprise()
    import apprise  # here, not at the top: loading its plugins takes a quarter second

    from gpuwarden.notify.plugins import load_plugins

    SCRUBBER.learn(urls)
    load_plugins(urls)  # only the plugins these URLs need (usually warm already)
    sender = apprise.Apprise()
    for number, url in enumerate(urls, start=1):
        if not sender.add(url):
            return False, f"URL {number} ({redact_url(url)}) is not a valid apprise URL"
    if not urls:
        return False, "the target has no URLs"
    try:
        result = sender.notify(
            body=body, title=title, notify_type=kind, body_format=body_format, timeout=timeout
        )
    except Exception as exc:  # apprise should not raise; a plugin bug must not kill a worker
        return False, clean_detail(f"{type(exc).__name__}: {exc}", urls)
    if result:
        return True, "sent"
    return False, _detail(result, urls)


def send_test(
    target: str, resolver: Resolver, *, timeout: float = 10.0, title: str | None = None
) -> list[UrlResult]:
    """``gpuwarden notify-test``: one test message to each of the target's URLs, each with its
    own ``Apprise``; one result per URL (its redacted form, ok, what went wrong)."""
    try:
        urls = resolver(target)
    except KeyError:
        return [UrlResult(target, False, f"no notify target {target!r} in the config")]
    except Exception as exc:
        return [UrlResult(target, False, clean_error(f"cannot read the target's URLs: {exc}"))]
    if not urls:
        return [UrlResult(target, False, "the target has no URLs")]
    heading = title or f"gpuwarden test message for target {target}"
    body = "If you can read this, gpuwarden can reach you through this URL."
    out: list[UrlResult] = []
    for url in urls:
        ok, detail = deliver([url], heading, body, "info", "text", timeout)
        out.append(UrlResult(redact_url(url), ok, detail))
    return out
