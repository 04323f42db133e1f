"""Real receivers for notification tests: an HTTP server for apprise's ``json://`` and an SMTP
server (aiosmtpd) for ``mailto://``, both on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message as EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class JsonReceiver:
    """Records every ``json://`` delivery (title, message, type, path). ``status`` is what it
    answers (set 500 to fail deliveries); ``stop()``/``start()`` take it off and back on the
    same port (an outage)."""

    port: int = 0
    status: int = 200
    received: list[dict[str, Any]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> JsonReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if receiver.status == 200:
                    doc = json.loads(raw)
                    doc["path"] = self.path
                    with receiver._lock:
                        receiver.received.append(doc)
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def url(self, path: str = "hook") -> str:
        return f"json://127.0.0.1:{self.port}/{path}"

    def titles(self) -> list[str]:
        with self._lock:
            return [str(d["title"]) for d in self.received]


class _Mailbox:
    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.original_content))
        return "250 OK"


class SmtpReceiver:
    """An aiosmtpd server on 127.0.0.1; ``messages`` are the e-mails it got."""

    def __init__(self) -> None:
        self._box = _Mailbox()
        with socket.socket() as probe:  # a free port: the controller checks it by connecting
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        self._port = port
        self._controller = Controller(self._box, hostname="127.0.0.1", port=port)

    def start(self) -> SmtpReceiver:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def messages(self) -> list[EmailMessage]:
        return list(self._box.messages)

    def url(self) -> str:
        return (
            f"mailto://127.0.0.1:{self.port}?mode=insecure"
            "&from=gpuwarden@example.org&to=oncall@example.org"
        )


def running_json() -> Iterator[JsonReceiver]:
    receiver = JsonReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()
