"""The running daemon: its CPU and memory at a 1 s tick, and breach-to-action latency.

    python bench/daemon.py                        # overhead (60 s windows) and latency
    BENCH_DAEMON_WINDOW=300 python bench/daemon.py   # the 5-minute window the target names
    BENCH_ALERTING_RUNS=1 python bench/daemon.py      # one run of the comparison, not three

Every figure comes from a real ``python -m gpuwarden run`` child process replaying a
generated scenario (non-spawned jobs, so nothing but the daemon does work) with
``bench/engine.py``'s generated rules, ``tick: 1s`` and a state directory in a temporary
directory. CPU is utime+stime from ``/proc/<pid>/stat`` over the window, as a share of one
core; RSS is ``VmRSS`` from ``/proc/<pid>/status`` at the end of the window (``VmHWM``, the
peak, beside it). Targets: at most 0.5 % of a core and 60 MiB without a cloud profile;
breach-to-action within one tick + 100 ms (docs/performance.md). Then ``bench/alerting.py``:
breach → webhook and breach → SIGTERM with ``for: 5s``, gpuwarden against Prometheus +
Alertmanager on one breach schedule.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import yaml

from harness import ROOT, banner, playbook_text

TICK_S = 1.0
WARMUP_S = 10.0
TOTAL_MIB = 81559
CPU_TARGET_PCT = 0.5
RSS_TARGET_MIB = 60.0
LATENCY_OFFSETS = (6.0, 6.2, 6.4, 6.6, 6.8)  # breach times: spread over the tick's phase
CLOUD = {
    "profiles": {
        "burst-a100": {
            "provider": "aws",
            "region": "us-east-1",
            "instance_types": ["p4d.24xlarge"],
            "launch_template": "lt-0123456789abcdef0",
            "market": "on-demand",
        }
    }
}


def window_s() -> float:
    return float(os.environ.get("BENCH_DAEMON_WINDOW", "60"))


# -- a local notification receiver ------------------------------------------------------------


class Receiver:
    """An HTTP server on 127.0.0.1 that records the wall time of every JSON message."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                at = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    message = json.loads(body or b"{}")
                except ValueError:
                    message = {}
                outer.received.append((at, message if isinstance(message, dict) else {}))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- files ------------------------------------------------------------------------------------


