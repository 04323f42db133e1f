"""Process attribution: priority resolution (pure, table-tested) and the Attributor against real
child processes: running, zombie, reaped, owned by another user, exiting while being read."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuwarden.config import MatchRule, Priorities, PriorityClass
from gpuwarden.model import ProcessInfo
from gpuwarden.sources.cgroups import parse_cgroup
from gpuwarden.sources.priority import (
    PriorityResolver,
    normalise_signal,
    resolve_priority,
    rule_env_keys,
)
from gpuwarden.sources.procs import KEPT_ENV_KEYS, Attributor

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
SECRET = "hunter2-do-not-log-me"
IS_ROOT = os.geteuid() == 0


def rule(**conditions: object) -> MatchRule:
    """A match rule from keyword conditions, validated as the config file's would be."""
    return MatchRule.model_validate(conditions)


def classes(*rules: tuple[str, tuple[MatchRule, ...]], **kw: str) -> Priorities:
    """Priorities with the default class names, some given match rules."""
    by_name = dict(rules)
    names = ("critical", "high", "normal", "low", "scavenger")
    return Priorities(
        classes=tuple(PriorityClass(name=n, match=by_name.get(n, ())) for n in names), **kw
    )


# ---------------------------------------------------------------------------------------------
# Priority resolution (pure)

ALICE_TRAIN = ProcessInfo(
    pid=100,
    user="alice",
    groups=("alice", "ml"),
    cmdline=("python", "/home/alice/train.py", "--lr", "0.1"),
    exe="/usr/bin/python3.11",
    cgroup="/system.slice/slurmstepd.scope/job_7/step_0/user/task_0",
    cgroup_trusted=True,
    systemd_unit="slurmstepd.scope",
    env={"TEAM": "vision", "SLURM_JOB_ID": "7", "SLURM_JOB_PARTITION": "prod"},
)
# The same job, had its owner made the cgroup under their own user manager.
ALICE_OWN_CGROUP = replace(ALICE_TRAIN, cgroup_trusted=False)
ALICE_IN_SLURM = replace(ALICE_TRAIN, slurm_partition="debug", slurm_qos="normal")
UNKNOWN = ProcessInfo(pid=101)

