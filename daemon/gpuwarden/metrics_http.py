"""The HTTP side of the metrics endpoint: one thread, bounded connections, timeouts everywhere.

prometheus_client's own server starts a thread per connection and waits on each without a
timeout: 330 idle connections to the port were 330 threads, past the unit's ``TasksMax=256``,
and the daemon's exec hooks then failed with EAGAIN. This server runs an asyncio loop in a
single thread, whatever the number of connections:

- at most ``max_connections`` are open; a new one beyond that closes the connection that has
  waited longest without sending a whole request (so a flood of idle connections cannot keep a
  scrape out), or, when every open connection is being answered, is itself closed;
- a request head must arrive whole within ``read_timeout`` seconds and be at most
  ``HEAD_LIMIT`` bytes; the answer must be taken by the client within ``write_timeout``;
- one request per connection (``Connection: close``), ``GET`` or ``HEAD``, any path: what
  prometheus_client serves too, in the format the ``Accept`` header asks for, gzipped when
  the client accepts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
from collections import OrderedDict
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

HEAD_LIMIT: Final = 8192  # bytes of a request line and headers
MAX_CONNECTIONS: Final = 32
READ_TIMEOUT: Final = 5.0
WRITE_TIMEOUT: Final = 10.0


class MetricsServer:
    """Serves ``registry`` on ``host:port`` (port 0: any free port) from one daemon thread."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        *,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout: float = READ_TIMEOUT,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        self._registry = registry
        self._max = max_connections
        self._read_timeout = read_timeout
        self._write_timeout = write_timeout
        self._loop = asyncio.new_event_loop()
        # Connections that have not sent a whole request yet, oldest first; and all of them.
        self._waiting: OrderedDict[asyncio.StreamWriter, None] = OrderedDict()
        self._open: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self.refused = 0  # connections closed because too many were open
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, host, port, limit=HEAD_LIMIT, backlog=128)
            )
        except BaseException:
            self._loop.close()
            raise
        bound = self._server.sockets[0].getsockname()
        self.address: tuple[str, int] = (str(bound[0]), int(bound[1]))
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="gpuwarden-metrics", daemon=True
        )
        self._thread.start()

    @property
    def connections(self) -> int:
        """Connections open now (for tests and the curious)."""
        return len(self._open)

    def close(self) -> None:
        """Stop listening, drop every connection, end the thread; safe to call twice."""
        if self._loop.is_closed():
            return

        async def stop() -> None:
            self._server.close()
            for writer in list(self._open):
                writer.transport.abort()
            # Let each connection's handler see its end and finish before the loop stops.
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

        with contextlib.suppress(RuntimeError, TimeoutError):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    # -- one connection ---------------------------------------------------------------------

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        if len(self._open) >= self._max:
            if not self._waiting:
                return False
            oldest = next(iter(self._waiting))
            self._forget(oldest)
            oldest.transport.abort()
            self.refused += 1
        self._open.add(writer)
        self._waiting[writer] = None
        return True

    def _forget(self, writer: asyncio.StreamWriter) -> None:
        self._open.discard(writer)
        self._waiting.pop(writer, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            self.refused += 1
            writer.transport.abort()
            return
        answered = False
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        try:
            async with asyncio.timeout(self._read_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
            self._waiting.pop(writer, None)
            writer.write(self._answer(head))
            async with asyncio.timeout(self._write_timeout):
                await writer.drain()
            answered = True
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # an idle, slow, oversized or vanished client
        finally:
            if handler is not None:
                self._handlers.discard(handler)
            self._forget(writer)
            if answered:
                writer.close()
            else:  # nothing more is owed to it, and nothing left to flush
                writer.transport.abort()

    def _answer(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        method, _, rest = lines[0].partition(" ")
        if method not in ("GET", "HEAD") or not rest.strip():
            return _response("405 Method Not Allowed", {"Allow": "GET, HEAD"}, b"")
        fields = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                fields[name.strip().lower()] = value.strip()
        encoder, content_type = choose_encoder(fields.get("accept", ""))
        try:
            body = encoder(self._registry)
        except Exception as exc:  # a collector failed: say so, keep serving
            text = f"collecting metrics failed: {type(exc).__name__}\n".encode()
            return _response("500 Internal Server Error", {"Content-Type": "text/plain"}, text)
        headers = {"Content-Type": content_type}
        if "gzip" in fields.get("accept-encoding", ""):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        return _response("200 OK", headers, body, send_body=method == "GET")


def _response(
    status: str, headers: dict[str, str], body: bytes, *, send_body: bool = True
) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers.items())]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (body if send_body else b"")
