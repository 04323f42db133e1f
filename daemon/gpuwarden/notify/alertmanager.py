"""The Alertmanager client: posting alerts (``/api/v2/alerts``) and reading silences.

``Delivery`` is what the sender calls, instead of apprise, for a row of an Alertmanager
target: it posts the row's alert to every URL of the target (the instances of a cluster each
need every alert; one that accepts is enough for the row to count as sent) and skips a row
the outbox holds a newer one for (a firing post delivered after the resolve post would fire
the alert again). Failures are retried by the sender like any other delivery: the outbox keeps
the alerts while Alertmanager is down.

``SilenceWatch`` asks Alertmanager which of this host's alerts a silence covers, for targets
with ``ack_on_silence``: each such incident is acknowledged once (``take``), as if someone
had run ``gpuwarden ack`` — a rule with ``pause_on_ack`` climbs no further.

Credentials in a URL (``http://user:password@host:9093``) go in an ``Authorization`` header,
never in a log line; every error is redacted before it is logged or stored.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuwarden.clock import Clock, SystemClock
from gpuwarden.notify.alerts import iso, posted
from gpuwarden.notify.delivery import SCRUBBER, Resolver, UrlResult, clean_detail
from gpuwarden.notify.messages import clean
from gpuwarden.notify.outbox import Outbox, OutboxRow, clean_error
from gpuwarden.notify.routing import redact_url

if TYPE_CHECKING:
    import urllib.request

log = logging.getLogger("gpuwarden.notify")

MAX_ANSWER = 4 * 1024 * 1024  # bytes read of one answer (a fleet's alerts; nothing larger)


class AlertmanagerError(Exception):
    """A call failed; the message is redacted and one line."""


def _request(base: str, path: str, *, data: bytes | None = None) -> urllib.request.Request:
    """A request to ``base`` + ``path``, with a URL's user and password as Basic auth."""
    # Here, not at the top: urllib.request loads http.client, email and ssl (~1.4 MiB), which a
    # daemon without an Alertmanager target does not need (apprise, when used, loads them too).
    import urllib.request

    parts = urllib.parse.urlsplit(base.strip())
    if parts.scheme not in ("http", "https"):
        raise AlertmanagerError(f"{redact_url(base)}: not an http:// or https:// URL")
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port is not None:
        netloc += f":{parts.port}"
    path, _, query = path.partition("?")
    url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + path, query, ""))
    # http or https only (checked above)
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")  # noqa: S310
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    return request


def call(base: str, path: str, *, body: Any = None, timeout: float = 10.0) -> Any:
    """One call to the Alertmanager at ``base``: the JSON answer (None when empty).
    Raises ``AlertmanagerError`` with a redacted, one-line message."""
    data = None if body is None else json.dumps(body).encode()
    request = _request(base, path, data=data)
    where = f"{redact_url(base)}{path.partition('?')[0]}"
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
            raw = answer.read(MAX_ANSWER)
    except urllib.error.HTTPError as exc:
        said = exc.read(300).decode("utf-8", "replace")
        raise AlertmanagerError(clean_detail(f"{where}: HTTP {exc.code}: {said}", [base])) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AlertmanagerError(clean_detail(f"{where}: {reason}", [base])) from None
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise AlertmanagerError(f"{where}: the answer is not JSON") from None


def post_alerts(
    urls: Sequence[str], alerts: list[dict[str, Any]], timeout: float
) -> tuple[bool, str]:
    """Post ``alerts`` to every Alertmanager of ``urls``: (some accepted them, what failed)."""
    SCRUBBER.learn(urls)
    if not urls:
        return False, "the target has no URLs"
    failed: list[str] = []
    for url in urls:
        try:
            call(url, "/api/v2/alerts", body=alerts, timeout=timeout)
        except AlertmanagerError as exc:
            failed.append(str(exc))
    if len(failed) == len(urls):
        return False, "; ".join(failed)
    if failed:
        log.warning(
            "alertmanager post: %d of %d instances failed: %s",
            len(failed),
            len(urls),
            "; ".join(failed),
        )
    return True, "sent"


class Delivery:
    """The sender's delivery for Alertmanager targets (``Sender(deliverers=…)``)."""

    def __init__(self, outbox: Outbox, clock: Clock | None = None) -> None:
        self.outbox = outbox
        self.clock: Clock = clock or SystemClock()

    def __call__(self, row: OutboxRow, urls: list[str], timeout: float) -> tuple[bool, str]:
        if self.outbox.newer(row):
            return True, "superseded by a newer state of the alert"
        try:
            alert = posted(row.body, self.clock.now())
        except ValueError as exc:
            return False, str(exc)
        return post_alerts(urls, [alert], timeout)


TEST_ALERT = "GpuwardenTest"
TEST_FOR = 300.0  # seconds a test alert fires (it resolves by itself)


