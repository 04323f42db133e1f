"""Scenario jobs attached to live processes that an outside harness owns: found by PID or by a
capped, time-boxed regex, attributed from /proc only, bounded by the scenario file's owner, left
running when the scenario closes, and acted on by a daemon replaying the scenario."""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden import config as config_mod
from gpuwarden import drill
from gpuwarden.clock import ScaledClock
from gpuwarden.errors import InputError
from gpuwarden.journal.journal import Journal
from gpuwarden.playbook import loader
from gpuwarden.runtime import Runtime
from gpuwarden.sources import attach
from gpuwarden.sources.procs import Attributor
from gpuwarden.sources.scenario import ScenarioSource
from gpuwarden.sources.select import SourceSpec

ROOT = Path(__file__).resolve().parent.parent
SLEEP = shutil.which("sleep") or "/bin/sleep"

SCENARIO = """\
version: 1
name: harness-owned-job
host: gpu-node-03
gpus:
  - {{index: 0, memory_total_mib: 81920}}
jobs:
  - id: harness
    attach: {attach}
timeline:
  - at: 0s
    gpus: {{0: {{jobs: {{harness: 79000}}}}}}
  - at: 4m
    end: true
"""


def harness(seconds: str, **options: Any) -> subprocess.Popen[bytes]:
    """A process some harness started: ``sleep`` with a command line no other process has."""
    process: subprocess.Popen[bytes] = subprocess.Popen(
        [SLEEP, seconds], start_new_session=True, **options
    )
    return process


def unique_seconds() -> str:
    return f"{random.randint(10_000, 90_000)}.{random.randint(100, 999)}"


@pytest.fixture
def job() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    seconds = unique_seconds()
    process = harness(seconds, env={"PATH": "/usr/bin:/bin", "GPUWARDEN_PRIORITY": "low"})
    try:
        yield process, seconds
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def scenario_file(tmp_path: Path, attach_text: str, name: str = "attach.yaml") -> Path:
    path = tmp_path / name
    path.write_text(SCENARIO.format(attach=attach_text))
    path.chmod(0o644)
    return path


@pytest.fixture
def cfg() -> config_mod.Config:
    return config_mod.load(ROOT / "config" / "demo.yaml")


def open_scenario(path: Path, cfg: config_mod.Config, **kwargs: object) -> ScenarioSource:
    return ScenarioSource.open(
        path, priorities=cfg.priorities, attributor=Attributor(cfg.priorities), **kwargs
    )


def test_attach_by_pid_reads_the_process_from_proc_and_leaves_it_running(tmp_path, job, cfg):
    process, seconds = job
    path = scenario_file(tmp_path, f"{{pid: {process.pid}}}")
    with open_scenario(path, cfg) as source:
        assert source.pid_of("harness") == process.pid
        snap = source.snapshot(source.start_time + 1)
        (proc,) = snap.processes
        assert (proc.pid, proc.gpu, proc.gpu_memory_mib) == (process.pid, 0, 79000)
        assert proc.info.cmdline == (SLEEP, seconds)
        assert (proc.info.user, proc.info.uid) == ("root", 0)
        assert proc.info.priority == "low"  # from its real environment, not from the file
    assert process.poll() is None  # closing the scenario left the harness's process alone


def test_attach_by_match_finds_the_one_process(tmp_path, job, cfg):
    process, seconds = job
    path = scenario_file(tmp_path, f"{{match: 'sleep {seconds.replace('.', '[.]')}$'}}")
    with open_scenario(path, cfg) as source:
        assert source.pid_of("harness") == process.pid


def test_an_attached_process_that_exits_leaves_the_snapshots(tmp_path, job, cfg):
    process, _seconds = job
    with open_scenario(scenario_file(tmp_path, f"{{pid: {process.pid}}}"), cfg) as source:
        assert len(source.snapshot(source.start_time).processes) == 1
        process.kill()
        process.wait()
        snap = source.snapshot(source.start_time + 2)
        assert snap.processes == ()
        assert snap.gpus[0].memory.used_mib == 0


def test_no_match_and_two_matches_are_errors_at_the_attach_key(tmp_path, cfg):
    seconds = unique_seconds()
    path = scenario_file(tmp_path, f"{{match: 'sleep {seconds}'}}")
    with pytest.raises(InputError) as caught:
        open_scenario(path, cfg)
    rendered = caught.value.render()
    assert rendered.startswith(f"{path}:8:13: job 'harness': no process matches 'sleep {seconds}'")
    assert "hint: is the harness running?" in rendered
    twins = [harness(seconds), harness(seconds)]
    try:
        with pytest.raises(InputError) as caught:
            open_scenario(path, cfg)
        pids = ", ".join(str(p.pid) for p in sorted(twins, key=lambda p: p.pid))
        assert f"2 processes match 'sleep {seconds}' (pids {pids})" in caught.value.render()
    finally:
        for twin in twins:
            twin.kill()
            twin.wait()


def test_a_vanished_pid_is_an_error(tmp_path, cfg):
    gone = harness("0")
    gone.wait()
    path = scenario_file(tmp_path, f"{{pid: {gone.pid}}}")
    with pytest.raises(InputError, match=f"job 'harness': no process {gone.pid}"):
        open_scenario(path, cfg)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("user: root", "user"),
        ("env: {GPUWARDEN_PRIORITY: critical}", "env"),
        ("uid: 0", "uid"),
        ("cmdline: python train.py", "cmdline"),
        ("spawn: true", "spawn"),
    ],
)
def test_an_attached_job_declares_nothing_about_itself(tmp_path, cfg, extra, key):
    path = tmp_path / "declared.yaml"
    text = SCENARIO.format(attach="{pid: 4242}").replace(
        "    attach: {pid: 4242}\n", f"    attach: {{pid: 4242}}\n    {extra}\n"
    )
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        open_scenario(path, cfg)
    rendered = caught.value.render()
    assert rendered.startswith(f"{path}:9:5: {key} on an attached job — expected attach alone")
    assert "never from the scenario" in rendered


