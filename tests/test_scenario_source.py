"""Scenario playback: keyframes, ramps, events, lost GPUs, and real stand-in processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwarden.config import Priorities
from gpuwarden.model import EventKind
from gpuwarden.sources.procs import Attributor
from gpuwarden.sources.scenario import SYNTHETIC_PID_BASE, ScenarioSource

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


BASIC = """
name: basic
host: node-1
gpus:
  - {index: 0, name: NVIDIA A100-SXM4-80GB, memory_total_mib: 81920, power_limit_w: 400}
  - {index: 1, name: NVIDIA A100-SXM4-80GB, memory_total_mib: 81920, unsupported: [temperature_c]}
jobs:
  - {id: trainer, user: alice, cmdline: python train.py, env: {GPUWARDEN_PRIORITY: high}}
  - {id: notebook, user: bob, cmdline: jupyter-lab, env: {GPUWARDEN_PRIORITY: low}, started: 2h}
timeline:
  - at: 0s
    gpus:
      0: {utilization_pct: 90, temperature_c: 70, power_w: 300, other_mib: 100,
          jobs: {trainer: 40000}}
      1: {utilization_pct: 10, temperature_c: 40}
  - at: 2m
    ramp: true
    gpus: {0: {temperature_c: 80, jobs: {trainer: 40000, notebook: {memory_mib: 20000, sm_pct: 0}}}}
  - at: 3m
    events: [{gpu: 1, xid: 79}]
    gpus: {1: {lost: "fell off the bus"}}
  - at: 5m
    end: true
"""


@pytest.fixture
def basic(tmp_path: Path):
    with ScenarioSource.open(write(tmp_path, BASIC)) as source:
        yield source


def at(source: ScenarioSource, offset: float):
    return source.snapshot(source.start_time + offset)


def test_first_keyframe(basic: ScenarioSource) -> None:
    snap = at(basic, 0)
    assert snap.host == "node-1"
    gpu0 = snap.gpu(0)
    assert gpu0 is not None
    assert gpu0.memory.used_mib == 40100  # the job plus other_mib
    assert gpu0.memory.free_mib == 81920 - 40100
    assert gpu0.power_limit_w == 400
    assert [p.info.user for p in snap.processes] == ["alice"]


def test_unsupported_field_is_none_not_zero(basic: ScenarioSource) -> None:
    gpu1 = at(basic, 0).gpu(1)
    assert gpu1 is not None
    assert gpu1.temperature_c is None
    assert gpu1.power_limit_w is None  # never declared: unknown, not 0
    assert gpu1.utilization_pct == 10


def test_ramp_interpolates_values_and_a_new_job_from_zero(basic: ScenarioSource) -> None:
    snap = at(basic, 60)
    gpu0 = snap.gpu(0)
    assert gpu0 is not None
    assert gpu0.temperature_c == 75
    notebook = [p for p in snap.processes if p.info.user == "bob"]
    assert notebook[0].gpu_memory_mib == 10000
    assert gpu0.memory.used_mib == 40000 + 10000 + 100


RAMPING_JOBS = """
name: order
gpus: [{index: 0, memory_total_mib: 81920}]
jobs:
  - {id: a, cmdline: a}
  - {id: b, cmdline: b}
  - {id: c, cmdline: c}
  - {id: d, cmdline: d}
timeline:
  - {at: 0s, gpus: {0: {jobs: {c: 100, a: 200}}}}
  - {at: 1m, ramp: true, gpus: {0: {jobs: {d: 300, a: 400, b: 500}}}}
  - {at: 2m, end: true}
"""

ORDER_OF_JOBS = """
import sys
from gpuwarden.sources.scenario import ScenarioSource
with ScenarioSource.open(sys.argv[1], spawn=False) as source:
    snapshot = source.snapshot(source.start_time + 30)
    print(" ".join(source.job_of(p.pid) or "?" for p in snapshot.processes))
