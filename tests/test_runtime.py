"""The run loop on real processes: the same steps as a drill, dry-run, restart, undo, rails."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpuwarden import config as config_mod
from gpuwarden import drill
from gpuwarden.clock import ScaledClock
from gpuwarden.config import Config
from gpuwarden.journal.journal import Journal
from gpuwarden.playbook import loader
from gpuwarden.runtime import Runtime
from gpuwarden.sources.procs import Attributor
from gpuwarden.sources.scenario import ScenarioSource
from tests.signal_targets import session_spool

ROOT = Path(__file__).resolve().parent.parent
SPEED = 40.0


def scenario_copy(tmp_path: Path, end: str = "4m30s", extra: str = "") -> Path:
    text = (ROOT / "scenarios" / "memory-pressure-low-priority.yaml").read_text()
    text = text[: text.index("  - at: 4m\n")]  # keep the squeeze, replace what follows
    text += extra + f"  - at: {end}\n    end: true\n"
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def cfg() -> Config:
    # The stand-ins run as whoever runs the tests (root in CI): do not protect root here.
    loaded = config_mod.load(ROOT / "config" / "demo.yaml")
    return loaded.model_copy(update={"ack_spool": session_spool()})


class Run:
    """One daemon run over a scenario with real stand-in jobs."""

    def __init__(
        self,
        tmp_path: Path,
        cfg: Config,
        scenario: Path,
        playbook: Path | str,
        *,
        at: float = 0.0,
        dry_run: bool = False,
    ) -> None:
        self.cfg = cfg
        self.playbooks = loader.load([playbook], cfg)
        self.source = ScenarioSource.open(
            scenario,
            priorities=cfg.priorities,
            attributor=Attributor(cfg.priorities),
            workdir=tmp_path / "jobs",
            ack_spool=cfg.ack_spool,
        )
        self.clock = ScaledClock(SPEED)
        self.source.start_time = self.clock.now() - at
        self.journal_path = tmp_path / "state" / "journal.db"
        self.dry_run = dry_run

    def runtime(self) -> Runtime:
        return Runtime(
            self.cfg,
            self.source,
            self.playbooks,
            Journal(self.journal_path),
            clock=self.clock,
            dry_run=self.dry_run,
            host="test-node",
        )

    def signals(self, job: str) -> list[str]:
        return self.source.standins[job].signals()

    def steps(self) -> list[tuple[str, tuple[str | None, ...]]]:
        journal = Journal.open_readonly(self.journal_path)
        try:
            out = []
            for incident in journal.incidents():
                for row in journal.timeline(incident.id):
                    if row.kind == "step":
                        pids = [t["pid"] for t in row.data.get("targets", [])]
                        out.append(
                            (
                                row.data.get("label") or row.data.get("kind", "?"),
                                tuple(self.source.job_of(p) for p in pids),
                            )
                        )
            return out
        finally:
            journal.close()


def drill_steps(scenario: Path, cfg: Config, playbook: Path) -> list[tuple[str, tuple[Any, ...]]]:
    playbooks = loader.load([playbook], cfg)
    return [
        (r["step"], tuple(t["job"] for t in r["targets"]))
        for r in drill.run(scenario, cfg, playbooks)
        if r["kind"] == "step"
    ]


def test_a_real_run_takes_the_same_steps_as_the_drill(tmp_path: Path, cfg: Config) -> None:
    scenario = scenario_copy(tmp_path)
    playbook = ROOT / "playbooks" / "memory-pressure.yaml"
    run = Run(tmp_path, cfg, scenario, playbook, at=80.0)
    stats = run.runtime().run()
    assert (
        run.steps()
        == drill_steps(scenario, cfg, playbook)
        == [("notify", ()), ("checkpoint", ("trainer",)), ("kill", ("sweep",))]
    )
    assert stats.failed == 0
    assert "ack SIGUSR1" in run.signals("trainer")
    assert run.signals("sweep")[-1] == "exit SIGTERM"
    assert "signal SIGTERM" not in run.signals("trainer")


def test_dry_run_plans_the_same_and_touches_nothing(tmp_path: Path, cfg: Config) -> None:
    scenario = scenario_copy(tmp_path, end="4m20s")
    playbook = ROOT / "playbooks" / "memory-pressure.yaml"
    run = Run(tmp_path, cfg, scenario, playbook, at=80.0, dry_run=True)
    runtime = run.runtime()
    stats = runtime.run()
    assert [s[0] for s in run.steps()] == ["notify", "checkpoint", "kill"]
    assert run.steps()[2] == ("kill", ("sweep",))
    for job in ("trainer", "sweep"):
        assert [line for line in run.signals(job) if not line.startswith("ready")] == []
    assert stats.failed == 0


SQUEEZE = """
rules:
  - name: squeeze
    for_each: gpu
    when: gpu.memory.used_pct >= 95
    for: 10s
    until: gpu.memory.used_pct < 85
    steps:
      - suspend: {select: process.priority <= low}
      - after: 1m
        renice: {select: process.priority >= normal, nice: 10}
