"""Tell systemd what the daemon is doing: the sd_notify protocol, stdlib only.

A message is one datagram of ``KEY=VALUE`` lines sent to the AF_UNIX socket named in
``$NOTIFY_SOCKET`` (a path, or an abstract name written with a leading ``@``). Without that
variable every call is a no-op, so the daemon runs the same under a terminal, a test or systemd.
A failed send is logged once and never raised: systemd going away must not stop the daemon.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)

STATUS_MAX = 1024  # systemd shows one line; keep a runaway summary from filling the datagram


def one_line(text: str) -> str:
    """``text`` made safe for a STATUS value: no line breaks, bounded length."""
    flat = " ".join(text.split())
    return flat[:STATUS_MAX]


class SystemdNotifier:
    """Sends READY, STATUS, WATCHDOG, RELOADING and STOPPING to systemd, when run under it."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._env = env
        self._address = _address(env.get("NOTIFY_SOCKET", ""))
        self._sock: socket.socket | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        """True when ``$NOTIFY_SOCKET`` names a socket to talk to."""
        return self._address is not None

    def ready(self, status: str | None = None) -> bool:
        """Start-up (or a reload) is complete; optionally with a one-line status."""
        return self._send("READY=1", status)

    def status(self, text: str) -> bool:
        """A one-line summary shown by ``systemctl status``."""
        return self._send(None, text)

    def watchdog(self) -> bool:
        """The main loop is alive; send at least every ``watchdog_interval()`` seconds."""
        return self._send("WATCHDOG=1", None)

    def reloading(self, status: str | None = None) -> bool:
        """A reload has begun; follow with ``ready()`` when it is done (or has failed)."""
        stamp = f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"
        return self._send(stamp, status)

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown has begun."""
        return self._send("STOPPING=1", status)

    def watchdog_interval(self) -> float | None:
        """Seconds between watchdog pings (half of ``WatchdogSec``), or None when not asked for."""
        usec = self._env.get("WATCHDOG_USEC", "")
        pid = self._env.get("WATCHDOG_PID", "")
        if pid and (not pid.isdigit() or int(pid) != os.getpid()):
            return None
        if not usec.isdigit() or int(usec) == 0:
            return None
        return int(usec) / 1_000_000 / 2

    def close(self) -> None:
        """Release the socket; later calls open it again."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _send(self, fields: str | None, status: str | None) -> bool:
        if self._address is None:
            return False
        lines = [fields] if fields else []
        if status is not None:
            lines.append(f"STATUS={one_line(status)}")
        if not lines:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(lines).encode(), self._address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "sd_notify to %s failed: %s (further failures are not logged)",
                    self._env.get("NOTIFY_SOCKET"),
                    exc,
                )
            self.close()
            return False
        return True


def _address(value: str) -> str | bytes | None:
    """The socket address in ``$NOTIFY_SOCKET``: a path, ``@name`` (abstract), or None."""
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None