RESOLVE_CASES: list[tuple[str, Priorities, ProcessInfo, str]] = [
    ("no rules: default", classes(), ALICE_TRAIN, "normal"),
    ("custom default", classes(default="low"), UNKNOWN, "low"),
    (
        "first class wins over a later one",
        classes(
            ("low", (rule(user=("alice",)),)),
            ("high", (rule(group=("ml",)),)),
        ),
        ALICE_TRAIN,
        "high",
    ),
    (
        "a command line never raises",
        classes(("high", (rule(cmdline="train"),))),
        ALICE_TRAIN,
        "normal",
    ),
    (
        "a command line cannot raise above a placing rule",
        classes(("low", (rule(user=("alice",)),)), ("high", (rule(cmdline="train"),))),
        ALICE_TRAIN,
        "low",
    ),
    (
        "a command line lowers a declared class",
        classes(("low", (rule(cmdline="train"),))),
        replace(ALICE_TRAIN, declared_priority="high"),
        "low",
    ),
    (
        "a placing rule of a higher class comes first",
        classes(("high", (rule(group=("ml",)),)), ("low", (rule(cmdline="train"),))),
        ALICE_TRAIN,
        "high",
    ),
    (
        "exe must match whole",
        classes(("high", (rule(exe="/usr/bin/python"),))),
        ALICE_TRAIN,
        "normal",
    ),
    (
        "exe places",
        classes(("high", (rule(exe=r"/usr/bin/python3\.\d+"),))),
        ALICE_TRAIN,
        "high",
    ),
    (
        "any rule of a class",
        classes(("low", (rule(user=("bob",)), rule(group=("ml",))))),
        ALICE_TRAIN,
        "low",
    ),
    ("user any of", classes(("high", (rule(user=("bob", "alice")),))), ALICE_TRAIN, "high"),
    ("user differs", classes(("high", (rule(user=("bob",)),))), ALICE_TRAIN, "normal"),
    ("group any of", classes(("low", (rule(group=("ops", "ml")),))), ALICE_TRAIN, "low"),
    ("group differs", classes(("low", (rule(group=("ops",)),))), ALICE_TRAIN, "normal"),
    (
        "cmdline is searched in the joined arguments",
        classes(("low", (rule(cmdline=r"train\.py --lr"),))),
        ALICE_TRAIN,
        "low",
    ),
    (
        "cmdline regex misses",
        classes(("low", (rule(cmdline=r"^serve"),))),
        ALICE_TRAIN,
        "normal",
    ),
    (
        "all conditions of a rule must hold",
        classes(("critical", (rule(user=("alice",), cmdline="serve"),))),
        ALICE_TRAIN,
        "normal",
    ),
    (
        "all conditions hold",
        classes(("critical", (rule(user=("alice",), unit=r".*\.scope", group=("ml",)),))),
        ALICE_TRAIN,
        "critical",
    ),
    (
        "a rule is as weak as its weakest condition",
        classes(("critical", (rule(user=("alice",), cmdline="train", group=("ml",)),))),
        ALICE_TRAIN,
        "normal",
    ),
    ("cgroup searched", classes(("low", (rule(cgroup=r"job_\d+"),))), ALICE_TRAIN, "low"),
    (
        "unit must match whole",
        classes(("high", (rule(unit="slurmstepd"),))),
        ALICE_TRAIN,
        "normal",
    ),
    (
        "unit full match",
        classes(("high", (rule(unit=r"slurm.*\.scope"),))),
        ALICE_TRAIN,
        "high",
    ),
    (
        "a unit in a cgroup its owner made never raises",
        classes(("high", (rule(unit=r"slurm.*\.scope"),))),
        ALICE_OWN_CGROUP,
        "normal",
    ),
    (
        "a cgroup its owner made never raises",
        classes(("critical", (rule(cgroup="job_7"),))),
        ALICE_OWN_CGROUP,
        "normal",
    ),
    (
        "a cgroup its owner made may lower",
        classes(("scavenger", (rule(cgroup="job_7"),))),
        ALICE_OWN_CGROUP,
        "scavenger",
    ),
    ("env equal", classes(("high", (rule(env={"TEAM": "vision"}),))), ALICE_TRAIN, "high"),
    (
        "env is capped at declared_max",
        classes(("critical", (rule(env={"TEAM": "vision"}),))),
        ALICE_TRAIN,
        "high",
    ),
    (
        "env with a lower declared_max",
        classes(("high", (rule(env={"TEAM": "vision"}),)), declared_max="normal"),
        ALICE_TRAIN,
        "normal",
    ),
    (
        "a partition Slurm did not confirm never raises",
        classes(("high", (rule(env={"SLURM_JOB_PARTITION": "prod"}),))),
        ALICE_TRAIN,
        "normal",
    ),
    (
        "a partition Slurm did not confirm may lower",
        classes(("low", (rule(env={"SLURM_JOB_PARTITION": "prod"}),))),
        ALICE_TRAIN,
        "low",
    ),
    (
        "Slurm's partition, not the environment's",
        classes(("high", (rule(env={"SLURM_JOB_PARTITION": "prod"}),))),
        ALICE_IN_SLURM,
        "normal",
    ),
    (
        "Slurm's partition places",
        classes(("critical", (rule(env={"SLURM_JOB_PARTITION": "debug"}),))),
        ALICE_IN_SLURM,
        "critical",
    ),
    (
        "Slurm's QOS places",
        classes(("critical", (rule(env={"SLURM_JOB_QOS": "normal"}),))),
        ALICE_IN_SLURM,
        "critical",
    ),
    (
        "other Slurm variables only lower",
        classes(("high", (rule(env={"SLURM_JOB_ID": "7"}),))),
        ALICE_IN_SLURM,
        "normal",
    ),
    (
        "env needs every key",
        classes(("high", (rule(env={"TEAM": "vision", "TIER": "prod"}),))),
        ALICE_TRAIN,
        "normal",
    ),
    (
        "env value differs",
        classes(("high", (rule(env={"TEAM": "nlp"}),))),
        ALICE_TRAIN,
        "normal",
    ),
    # Facts the process does not reveal never match, however permissive the rule.
    ("no user", classes(("low", (rule(user=("",)),))), UNKNOWN, "normal"),
    ("no cmdline", classes(("low", (rule(cmdline=".*"),))), UNKNOWN, "normal"),
    ("no cgroup", classes(("low", (rule(cgroup=".*"),))), UNKNOWN, "normal"),
    ("no unit", classes(("low", (rule(unit=".*"),))), UNKNOWN, "normal"),
    ("no groups", classes(("low", (rule(group=("root",)),))), UNKNOWN, "normal"),
    ("no env", classes(("low", (rule(env={"A": ""}),))), UNKNOWN, "normal"),
    # Declared priorities.
    ("declared lower", classes(), ProcessInfo(pid=1, declared_priority="scavenger"), "scavenger"),
    ("declared at the cap", classes(), ProcessInfo(pid=1, declared_priority="high"), "high"),
    ("declared above the cap", classes(), ProcessInfo(pid=1, declared_priority="critical"), "high"),
    (
        "declared with a lower cap",
        classes(declared_max="normal"),
        ProcessInfo(pid=1, declared_priority="high"),
        "normal",
    ),
    ("declared, any case", classes(), ProcessInfo(pid=1, declared_priority=" LOW "), "low"),
    ("declared unknown", classes(), ProcessInfo(pid=1, declared_priority="urgent"), "normal"),
    ("declared empty", classes(default="low"), ProcessInfo(pid=1, declared_priority=""), "low"),
    (
        "a rule beats the declaration",
        classes(("scavenger", (rule(user=("alice",)),))),
        ProcessInfo(pid=1, user="alice", declared_priority="high"),
        "scavenger",
    ),
]


@pytest.mark.parametrize(
    ("priorities", "info", "expected"),
    [case[1:] for case in RESOLVE_CASES],
    ids=[case[0] for case in RESOLVE_CASES],
)
def test_resolve_priority(priorities: Priorities, info: ProcessInfo, expected: str) -> None:
    assert PriorityResolver(priorities).resolve(info) == expected
    assert resolve_priority(priorities, info) == expected


