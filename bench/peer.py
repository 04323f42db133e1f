"""The nearest peer: ansible-rulebook (Event-Driven Ansible) on the same samples, one rule each.

    python bench/peer.py                  # or: make bench BENCH=peer (needs PyPI and Java 17+)

Not in the default ``make bench``: it installs ansible-rulebook and ansible-core from PyPI
into a temporary virtual environment (``BENCH_PEER_VENV=DIR`` keeps one between runs), and
ansible-rulebook needs a Java 17+ runtime (``java`` on the PATH, or ``JAVA_HOME``). Nothing
of it is kept in this repository.

Both sides see the same samples: the first ``BENCH_PEER_HOURS`` hours (default 3) of the
drill benchmark's 8-GPU scenario, played back once to write each GPU's memory use per second
as one JSON event a line. ansible-rulebook reads that file through a ten-line source plugin
written next to it and runs one rule, ``event.memory_used_pct >= 95``; gpuwarden drills the
scenario with one rule, ``gpu.memory.used_pct >= 95``, for each GPU. Both rules notify on a
match (``debug`` / ``notify``), so neither side's actions dominate.

ansible-rulebook's rate excludes its start-up (a Java VM and the Drools rule engine, several
seconds): it is the difference between reading all the events and reading the first 1,000,
divided by the difference in wall time. gpuwarden's rate includes everything a drill does:
loading the scenario, playback, the engine and the timeline. Rounds alternate between the
two, and each figure is the median of the rounds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Any

from gpuwarden import config as config_module
from gpuwarden import drill
from gpuwarden.playbook import loader
from gpuwarden.sources.scenario import ScenarioSource
from harness import ROOT, banner, header, load
from throughput import write_day

ROUNDS = 3
WARM = 1_000  # events of the short ansible-rulebook run, whose time is the start-up's
THRESHOLD = 95
PACKAGES = ("ansible-rulebook", "ansible-core")  # the core for ansible-galaxy, which it calls

SOURCE_PLUGIN = '''"""Events from a JSON-lines file, as many as asked (gpuwarden bench)."""
import json


async def main(queue, args):
    with open(args["path"], encoding="utf-8") as lines:
        for number, line in enumerate(lines):
            if number >= int(args["count"]):
                break
            await queue.put(json.loads(line))
'''

RULEBOOK = """- name: gpuwarden peer benchmark
  hosts: all
  sources:
    - jsonlines:
        path: {path}
        count: {count}
  rules:
    - name: gpu-memory-high
      condition: event.memory_used_pct >= {threshold}
      action:
        debug:
          msg: gpu-memory-high
"""

INVENTORY = "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"

PLAYBOOK = f"""rules:
  - name: gpu-memory-high
    for_each: gpu
    when: gpu.memory.used_pct >= {THRESHOLD}
    steps:
      - notify: oncall
"""


class Unavailable(Exception):
    """Why ansible-rulebook cannot run here."""


def java_home() -> str:
    """A Java 17+ runtime's home, or Unavailable saying why not."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if java is None or not Path(java).exists():
        raise Unavailable("no Java runtime: ansible-rulebook needs Java 17+ (java on the PATH)")
    version = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    found = re.search(r'version "(\d+)', version.stderr)
    if found is None or int(found[1]) < 17:
        raise Unavailable(f"ansible-rulebook needs Java 17+; {java} says {version.stderr[:80]!r}")
    return home or str(Path(os.path.realpath(java)).parent.parent)


