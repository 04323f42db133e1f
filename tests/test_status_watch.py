"""``status --watch`` fits the terminal: one screen per refresh, never a line wider than the
terminal, a compact one-line-per-GPU view when the table does not fit, events kept on screen
for a while, the replay's own time, and Ctrl-C ending it with exit 0 — checked on the view
itself and on the real command in a real pseudo-terminal of 80x24."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time
from pathlib import Path

from gpuwarden.cli.status_watch import Watch
from gpuwarden.model import Snapshot
from gpuwarden.sources.scenario import ScenarioSource

ROOT = Path(__file__).resolve().parent.parent
EIGHT = ROOT / "scenarios" / "xid79-one-of-eight.yaml"  # XID 79 on GPU 5 at 5m
SGR = re.compile(r"\x1b\[[0-9;]*m")


def frames(at: list[float], watch: Watch, width: int = 80, height: int = 24) -> list[str]:
    with ScenarioSource.open(EIGHT, spawn=False) as source:
        return [
            watch.frame(source.snapshot(source.start_time + t), width=width, height=height)
            for t in at
        ]


def test_eight_gpus_in_80x24_are_one_line_each_and_the_xid_stays() -> None:
    shown = frames([290.0, 300.0, 310.0, 600.0, 905.0], Watch(events_for=600.0))
    for frame in shown:
        lines = frame.splitlines()
        assert len(lines) <= 23
        assert max(len(line) for line in lines) <= 80
        assert sum(1 for line in lines if re.match(r"\[\d\] ", line)) == 8
    assert "GPU 5  XID 79" not in shown[0]
    for frame in shown[1:4]:  # kept on screen for ten minutes of the replay's time
        assert "GPU 5  XID 79 (GPU has fallen off the bus)" in frame
        assert re.search(r"^\[5\] H100 80GB HBM3 +LOST: GPU has fallen off the bus", frame, re.M)
    assert "GPU 5  XID 79" not in shown[4]  # and gone after


def test_a_big_terminal_gets_the_full_table_and_compact_can_be_asked_for() -> None:
    (full,) = frames([300.0], Watch(), width=140, height=60)
    assert "PID     USER     PRIORITY" in full
    (compact,) = frames([300.0], Watch(compact=True), width=140, height=60)
    assert "PID     USER" not in compact
    assert compact.count("\n") == 1 + 8 + 2 - 1  # header, eight GPUs, "events" and the XID


def test_open_incidents_go_under_the_gpus_and_the_screen_still_fits() -> None:
    below = ["open incidents (30)"] + [f"  incident-{n}  high  GPU {n % 8}" for n in range(30)]
    for watch, width, height in ((Watch(), 80, 24), (Watch(), 140, 60), (Watch(), 40, 6)):
        (screen,) = [
            watch.frame(snap, width=width, height=height, below=below) for snap in _snapshots()
        ]
        lines = screen.split("\n")
        assert len(lines) <= height - 1
        assert all(len(line) <= width for line in lines)
        assert lines[0].startswith("gpu-node")  # the header never scrolls away
        assert sum(line.startswith("[") for line in lines) == 8 or height < 10  # every GPU
        if height >= 24:
            assert "open incidents (30)" in lines  # under the GPUs
        if height == 24:  # cut to the room the GPUs leave, saying so
            assert lines[-1].strip().startswith("…")
            assert "more lines" in lines[-1]
    (roomy,) = [Watch().frame(s, width=140, height=200, below=below) for s in _snapshots()]
    assert roomy.split("\n")[-31:] == below  # all of it when it fits, after the table


def _snapshots() -> list[Snapshot]:
    with ScenarioSource.open(EIGHT, spawn=False) as source:
        return [source.snapshot(source.start_time + 300.0)]


def test_a_tiny_terminal_says_what_it_leaves_out() -> None:
    (tiny,) = frames([300.0], Watch(), width=40, height=6)
    lines = tiny.splitlines()
    assert len(lines) == 5
    assert all(len(line) <= 40 for line in lines)
    assert lines[-1] == "… 5 more GPUs (a taller terminal)"  # three shown


def read_until(fd: int, deadline: float) -> bytes:
    out = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    return out


def wait_or_kill(pid: int, deadline: float, output: bytes) -> int:
    """The child's wait status; a child still running at ``deadline`` ignored the Ctrl-C:
    it is killed and the test fails with where it was waiting and what it last wrote."""
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        wchan = "?"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(
        f"status --watch still ran after Ctrl-C (waiting in {wchan}): {output[-800:]!r}"
    )


def test_watch_in_a_real_80x24_terminal() -> None:
    # Four seconds before the XID: the screen shows it arrive and keeps it there.
    argv = [
        sys.executable, "-m", "gpuwarden", "status", "--watch", "1",
        "--source", f"scenario:{EIGHT}@4m57s", "--color", "always",
    ]  # fmt: skip
    pid, master = pty.fork()
    if pid == 0:  # the child: a session of its own on the new terminal
        os.chdir(ROOT)
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
        os.execve(sys.executable, argv, {**env, "TERM": "xterm-256color"})
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    os.kill(pid, signal.SIGWINCH)
    output = read_until(master, time.monotonic() + 9.0)
    os.write(master, b"\x03")  # Ctrl-C, as a person types it
    output += read_until(master, time.monotonic() + 15.0)  # ends when the child closes it
    status = wait_or_kill(pid, time.monotonic() + 10.0, output)
    os.close(master)
    assert os.WIFEXITED(status), status
    assert os.WEXITSTATUS(status) == 0  # README, exit codes: Ctrl-C ends a watch with 0
    screens = output.decode().split("\x1b[H\x1b[2J")[1:]
    assert len(screens) >= 5, output[-2000:]
    seen_xid = []
    for screen in screens:
        lines = SGR.sub("", screen).replace("\r\n", "\n").rstrip("\n").split("\n")
        assert len(lines) <= 23, lines
        assert max(len(line) for line in lines) <= 80, max(lines, key=len)
        assert lines[0].startswith("gpu-node-21  2026-04-02T03:1")  # the replay's own time
        seen_xid.append(any("GPU 5  XID 79 (GPU has fallen off the bus)" in line for line in lines))
    first = seen_xid.index(True)
    assert first > 0  # it arrived while watching ...
    assert all(seen_xid[first:])  # ... and stayed on every later screen
    assert len(seen_xid) - first >= 3
