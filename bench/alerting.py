"""First page: gpuwarden against Prometheus + Alertmanager on one breach schedule, in one run.

    python bench/alerting.py            # 3 runs of 6 breaches (about 6 minutes)
    BENCH_ALERTING_RUNS=1 python bench/alerting.py

One schedule of breaches (GPU 0's memory steps from 50 % to 98 % at known wall times and back
after 10 s) feeds, at the same time:

- gpuwarden (``bench/fake_gpus.py``: the real daemon over the fake NVML library), tick 1 s,
  once with ``fast_sample: 200ms`` and once with ``fast_sample: 0`` (readings at ticks only),
  each with a rule ``used_pct >= 95 for 5s`` that notifies a ``json://`` webhook
  (``group_wait: 0s``) and one on the same condition that kills a real low-priority process
  (each breach has its own victim, which notes when SIGTERM arrives);
- Prometheus (scrape and evaluation every 1 s, the same rule with ``for: 5s``) scraping a tiny
  exporter that computes the same schedule from the same clock, and Alertmanager
  (``group_wait: 0s``, clustering off) posting to a webhook on the same receiver. Each breach
  carries its own ``episode`` label, so that every alert starts a new group: Alertmanager's
  fastest path, no ``group_interval`` wait.

Breaches are 16 1/6 s apart, so that six of them fall at six points of each system's tick
phase. Breach → webhook is the receiver's arrival time minus the breach's wall time; breach →
SIGTERM the victim's note minus the breach. Needs the Debian packages ``prometheus`` and
``prometheus-alertmanager`` (skipped, saying so, when they are missing).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from harness import ROOT

FOR_S = 5.0
TICK_S = 1.0
EPISODES = int(os.environ.get("BENCH_ALERTING_EPISODES", "6"))
PERIOD_S = 16.0 + 1.0 / 6.0  # breaches fall at six different points of a 1 s tick
HOLD_S = 10.0  # how long a breach lasts
LEAD_S = 12.0  # from starting everything to the first breach
TOTAL_MIB = 81559
GPUS = 8
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"

VICTIM = """
import os, signal, sys, time
def term(*_):
    with open(sys.argv[1], "w") as out:
        out.write(repr(time.time()))
    os._exit(0)
signal.signal(signal.SIGTERM, term)
while True:
    time.sleep(3600)
"""

RULES = f"""rules:
  - name: breach-notify
    severity: critical
    for_each: gpu
    when: gpu.memory.used_pct >= 95
    for: {FOR_S:g}s
    cooldown: 0s
    steps:
      - notify: oncall
  - name: breach-kill
    severity: critical
    for_each: gpu
    when: gpu.memory.used_pct >= 95
    for: {FOR_S:g}s
    cooldown: 0s
    steps:
      - kill: {{select: process.priority <= low, grace: 10s}}