def test_custom_class_names() -> None:
    priorities = Priorities(
        classes=(
            PriorityClass(name="prod", match=(rule(unit=r"inference-.*\.service"),)),
            PriorityClass(name="research"),
            PriorityClass(name="batch"),
        ),
        default="research",
        declared_max="research",
    )
    resolver = PriorityResolver(priorities)
    inference = ProcessInfo(pid=1, systemd_unit="inference-a.service", cgroup_trusted=True)
    assert resolver.resolve(inference) == "prod"
    assert resolver.resolve(replace(inference, cgroup_trusted=False)) == "research"
    assert resolver.resolve(ProcessInfo(pid=1, declared_priority="prod")) == "research"
    assert resolver.resolve(ProcessInfo(pid=1, declared_priority="batch")) == "batch"
    assert resolver.resolve(ProcessInfo(pid=1, declared_priority="normal")) == "research"


SIGNAL_CASES: list[tuple[str | None, str | None]] = [
    ("USR1", "SIGUSR1"),
    ("SIGUSR1", "SIGUSR1"),
    ("sigusr2", "SIGUSR2"),
    (" term\n", "SIGTERM"),
    (str(int(signal.SIGUSR1)), "SIGUSR1"),
    (str(int(signal.SIGINT)), "SIGINT"),
    ("SIGIOT", "SIGABRT"),
    ("KILL", None),
    (str(int(signal.SIGKILL)), None),
    ("SIGSTOP", None),
    ("0", None),
    ("-10", None),
    ("999", None),
    ("USR3", None),
    ("SIG", None),
    ("", None),
    ("\u0661\u0660", None),  # Arabic-Indic "10": not a signal number here
    ("USR1; rm -rf /", None),
    (None, None),
]


@pytest.mark.parametrize(("value", "expected"), SIGNAL_CASES)
def test_normalise_signal(value: str | None, expected: str | None) -> None:
    assert normalise_signal(value) == expected


def test_rule_env_keys() -> None:
    priorities = classes(
        ("high", (rule(env={"TEAM": "a"}), rule(env={"TIER": "b", "TEAM": "c"}))),
        ("low", (rule(user=("x",)),)),
    )
    assert rule_env_keys(priorities) == ("TEAM", "TIER")
    assert rule_env_keys(classes()) == ()


# ---------------------------------------------------------------------------------------------
# The Attributor, against real processes

