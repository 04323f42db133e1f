"""sd_notify against real AF_UNIX datagram sockets, as systemd's manager would receive it."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.sdnotify import SystemdNotifier


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket in tmp_path and the $NOTIFY_SOCKET value naming it."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    yield sock, str(path)
    sock.close()


def fields(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n"))


def test_ready_with_status(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("watching 8 GPUs, 3 rules") is True
    assert fields(sock) == {"READY": "1", "STATUS": "watching 8 GPUs, 3 rules"}


def test_status_never_carries_a_newline(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path})
    notifier.status("gpu0 hot\nREADY=1\r\nSTOPPING=1")
    data = sock.recv(4096).decode()
    assert "\n" not in data
    assert data == "STATUS=gpu0 hot READY=1 STOPPING=1"


def test_watchdog(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    SystemdNotifier({"NOTIFY_SOCKET": path}).watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"


def test_reloading_carries_monotonic_usec(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path})
    before = time.monotonic_ns() // 1000
    notifier.reloading("reloading playbooks")
    after = time.monotonic_ns() // 1000
    got = fields(sock)
    assert got["RELOADING"] == "1"
    assert before <= int(got["MONOTONIC_USEC"]) <= after
    assert got["STATUS"] == "reloading playbooks"
    notifier.ready()
    assert sock.recv(4096) == b"READY=1"


def test_stopping(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    SystemdNotifier({"NOTIFY_SOCKET": path}).stopping("resuming 2 suspended jobs")
    assert fields(sock) == {"STOPPING": "1", "STATUS": "resuming 2 suspended jobs"}


def test_abstract_socket() -> None:
    name = f"gpuwarden-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2)
    try:
        notifier = SystemdNotifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.ready("up")
        assert fields(sock) == {"READY": "1", "STATUS": "up"}
    finally:
        sock.close()


@pytest.mark.parametrize("value", [None, "", "relative/path", "@"])
def test_no_socket_is_a_no_op(value: str | None) -> None:
    env = {} if value is None else {"NOTIFY_SOCKET": value}
    notifier = SystemdNotifier(env)
    assert not notifier.enabled
    assert notifier.ready("x") is False
    assert notifier.watchdog() is False
    assert notifier.reloading() is False
    assert notifier.stopping() is False


def test_reads_the_process_environment_by_default(
    receiver: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    SystemdNotifier().watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"


def test_vanished_socket_does_not_raise_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gone.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(path)})
    assert notifier.ready()
    sock.close()
    path.unlink()
    with caplog.at_level(logging.WARNING, logger="gpuwarden.sdnotify"):
        assert notifier.watchdog() is False
        assert notifier.watchdog() is False
        assert notifier.stopping() is False
    warnings = [r for r in caplog.records if r.name == "gpuwarden.sdnotify"]
    assert len(warnings) == 1
    assert str(path) in warnings[0].getMessage()


def test_socket_back_after_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "again.sock"
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(path)})
    assert notifier.watchdog() is False  # nothing bound yet
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    try:
        assert notifier.watchdog() is True
        assert sock.recv(4096) == b"WATCHDOG=1"
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "nope"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert SystemdNotifier(env).watchdog_interval() == expected