def write_config(directory: Path, url: str, *, cloud: bool, group_wait: str = "30s") -> Path:
    config: dict[str, Any] = {
        "tick": "1s",
        "source": f"scenario:{directory / 'scenario.yaml'}",
        "playbooks": str(directory / "playbooks"),
        "state_dir": str(directory / "state"),
        "priorities": {
            "classes": [{"name": "high"}, {"name": "normal"}, {"name": "low"}],
            "default": "normal",
        },
        "protected": {"root": False, "users": [], "names": []},
        "notify": {
            "group_wait": group_wait,
            "targets": {"oncall": {"urls": [url]}, "chat": {"urls": [url]}},
        },
    }
    if cloud:
        config["cloud"] = CLOUD
    path = directory / "gpuwarden.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _gpus(count: int) -> list[dict[str, Any]]:
    return [
        {"index": g, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": TOTAL_MIB}
        | {"power_limit_w": 700}
        for g in range(count)
    ]


def write_steady(path: Path, gpus: int, procs: int, seconds: float) -> Path:
    """``gpus`` busy GPUs shared by ``procs`` non-spawned jobs, ramping slowly, nothing firing."""
    per_gpu = max(1, procs // gpus)
    share = int(0.6 * TOTAL_MIB / per_gpu)
    jobs = [
        {
            "id": f"job-{k}",
            "cmdline": f"python worker.py --shard {k}",
            "user": f"user{k % 7}",
            "env": {"GPUWARDEN_PRIORITY": ("high", "normal", "low")[k % 3]},
            "started": "3h",
        }
        for k in range(procs)
    ]

    def frame(at: int, grow: int) -> dict[str, Any]:
        gpus_now = {
            g: {
                "utilization_pct": 90,
                "temperature_c": 65 + grow,
                "power_w": 450 + 10 * grow,
                "jobs": {
                    f"job-{k}": {"memory_mib": share + grow, "sm_pct": 50 + grow}
                    for k in range(g * per_gpu, min(procs, (g + 1) * per_gpu))
                },
            }
            for g in range(gpus)
        }
        return {"at": at, **({"ramp": True} if at else {}), "gpus": gpus_now}

    length = int(seconds) + 3600
    scenario = {
        "version": 1,
        "name": f"bench-daemon-{gpus}x{procs}",
        "host": "bench-node",
        "gpus": _gpus(gpus),
        "jobs": jobs,
        "timeline": [frame(0, 0), frame(length // 2, 5), {**frame(length, 0), "end": True}],
    }
    path.write_text(yaml.safe_dump(scenario, sort_keys=False), encoding="utf-8")
    return path


LATENCY_RULES = """rules:
  - name: breach-kill
    severity: critical
    for_each: gpu
    when: gpu.memory.used_pct >= 90
    steps:
      - kill: {select: process.priority <= low, grace: 10s}
  - name: breach-notify
    severity: critical
    for_each: gpu
    when: gpu.memory.used_pct >= 90
    steps:
      - notify: oncall
"""


def write_breach(path: Path, at: float) -> Path:
    """One GPU whose memory jumps from 50 % to 98 % at ``at`` seconds; a spawned low-priority
    victim that exits on SIGTERM."""
    scenario = {
        "version": 1,
        "name": "bench-daemon-breach",
        "host": "bench-node",
        "gpus": _gpus(1),
        "jobs": [
            {
                "id": "victim",
                "cmdline": "python sweep.py --trial 1",
                "env": {"GPUWARDEN_PRIORITY": "low"},
                "spawn": True,
                "on_term": "exit",
            }
        ],
        "timeline": [
            {"at": 0, "gpus": {0: {"other_mib": 1000, "jobs": {"victim": 40000}}}},
            {"at": at, "gpus": {0: {"jobs": {"victim": 79000}}}},
            {"at": at + 30, "end": True},
        ],
    }
    path.write_text(yaml.safe_dump(scenario, sort_keys=False), encoding="utf-8")
    return path


# -- the daemon process -----------------------------------------------------------------------


def start(directory: Path, config: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TMPDIR": str(directory)}
    env["PYTHONPATH"] = str(ROOT / "daemon")
    return subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "run", "--config", str(config)],
        cwd=directory,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(directory / "daemon.log", "wb"),
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_mib(pid: int, key: str) -> float:
    for text in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if text.startswith(key + ":"):
            return int(text.split()[1]) / 1024
    return float("nan")


def modules_loaded(pid: int, name: str) -> bool:
    """Whether a file of package ``name`` is mapped into ``pid`` (a C extension) — a coarse
    check; the RSS comparison is the real one."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return f"/{name}/" in maps


@dataclass(frozen=True)
class Overhead:
    label: str
    window_s: float
    cpu_pct: float
    rss_mib: float
    hwm_mib: float
    alive: bool


def overhead(
    label: str, gpus: int, procs: int, rules: int, seconds: float, *, cloud: bool
) -> Overhead:
    receiver = Receiver()
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-daemon-") as tmp:
        directory = Path(tmp)
        (directory / "playbooks").mkdir()
        (directory / "state").mkdir()
        (directory / "playbooks" / "bench.yaml").write_text(playbook_text(rules), encoding="utf-8")
        write_steady(directory / "scenario.yaml", gpus, procs, WARMUP_S + seconds)
        proc = start(directory, write_config(directory, receiver.url, cloud=cloud))
        try:
            time.sleep(WARMUP_S)
            if proc.poll() is not None:
                log = (directory / "daemon.log").read_text(errors="replace")
                raise RuntimeError(f"the daemon exited early ({proc.returncode}):\n{log[-2000:]}")
            wall0, cpu0 = time.monotonic(), cpu_s(proc.pid)
            time.sleep(seconds)
            wall1, cpu1 = time.monotonic(), cpu_s(proc.pid)
            rss, hwm = status_mib(proc.pid, "VmRSS"), status_mib(proc.pid, "VmHWM")
            alive = proc.poll() is None
        finally:
            stop(proc)
            receiver.close()
    pct = (cpu1 - cpu0) / (wall1 - wall0) * 100
    return Overhead(label, wall1 - wall0, pct, rss, hwm, alive)


# -- latency ----------------------------------------------------------------------------------


def _log_lines(directory: Path) -> list[tuple[float, str]]:
    lines = []
    for log in directory.glob("gpuwarden-scenario-*/victim/victim.signals.log"):
        for text in log.read_text(encoding="utf-8", errors="replace").splitlines():
            stamp, _, rest = text.partition(" ")
            try:
                lines.append((float(stamp), rest))
            except ValueError:
                continue
    return lines


def latency_once(at: float) -> tuple[float | None, float | None]:
    """Seconds from the breach to the victim's SIGTERM, and to the notification's arrival."""
    receiver = Receiver()
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-latency-") as tmp:
        directory = Path(tmp)
        (directory / "playbooks").mkdir()
        (directory / "state").mkdir()
        (directory / "playbooks" / "breach.yaml").write_text(LATENCY_RULES, encoding="utf-8")
        write_breach(directory / "scenario.yaml", at)
        # group_wait 0 s: the notification's own path, not the (default 30 s) grouping wait
        config = write_config(directory, receiver.url, cloud=False, group_wait="0s")
        proc = start(directory, config)
        ready = term = None
        deadline = time.monotonic() + at + 20
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                lines = _log_lines(directory)
                ready = next((t for t, s in lines if s.startswith("ready")), ready)
                term = next((t for t, s in lines if s == "signal SIGTERM"), term)
                if term is not None and receiver.received:
                    break
                time.sleep(0.005)
        finally:
            stop(proc)
            receiver.close()
    if ready is None:
        return None, None
    # The scenario clock starts once the stand-in is ready, so ready + at is the earliest the
    # breach can be visible: the figures are upper bounds by the few ms in between.
    breach = ready + at
    to_kill = term - breach if term is not None else None
    to_note = receiver.received[0][0] - breach if receiver.received else None
    return to_kill, to_note


def _ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    low, high = min(values) * 1000, max(values) * 1000
    return f"{statistics.median(values) * 1000:.0f} ms (min {low:.0f}, max {high:.0f})"


def main() -> None:
    seconds = window_s()
    print(f"\n## Daemon overhead (real `gpuwarden run`, tick {TICK_S:g} s)\n")
    if seconds != 300:
        print(f"window {seconds:g} s (the target names 5 minutes: BENCH_DAEMON_WINDOW=300)")
    print(f"{'':<44} {'window':>8} {'CPU % core':>11} {'RSS MiB':>8} {'peak MiB':>9}", flush=True)
    runs = [
        ("8 GPUs x 64 procs x 30 rules", 8, 64, 30, seconds, False),
        ("8 GPUs x 64 procs x 30 rules, cloud profile", 8, 64, 30, seconds, True),
        ("16 GPUs x 1024 procs x 100 rules", 16, 1024, 100, min(seconds, 30.0), False),
    ]
    results = []
    for label, gpus, procs, rules, window, cloud in runs:
        r = overhead(label, gpus, procs, rules, window, cloud=cloud)
        results.append(r)
        note = "" if r.alive else "  (daemon had exited!)"
        print(
            f"{label:<44} {r.window_s:>6.0f} s {r.cpu_pct:>11.2f} {r.rss_mib:>8.1f} "
            f"{r.hwm_mib:>9.1f}{note}",
            flush=True,
        )
    base = results[0]
    cpu_met = "met" if base.cpu_pct <= CPU_TARGET_PCT else "NOT met"
    rss_met = "met" if base.rss_mib <= RSS_TARGET_MIB else "NOT met"
    print(
        f"target ≤ {CPU_TARGET_PCT} % of a core: {cpu_met} · ≤ {RSS_TARGET_MIB:g} MiB: {rss_met}"
        f" · cloud profile adds {results[1].rss_mib - base.rss_mib:+.1f} MiB RSS"
    )

    print("\n## Breach-to-action latency (1 GPU, spawned victim, tick 1 s)\n", flush=True)
    kills: list[float] = []
    notes: list[float] = []
    for at in LATENCY_OFFSETS:
        to_kill, to_note = latency_once(at)
        print(
            f"breach at {at:4.1f} s: SIGTERM after "
            f"{'n/a' if to_kill is None else f'{to_kill * 1000:.0f} ms'}, notification after "
            f"{'n/a' if to_note is None else f'{to_note * 1000:.0f} ms'}",
            flush=True,
        )
        if to_kill is not None:
            kills.append(to_kill)
        if to_note is not None:
            notes.append(to_note)
    limit = TICK_S + 0.1
    print(f"breach → SIGTERM      median {_ms(kills)}")
    print(f"breach → notification median {_ms(notes)}")
    met = bool(kills) and max(kills) <= limit
    verdict = "met" if met else "NOT met"
    print(f"target ≤ {limit * 1000:.0f} ms (one tick + 100 ms): {verdict} (all runs)")

    # With `for`, against Prometheus + Alertmanager on the same breaches (bench/alerting.py).
    import alerting

    alerting.main()


if __name__ == "__main__":
    print(banner(), flush=True)
    main()