Popen = subprocess.Popen[bytes]
Spawn = Callable[..., Popen]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Starts real children; every one is killed and reaped at the end of the test."""
    children: list[Popen] = []

    def start(argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> Popen:
        kw.setdefault("stdout", subprocess.DEVNULL)
        child: Popen = subprocess.Popen(argv, env=env if env is not None else {}, **kw)
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()


SLEEPER = "import sys, time; print('ready', flush=True); time.sleep(600)"


def sleeper_argv(marker: str) -> list[str]:
    return [sys.executable, "-c", SLEEPER, marker]


def _ready(child: Popen) -> Popen:
    """Waits until the child's interpreter runs its program: before, the child is a copy of
    this test process (the same command line and environment), not yet the program."""
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"
    return child


def own_group_names() -> tuple[str, ...]:
    gids = [os.getgid(), *os.getgroups()]
    return tuple(dict.fromkeys(grp.getgrgid(g).gr_name for g in gids))


def job_env(**extra: str) -> dict[str, str]:
    env = {
        "GPUWARDEN_PRIORITY": "low",
        "GPUWARDEN_CHECKPOINT_SIGNAL": "USR1",
        "GPUWARDEN_ACK_DIR": "/run/gpuwarden/ack",
        "SLURM_JOB_ID": "4242",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "TEAM": "vision",
    }
    env.update(extra)
    return env


def marker() -> str:
    return f"gpuwarden-test-{uuid.uuid4().hex[:12]}"


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.01)


def test_describes_a_real_child(spawn: Spawn) -> None:
    mark = marker()
    before = time.time()
    child = spawn(sleeper_argv(mark), job_env(), stdout=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"  # the interpreter is loaded
    info = Attributor(Priorities()).describe([child.pid], time.time())[child.pid]

    assert info.pid == child.pid
    assert not info.orphaned
    assert info.access_denied == ()
    assert info.cmdline is not None
    assert info.cmdline[-1] == mark
    assert info.cmdline[0] == sys.executable
    assert info.name is not None
    assert info.name.startswith("python")
    assert info.uid == os.getuid()
    assert info.user == pwd.getpwuid(os.getuid()).pw_name
    assert info.groups == own_group_names()
    assert info.create_time is not None
    assert before - 2 <= info.create_time <= time.time() + 1
    assert info.status in {"running", "sleeping"}
    assert info.nice == os.getpriority(os.PRIO_PROCESS, child.pid)
    assert info.rss_mib is not None
    assert info.rss_mib >= 1
    assert info.cpu_pct is None  # first observation
    assert info.cgroup == parse_cgroup(Path(f"/proc/{child.pid}/cgroup").read_text()).path
    # Only the keys gpuwarden reads are kept; the secret is dropped, and so is TEAM (no rule).
    assert info.env == {
        "GPUWARDEN_PRIORITY": "low",
        "GPUWARDEN_CHECKPOINT_SIGNAL": "USR1",
        "GPUWARDEN_ACK_DIR": "/run/gpuwarden/ack",
        "SLURM_JOB_ID": "4242",
    }
    assert SECRET not in repr(info)
    assert SECRET not in json.dumps(asdict(info))
    assert info.declared_priority == "low"
    assert info.checkpoint_signal == "SIGUSR1"
    assert info.checkpointable
    assert info.slurm_job == "4242"  # not in this machine's cgroup: from the environment
    assert info.priority == "low"


def test_groups_include_real_and_supplementary(spawn: Spawn) -> None:
    if not IS_ROOT:
        pytest.skip("starting a child as another user needs root")
    child = spawn(
        ["/bin/sleep", "600"], user="nobody", group="nogroup", extra_groups=["users", "nogroup"]
    )
    wait_for(lambda: psutil.Process(child.pid).uids().real != 0)
    info = Attributor(Priorities()).describe([child.pid], time.time())[child.pid]
    assert info.user == "nobody"
    assert info.uid == pwd.getpwnam("nobody").pw_uid
    assert info.groups == ("nogroup", "users")
    assert info.env == {}  # readable, nothing worth keeping


def test_env_keys_asked_for_and_named_by_rules_are_kept(spawn: Spawn) -> None:
    child = _ready(spawn(sleeper_argv(marker()), job_env(PROJECT="atlas"), stdout=subprocess.PIPE))
    priorities = classes(("high", (rule(env={"PROJECT": "atlas"}),)))

    info = Attributor(priorities, env_keys=["TEAM"]).describe([child.pid], 0.0)[child.pid]
    assert info.env is not None
    assert info.env["TEAM"] == "vision"
    assert info.env["PROJECT"] == "atlas"
    assert set(info.env) == {*KEPT_ENV_KEYS, "TEAM", "PROJECT"}
    assert info.priority == "high"

    plain = Attributor(Priorities()).describe([child.pid], 0.0)[child.pid]
    assert plain.env is not None
    assert set(plain.env) == set(KEPT_ENV_KEYS)


def test_declared_priority_is_capped_and_rules_win(spawn: Spawn) -> None:
    mark = marker()
    greedy = _ready(
        spawn(sleeper_argv(mark), job_env(GPUWARDEN_PRIORITY="critical"), stdout=subprocess.PIPE)
    )
    info = Attributor(Priorities()).describe([greedy.pid], 0.0)[greedy.pid]
    assert info.declared_priority == "critical"
    assert info.priority == "high"

    ruled = Attributor(classes(("scavenger", (rule(cmdline=mark),))))
    assert ruled.describe([greedy.pid], 0.0)[greedy.pid].priority == "scavenger"


def test_bad_declarations_are_ignored(spawn: Spawn) -> None:
    child = spawn(
        sleeper_argv(marker()),
        job_env(
            GPUWARDEN_PRIORITY="urgent",
            GPUWARDEN_CHECKPOINT_SIGNAL="KILL",
            SLURM_JOB_ID="42; rm -rf /",
        ),
        stdout=subprocess.PIPE,
    )
    _ready(child)
    info = Attributor(classes(default="low")).describe([child.pid], 0.0)[child.pid]
    assert info.declared_priority == "urgent"
    assert info.priority == "low"
    assert info.checkpoint_signal is None
    assert not info.checkpointable
    assert info.slurm_job is None


def test_zombie_is_still_a_zombie(spawn: Spawn) -> None:
    child = spawn([sys.executable, "-c", "pass"], job_env())
    wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)

    info = Attributor(Priorities()).describe([child.pid], 0.0)[child.pid]
    assert info.status == "zombie"
    assert info.zombie
    assert not info.orphaned
    assert info.cmdline is None
    assert info.env is None
    assert info.declared_priority is None
    assert info.access_denied == ()  # a zombie's missing facts are not a permission problem
    assert info.uid == os.getuid()
    assert info.create_time is not None

    child.wait(timeout=10)
    after = Attributor(Priorities()).describe([child.pid], 0.0)[child.pid]
    # Reaped: gone (unless the PID was reused by now, which a different start time shows).
    assert after.orphaned or after.create_time != info.create_time


def test_missing_pid_is_orphaned() -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    missing = pid_max + 1
    attributor = Attributor(classes(default="scavenger"))
    found = attributor.describe([missing, 0, -5], 0.0)
    assert found == {
        missing: ProcessInfo(pid=missing, orphaned=True, priority="scavenger"),
        0: ProcessInfo(pid=0, orphaned=True, priority="scavenger"),
        -5: ProcessInfo(pid=-5, orphaned=True, priority="scavenger"),
    }


def test_cpu_pct_is_none_first_then_measured(spawn: Spawn) -> None:
    busy = spawn([sys.executable, "-c", "while True: pass", marker()])
    idle = spawn(sleeper_argv(marker()))
    attributor = Attributor(Priorities())

    watched = psutil.Process(busy.pid)

    def cpu_s() -> float:
        times = watched.cpu_times()
        return float(times.user + times.system)

    # Bounds on the CPU time and wall time between the two observations, read around each:
    # the figure must lie between them however loaded the machine is.
    c0, w0 = cpu_s(), time.monotonic()
    assert attributor.describe([busy.pid, idle.pid], 0.0)[busy.pid].cpu_pct is None
    c1, w1 = cpu_s(), time.monotonic()
    deadline = time.monotonic() + 30
    while cpu_s() - c1 < 0.3 and time.monotonic() < deadline:  # enough to tell from idle
        time.sleep(0.05)
    c2, w2 = cpu_s(), time.monotonic()
    second = attributor.describe([busy.pid, idle.pid], 0.5)
    c3, w3 = cpu_s(), time.monotonic()
    busy_pct = second[busy.pid].cpu_pct
    idle_pct = second[idle.pid].cpu_pct
    assert busy_pct is not None
    tick = 0.011  # /proc/PID/stat counts in clock ticks (1/100 s), rounded down
    assert 100 * (c2 - c1 - tick) / (w3 - w0) <= busy_pct <= 100 * (c3 - c0 + tick) / (w2 - w1)
    assert idle_pct is not None
    assert 0.0 <= idle_pct < busy_pct

    # A process not asked about is forgotten: its next observation starts over.
    attributor.describe([idle.pid], 1.0)
    assert attributor.describe([busy.pid], 1.5)[busy.pid].cpu_pct is None


def test_duplicate_pids_are_described_once(spawn: Spawn) -> None:
    child = spawn(sleeper_argv(marker()))
    found = Attributor(Priorities()).describe([child.pid, child.pid], 0.0)
    assert list(found) == [child.pid]


def _fake_proc(tmp_path: Path, pid: int, cgroup_fixture: str) -> Path:
    """A proc tree holding one real process's status and a chosen cgroup file."""
    root = tmp_path / "proc"
    (root / str(pid)).mkdir(parents=True)
    shutil.copyfile(f"/proc/{pid}/status", root / str(pid) / "status")
    shutil.copyfile(FIXTURES / cgroup_fixture, root / str(pid) / "cgroup")
    return root


