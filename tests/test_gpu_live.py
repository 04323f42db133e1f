"""On a real GPU: a real process holds real GPU memory, NVML sees it, and the daemon acts on it.

Needs an NVIDIA driver and GPU (the ``gpu`` marker) and PyTorch to allocate the memory with;
``make gpu-check`` runs these. Elsewhere they are skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.config import Priorities
from gpuwarden.model import Snapshot
from gpuwarden.sources.nvml import NvmlSource
from gpuwarden.sources.procs import Attributor

MARKER = "gpuwarden-gpu-check-hog"
HOG_MIB = 4096
# Allocates HOG_MIB on GPU 0 with PyTorch, says so, then holds it.
HOG = """
import sys, time
import torch
mib = int(sys.argv[2])
held = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda:0")
held.fill_(1)
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(600)
"""

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="needs PyTorch to allocate GPU memory"
    ),
]


@pytest.fixture
def hog() -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOG, MARKER, str(HOG_MIB)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "ready", f"the GPU memory holder did not start: {line!r}"
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)


def snapshot() -> Snapshot:
    with NvmlSource(Attributor(Priorities()), host=socket.gethostname()) as source:
        return source.snapshot(time.time())


def test_nvml_attributes_the_memory_a_real_process_holds(hog: subprocess.Popen[str]) -> None:
    snap = snapshot()
    mine = [p for p in snap.processes if p.pid == hog.pid]
    seen = [(p.pid, p.gpu_memory_mib, p.info.name) for p in snap.processes]
    assert mine, f"NVML did not report PID {hog.pid}; it reported {seen}"
    entry = mine[0]
    assert entry.gpu == 0
    assert entry.gpu_memory_mib is not None
    assert entry.gpu_memory_mib >= HOG_MIB, seen
    assert entry.info.cmdline is not None
    assert MARKER in entry.info.cmdline
    gpu = snap.gpus[0]
    assert gpu.memory.used_mib is not None
    assert gpu.memory.used_mib >= HOG_MIB


PLAYBOOK = f"""
rules:
  - name: gpu-check-hog
    description: The test's GPU memory holder; nothing else matches.
    for_each: process
    when: '"{MARKER}" in process.cmdline and process.gpu_memory_mib >= 1024'
    for: 1s
    severity: warning
    steps:
      - kill: {{select: '"{MARKER}" in process.cmdline', grace: 10s}}
"""

CONFIG = """
host: gpu-check
tick: 500ms
timezone: UTC
protected: {root: false, users: []}
"""


def gpuwarden(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_the_daemon_kills_a_real_gpu_process_and_the_memory_comes_back(
    hog: subprocess.Popen[str], tmp_path: Path
) -> None:
    config = tmp_path / "gpuwarden.yaml"
    config.write_text(CONFIG)
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / "hog.yaml").write_text(PLAYBOOK)
    state = tmp_path / "state"
    for path in (config, playbooks / "hog.yaml"):
        path.chmod(0o644)
    began = time.monotonic()
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "run",
            "--source",
            "nvml",
            "--config",
            str(config),
            "--playbooks",
            str(playbooks),
            "--state-dir",
            str(state),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        hog.wait(timeout=60)
        killed_after = time.monotonic() - began
        deadline = time.monotonic() + 30
        freed = False
        while time.monotonic() < deadline:
            if not any(p.pid == hog.pid for p in snapshot().processes):
                freed = True
                break
            time.sleep(0.5)
    finally:
        daemon.terminate()
        output, _ = daemon.communicate(timeout=30)
    assert hog.returncode is not None, output
    assert hog.returncode < 0, output  # ended by a signal
    assert freed, f"NVML still lists PID {hog.pid} after it ended\n{output}"
    shown = gpuwarden(
        "incident", "last", "--json", "--state-dir", str(state), "--config", str(config)
    )
    assert shown.returncode == 0, shown.stderr
    timeline = json.loads(shown.stdout)
    assert timeline["incident"]["rule"] == "gpu-check-hog"
    (kill,) = [s for s in timeline["steps"] if s["kind"] == "kill"]
    assert kill["status"] == "done", kill
    assert [r["pid"] for r in kill["results"]] == [hog.pid], kill
    assert kill["results"][0]["state"] in {"terminated", "killed"}, kill
    print(f"rule fired and the holder was killed {killed_after:.1f}s after the daemon started")