"""


def test_ramping_jobs_are_listed_in_keyframe_order_in_every_run(tmp_path: Path) -> None:
    """The earlier keyframe's jobs, then those the later one adds, whatever the interpreter's
    hash seed (the order of a GPU's processes is the order steps act on them in)."""
    path = write(tmp_path, RAMPING_JOBS)
    orders = set()
    for seed in ("1", "2", "3", "4", "5"):
        done = subprocess.run(
            [sys.executable, "-c", ORDER_OF_JOBS, str(path)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
        )
        orders.add(done.stdout.strip())
    assert orders == {"c a d b"}


def test_values_persist_after_a_keyframe(basic: ScenarioSource) -> None:
    gpu0 = at(basic, 150).gpu(0)
    assert gpu0 is not None
    assert (gpu0.temperature_c, gpu0.utilization_pct) == (80, 90)


def test_event_is_reported_once_and_gpu_turns_lost(basic: ScenarioSource) -> None:
    assert at(basic, 170).events == ()
    snap = at(basic, 181)
    kinds = sorted(e.kind for e in snap.events)
    assert kinds == [EventKind.GPU_LOST, EventKind.XID]
    xid = next(e for e in snap.events if e.kind is EventKind.XID)
    assert (xid.gpu, xid.xid, xid.time) == (1, 79, basic.start_time + 180)
    gpu1 = snap.gpu(1)
    assert gpu1 is not None
    assert gpu1.lost
    assert gpu1.error == "fell off the bus"
    assert snap.gpu(0) is not None  # the other GPU still reports
    assert at(basic, 200).events == ()


def test_first_snapshot_reports_events_so_far(tmp_path: Path) -> None:
    with ScenarioSource.open(write(tmp_path, BASIC)) as source:
        snap = at(source, 240)
    assert [e.xid for e in snap.events] == [79]


def test_synthetic_pids_cannot_be_real(basic: ScenarioSource) -> None:
    snap = at(basic, 100)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for proc in snap.processes:
        assert proc.pid >= SYNTHETIC_PID_BASE > pid_max
        assert not Path(f"/proc/{proc.pid}").exists()


def test_priority_and_age_from_the_scenario(basic: ScenarioSource) -> None:
    snap = at(basic, 120)
    by_user = {p.info.user: p for p in snap.processes}
    assert by_user["alice"].info.priority == "high"
    assert by_user["bob"].info.priority == "low"
    assert by_user["bob"].age_s(snap.time) == pytest.approx(2 * 3600 + 120)


def test_declared_priority_is_capped(tmp_path: Path) -> None:
    text = BASIC.replace("GPUWARDEN_PRIORITY: high", "GPUWARDEN_PRIORITY: critical")
    with ScenarioSource.open(write(tmp_path, text), priorities=Priorities()) as source:
        snap = at(source, 0)
    assert snap.processes[0].info.declared_priority == "critical"
    assert snap.processes[0].info.priority == "high"


@pytest.mark.parametrize(
    ("job", "unit", "trusted", "priority"),
    [
        # A unit alone is the system manager's: a root-owned cgroup.
        ("unit: triton.service", "triton.service", True, "critical"),
        ("cgroup: /system.slice/triton.service", "triton.service", True, "critical"),
        # Under the user's own manager: its owner made it, so it does not raise.
        (
            "cgroup: /user.slice/user-1000.slice/user@1000.service/app.slice/triton.service",
            "triton.service",
            False,
            "normal",
        ),
    ],
)
def test_a_scenario_says_where_a_unit_lies(
    tmp_path: Path, job: str, unit: str, trusted: bool, priority: str
) -> None:
    text = BASIC.replace(
        "{id: trainer, user: alice, cmdline: python train.py, env: {GPUWARDEN_PRIORITY: high}}",
        f"{{id: trainer, user: alice, uid: 1000, exe: /usr/bin/python3.11, "
        f"cmdline: python train.py, {job}}}",
    )
    priorities = Priorities.model_validate(
        {
            "classes": [
                {"name": "critical", "match": [{"unit": r"triton\.service"}]},
                {"name": "normal"},
            ],
            "declared_max": "normal",
        }
    )
    with ScenarioSource.open(write(tmp_path, text), priorities=priorities) as source:
        info = at(source, 0).processes[0].info
    assert (info.systemd_unit, info.cgroup_trusted, info.priority) == (unit, trusted, priority)
    assert (info.uid, info.exe) == (1000, "/usr/bin/python3.11")


def test_explicit_memory_used_overrides_the_sum(tmp_path: Path) -> None:
    text = BASIC.replace("other_mib: 100,", "other_mib: 100, memory_used_mib: 80000,")
    with ScenarioSource.open(write(tmp_path, text)) as source:
        gpu0 = at(source, 0).gpu(0)
    assert gpu0 is not None
    assert gpu0.memory.used_mib == 80000


def test_orphaned_job(tmp_path: Path) -> None:
    with ScenarioSource.open(SCENARIOS / "orphaned-memory-dead-pid.yaml") as source:
        snap = at(source, 0)
    ghost = [p for p in snap.processes if p.gpu == 2]
    assert len(ghost) == 1
    assert ghost[0].info.orphaned
    assert ghost[0].info.user is None
    assert ghost[0].gpu_memory_mib == 24576


SPAWNED = """
name: spawned
host: node-2
gpus: [{index: 0, memory_total_mib: 81920}]
jobs:
  - id: trainer
    cmdline: python train.py --model llama
    env: {GPUWARDEN_PRIORITY: high, GPUWARDEN_CHECKPOINT_SIGNAL: SIGUSR1, SECRET_TOKEN: s3cr3t}
    spawn: true
  - id: sweep
    cmdline: python sweep.py --trial 3
    env: {GPUWARDEN_PRIORITY: low}
    spawn: true
timeline:
  - at: 0s
    gpus: {0: {other_mib: 500, jobs: {trainer: 50000, sweep: 20000}}}
  - at: 10m
    end: true
"""


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_spawned_jobs_are_real_processes_with_real_attribution(tmp_path: Path) -> None:
    priorities = Priorities()
    with ScenarioSource.open(
        write(tmp_path, SPAWNED), priorities=priorities, attributor=Attributor(priorities)
    ) as source:
        snap = at(source, 0)
        by_pid = {p.pid: p for p in snap.processes}
        trainer = by_pid[source.pid_of("trainer")]
        assert Path(f"/proc/{trainer.pid}").exists()
        assert trainer.info.cmdline == ("python", "train.py", "--model", "llama")
        assert trainer.info.priority == "high"
        assert trainer.info.checkpoint_signal == "SIGUSR1"
        assert "SECRET_TOKEN" not in (trainer.info.env or {})
        assert by_pid[source.pid_of("sweep")].info.priority == "low"


def test_spawned_job_acknowledges_a_checkpoint_signal(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    with ScenarioSource.open(write(tmp_path, SPAWNED), ack_spool=spool) as source:
        standin = source.standins["trainer"]
        assert standin.ack_dir == spool
        ack = standin.ack_file
        ack.parent.mkdir(mode=0o700, parents=True)  # what the daemon does before it asks
        os.kill(standin.pid, signal.SIGUSR1)
        wait_for(ack.exists)
        wait_for(lambda: "ack SIGUSR1" in standin.signals())
        assert standin.signals()[:2] == [f"ready pid={standin.pid}", "signal SIGUSR1"]
        assert '"signal": "SIGUSR1"' in ack.read_text()


def test_killed_job_memory_leaves_the_next_snapshot(tmp_path: Path) -> None:
    with ScenarioSource.open(write(tmp_path, SPAWNED)) as source:
        before = at(source, 0).gpu(0)
        assert before is not None
        assert before.memory.used_mib == 70500
        sweep = source.standins["sweep"]
        os.kill(sweep.pid, signal.SIGTERM)
        wait_for(lambda: not sweep.alive())
        snap = at(source, 5)
        after = snap.gpu(0)
        assert after is not None
        assert after.memory.used_mib == 50500
        assert [p.pid for p in snap.processes] == [source.pid_of("trainer")]
        assert sweep.signals()[-1] == "exit SIGTERM"


def test_close_stops_every_stand_in(tmp_path: Path) -> None:
    source = ScenarioSource.open(write(tmp_path, SPAWNED))
    pids = [s.pid for s in source.standins.values()]
    source.close()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()