def _cgroup_tree(tmp_path: Path, cgroup_fixture: str, owner: int = 0) -> Path:
    """A cgroup root in which every cgroup a fixture names exists, owned by ``owner`` (this
    test's own uid stands in for root when the tests do not run as root)."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").touch()  # the unified hierarchy is mounted here (v2)
    for line in (FIXTURES / cgroup_fixture).read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        mount = root if controllers == "" else root / controllers.removeprefix("name=")
        (mount / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    if owner != os.geteuid():
        for directory in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            os.chown(directory, owner, -1)
    return root


@pytest.mark.parametrize(
    ("fixture", "match_rule", "expected"),
    [
        (
            "k8s-systemd-driver.txt",
            rule(cgroup="kubepods-burstable"),
            {
                "pod": "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e",
                "container": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "systemd_unit": None,
                "slurm_job": "4242",
            },
        ),
        (
            "systemd-service.txt",
            rule(unit=r"jupyter\.service"),
            {"systemd_unit": "jupyter.service", "container": None, "slurm_job": "4242"},
        ),
        (
            "slurm-v1.txt",
            rule(cgroup=r"/slurm/uid_\d+/job_4242/"),
            {"slurm_job": "4242", "cgroup": "/slurm/uid_1000/job_4242/step_0/task_0"},
        ),
    ],
)
def test_cgroup_facts_reach_the_process(
    spawn: Spawn, tmp_path: Path, fixture: str, match_rule: MatchRule, expected: dict[str, object]
) -> None:
    child = _ready(
        spawn(sleeper_argv(marker()), job_env(SLURM_JOB_ID="4242"), stdout=subprocess.PIPE)
    )
    root = _fake_proc(tmp_path, child.pid, fixture)
    cgroups = _cgroup_tree(tmp_path, fixture)
    priorities = classes(("critical", (match_rule,)))
    attributor = Attributor(priorities, proc_root=root, cgroup_root=cgroups)
    info = attributor.describe([child.pid], 0.0)[child.pid]
    assert info.cgroup_trusted is IS_ROOT  # root-owned all the way down
    assert info.priority == ("critical" if IS_ROOT else "low")  # else the declared class
    assert {k: getattr(info, k) for k in expected} == expected


def test_cgroup_job_beats_the_environment(spawn: Spawn, tmp_path: Path) -> None:
    child = _ready(
        spawn(sleeper_argv(marker()), job_env(SLURM_JOB_ID="999"), stdout=subprocess.PIPE)
    )
    root = _fake_proc(tmp_path, child.pid, "slurm-v2.txt")
    info = Attributor(Priorities(), proc_root=root).describe([child.pid], 0.0)[child.pid]
    assert info.slurm_job == "4242"
    assert info.systemd_unit == "slurmstepd.scope"


def test_unreadable_cgroup_file_is_an_unknown_fact(spawn: Spawn, tmp_path: Path) -> None:
    child = _ready(spawn(sleeper_argv(marker()), job_env(), stdout=subprocess.PIPE))
    root = tmp_path / "empty-proc"
    root.mkdir()
    info = Attributor(Priorities(), proc_root=root).describe([child.pid], 0.0)[child.pid]
    assert not info.orphaned  # psutil still sees it; only our files are missing
    assert info.cgroup is None
    assert info.status in {"running", "sleeping"}
    assert info.groups == (grp.getgrgid(os.getgid()).gr_name,)  # no status file: real gid only


def _describe_as_nobody(pid: int) -> dict[str, object]:
    """Runs the Attributor in a forked child that has dropped root for ``nobody``."""
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        status = 1
        try:
            os.close(read_fd)
            nobody = pwd.getpwnam("nobody")
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            info = Attributor(Priorities()).describe([pid], 0.0)[pid]
            with os.fdopen(write_fd, "w") as out:
                json.dump(asdict(info), out)
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd) as inp:
        text = inp.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the unprivileged describe failed"
    result: dict[str, object] = json.loads(text)
    return result


def test_access_denied_degrades_to_what_is_readable(spawn: Spawn) -> None:
    mark = marker()
    if IS_ROOT:
        target = _ready(spawn(sleeper_argv(mark), job_env(), stdout=subprocess.PIPE))
        got = _describe_as_nobody(target.pid)
        # Another user's environment and executable need ptrace access to the process.
        assert got["access_denied"] == ["exe", "environ"]
        assert got["exe"] is None
        assert got["user"] == "root"
        assert got["cmdline"] == [*sleeper_argv(mark)]
        assert got["status"] in {"running", "sleeping"}
        assert got["cgroup"] is not None
    else:
        owner = psutil.Process(1).uids().real
        if owner == os.getuid():
            pytest.skip("needs root, or a process of another user")
        got = asdict(Attributor(Priorities()).describe([1], 0.0)[1])
        denied = got["access_denied"]
        assert isinstance(denied, tuple)
        assert "environ" in denied
    assert got["orphaned"] is False
    assert got["env"] is None
    assert got["declared_priority"] is None
    assert got["checkpoint_signal"] is None
    assert got["priority"] == "normal"


def test_processes_exiting_while_read_never_raise(spawn: Spawn) -> None:
    """Children exit and are reaped by another thread while they are being described."""
    attributor = Attributor(Priorities())
    seen_alive = seen_gone = 0
    for _ in range(20):
        child = spawn([sys.executable, "-c", "import time; time.sleep(0.02)"], job_env())
        reaper = threading.Thread(target=child.wait)
        reaper.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            info = attributor.describe([child.pid], 0.0)[child.pid]
            if info.orphaned:
                assert info == ProcessInfo(pid=child.pid, orphaned=True, priority="normal")
                seen_gone += 1
                break
            assert info.pid == child.pid
            assert info.status is None or isinstance(info.status, str)
            if info.env is not None:
                assert "AWS_SECRET_ACCESS_KEY" not in info.env
            seen_alive += 1
        reaper.join(timeout=10)
    assert seen_alive > 0
    assert seen_gone == 20


# ---------------------------------------------------------------------------------------------
# What is kept between calls: static facts per process identity, dynamic facts read every call

MIB = 1024 * 1024
# Prints ready, waits for a line on stdin, then runs argv[1:] with a different environment.
EXEC_ON_LINE = (
    "import os, sys; print('ready', flush=True); sys.stdin.readline(); "
    "os.execve(sys.argv[1], sys.argv[1:], {'GPUWARDEN_PRIORITY': 'scavenger'})"
)
# Prints ready, exits on a line on stdin.
EXIT_ON_LINE = "import sys; print('ready', flush=True); sys.stdin.readline()"


def _send_line(child: Popen) -> None:
    assert child.stdin is not None
    child.stdin.write(b"go\n")
    child.stdin.flush()


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _tree(tmp_path: Path, pid: int, cgroup_fixture: str, *, live_stat: bool) -> Path:
    """A proc tree for one real process: its status copied, a chosen cgroup file, and its
    ``stat`` either linked to the live file or copied (so that a test may rewrite it)."""
    root = _fake_proc(tmp_path, pid, cgroup_fixture)
    if live_stat:
        (root / str(pid) / "stat").symlink_to(f"/proc/{pid}/stat")
    else:
        shutil.copyfile(f"/proc/{pid}/stat", root / str(pid) / "stat")
    return root


def _set_cgroup(root: Path, pid: int, cgroup_fixture: str) -> None:
    shutil.copyfile(FIXTURES / cgroup_fixture, root / str(pid) / "cgroup")


def _set_stat_field(root: Path, pid: int, number: int, value: str) -> None:
    """Rewrites field ``number`` (as proc(5) counts) of a copied stat file; psutil still
    reads the real one."""
    path = root / str(pid) / "stat"
    head, _, tail = path.read_text().rpartition(")")
    fields = tail.split()
    fields[number - 3] = value
    path.write_text(f"{head}) {' '.join(fields)}\n")


def _stat_field(root: Path, pid: int, number: int) -> str:
    return (root / str(pid) / "stat").read_text().rpartition(")")[2].split()[number - 3]


def test_static_facts_are_kept_dynamic_facts_are_read_each_call(
    spawn: Spawn, tmp_path: Path
) -> None:
    child = spawn(sleeper_argv(marker()), job_env(), stdout=subprocess.PIPE)
    _ready(child)
    root = _tree(tmp_path, child.pid, "slurm-v2.txt", live_stat=True)
    attributor = Attributor(Priorities(), proc_root=root)
    first = attributor.describe([child.pid], 0.0)[child.pid]
    assert first.slurm_job == "4242"
    assert first.status in {"running", "sleeping"}
    assert first.nice == 0
    assert first.cpu_pct is None

    # The cgroup file now says something else; the process is the same, so it is not re-read.
    _set_cgroup(root, child.pid, "docker-v2.txt")
    os.setpriority(os.PRIO_PROCESS, child.pid, 7)
    os.kill(child.pid, signal.SIGSTOP)
    wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_STOPPED)
    second = attributor.describe([child.pid], 1.0)[child.pid]
    assert second.status == "stopped"
    assert second.nice == 7
    assert second.cpu_pct is not None
    assert second.rss_mib == psutil.Process(child.pid).memory_info().rss // MIB
    assert (second.cgroup, second.slurm_job, second.container) == (
        first.cgroup,
        first.slurm_job,
        None,
    )
    assert second.cmdline == first.cmdline
    assert second.env == first.env
    assert second.create_time == first.create_time
    assert second.priority == first.priority == "low"

    os.kill(child.pid, signal.SIGCONT)
    wait_for(lambda: psutil.Process(child.pid).status() != psutil.STATUS_STOPPED)
    third = attributor.describe([child.pid], 2.0)[child.pid]
    assert third.status in {"running", "sleeping"}
    assert third.container is None
    # A new Attributor reads the file as it is now: the kept facts above were the old ones.
    fresh = Attributor(Priorities(), proc_root=root).describe([child.pid], 2.0)[child.pid]
    assert fresh.container is not None
    assert fresh.slurm_job == "4242"  # from the environment, the cgroup no longer says


def test_a_new_start_time_is_a_new_process(spawn: Spawn, tmp_path: Path) -> None:
    """The identity check itself: same PID, another start time (field 22) in ``stat``, so
    nothing is kept, though psutil still reads the same real process."""
    child = spawn(sleeper_argv(marker()), job_env(SLURM_JOB_ID="1"), stdout=subprocess.PIPE)
    _ready(child)
    root = _tree(tmp_path, child.pid, "slurm-v2.txt", live_stat=False)
    attributor = Attributor(Priorities(), proc_root=root)
    assert attributor.describe([child.pid], 0.0)[child.pid].slurm_job == "4242"

    _set_cgroup(root, child.pid, "docker-v2.txt")
    kept = attributor.describe([child.pid], 1.0)[child.pid]
    assert kept.slurm_job == "4242"
    assert kept.container is None
    assert kept.cpu_pct is not None

    _set_stat_field(root, child.pid, 22, str(int(_stat_field(root, child.pid, 22)) + 1))
    other = attributor.describe([child.pid], 2.0)[child.pid]
    assert other.slurm_job == "1"
    assert other.container is not None
    assert other.cpu_pct is None  # a first observation


def test_a_reused_pid_does_not_inherit_facts(spawn: Spawn) -> None:
    last_pid = Path("/proc/sys/kernel/ns_last_pid")
    if not IS_ROOT or not last_pid.exists():
        pytest.skip("handing out a chosen PID needs root and /proc/sys/kernel/ns_last_pid")
    attributor = Attributor(classes(("high", (rule(env={"TEAM": "vision"}),))))
    first = spawn(sleeper_argv(marker()), job_env(), stdout=subprocess.PIPE)
    _ready(first)
    before = attributor.describe([first.pid], 0.0)[first.pid]
    assert before.priority == "high"
    # Start times count clock ticks (10 ms): a PID handed out again within the same tick would
    # be the same identity, as it is for psutil. Real reuse waits for the PID counter to wrap.
    time.sleep(0.05)
    pid = first.pid
    first.kill()
    first.wait(timeout=10)

    mark = marker()
    for _attempt in range(50):  # another process may take the PID first: try again
        last_pid.write_text(str(pid - 1))
        second = spawn(
            sleeper_argv(mark), {"GPUWARDEN_PRIORITY": "scavenger"}, stdout=subprocess.PIPE
        )
        if second.pid == pid:
            break
        second.kill()
    else:
        pytest.skip("the PID was taken by other processes every time")
    _ready(second)
    after = attributor.describe([pid], 1.0)[pid]
    assert after.create_time != before.create_time
    assert after.cmdline is not None
    assert after.cmdline[-1] == mark
    assert after.env == {"GPUWARDEN_PRIORITY": "scavenger"}
    assert after.slurm_job is None
    assert after.checkpoint_signal is None
    assert after.priority == "scavenger"
    assert after.cpu_pct is None


def test_exec_of_another_program_is_seen(spawn: Spawn) -> None:
    sleep = shutil.which("sleep")
    assert sleep is not None
    child = spawn(
        [sys.executable, "-c", EXEC_ON_LINE, sleep, "600"],
        job_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    _ready(child)
    attributor = Attributor(Priorities())
    before = attributor.describe([child.pid], 0.0)[child.pid]
    assert before.priority == "low"
    assert before.checkpoint_signal == "SIGUSR1"

    _send_line(child)
    wait_for(lambda: _comm(child.pid) == "sleep")
    after = attributor.describe([child.pid], 1.0)[child.pid]
    assert after.name == "sleep"
    assert after.cmdline == (sleep, "600")
    assert after.env == {"GPUWARDEN_PRIORITY": "scavenger"}
    assert after.priority == "scavenger"
    assert after.checkpoint_signal is None
    assert after.create_time == before.create_time
    assert after.cpu_pct is not None  # the same process: CPU use is measured across the exec


def test_exec_of_the_same_program_is_seen(spawn: Spawn) -> None:
    """A new command line under the same command name: the memory layout tells."""
    mark = marker()
    child = spawn(
        [sys.executable, "-c", EXEC_ON_LINE, *sleeper_argv(f"{mark}-after-exec")],
        job_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    _ready(child)
    name = _comm(child.pid)
    attributor = Attributor(Priorities())
    assert attributor.describe([child.pid], 0.0)[child.pid].priority == "low"

    _send_line(child)
    _ready(child)  # the new interpreter runs
    assert _comm(child.pid) == name
    after = attributor.describe([child.pid], 1.0)[child.pid]
    assert after.cmdline is not None
    assert after.cmdline[-1] == f"{mark}-after-exec"
    assert after.priority == "scavenger"


def test_kept_facts_are_read_again_after_refresh_after(spawn: Spawn, tmp_path: Path) -> None:
    child = spawn(sleeper_argv(marker()), job_env(), stdout=subprocess.PIPE)
    _ready(child)
    root = _tree(tmp_path, child.pid, "slurm-v2.txt", live_stat=True)
    attributor = Attributor(Priorities(), proc_root=root, refresh_after=60.0)
    assert attributor.describe([child.pid], 1000.0)[child.pid].container is None
    _set_cgroup(root, child.pid, "docker-v2.txt")
    assert attributor.describe([child.pid], 1059.0)[child.pid].container is None
    refreshed = attributor.describe([child.pid], 1060.0)[child.pid]
    assert refreshed.container is not None
    assert refreshed.cpu_pct is not None
    # A clock stepped far back is no reason to trust the kept facts longer.
    _set_cgroup(root, child.pid, "slurm-v2.txt")
    assert attributor.describe([child.pid], 1061.0)[child.pid].container is not None
    assert attributor.describe([child.pid], 900.0)[child.pid].container is None


def test_pids_not_asked_about_are_forgotten(spawn: Spawn, tmp_path: Path) -> None:
    child = spawn(sleeper_argv(marker()), job_env(), stdout=subprocess.PIPE)
    other = spawn(sleeper_argv(marker()), job_env())
    _ready(child)
    root = _tree(tmp_path, child.pid, "slurm-v2.txt", live_stat=True)
    attributor = Attributor(Priorities(), proc_root=root)
    assert attributor.describe([child.pid], 0.0)[child.pid].container is None
    _set_cgroup(root, child.pid, "docker-v2.txt")
    attributor.describe([other.pid], 1.0)
    again = attributor.describe([child.pid], 2.0)[child.pid]
    assert again.container is not None
    assert again.cpu_pct is None


def test_a_known_process_that_exits_is_a_zombie(spawn: Spawn) -> None:
    mark = marker()
    child = spawn(
        [sys.executable, "-c", EXIT_ON_LINE, mark],
        job_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    _ready(child)
    attributor = Attributor(classes(("scavenger", (rule(cmdline=mark),))))
    alive = attributor.describe([child.pid], 0.0)[child.pid]
    assert alive.priority == "scavenger"
    assert alive.cmdline is not None

    _send_line(child)
    wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)
    dead = attributor.describe([child.pid], 1.0)[child.pid]
    assert dead.status == "zombie"
    assert dead.cmdline is None
    assert dead.env is None
    assert dead.declared_priority is None
    assert dead.priority == "normal"  # resolved again: the rule's cmdline is gone
    assert dead.create_time == alive.create_time


def test_command_names_with_parentheses_and_spaces(spawn: Spawn) -> None:
    odd = "a) b (c"
    script = (
        f"open('/proc/self/comm', 'w').write({odd!r}); print('ready', flush=True); "
        "import time; time.sleep(600)"
    )
    child = spawn([sys.executable, "-c", script], job_env(), stdout=subprocess.PIPE)
    _ready(child)
    attributor = Attributor(Priorities())
    assert attributor.describe([child.pid], 0.0)[child.pid].name == odd
    os.setpriority(os.PRIO_PROCESS, child.pid, 3)
    kept = attributor.describe([child.pid], 1.0)[child.pid]
    assert kept.name == odd
    assert kept.nice == 3
    assert kept.status in {"running", "sleeping"}
    assert kept.priority == "low"
    assert kept.rss_mib is not None
    assert kept.rss_mib >= 1


def test_an_ending_process_is_read_afresh(spawn: Spawn, tmp_path: Path) -> None:
    """State Z or X in ``stat`` means the kept command line and environment are gone, even
    where the memory layout cannot be seen (an unprivileged daemon sees zeros)."""
    child = _ready(spawn(sleeper_argv(marker()), job_env(), stdout=subprocess.PIPE))
    root = _tree(tmp_path, child.pid, "slurm-v2.txt", live_stat=False)
    for number in (26, 27, 28, 48, 49, 50, 51):
        _set_stat_field(root, child.pid, number, "0")
    attributor = Attributor(Priorities(), proc_root=root)
    assert attributor.describe([child.pid], 0.0)[child.pid].container is None
    _set_cgroup(root, child.pid, "docker-v2.txt")
    assert attributor.describe([child.pid], 1.0)[child.pid].container is None
    _set_stat_field(root, child.pid, 3, "Z")
    assert attributor.describe([child.pid], 2.0)[child.pid].container is not None