"""


def runs() -> int:
    return int(os.environ.get("BENCH_ALERTING_RUNS", "3"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def available() -> str | None:
    """Why the comparison cannot run here (None: it can)."""
    missing = [p for p in (PROMETHEUS, ALERTMANAGER) if not Path(p).exists()]
    if missing:
        return (
            f"not found: {', '.join(missing)} (Debian: apt-get install prometheus "
            "prometheus-alertmanager)"
        )
    return None


# -- the schedule, the exporter and the receiver ----------------------------------------------


def make_schedule(t0: float) -> list[dict[str, float]]:
    return [
        {"start": t0 + LEAD_S + k * PERIOD_S, "end": t0 + LEAD_S + k * PERIOD_S + HOLD_S}
        for k in range(EPISODES)
    ]


def episode_at(episodes: list[dict[str, float]], at: float) -> tuple[int, bool]:
    """(the index of the latest episode started by ``at``, whether it is breaching now)."""
    index = -1
    for k, e in enumerate(episodes):
        if e["start"] <= at:
            index = k
    return index, index >= 0 and at < episodes[index]["end"]


class Servers:
    """The exporter Prometheus scrapes and the receiver every webhook posts to, on 127.0.0.1."""

    def __init__(self, episodes: list[dict[str, float]]) -> None:
        self.episodes = episodes
        self.received: list[tuple[float, str, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                k, high = episode_at(outer.episodes, time.time())
                pct = 98.0 if high else 50.0
                body = (
                    "# TYPE gpu_memory_used_pct gauge\n"
                    f'gpu_memory_used_pct{{gpu="0",episode="{k + 1}"}} {pct}\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                at = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.received.append((at, self.path, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        ThreadingHTTPServer.daemon_threads = True
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def first_after(self, path: str, start: float, end: float) -> float | None:
        times = [at for at, p, _ in self.received if p == path and start <= at < end]
        return min(times, default=None)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the two systems --------------------------------------------------------------------------


@dataclass
class Daemon:
    label: str
    fast_sample: str
    path: str  # the webhook path its messages arrive on
    victims: list[subprocess.Popen[bytes]] = field(default_factory=list)
    notes: list[Path] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    cpu_s: float = 0.0
    rss_mib: float = float("nan")
    ready_rss_mib: float = float("nan")  # warm, before the first breach


def start_daemon(d: Daemon, directory: Path, episodes: list[dict[str, float]], port: int) -> None:
    home = directory / d.label.replace(" ", "-")
    (home / "playbooks").mkdir(parents=True)
    (home / "state").mkdir()
    (home / "playbooks" / "breach.yaml").write_text(RULES, encoding="utf-8")
    env = {**os.environ, "GPUWARDEN_PRIORITY": "low"}
    schedule = []
    for k, e in enumerate(episodes):
        note = home / f"victim-{k}.term"
        victim = subprocess.Popen([sys.executable, "-c", VICTIM, str(note)], env=env)
        d.victims.append(victim)
        d.notes.append(note)
        schedule.append({**e, "pid": victim.pid})
    (home / "schedule.json").write_text(
        json.dumps(
            {
                "gpus": GPUS,
                "total_mib": TOTAL_MIB,
                "low_pct": 50,
                "high_pct": 98,
                "episodes": schedule,
            }
        ),
        encoding="utf-8",
    )
    config = {
        "tick": f"{TICK_S:g}s",
        "fast_sample": d.fast_sample,
        "source": "nvml",
        "playbooks": str(home / "playbooks"),
        "state_dir": str(home / "state"),
        "priorities": {
            "classes": [{"name": "high"}, {"name": "normal"}, {"name": "low"}],
            "default": "normal",
        },
        "protected": {"root": False, "users": [], "names": []},
        "notify": {
            "group_wait": "0s",
            "group_interval": "1s",  # as Alertmanager's below
            "targets": {"oncall": {"urls": [f"json://127.0.0.1:{port}{d.path}"]}},
        },
        "safety": {
            "per_rule": {"actions": 100, "window": "10m"},
            "overall": {"actions": 100, "window": "10m"},
            "breaker": {"actions": 100, "window": "10m"},
        },
    }
    (home / "gpuwarden.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    d.proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "fake_gpus.py"),
            str(home / "schedule.json"),
            "run",
            "--config",
            str(home / "gpuwarden.yaml"),
        ],
        cwd=home,
        env={**os.environ, "PYTHONPATH": str(ROOT / "daemon"), "TMPDIR": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=open(home / "daemon.log", "wb"),  # noqa: SIM115 - closed with the process
    )


def start_prometheus(
    directory: Path, exporter: int, receiver: int
) -> list[subprocess.Popen[bytes]]:
    home = directory / "prometheus"
    home.mkdir()
    am_port, prom_port = free_port(), free_port()
    (home / "rules.yml").write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "bench",
                        "rules": [
                            {
                                "alert": "GpuMemoryFull",
                                "expr": "gpu_memory_used_pct >= 95",
                                "for": f"{FOR_S:g}s",
                            }
                        ],
                    }
                ]
            }
        ),
        encoding="utf-8",
    )
    (home / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(home / "rules.yml")],
                "alerting": {
                    "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]
                },
                "scrape_configs": [
                    {
                        "job_name": "fake-gpus",
                        "static_configs": [{"targets": [f"127.0.0.1:{exporter}"]}],
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    (home / "alertmanager.yml").write_text(
        yaml.safe_dump(
            {
                "route": {
                    "receiver": "hook",
                    "group_by": ["alertname", "episode"],
                    "group_wait": "0s",
                    "group_interval": "1s",
                    "repeat_interval": "1h",
                },
                "receivers": [
                    {
                        "name": "hook",
                        "webhook_configs": [
                            {"url": f"http://127.0.0.1:{receiver}/am", "send_resolved": False}
                        ],
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    log = open(home / "log.txt", "wb")  # noqa: SIM115 - closed with the processes
    alertmanager = subprocess.Popen(
        [
            ALERTMANAGER,
            f"--config.file={home / 'alertmanager.yml'}",
            f"--storage.path={home / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=log,
    )
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=log,
        stderr=log,
    )
    return [alertmanager, prometheus]


def cpu_s(pid: int) -> float:
    text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- one run ----------------------------------------------------------------------------------


@dataclass
class RunResult:
    webhook: dict[str, list[float | None]]  # system -> breach → webhook, per breach
    sigterm: dict[str, list[float | None]]  # gpuwarden variant -> breach → SIGTERM
    cpu_pct: dict[str, float]
    rss_mib: dict[str, float]
    ready_rss_mib: dict[str, float]


def one_run() -> RunResult:
    daemons = [
        Daemon("gpuwarden fast_sample 200ms", "200ms", "/gw-fast"),
        Daemon("gpuwarden ticks only", "0", "/gw-tick"),
    ]
    t0 = time.time()
    episodes = make_schedule(t0)
    servers = Servers(episodes)
    others: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-alerting-") as tmp:
        directory = Path(tmp)
        try:
            others = start_prometheus(directory, servers.port, servers.port)
            for d in daemons:
                start_daemon(d, directory, episodes, servers.port)
            time.sleep(LEAD_S - 2.0)
            started = {d.label: (time.monotonic(), cpu_s(d.proc.pid)) for d in daemons if d.proc}
            for d in daemons:
                assert d.proc is not None
                d.ready_rss_mib = rss_mib(d.proc.pid)
            time.sleep(max(0.0, episodes[-1]["end"] + 4.0 - time.time()))
            for d in daemons:
                assert d.proc is not None
                if d.proc.poll() is not None:
                    log = (directory / d.label.replace(" ", "-") / "daemon.log").read_text()
                    raise RuntimeError(f"{d.label} exited early:\n{log[-3000:]}")
                wall0, cpu0 = started[d.label]
                d.cpu_s = (cpu_s(d.proc.pid) - cpu0) / (time.monotonic() - wall0) * 100
                d.rss_mib = rss_mib(d.proc.pid)
        finally:
            for d in daemons:
                stop(d.proc)
                for v in d.victims:
                    if v.poll() is None:
                        v.kill()
                    v.wait()
            for p in others:
                stop(p)
            servers.close()
        webhook: dict[str, list[float | None]] = {}
        sigterm: dict[str, list[float | None]] = {}
        paths = {"Prometheus + Alertmanager": "/am", **{d.label: d.path for d in daemons}}
        for system, path in paths.items():
            found: list[float | None] = []
            for k, e in enumerate(episodes):
                end = episodes[k + 1]["start"] if k + 1 < len(episodes) else float("inf")
                at = servers.first_after(path, e["start"], end)
                found.append(None if at is None else at - e["start"])
            webhook[system] = found
        for d in daemons:
            terms: list[float | None] = []
            for note, e in zip(d.notes, episodes, strict=True):
                terms.append(float(note.read_text()) - e["start"] if note.exists() else None)
            sigterm[d.label] = terms
    return RunResult(
        webhook,
        sigterm,
        {d.label: d.cpu_s for d in daemons},
        {d.label: d.rss_mib for d in daemons},
        {d.label: d.ready_rss_mib for d in daemons},
    )


def idle_cost(window: float) -> dict[str, tuple[float, float]]:
    """CPU (% of a core) and RSS (MiB) of the two daemons side by side on 8 fake GPUs and no
    breach, over ``window`` seconds after a 10 s warm-up: what fast readings cost at rest."""
    daemons = [
        Daemon("gpuwarden fast_sample 200ms", "200ms", "/gw-fast"),
        Daemon("gpuwarden ticks only", "0", "/gw-tick"),
    ]
    servers = Servers([])
    out: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-idle-") as tmp:
        try:
            for d in daemons:
                start_daemon(d, Path(tmp), [], servers.port)
            time.sleep(10.0)
            began = {d.label: (time.monotonic(), cpu_s(d.proc.pid)) for d in daemons if d.proc}
            time.sleep(window)
            for d in daemons:
                assert d.proc is not None
                assert d.proc.poll() is None, f"{d.label} exited"
                wall0, cpu0 = began[d.label]
                pct = (cpu_s(d.proc.pid) - cpu0) / (time.monotonic() - wall0) * 100
                out[d.label] = (pct, rss_mib(d.proc.pid))
        finally:
            for d in daemons:
                stop(d.proc)
            servers.close()
    return out


def _s(values: list[float]) -> str:
    if not values:
        return "n/a"
    return (
        f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f}, n={len(values)})"
    )


def main() -> None:
    why = available()
    print(f"\n## First page: gpuwarden and Prometheus + Alertmanager (for {FOR_S:g} s, 1 s tick)\n")
    if why is not None:
        print(f"skipped: {why}")
        return
    print(
        f"{runs()} run(s) of {EPISODES} breaches, {PERIOD_S:.2f} s apart, all systems at once; "
        f"load average before: {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    webhook: dict[str, list[float]] = {}
    sigterm: dict[str, list[float]] = {}
    per_run: dict[str, list[float]] = {}
    for number in range(1, runs() + 1):
        result = one_run()
        for system, found in result.webhook.items():
            got = [v for v in found if v is not None]
            webhook.setdefault(system, []).extend(got)
            if got:
                per_run.setdefault(system, []).append(statistics.median(got))
            shown = " ".join("n/a" if v is None else f"{v:.2f}" for v in found)
            print(f"run {number} {system:<30} breach → webhook s: {shown}", flush=True)
        for system, found in result.sigterm.items():
            sigterm.setdefault(system, []).extend(v for v in found if v is not None)
            shown = " ".join("n/a" if v is None else f"{v:.2f}" for v in found)
            print(f"run {number} {system:<30} breach → SIGTERM s: {shown}", flush=True)
        for system, pct in result.cpu_pct.items():
            print(
                f"run {number} {system:<30} CPU {pct:.2f} % of a core (8 fake GPUs, from 2 s "
                f"before the first breach to 4 s after the last), RSS "
                f"{result.ready_rss_mib[system]:.1f} MiB warm before the first breach, "
                f"{result.rss_mib[system]:.1f} MiB at the end",
                flush=True,
            )
        print(f"load average after run {number}: {os.getloadavg()[0]:.2f}", flush=True)
    print()
    print(f"{'':<30} {'breach → webhook, median (min-max)':<40} {'over for':>9}")
    for system, values in webhook.items():
        over = statistics.median(values) - FOR_S if values else float("nan")
        print(f"{system:<30} {_s(values):<40} {over:>+8.2f}s")
    for system, values in sigterm.items():
        over = statistics.median(values) - FOR_S if values else float("nan")
        print(f"{system + ' SIGTERM':<30} {_s(values):<40} {over:>+8.2f}s")
    print(
        "medians of each run's median (webhook): "
        + "; ".join(f"{s} {', '.join(f'{v:.2f}' for v in vs)}" for s, vs in per_run.items())
    )
    at_rest()


def at_rest() -> None:
    window = float(os.environ.get("BENCH_ALERTING_IDLE", "60"))
    print(f"\nAt rest (no breach), both daemons side by side, {window:g} s windows:", flush=True)
    cpu: dict[str, list[float]] = {}
    for number in range(1, runs() + 1):
        for system, (pct, rss) in idle_cost(window).items():
            cpu.setdefault(system, []).append(pct)
            print(f"idle run {number} {system:<30} CPU {pct:.2f} % of a core, RSS {rss:.1f} MiB")
        print(f"load average: {os.getloadavg()[0]:.2f}", flush=True)
    for system, values in cpu.items():
        print(f"{system:<30} CPU at rest, median {statistics.median(values):.2f} % of a core")


if __name__ == "__main__":
    from harness import banner

    print(banner(), flush=True)
    main()
