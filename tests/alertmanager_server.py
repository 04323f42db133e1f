"""A real Alertmanager on 127.0.0.1 for the tests, with a real webhook receiver behind it.

One Alertmanager per test session (Debian's ``prometheus-alertmanager``; ``alertmanager`` if
that is what is installed), clustering off, its state in a temporary directory. Its one route
groups by ``alertname`` with short waits, so a test sees a notification within seconds; tests
keep out of each other's way by giving their rules names of their own. Import the fixture
where it is needed::

    from tests.alertmanager_server import fixture_alertmanager  # noqa: F401

Without the binary the tests that use it are skipped, saying so; under ``CI=true`` they fail
(.ci/run installs it: a missing system must not pass silently).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

BINARIES = ("prometheus-alertmanager", "alertmanager")
GROUP_WAIT = "3s"  # long enough for three hosts' posts to land in one group, even on a busy box
GROUP_INTERVAL = "2s"
WAIT = 60.0  # seconds a test waits for Alertmanager to do something before it gives up


def binary() -> str | None:
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


def require() -> str:
    """The binary; skips the test without it (fails it under CI=true)."""
    found = binary()
    if found is None:
        reason = (
            "prometheus-alertmanager is not installed "
            "(apt-get -o APT::Sandbox::User=root install prometheus-alertmanager)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    return found


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds")


@dataclass
class Webhook:
    """Records every notification Alertmanager sends (its webhook JSON)."""

    received: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> Webhook:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                doc = json.loads(self.rfile.read(length))
                with hook._lock:
                    hook.received.append(doc)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def about(self, alertname: str) -> list[dict[str, Any]]:
        """The notifications of the group of ``alertname``, in the order they came."""
        with self._lock:
            return [n for n in self.received if n["groupLabels"].get("alertname") == alertname]


@dataclass
class Alertmanager:
    url: str
    webhook: Webhook
    process: subprocess.Popen[bytes]
    workdir: Path

    def call(self, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method="POST" if data is not None else "GET",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            raw = answer.read()
        return json.loads(raw) if raw.strip() else None

    def silence(self, by: str = "alice", comment: str = "on it", **labels: str) -> str:
        """A silence of the alerts with these labels, for an hour; its id."""
        now = time.time()
        answer = self.call(
            "/api/v2/silences",
            {
                "matchers": [
                    {"name": k, "value": v, "isRegex": False, "isEqual": True}
                    for k, v in labels.items()
                ],
                "startsAt": iso(now - 1),
                "endsAt": iso(now + 3600),
                "createdBy": by,
                "comment": comment,
            },
        )
        return str(answer["silenceID"])

    def alerts(self, **labels: str) -> list[dict[str, Any]]:
        """The alerts Alertmanager holds now (active or suppressed) with these labels."""
        query = urllib.parse.urlencode([("filter", f'{k}="{v}"') for k, v in labels.items()])
        return list(self.call(f"/api/v2/alerts?{query}"))


def wait_for(what: Callable[[], Any], message: str, timeout: float = WAIT) -> Any:
    """``what()`` once it is truthy; fails the test after ``timeout`` seconds without."""
    deadline = time.monotonic() + timeout
    while True:
        found = what()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"after {timeout:.0f}s: {message}")
        time.sleep(0.1)


def start(workdir: Path, webhook: Webhook, *, address: str = "127.0.0.1:0") -> Alertmanager:
    """An Alertmanager listening on ``address`` (port 0: any free one), its webhook receiver
    at ``webhook``."""
    exe = require()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "alertmanager.yml"
    config.write_text(
        "route:\n"
        "  receiver: hook\n"
        "  group_by: [alertname]\n"
        f"  group_wait: {GROUP_WAIT}\n"
        f"  group_interval: {GROUP_INTERVAL}\n"
        "  repeat_interval: 1h\n"
        "receivers:\n"
        "  - name: hook\n"
        "    webhook_configs:\n"
        f"      - url: http://127.0.0.1:{webhook.port}/hook\n"
        "        send_resolved: true\n"
    )
    log = (workdir / "alertmanager.log").open("wb")
    process = subprocess.Popen(
        [
            exe,
            f"--config.file={config}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address={address}",
            "--cluster.listen-address=",
            "--log.level=info",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    listening = re.compile(r'msg="Listening on" address=(\S+)')

    def address_seen() -> str | None:
        if process.poll() is not None:
            pytest.fail(f"alertmanager exited: {(workdir / 'alertmanager.log').read_text()}")
        found = listening.search((workdir / "alertmanager.log").read_text())
        return found.group(1) if found else None

    url = "http://" + wait_for(address_seen, "alertmanager did not start listening", 30)
    manager = Alertmanager(url, webhook, process, workdir)

    def ready() -> bool:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url + "/-/ready", timeout=2) as answer,
        ):
            return bool(answer.status == 200)
        return False

    wait_for(ready, "alertmanager did not become ready", 30)
    return manager


def stop(manager: Alertmanager) -> None:
    manager.process.terminate()
    try:
        manager.process.wait(10)
    except subprocess.TimeoutExpired:
        manager.process.kill()
        manager.process.wait(10)


@pytest.fixture(scope="session", name="alertmanager")
def fixture_alertmanager() -> Iterator[Alertmanager]:
    require()
    webhook = Webhook().start()
    workdir = Path(tempfile.mkdtemp(prefix="gpuwarden-alertmanager-"))
    manager = start(workdir, webhook)
    try:
        yield manager
    finally:
        stop(manager)
        webhook.stop()
        shutil.rmtree(workdir, ignore_errors=True)