def send_test(
    target: str, resolver: Resolver, *, host: str, timeout: float = 10.0
) -> list[UrlResult]:
    """``gpuwarden notify-test`` for an Alertmanager target: one test alert
    (``alertname=GpuwardenTest``, severity ``info``, firing for five minutes) to each URL."""
    try:
        urls = resolver(target)
    except KeyError:
        return [UrlResult(target, False, f"no notify target {target!r} in the config")]
    except Exception as exc:
        return [UrlResult(target, False, clean_error(f"cannot read the target's URLs: {exc}"))]
    if not urls:
        return [UrlResult(target, False, "the target has no URLs")]
    now = time.time()
    alert = {
        "labels": {"alertname": TEST_ALERT, "severity": "info", "host": host},
        "annotations": {
            "summary": f"a test alert from gpuwarden on {host} for target {target}",
        },
        "startsAt": iso(now),
        "endsAt": iso(now + TEST_FOR),
    }
    out = []
    for url in urls:
        ok, detail = post_alerts([url], [alert], timeout)
        out.append(UrlResult(redact_url(url), ok, detail))
    return out


def silenced(base: str, host: str, *, timeout: float = 10.0) -> dict[str, list[str]]:
    """This host's alerts that a silence covers, as incident id → silence ids."""
    query = urllib.parse.urlencode(
        [
            ("filter", f'host="{host}"'),
            ("silenced", "true"),
            ("inhibited", "true"),
            ("active", "false"),
            ("unprocessed", "false"),
        ]
    )
    answer = call(base, f"/api/v2/alerts?{query}", timeout=timeout)
    found: dict[str, list[str]] = {}
    for alert in answer if isinstance(answer, list) else ():
        if not isinstance(alert, dict):
            continue
        status = alert.get("status") or {}
        by = [str(s) for s in status.get("silencedBy") or ()]
        incident = (alert.get("annotations") or {}).get("incident")
        if by and isinstance(incident, str) and incident:
            found.setdefault(incident, []).extend(by)
    return found


def silence_note(base: str, silence: str, *, timeout: float = 10.0) -> str:
    """Who made a silence and why, for the log (their text, cleaned)."""
    try:
        found = call(base, f"/api/v2/silence/{urllib.parse.quote(silence)}", timeout=timeout)
    except AlertmanagerError:
        return f"silence {silence}"
    if not isinstance(found, dict):
        return f"silence {silence}"
    who = clean(found.get("createdBy") or "someone", 80)
    why = clean(found.get("comment") or "", 200)
    return f"silence {silence} by {who}" + (f": {why}" if why else "")


class SilenceWatch:
    """Reads silences of this host's alerts from each Alertmanager target with
    ``ack_on_silence``, every ``poll`` seconds in its own thread (``start``), or when asked
    (``poll_once``). ``take()`` hands over each silenced incident once."""

    def __init__(
        self,
        targets: Mapping[str, Callable[[], list[str]]],
        host: str,
        *,
        poll: float = 15.0,
        timeout: float = 10.0,
    ) -> None:
        self.targets = dict(targets)  # target name → its URLs, resolved when asked
        self.host = host
        self.poll = poll
        self.timeout = timeout
        self._lock = threading.Lock()
        self._found: dict[str, str] = {}  # incident → what silenced it, not yet taken
        self._taken: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> int:
        """Ask every target once; how many incidents were newly found silenced."""
        new = 0
        for name, urls_of in self.targets.items():
            try:
                urls = urls_of()
            except Exception as exc:  # a secret that cannot be read: said once per poll
                log.warning("alertmanager %s: cannot read its URLs: %s", name, exc)
                continue
            new += self._ask(name, urls)
        return new

    def _ask(self, name: str, urls: list[str]) -> int:
        errors = []
        for url in urls:  # the instances of a cluster share their silences: one answer will do
            try:
                found = silenced(url, self.host, timeout=self.timeout)
            except AlertmanagerError as exc:
                errors.append(str(exc))
                continue
            new = 0
            for incident, silences in found.items():
                with self._lock:
                    if incident in self._taken or incident in self._found:
                        continue
                note = silence_note(url, silences[0], timeout=self.timeout)
                with self._lock:
                    self._found[incident] = f"Alertmanager {note}"
                new += 1
            return new
        if errors:
            log.warning("alertmanager %s: cannot read silences: %s", name, "; ".join(errors))
        return 0

    def take(self) -> dict[str, str]:
        """Incidents found silenced since the last call (incident → who silenced it)."""
        with self._lock:
            found, self._found = self._found, {}
            self._taken.update(found)
        return found

    def start(self) -> None:
        if self._thread is not None or not self.targets:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpuwarden-silences", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.poll_once()
            except Exception:  # a bug here must not end the watch
                log.exception("alertmanager silence watch failed")

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