"""
# at 3m the sweep shrinks: GPU 0 falls below 85 % and the incident resolves
RELIEF = """  - at: 3m
    gpus:
      0: {jobs: {trainer: {memory_mib: 52000, sm_pct: 85}, sweep: {memory_mib: 5000}}}
"""


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def wait_until(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_restart_mid_ladder_repeats_nothing_and_resumes_the_job(
    tmp_path: Path, cfg: Config
) -> None:
    playbook = tmp_path / "squeeze.yaml"
    playbook.write_text(SQUEEZE)
    scenario = scenario_copy(tmp_path, end="3m30s", extra=RELIEF)
    run = Run(tmp_path, cfg, scenario, playbook, at=90.0)
    sweep = run.source.standins["sweep"]
    first = run.runtime()
    first.recover()
    # tick until the suspend has been carried out, then "die": no shutdown, no undo
    wait_until(lambda: (first.tick(), state_of(sweep.pid) == "T")[1])
    first.tick()  # its outcome is journaled; then it is abandoned, as if SIGKILLed
    second = run.runtime()
    stats = second.run()
    assert [s[0] for s in run.steps()] == ["suspend", "renice"]  # nothing repeated
    assert run.steps()[0] == ("suspend", ("sweep",))
    assert "signal SIGCONT" in sweep.signals()  # resumed when the incident resolved
    assert stats.undone >= 1


def test_shutdown_resumes_a_suspended_job(tmp_path: Path, cfg: Config) -> None:
    playbook = tmp_path / "squeeze.yaml"
    playbook.write_text(SQUEEZE)
    scenario = scenario_copy(tmp_path, end="2m40s")  # ends while still squeezed
    run = Run(tmp_path, cfg, scenario, playbook, at=90.0)
    sweep = run.source.standins["sweep"]
    states: list[str] = []
    runtime = run.runtime()
    close_source = run.source.close
    original_shutdown = runtime.shutdown

    def shutdown() -> None:
        states.append(state_of(sweep.pid))  # the incident is still open here
        original_shutdown()

    def close() -> None:
        states.append(state_of(sweep.pid))  # undos have run; the jobs still exist
        close_source()

    runtime.shutdown = shutdown  # type: ignore[method-assign]
    run.source.close = close  # type: ignore[method-assign]
    runtime.run()
    assert states[0] == "T"  # suspended while the incident was open
    assert states[1] != "T"  # resumed on the way out
    assert "signal SIGCONT" in sweep.signals()


def test_the_circuit_breaker_halts_destructive_steps(tmp_path: Path, cfg: Config) -> None:
    tight = cfg.model_copy(
        update={
            "safety": cfg.safety.model_copy(
                update={"breaker": config_mod.Limit(actions=1, window=600.0)}
            )
        }
    )
    playbook = tmp_path / "two-kills.yaml"
    playbook.write_text("""
rules:
  - name: two-kills
    for_each: gpu
    when: gpu.memory.used_pct >= 50
    for: 10s
    steps:
      - kill: {select: process.priority <= low, grace: 2s}
      - kill: {select: process.priority >= high, grace: 2s}