def install(where: Path) -> Path:
    """ansible-rulebook and ansible-core in a virtual environment at ``where``; its bin/."""
    bin_dir = where / "bin"
    if not (bin_dir / "ansible-rulebook").exists():
        print(f"installing ansible-rulebook and ansible-core into {where} ...", flush=True)
        venv.create(where, with_pip=True)
        done = subprocess.run(
            [str(bin_dir / "python"), "-m", "pip", "install", "-q", *PACKAGES],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise Unavailable(f"pip install ansible-rulebook failed: {done.stderr[-600:]}")
    return bin_dir


def write_events(scenario: Path, events: Path, hours: int) -> int:
    """Each GPU's memory use at each second of the first ``hours`` of ``scenario``, one JSON
    event a line, as the drill's playback shows them; how many."""
    cfg = config_module.load(ROOT / "config" / "gpuwarden.yaml")
    source = ScenarioSource.open(scenario, priorities=cfg.priorities, spawn=False)
    count = 0
    try:
        with events.open("w", encoding="utf-8") as out:
            for second in range(hours * 3600 + 1):
                snapshot = source.snapshot(source.start_time + second)
                for gpu in snapshot.gpus:
                    used = gpu.memory.used_mib or 0
                    pct = 100.0 * used / (gpu.memory.total_mib or 1)
                    out.write(json.dumps({"gpu": gpu.index, "t": second, "memory_used_pct": pct}))
                    out.write("\n")
                    count += 1
    finally:
        source.close()
    return count


def run_rulebook(bin_dir: Path, java: str, work: Path, events: Path, count: int) -> dict[str, Any]:
    rulebook = work / f"rules-{count}.yml"
    rulebook.write_text(RULEBOOK.format(path=events, count=count, threshold=THRESHOLD))
    env = dict(os.environ, JAVA_HOME=java, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    command = [str(bin_dir / "ansible-rulebook"), "-i", str(work / "inventory.yml")]
    command += ["-r", str(rulebook), "-S", str(work / "sources")]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise Unavailable(f"ansible-rulebook failed: {(done.stdout + done.stderr)[-600:]}")
    return {"wall_s": wall, "matches": done.stdout.count("gpu-memory-high")}


def run_gpuwarden(scenario: Path, work: Path) -> dict[str, Any]:
    cfg = config_module.load(ROOT / "config" / "gpuwarden.yaml")
    (work / "playbooks").mkdir(exist_ok=True)
    (work / "playbooks" / "one.yaml").write_text(PLAYBOOK)
    playbooks = loader.load([work / "playbooks"], cfg)
    summary = drill.Summary()
    began = time.perf_counter()
    records = sum(1 for _ in drill.run(scenario, cfg, playbooks, tick=1.0, summary=summary))
    wall = time.perf_counter() - began
    return {
        "wall_s": wall,
        "samples": 8 * summary.ticks,
        "records": records,
        "fired": summary.fired,
    }


def main() -> None:
    hours = int(os.environ.get("BENCH_PEER_HOURS", "3"))
    header(f"Peer: ansible-rulebook vs gpuwarden drill, one rule, {hours} h of 8 GPUs", "")
    try:
        java = java_home()
    except Unavailable as exc:
        print(f"peer benchmark skipped: {exc}")
        return
    with tempfile.TemporaryDirectory(prefix="gpuwarden-peer-") as tmp:
        work = Path(tmp)
        kept = os.environ.get("BENCH_PEER_VENV")
        try:
            bin_dir = install(Path(kept) if kept else work / "venv")
        except Unavailable as exc:
            print(f"peer benchmark skipped: {exc}")
            return
        version = subprocess.run(
            [str(bin_dir / "pip"), "show", "ansible-rulebook"],
            capture_output=True,
            text=True,
            check=False,
        )
        found = re.search(r"^Version: (.+)$", version.stdout, re.MULTILINE)
        print(f"ansible-rulebook {found[1] if found else '?'} · Java home {java}")
        (work / "sources").mkdir()
        (work / "sources" / "jsonlines.py").write_text(SOURCE_PLUGIN)
        (work / "inventory.yml").write_text(INVENTORY)
        scenario = write_day(work / "slice.yaml", hours=hours)
        events = work / "events.jsonl"
        count = write_events(scenario, events, hours)
        print(f"{count:,} samples (8 GPUs x {hours * 3600 + 1:,} s); threshold {THRESHOLD} %")
        peer_rates, ours, rows = [], [], []
        for n in range(ROUNDS):
            try:
                warm = run_rulebook(bin_dir, java, work, events, WARM)
                full = run_rulebook(bin_dir, java, work, events, count)
            except Unavailable as exc:
                print(f"peer benchmark stopped: {exc}")
                return
            mine = run_gpuwarden(scenario, work)
            rate = (count - WARM) / max(full["wall_s"] - warm["wall_s"], 1e-9)
            peer_rates.append(rate)
            ours.append(mine["samples"] / mine["wall_s"])
            rows.append((full, warm, mine))
            print(
                f"  round {n + 1}: ansible-rulebook {full['wall_s']:.1f} s all, "
                f"{warm['wall_s']:.1f} s the first {WARM:,} ({full['matches']:,} matches) -> "
                f"{rate:,.0f} events/s; "
                f"gpuwarden drill {mine['wall_s']:.2f} s ({mine['fired']} fired) -> "
                f"{ours[-1]:,.0f} samples/s · {load()}",
                flush=True,
            )
    peer, mine_rate = statistics.median(peer_rates), statistics.median(ours)
    print(f"\n{'ansible-rulebook, one rule (after start-up)':<52} {peer:>10,.0f} events/s")
    print(f"{'gpuwarden drill, one rule (everything)':<52} {mine_rate:>10,.0f} samples/s")
    print(f"{'ratio':<52} {mine_rate / peer:>10.1f} x")


if __name__ == "__main__":
    print(banner())
    main()
    sys.exit(0)
