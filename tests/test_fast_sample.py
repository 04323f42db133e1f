"""Between ticks: fast readings start a rule's pending clock at the reading that crossed, and
a tick runs when `for` is reached. The run loop on the NVML source over the fake NVML library
and a simulated clock (both our seams): times are the clock's, exact, not measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwarden import config as config_mod
from gpuwarden.clock import SimClock
from gpuwarden.config import Config
from gpuwarden.engine.fast import FastWatch, watched
from gpuwarden.journal.journal import Journal
from gpuwarden.model import GpuState, Memory
from gpuwarden.playbook import loader
from gpuwarden.runtime import Runtime
from gpuwarden.sources.nvml import NvmlSource
from tests.fake_nvml import FakeGpu, FakeNvml, installed

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOK = ROOT / "playbooks" / "memory-pressure.yaml"
TOTAL = 81559
START = 1_767_225_600.0

RULES = """rules:
  - name: memory-full
    for_each: gpu
    when: gpu.memory.used_pct >= 95
    for: 5s
    steps:
      - notify: oncall
  - name: memory-trend
    for_each: gpu
    when: avg(gpu.memory.used_pct, 1m) >= 99
    for: 5s
    steps:
      - notify: oncall
"""


class BreachClock(SimClock):
    """The simulated clock; at ``breach`` the fake GPU's memory jumps to 98 %, and at
    ``end`` the run is told to stop. Every reading the source made is kept."""

    def __init__(self, gpu: FakeGpu, breach: float, end: float) -> None:
        super().__init__(START)
        self.gpu, self.breach, self.end = gpu, breach, end
        self.runtime: Runtime | None = None

    def advance(self, seconds: float) -> None:
        super().advance(seconds)
        if self.now() >= self.breach:
            self.gpu.used_mib = int(TOTAL * 0.98)
        if self.now() >= self.end and self.runtime is not None:
            self.runtime.stop()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return path


def config(**extra: Any) -> Config:
    return config_mod.Config.model_validate(
        {"notify": {"targets": {"oncall": {"urls": ["json://127.0.0.1:9/"]}}}, **extra}
    )


def run_once(tmp_path: Path, *, fast_sample: float, breach: float) -> list[Any]:
    cfg = config(tick=1.0, fast_sample=fast_sample, state_dir=str(tmp_path))
    gpu = FakeGpu(index=0, total_mib=TOTAL, used_mib=TOTAL // 2)
    clock = BreachClock(gpu, START + breach, START + breach + 8.0)
    with installed(FakeNvml([gpu])):
        source = NvmlSource(None, host="test-node", events=False)
        runtime = Runtime(
            cfg,
            source,
            loader.load([write(tmp_path, RULES)], cfg),
            Journal(tmp_path / "journal.db"),
            clock=clock,
            host="test-node",
        )
        clock.runtime = runtime
        runtime.run()
    journal = Journal.open_readonly(tmp_path / "journal.db")
    try:
        incidents = journal.incidents()
        assert [i.rule for i in incidents] == ["memory-full"]
        return journal.timeline(incidents[0].id)
    finally:
        journal.close()


def times(rows: list[Any]) -> dict[str, float]:
    return {row.kind: row.time - START for row in rows if row.kind in ("pending", "firing")}


def test_the_pending_clock_starts_at_the_fast_reading_that_crossed(tmp_path: Path) -> None:
    # Ticks at 0, 1, 2, ...; readings every 0.2 s between them. The breach at 2.3 s is first
    # seen by the reading at 2.4 s: pending from then, firing when `for` is reached (7.4 s),
    # not at the ticks after (3 s and 8 s).
    found = times(run_once(tmp_path, fast_sample=0.2, breach=2.3))
    assert found["pending"] == pytest.approx(2.4, abs=1e-6)
    assert found["firing"] == pytest.approx(7.4 + 0.001, abs=1e-6)


def test_without_fast_readings_the_clock_starts_at_the_next_tick(tmp_path: Path) -> None:
    # The tick at 8 s, where `for` is reached, moves to just after it (one tick, not two).
    found = times(run_once(tmp_path, fast_sample=0, breach=2.3))
    assert found["pending"] == pytest.approx(3.0, abs=1e-6)
    assert found["firing"] == pytest.approx(8.0 + 0.001, abs=1e-6)


def test_only_rules_a_fast_reading_can_decide_are_watched(tmp_path: Path) -> None:
    cfg = config()
    playbooks = loader.load([write(tmp_path, RULES)], cfg)
    assert [r.name for r in playbooks.rules if watched(r)] == ["memory-full"]
    watch = FastWatch(playbooks, cfg.tz)
    assert watch.fields == {"gpu.memory.used_pct"}

    def gpu(used: int) -> GpuState:
        return GpuState(index=0, memory=Memory(total_mib=TOTAL, used_mib=used, free_mib=0))

    assert watch.crossed([gpu(TOTAL // 2)], START) == []
    assert watch.crossed([gpu(TOTAL)], START + 0.2) == ["memory-full@gpu0"]
    assert watch.crossed([gpu(TOTAL)], START + 0.4) == []  # still over: no new crossing


def test_a_watched_rule_may_read_the_time(tmp_path: Path) -> None:
    cfg = config()
    text = RULES.replace(
        "when: gpu.memory.used_pct >= 95", "when: gpu.memory.used_pct >= 95 and time.hour == 0"
    )
    watch = FastWatch(loader.load([write(tmp_path, text)], cfg), cfg.tz)
    assert [r.name for r in watch.rules] == ["memory-full"]
    full = GpuState(index=0, memory=Memory(total_mib=TOTAL, used_mib=TOTAL, free_mib=0))
    assert watch.crossed([full], START + 3600) == []  # 01:00 UTC: the condition is false
    assert watch.crossed([full], START) == ["memory-full@gpu0"]  # 00:00 UTC


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("2s", "fast_sample: 2s is not shorter than the tick (1s)"),
        ("10ms", "fast_sample: 10ms is too often; use at least 50ms, or 0"),
        ("-1", "fast_sample: a duration cannot be negative"),
        ("soon", "fast_sample: not a duration: 'soon'"),
    ],
)
def test_a_bad_fast_sample_is_named_with_its_position(
    tmp_path: Path, value: str, said: str
) -> None:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(f"tick: 1s\nfast_sample: {value}\n")
    result = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "check", "--config", str(path), str(PLAYBOOK)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr  # `check`: 1 when the config is not valid
    assert f"{path}:2:14: {said}" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_fast_sample_zero_and_the_default_load(tmp_path: Path) -> None:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text("tick: 1s\nfast_sample: 0\n")
    assert config_mod.load(path).fast_sample == 0
    path.write_text("tick: 100ms\n")  # the default (200ms) is not checked against the tick
    assert config_mod.load(path).fast_sample == pytest.approx(0.2)
