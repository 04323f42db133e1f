"""The daemon's ladder on a real Slurm job: the run loop, the journal and the executors, with a
source that reports the job's process on a GPU that is full while it runs (this machine has no
GPU: the source is the one seam; attribution, Slurm and the signals are real)."""

from __future__ import annotations

import time
from pathlib import Path

from gpuwarden import config as config_mod
from gpuwarden.config import Config
from gpuwarden.journal.journal import Journal
from gpuwarden.model import GpuProcess, GpuState, Memory, Snapshot
from gpuwarden.playbook import loader
from gpuwarden.runtime import Runtime
from gpuwarden.sources.procs import Attributor
from tests.slurm_cluster import (  # noqa: F401
    Job,
    SlurmCluster,
    fixture_slurm,
    fixture_slurm_cluster,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
TOTAL_MIB = 80_000

LADDER = """
rules:
  - name: gpu-full
    when: gpu.memory.used_pct >= 95
    until: gpu.memory.used_pct < 80
    steps:
      - checkpoint: {wait: 30s}
      - suspend: {}
      - requeue: {hold: true, grace: 20s}
"""


class JobOnGpu:
    """GPU 0, 97 % full while the job's process lives, then 10 %; the process is described by
    the daemon's real attribution (its Slurm job comes from its cgroup or environment)."""

    name = "slurm-job-on-gpu"

    def __init__(self, pid: int, cfg: Config) -> None:
        self.pid = pid
        self.attributor = Attributor(cfg.priorities)

    def snapshot(self, now: float) -> Snapshot:
        info = self.attributor.describe([self.pid], now)[self.pid]
        alive = not info.orphaned and not info.zombie
        used = 77_600 if alive else 8_000
        gpu = GpuState(0, name="stand-in", memory=Memory(TOTAL_MIB, used, TOTAL_MIB - used, 0))
        procs = (GpuProcess(self.pid, 0, 70_000, info),) if alive else ()
        return Snapshot(host="slurm-node", time=now, gpus=(gpu,), processes=procs)

    def close(self) -> None:
        pass


def test_a_ladder_checkpoints_suspends_and_requeues_a_slurm_job(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(tmp_path)
    pid = job.pid()
    assert pid is not None
    demo = config_mod.load(ROOT / "config" / "demo.yaml")  # root's processes not protected
    cfg = demo.model_copy(update={"slurm": slurm.config(), "ack_spool": slurm.spool})
    playbook = tmp_path / "ladder.yaml"
    playbook.write_text(LADDER)
    journal_path = tmp_path / "state" / "journal.db"
    runtime = Runtime(
        cfg,
        JobOnGpu(pid, cfg),
        loader.load([playbook], cfg),
        Journal(journal_path),
        host="slurm-node",
    )
    try:
        deadline = time.monotonic() + 90
        while runtime.stats.undone == 0:  # the incident resolved and its undo ran
            assert time.monotonic() < deadline, "the ladder did not finish"
            runtime.tick()
            time.sleep(0.1)
    finally:
        runtime.shutdown()

    journal = Journal.open_readonly(journal_path)
    try:
        [incident] = journal.incidents()
        rows = journal.timeline(incident.id)
    finally:
        journal.close()
    outcomes = [
        (r.data["step_kind"], r.reason, r.data["detail"]) for r in rows if r.kind == "outcome"
    ]
    assert [o[:2] for o in outcomes] == [
        ("checkpoint", "acknowledged"),
        ("suspend", "suspended"),
        ("requeue", "requeued"),
    ]
    assert f"via slurm: scancel --signal=USR1 --full {job.id}" in outcomes[0][2]
    assert f"via slurm: scontrol suspend {job.id}" in outcomes[1][2]
    assert f"via slurm: scontrol requeuehold {job.id}" in outcomes[2][2]
    [undone] = [r for r in rows if r.kind == "undone"]
    assert (undone.data["undo"], undone.reason) == ("slurm_resume", "already")  # it is pending
    assert [r.data["targets"][0]["slurm_job"] for r in rows if r.kind == "step"] == [job.id] * 3
    # Slurm's own view, and what the job's process received
    shown = slurm.show(job)
    assert (shown["JobState"], shown["Reason"]) == ("PENDING", "job_requeued_in_held_state")
    assert shown["Restarts"] == "1"
    # The job was suspended when it was requeued: Slurm ended it with SIGKILL, unseen.
    assert job.signals() == ["signal SIGUSR1", "ack SIGUSR1"]
