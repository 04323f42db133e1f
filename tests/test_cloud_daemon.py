"""The cloud burst end to end, with real processes: ``gpuwarden run`` replays a scenario whose
GPU fills up, launches an instance on a moto EC2 server on 127.0.0.1, tells a real HTTP
receiver which instance it launched, and terminates it once the incident has resolved and the
profile's linger has passed. A daemon killed right after the launch and started again on the
same journal launches nothing a second time. ``gpuwarden cloud --json`` shows what EC2 shows.

Times: the scenario is replayed at ``SPEED`` x, so the whole incident — pressure, launch,
relief, linger, reap — takes a few seconds of wall time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.cloud import tags
from gpuwarden.cloud.instance import Managed
from gpuwarden.cloud.store import InstanceStore
from tests.cloud_server import (  # noqa: F401
    MotoEc2,
    fixture_aws_env,
    fixture_fresh_ec2,
    fixture_moto_ec2,
)
from tests.notify_receivers import JsonReceiver

ROOT = Path(__file__).resolve().parent.parent
HOST = "burst-test-node"
SPEED = 20.0  # simulated seconds per real second
INSTANCE_TYPE = "p4d.24xlarge"

# GPU 0 is full from 10 s to 90 s: pending at 10 s, firing at 20 s (for: 10s), the provision
# step at 30 s, resolved at 90 s; with linger 20s the instance is due at 110 s, and the reaper
# (every 2 s) ends it before the scenario stops at 150 s.
SCENARIO = """\
version: 1
name: burst-e2e
description: One GPU of an inference node fills up for a minute and a half.
host: burst-test-node
gpus:
  - {index: 0, name: NVIDIA H100 80GB HBM3, memory_total_mib: 81559}
jobs:
  - id: inference
    cmdline: tritonserver --model-repository /models
    env: {GPUWARDEN_PRIORITY: high}
timeline:
  - at: 0s
    gpus: {0: {utilization_pct: 80, other_mib: 500, jobs: {inference: 60000}}}
  - at: 10s
    gpus: {0: {utilization_pct: 99, jobs: {inference: 79500}}}
  - at: 90s
    gpus: {0: {utilization_pct: 40, jobs: {inference: 30000}}}
  - at: 150s
    end: true
"""
FIRES_AT = 20.0
RELIEF_AT = 90.0

# A GPU rule: its scope ("gpu:0") is the same after a restart. A process scope is keyed by
# PID and start time, and a replayed job's start time moves with the replay's start.
PLAYBOOK = """\
rules:
  - name: burst-when-full
    description: The inference GPU is full; add cloud capacity.
    for_each: gpu
    when: gpu.memory.used_pct >= 95
    for: 10s
    severity: critical
    cooldown: 1h
    group_wait: 0s
    group_interval: 60s   # the launch's outcome, with the ids, waits for this long at most
    steps:
      - notify: oncall
      - after: 10s
        provision: burst
"""


def config_text(ec2: MotoEc2) -> str:
    return f"""\
host: {HOST}
tick: 2s
protected: {{root: false, users: []}}
notify:
  targets:
    oncall:
      urls: [{{env: TEST_ONCALL_URL}}]
cloud:
  reap_interval: 2s
  profiles:
    burst:
      region: {ec2.region}
      endpoint_url: {ec2.endpoint_url}
      ami: {ec2.ami}
      subnets: [{ec2.subnet}]
      security_groups: [{ec2.security_group}]
      instance_types: [{INSTANCE_TYPE}]
      count: 1
      max_instances: 2
      max_hourly_usd: 100
      prices: {{{INSTANCE_TYPE}: 32.77}}
      ttl: 1h
      linger: 20s
reload: {{watch: false}}
"""


class Daemon:
    """Files for one daemon (config, scenario, playbook, state) and how to start it."""

    def __init__(self, tmp_path: Path, ec2: MotoEc2, receiver: JsonReceiver) -> None:
        self.tmp_path = tmp_path
        self.config = tmp_path / "gpuwarden.yaml"
        self.config.write_text(config_text(ec2))
        self.scenario = tmp_path / "burst.yaml"
        self.scenario.write_text(SCENARIO)
        self.playbook = tmp_path / "playbooks" / "burst.yaml"
        self.playbook.parent.mkdir()
        self.playbook.write_text(PLAYBOOK)
        self.state = tmp_path / "state"
        self.env = {**os.environ, "TEST_ONCALL_URL": receiver.url("oncall")}
        self.logs: list[Path] = []

    def start(self, at: float = 0.0) -> subprocess.Popen[bytes]:
        """``gpuwarden run`` on the scenario from ``at`` seconds in; stderr to a file."""
        log = self.tmp_path / f"run-{len(self.logs)}.log"
        self.logs.append(log)
        position = f"@{at:.1f}s" if at else ""
        with log.open("wb") as err:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpuwarden",
                    "run",
                    "--config",
                    str(self.config),
                    "--source",
                    f"scenario:{self.scenario}{position}",
                    "--playbooks",
                    str(self.playbook),
                    "--state-dir",
                    str(self.state),
                    "--speed",
                    str(SPEED),
                ],
                cwd=ROOT,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs)

    def journal(self) -> list[Managed]:
        with InstanceStore.open_readonly(self.state / "journal.db") as store:
            return store.all()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuwarden",
                *args,
                "--config",
                str(self.config),
                "--state-dir",
                str(self.state),
            ],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture
def receiver() -> Iterator[JsonReceiver]:
    r = JsonReceiver().start()
    yield r
    r.stop()


def ours(ec2: MotoEc2) -> dict[str, dict[str, Any]]:
    """Every instance on the server that carries gpuwarden's tags, by id, any state."""
    found: dict[str, dict[str, Any]] = {}
    pages = (
        ec2.client()
        .get_paginator("describe_instances")
        .paginate(Filters=[{"Name": f"tag:{tags.MANAGED}", "Values": ["true"]}])
    )
    for page in pages:
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                found[instance["InstanceId"]] = instance
    return found