@pytest.mark.parametrize(
    ("attach_text", "message"),
    [
        ("{pid: 12, match: x}", "attach takes one of pid: N or match: REGEX"),
        ("{}", "attach takes one of pid: N or match: REGEX"),
        ("{match: '(unclosed'}", "not a valid regular expression"),
        (f"{{match: '{'a' * 201}'}}", "at most 200 characters"),
        ("{pid: 1}", "greater than 1"),
    ],
)
def test_bad_attach_specs(tmp_path, cfg, attach_text, message):
    path = scenario_file(tmp_path, attach_text)
    with pytest.raises(InputError, match=message):
        open_scenario(path, cfg)


def test_a_scenario_others_can_write_attaches_to_nothing(tmp_path, job, cfg):
    process, _seconds = job
    path = scenario_file(tmp_path, f"{{pid: {process.pid}}}")
    path.chmod(0o666)
    with pytest.raises(InputError) as caught:
        open_scenario(path, cfg)
    rendered = caught.value.render()
    assert f"{path}: {path} can be changed by other users (mode 0666)" in rendered
    assert f"hint: chmod go-w {path}" in rendered


def test_a_pattern_that_backtracks_forever_is_stopped():
    lines = [(4242, "a" * 64 + "!")]
    began = time.monotonic()
    with pytest.raises(attach.AttachError, match=r"took more than 0\.5s"):
        attach.search("^(a+)+$", lines, timeout=0.5)
    assert time.monotonic() - began < 30  # the child was killed; this process never hung


def test_command_lines_are_searched_only_up_to_the_cap():
    long = "x" * attach.CMDLINE_MATCH_MAX
    assert attach.search("x$", [(1, long)]) == [1]
    found = attach.search("needle", [(2, long[: attach.CMDLINE_MATCH_MAX - 6] + "needle")])
    assert found == [2]


# --- the scenario's owner bounds what it reaches: a real user, made for this test ---------------


@pytest.fixture(scope="module")
def someone() -> Iterator[pwd.struct_passwd]:
    name = f"gwat{os.getpid() % 100000}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def test_a_users_scenario_attaches_to_that_users_process_only(tmp_path, job, cfg, someone):
    root_process, _seconds = job
    seconds = unique_seconds()
    theirs = harness(seconds, user=someone.pw_uid, group=someone.pw_gid, cwd="/")
    try:
        mine = scenario_file(tmp_path, f"{{pid: {theirs.pid}}}", "theirs.yaml")
        os.chown(mine, someone.pw_uid, someone.pw_gid)
        with open_scenario(mine, cfg) as source:
            (proc,) = source.snapshot(source.start_time).processes
            assert (proc.pid, proc.info.uid, proc.info.user) == (
                theirs.pid,
                someone.pw_uid,
                someone.pw_name,
            )
        # the same user's file may not reach root's process, by PID or by pattern
        other = scenario_file(tmp_path, f"{{pid: {root_process.pid}}}", "reach.yaml")
        os.chown(other, someone.pw_uid, someone.pw_gid)
        with pytest.raises(InputError) as caught:
            open_scenario(other, cfg)
        assert (
            f"pid {root_process.pid} belongs to uid 0, and {other} to uid {someone.pw_uid}"
        ) in caught.value.render()
        pattern = scenario_file(tmp_path, "{match: 'sleep [0-9]+[.][0-9]+$'}", "wide.yaml")
        os.chown(pattern, someone.pw_uid, someone.pw_gid)
        with open_scenario(pattern, cfg) as source:  # root's sleeps are not even candidates
            assert source.pid_of("harness") == theirs.pid
    finally:
        theirs.kill()
        theirs.wait()


# --- acted on: a daemon replaying the scenario, and a drill that only reads ----------------------

PLAYBOOK = """\
rules:
  - name: squeeze
    for_each: gpu
    when: gpu.memory.used_pct >= 95
    severity: critical
    steps:
      - kill: {select: process.priority <= low, grace: 5s}
"""


def test_a_drill_shows_the_attached_process_and_touches_nothing(tmp_path, job, cfg):
    process, _seconds = job
    playbook = tmp_path / "squeeze.yaml"
    playbook.write_text(PLAYBOOK)
    path = scenario_file(tmp_path, f"{{pid: {process.pid}}}")
    records = list(
        drill.run(SourceSpec("scenario", str(path)), cfg, loader.load([playbook], cfg), tick=60)
    )
    kills = [r for r in records if r["kind"] == "step" and r["step"] == "kill"]
    assert [[(t["pid"], t["job"], t["priority"]) for t in k["targets"]] for k in kills] == [
        [(process.pid, "harness", "low")]
    ]
    assert process.poll() is None  # a drill signals nothing


def test_a_daemon_replaying_the_scenario_kills_the_attached_process(tmp_path, job, cfg):
    process, _seconds = job
    playbook = tmp_path / "squeeze.yaml"
    playbook.write_text(PLAYBOOK)
    source = open_scenario(scenario_file(tmp_path, f"{{pid: {process.pid}}}"), cfg)
    clock = ScaledClock(40.0)
    source.start_time = clock.now()
    runtime = Runtime(
        cfg,
        source,
        loader.load([playbook], cfg),
        Journal(tmp_path / "journal.db"),
        clock=clock,
        host="gpu-node-03",
    )
    stats = runtime.run()
    assert stats.failed == 0
    assert process.wait(timeout=30) == -signal.SIGTERM
