"""The daemon as systemd runs it: readiness and reloads over a real notify socket, playbook
edits picked up while it runs, a broken edit refused, and both visible in the metrics; and a
flood of idle connections to the metrics port, under a task limit like the unit's."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(predicate: Callable[[], bool], timeout: float) -> float:
    began = time.monotonic()
    while not predicate():
        assert time.monotonic() - began < timeout, "timed out"
        time.sleep(0.05)
    return time.monotonic() - began


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def test_reload_readiness_and_metrics_while_running(tmp_path: Path) -> None:
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    shutil.copy(ROOT / "playbooks" / "memory-pressure.yaml", playbooks)
    port = free_port()
    cfg = tmp_path / "gpuwarden.yaml"
    cfg.write_text(
        (ROOT / "config" / "demo.yaml").read_text()
        + f"\nmetrics: {{listen: '127.0.0.1:{port}'}}\nreload: {{debounce: 100ms}}\n"
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(10)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "run",
            "--config",
            str(cfg),
            "--playbooks",
            str(playbooks),
            "--state-dir",
            str(tmp_path / "state"),
            "--source",
            "scenario:scenarios/thermal-throttling.yaml",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock")},
    )
    try:
        assert b"READY=1" in notify.recv(4096)
        until(lambda: "gpuwarden_tick_duration_seconds_count" in scrape(port), 10)
        first = scrape(port)
        # gpuwarden's own series carry the host; no reload yet is not a failed one; each
        # loaded rule's incident counter is there from 0 (what dashboard annotations need).
        assert 'gpuwarden_last_reload_successful{Hostname="demo-node"} 1.0' in first
        assert 'gpuwarden_shadow_mode{Hostname="demo-node"} 0.0' in first
        assert (
            'gpuwarden_incidents_total{Hostname="demo-node",rule="gpu-memory-pressure",'
            'severity="critical"} 0.0' in first
        )
        rules = playbooks / "memory-pressure.yaml"
        rules.write_text(rules.read_text().replace("used_pct >= 95", "used_pc >= 95"))
        failed = 'gpuwarden_reloads_total{Hostname="demo-node",result="failed"} 1.0'
        refused = until(lambda: failed in scrape(port), 5)
        rules.write_text(rules.read_text().replace("used_pc >= 95", "used_pct >= 97"))
        ok = 'gpuwarden_reloads_total{Hostname="demo-node",result="ok"} 1.0'
        taken = until(lambda: ok in scrape(port), 5)
        assert refused < 2.0
        assert taken < 2.0
        process.send_signal(signal.SIGHUP)  # the same path by signal: RELOADING, then READY
        messages: list[bytes] = []

        def reloading() -> bool:
            messages.append(notify.recv(4096))
            return b"RELOADING=1" in b"".join(messages)

        until(reloading, 5)
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    rest = b""
    notify.settimeout(0.5)
    try:
        while True:
            rest += notify.recv(4096)
    except OSError:
        pass
    notify.close()
    assert process.returncode == 0, err
    assert f"{rules}:13:11: unknown field gpu.memory.used_pc" in err
    assert "reload: ok (changed: gpu-memory-pressure)" in err
    assert b"STOPPING=1" in rest
    assert "Traceback" not in err


TASKS_MAX = 64  # well under the 330 connections, as the unit's TasksMax=256 is


def _tasks_limit() -> Path | None:
    """A pids cgroup limited to TASKS_MAX tasks (what systemd's TasksMax= sets), or None where
    none can be made; the caller removes it."""
    for mount in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if (mount / "cgroup.procs").exists() and (
            mount.name == "pids" or "pids" in (mount / "cgroup.subtree_control").read_text()
        ):
            limit = mount / f"gwt{os.getpid()}-tasks"
            try:
                limit.mkdir()
                (limit / "pids.max").write_text(f"{TASKS_MAX}\n")
            except OSError:
                with contextlib.suppress(OSError):
                    limit.rmdir()
                return None
            return limit
    return None


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


def _last_tick(text: str) -> float:
    for line in text.splitlines():
        if line.startswith("gpuwarden_last_tick_timestamp_seconds "):
            return float(line.split()[1])
    return 0.0


def test_330_idle_connections_leave_the_daemon_ticking_and_serving(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "gpuwarden.yaml"
    cfg.write_text(
        (ROOT / "config" / "demo.yaml").read_text().replace("tick: 2s", "tick: 200ms")
        + f"\nmetrics: {{listen: '127.0.0.1:{port}'}}\n"
    )
    limit = _tasks_limit()
    # The daemon joins the limited cgroup before it starts (systemd puts it there likewise).
    join = (
        "import os, sys\n"
        "if sys.argv[1]:\n"
        "    open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'gpuwarden', *sys.argv[2:]])\n"
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            join,
            str(limit / "cgroup.procs") if limit else "",
            "run",
            "--config",
            str(cfg),
            "--playbooks",
            str(ROOT / "playbooks" / "thermal-throttling.yaml"),
            "--state-dir",
            str(tmp_path / "state"),
            "--source",
            "scenario:scenarios/thermal-throttling.yaml",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    idle: list[socket.socket] = []
    try:
        until(lambda: _last_tick(scrape(port)) > 0, 20)
        if limit is not None:
            assert str(process.pid) in (limit / "cgroup.procs").read_text().split()
        for _ in range(330):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)  # let the daemon accept them all
        threads = _threads(process.pid)
        first = _last_tick(scrape(port))
        assert first > 0, "metrics are not served while 330 connections are open"
        until(lambda: _last_tick(scrape(port)) > first, 10)  # still ticking
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
    finally:
        for connection in idle:
            connection.close()
        if process.poll() is None:
            process.kill()
            process.wait()
        if limit is not None:
            with contextlib.suppress(OSError):
                limit.rmdir()
    assert threads < 32, f"{threads} threads for 330 connections"
    assert process.returncode == 0, err
    assert "Traceback" not in err, err
    assert "can't start new thread" not in err