def wait_for(what: str, predicate: Callable[[], bool], timeout: float, daemon: Daemon) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}\n{daemon.log()}")
        time.sleep(0.05)


def finish(process: subprocess.Popen[bytes], daemon: Daemon, timeout: float = 30) -> None:
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, daemon.log()
    assert "Traceback" not in daemon.log()


def state(instance: dict[str, Any]) -> str:
    return str(instance["State"]["Name"])


def shown(daemon: Daemon) -> dict[str, str]:
    """Instance id -> state, as ``gpuwarden cloud --json`` lists them."""
    result = daemon.cli("cloud", "--json")
    assert result.returncode == 0, result.stderr
    return {str(row["instance_id"]): str(row["state"]) for row in json.loads(result.stdout)}


def test_a_burst_launches_notifies_and_is_reaped_after_linger(
    tmp_path: Path, fresh_ec2: MotoEc2, receiver: JsonReceiver
) -> None:
    daemon = Daemon(tmp_path, fresh_ec2, receiver)
    process = daemon.start()
    try:
        wait_for("an instance is launched", lambda: bool(ours(fresh_ec2)), 20, daemon)
        launched = ours(fresh_ec2)
    finally:
        finish(process, daemon)

    # One instance, launched as the profile says and tagged with whose it is.
    assert len(launched) == 1, launched
    ((instance_id, instance),) = launched.items()
    assert instance["InstanceType"] == INSTANCE_TYPE
    assert instance["ImageId"] == fresh_ec2.ami
    assert instance["SubnetId"] == fresh_ec2.subnet
    found = tags.tag_dict(instance["Tags"])
    assert found[tags.MANAGED] == "true"
    assert found[tags.HOST] == HOST
    assert found[tags.RULE] == "burst-when-full"
    assert found[tags.PROFILE] == "burst"
    incident = found[tags.INCIDENT]
    assert incident

    # The on-call heard about it, with the instance's id.
    bodies = [f"{d['title']}\n{d['message']}" for d in receiver.received]
    assert any(instance_id in body for body in bodies), bodies

    # Ended after its incident resolved and the linger passed, and recorded as such.
    after = ours(fresh_ec2)
    assert set(after) == {instance_id}
    assert state(after[instance_id]) in {"shutting-down", "terminated"}
    (row,) = daemon.journal()
    assert row.instance_id == instance_id
    assert row.incident == incident
    assert row.end_reason == "linger"
    assert row.terminated_at is not None
    assert not row.live
    assert "cloud reap: terminated " + instance_id + " (linger)" in daemon.log()
    assert shown(daemon) == {instance_id: state(after[instance_id])}

    # The on-call heard that the spend ended too: which instance, why, and what it cost.
    bodies = [f"{d['title']}\n{d['message']}" for d in receiver.received]
    ended = [b for b in bodies if "cloud instance(s) of burst-when-full terminated" in b]
    assert len(ended) == 1, bodies
    assert instance_id in ended[0]
    assert "linger" in ended[0]
    assert "about $" in ended[0]


def test_a_restart_right_after_the_launch_launches_nothing_twice(
    tmp_path: Path, fresh_ec2: MotoEc2, receiver: JsonReceiver
) -> None:
    daemon = Daemon(tmp_path, fresh_ec2, receiver)
    first = daemon.start()
    try:
        wait_for("the daemon runs", lambda: "gpuwarden: running" in daemon.log(), 20, daemon)
        began = time.monotonic()  # the scenario's 0 s, give or take a tick
        wait_for("an instance is launched", lambda: bool(ours(fresh_ec2)), 20, daemon)
        first.send_signal(signal.SIGKILL)  # no shutdown: whatever was in flight stays so
        first.wait(timeout=10)
        killed = time.monotonic()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    launched = set(ours(fresh_ec2))
    assert len(launched) == 1
    # What the killed daemon left: `gpuwarden cloud` shows it as EC2 does.
    assert shown(daemon) == {i: state(d) for i, d in ours(fresh_ec2).items()}
    # Go on from where the scenario was: the GPU still full, the incident still open.
    position = (killed - began) * SPEED
    assert FIRES_AT <= position < RELIEF_AT, (position, daemon.log())
    second = daemon.start(at=position)
    finish(second, daemon)

    after = ours(fresh_ec2)
    assert set(after) == launched, "the restarted daemon launched again"
    (instance_id,) = launched
    assert state(after[instance_id]) in {"shutting-down", "terminated"}
    (row,) = daemon.journal()
    assert row.instance_id == instance_id
    assert row.end_reason == "linger"
    restarted = daemon.log().split("gpuwarden: running")[-1]
    assert "resumed incident" in restarted
    assert "provision incident=" not in restarted  # the step was not run again