""")
    scenario = scenario_copy(tmp_path, end="2m40s")
    run = Run(tmp_path, tight, scenario, playbook, at=90.0)
    stats = run.runtime().run()
    assert stats.refused == 1
    assert run.signals("sweep")[-1] == "exit SIGTERM"
    assert "signal SIGTERM" not in run.signals("trainer")
    journal = Journal(run.journal_path)
    try:
        assert journal.breaker() is not None
        assert journal.reset_breaker(time.time())
        assert journal.breaker() is None
    finally:
        journal.close()


def outcomes(journal_path: Path, kind: str) -> list[dict[str, Any]]:
    """The per-target outcome records of every ``kind`` step in the journal."""
    journal = Journal.open_readonly(journal_path)
    try:
        return [
            row.data
            for incident in journal.incidents()
            for row in journal.timeline(incident.id)
            if row.kind == "outcome" and row.data.get("step_kind") == kind
        ]
    finally:
        journal.close()


def test_the_decoy_drill_kills_the_hog_and_plans_trip_no_breaker(
    tmp_path: Path, cfg: Config
) -> None:
    # The breaker at 3: a plan of six (five decoys and the hog) counted whole would trip it.
    rails = cfg.safety.model_copy(update={"breaker": config_mod.Limit(actions=3, window=600.0)})
    guarded = cfg.model_copy(update={"safety": rails})
    text = (ROOT / "scenarios" / "decoy-swarm.yaml").read_text()
    scenario = tmp_path / "decoy-swarm.yaml"
    scenario.write_text(text.replace("  - at: 5m\n    end: true", "  - at: 3m\n    end: true"))
    playbook = ROOT / "playbooks" / "memory-pressure.yaml"
    assert [step for step in drill_steps(scenario, guarded, playbook) if step[0] == "kill"] == [
        ("kill", ("hog",))
    ]
    run = Run(tmp_path, guarded, scenario, playbook)
    stats = run.runtime().run()
    assert stats.refused == 0
    assert [
        (run.source.job_of(o["pid"]), o["state"]) for o in outcomes(run.journal_path, "kill")
    ] == [("hog", "terminated")]
    assert run.signals("hog")[-1] == "exit SIGTERM"
    for n in range(1, 6):  # never signalled (the run's end stopped them with SIGKILL)
        decoy = run.source.standins[f"decoy-{n}"]
        assert decoy.signals() == [f"ready pid={decoy.pid}"]
    journal = Journal.open_readonly(run.journal_path)
    try:
        assert journal.breaker() is None
        assert journal.actions_since(0) == 1
    finally:
        journal.close()


def cloud_round(runtime: Runtime) -> Any:
    assert runtime.rounds is not None
    return runtime.rounds.running


def test_the_daemon_calls_ec2_only_when_it_has_something_to_look_after(
    tmp_path: Path, cfg: Config
) -> None:
    """No rule provisions and nothing runs: no reconcile rounds (no EC2 calls every minute on
    a node that never bursts). A live instance in the journal: a round at the next interval."""
    from gpuwarden.clock import SimClock
    from gpuwarden.cloud.ec2 import CloudError
    from gpuwarden.cloud.instance import Managed
    from gpuwarden.cloud.service import CloudService
    from gpuwarden.cloud.store import InstanceStore
    from gpuwarden.config import CloudProfile

    assert cfg.cloud.profiles  # demo.yaml has a profile
    connects: list[str] = []

    def connect(profile: CloudProfile) -> Any:
        connects.append(profile.region)
        raise CloudError("unavailable", "no EC2 in this test")

    source = ScenarioSource.open(ROOT / "scenarios" / "xid79-one-of-eight.yaml")
    clock = SimClock(source.start_time)
    journal = Journal(tmp_path / "journal.db")
    store = InstanceStore.open(journal.path)
    runtime = Runtime(
        cfg,
        source,
        loader.load([ROOT / "playbooks" / "memory-pressure.yaml"], cfg),
        journal,
        clock=clock,
        host="test-node",
        cloud=CloudService(cfg.cloud, store, host="test-node", connect=connect),
    )
    try:
        for _ in range(3):
            runtime.tick()
            clock.sleep(cfg.cloud.reap_interval)
        assert cloud_round(runtime) is None
        assert connects == []
        store.add(
            Managed(
                instance_id="i-0123456789abcdef0",
                profile="burst-a100",
                region="us-east-1",
                instance_type="p4d.24xlarge",
                market="on-demand",
                state="running",
                launched_at=clock.now(),
                expires_at=clock.now() + 3600,
                host="test-node",
            ),
            clock.now(),
        )
        clock.sleep(cfg.cloud.reap_interval)
        runtime.tick()
        started = cloud_round(runtime)
        assert started is not None
        started.result(timeout=10)
        assert connects  # the round asked EC2 (reconcile, then the reaper: it is past its ttl)
        assert set(connects) == {"us-east-1"}
    finally:
        runtime.shutdown()
        journal.close()
        store.close()
