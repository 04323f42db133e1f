"""Which scenario rehearses which shipped playbook: the golden timelines in tests/golden/."""

from __future__ import annotations

import json
from pathlib import Path

from gpuwarden import config, drill
from gpuwarden.playbook import loader

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
CONFIG = ROOT / "config" / "gpuwarden.yaml"

# playbook file stem -> scenario file stem
PAIRS: dict[str, str] = {
    "memory-pressure": "memory-pressure-low-priority",
    "idle-holding-memory": "idle-notebook-holding-memory",
    "orphaned-memory": "orphaned-memory-dead-pid",
    "gpu-lost-fatal-xid": "xid79-one-of-eight",
    "thermal-throttling": "thermal-throttling",
    "working-hours-large-jobs": "working-hours-large-low-priority-job",
    "weekly-health-check": "weekly-health-check-remapped-rows",
    "memory-full-soon": "memory-leak-slow-climb",
    "cloud-burst": "cloud-burst",
}


def timeline(playbook: str) -> list[str]:
    """The drill of one shipped playbook against its scenario, one JSON line per record."""
    cfg = config.load(CONFIG)
    playbooks = loader.load([ROOT / "playbooks" / f"{playbook}.yaml"], cfg)
    scenario = ROOT / "scenarios" / f"{PAIRS[playbook]}.yaml"
    return [json.dumps(record, sort_keys=True) for record in drill.run(scenario, cfg, playbooks)]


def golden_path(playbook: str) -> Path:
    return GOLDEN_DIR / f"{playbook}.jsonl"
