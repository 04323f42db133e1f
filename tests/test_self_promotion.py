"""Self-promotion, tried as a hostile user would, with the shipped config: real processes of a
real second user (``mallory``, created for the session), attributed by the real Attributor.

Each attempt once worked: ``exec -a sshd`` made a job protected; ``SLURM_JOB_PARTITION=prod``
outside Slurm gave class ``high``; a cgroup made under ``user@UID.service`` named
``triton.service`` gave ``critical`` and protection; a renamed argv[0] moved a kill onto another
user's job. Each test also runs the legitimate form (root's own cgroup, Slurm's own answer), so
that it would fail if trust were simply switched off.

The cgroup tests make real cgroups in this machine's unified (v2) hierarchy, in a directory of
their own that they remove afterwards; where cgroups cannot be made they are skipped, and the
ownership rule is still tested on a directory tree owned by the user (the last tests here).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuwarden import config
from gpuwarden.config import Config
from gpuwarden.engine.engine import Engine
from gpuwarden.engine.protect import ProtectedMatcher
from gpuwarden.model import GpuProcess, GpuState, Memory, Outcome, ProcessInfo, Snapshot
from gpuwarden.playbook import loader
from gpuwarden.sources.cgroup_trust import CgroupTrust
from gpuwarden.sources.cgroups import parse_cgroup
from gpuwarden.sources.procs import Attributor
from gpuwarden.sources.slurm import SlurmJobs
from tests.cli_runner import gpuwarden
from tests.system_users import User

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = config.load(ROOT / "config" / "gpuwarden.yaml")
PYTHON = "/usr/bin/python3"
# A job that waits: prints "ready" once it is what it will stay, then sleeps.
WAIT = "import time; print('ready', flush=True); time.sleep(600)"
# The same, having first renamed its process (comm) with prctl(PR_SET_NAME).
RENAMED = (
    "import ctypes, time; ctypes.CDLL(None).prctl(15, b'sshd', 0, 0, 0); "
    "print('ready', flush=True); time.sleep(600)"
)
# Run as root, then become the user: optionally join a cgroup first (as systemd would).
LAUNCH = (
    "import os, sys, warnings  # execvp imports warnings: before giving up root\n"
    "procs, uid, gid, *argv = sys.argv[1:]\n"
    "if procs:\n"
    "    with open(procs, 'w') as f:\n"
    "        f.write(str(os.getpid()))\n"
    "os.setgroups([]); os.setgid(int(gid)); os.setuid(int(uid))\n"
    "os.execvp(argv[0], argv)\n"
)

Start = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def start() -> Iterator[Start]:
    """Starts ``argv`` as ``user`` (in the cgroup whose ``cgroup.procs`` is given) and waits
    for its "ready"; every process is killed and reaped at the end of the test."""
    started: list[subprocess.Popen[bytes]] = []

    def run(
        user: User | None,
        argv: list[str],
        env: dict[str, str] | None = None,
        procs: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        uid, gid = (user.uid, user.gid) if user else (0, 0)
        child = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, str(procs or ""), str(uid), str(gid), *argv],
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
            cwd="/",
        )
        started.append(child)
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n", "the job did not start"
        return child

    yield run
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()


def describe(pid: int, attributor: Attributor | None = None) -> ProcessInfo:
    attributor = attributor or Attributor(SHIPPED.priorities)
    return attributor.describe([pid], time.time())[pid]


def protection(info: ProcessInfo) -> str | None:
    return ProtectedMatcher(SHIPPED.protected).why(info)


def notebook_argv() -> list[str]:
    """mallory's notebook kernel, started as ``exec -a sshd`` and renamed to ``sshd``."""
    return [
        "bash",
        "-c",
        'exec -a sshd "$0" -c "$1" ipykernel_launcher -f kernel-7c1e.json',
        PYTHON,
        RENAMED,
    ]


# -- exec -a sshd --------------------------------------------------------------------------------


def test_exec_a_sshd_does_not_protect(system_users: dict[str, User], start: Start) -> None:
    mallory = system_users["mallory"]
    info = describe(start(mallory, notebook_argv()).pid)
    # The forgery took: the process calls itself sshd by name and by argv[0] ...
    assert info.name == "sshd"
    assert info.cmdline is not None
    assert info.cmdline[0] == "sshd"
    # ... but the kernel still says who runs what.
    assert info.uid == mallory.uid
    assert info.exe == os.path.realpath(PYTHON)
    assert protection(info) is None
    assert info.priority == "low"  # the notebook rule may still lower it
    # The same program as root is protected: by its uid, not its name.
    as_root = describe(start(None, notebook_argv()).pid)
    assert protection(as_root) == "owned by root (protected.root)"


# -- SLURM_JOB_PARTITION outside Slurm -----------------------------------------------------------


def test_a_partition_claimed_outside_slurm_does_not_raise(
    system_users: dict[str, User], start: Start, tmp_path: Path
) -> None:
    mallory = system_users["mallory"]
    claim = {"SLURM_JOB_PARTITION": "prod", "SLURM_JOB_ID": "4242"}
    job = start(mallory, [PYTHON, "-c", WAIT, "train.py"], claim)
    assert describe(job.pid).priority == "normal"  # the default, not the rule's "high"
    # Where Slurm is there, a job outside any Slurm cgroup is not asked about: still a claim.
    squeue = fake_squeue(tmp_path, {"4242": "prod|normal"})
    slurm = Attributor(SHIPPED.priorities, slurm=SlurmJobs(str(squeue)))
    assert describe(job.pid, slurm).priority == "normal"
    assert asked(squeue) == []
    # A declaration is honoured up to declared_max, as it always was.
    declared = start(mallory, [PYTHON, "-c", WAIT], {"GPUWARDEN_PRIORITY": "critical"})
    assert describe(declared.pid).priority == "high"


def fake_squeue(tmp_path: Path, answers: dict[str, str]) -> Path:
    """An executable answering ``squeue --noheader --jobs=ID --format=%P|%q`` as slurmctld
    would (standing in for a Slurm cluster), logging each job it was asked about."""
    script = tmp_path / "squeue"
    cases = "\n".join(f"  {job}) echo '{line}' ;;" for job, line in answers.items())
    script.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do case "$arg" in --jobs=*) job="${arg#--jobs=}" ;; esac; done\n'
        f'echo "$job" >> {tmp_path}/squeue.log\n'
        'case "$job" in\n'
        f"{cases}\n"
        "  *) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return script


def asked(squeue: Path) -> list[str]:
    log = squeue.parent / "squeue.log"
    return log.read_text().split() if log.exists() else []


# -- cgroups -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cgroup_base() -> Iterator[tuple[Path, str]]:
    """A cgroup of our own in the unified hierarchy: (its directory, its path as
    /proc/PID/cgroup shows it). Skipped where cgroups cannot be made."""
    mount = Path("/sys/fs/cgroup")
    if not (mount / "cgroup.controllers").exists():
        mount = mount / "unified"  # a hybrid machine (systemd's layout)
    own = Path("/proc/self/cgroup").read_text().splitlines()
    unified = next((line[3:] for line in own if line.startswith("0::")), None)
    if unified is None or unified != "/":
        pytest.skip(f"this process is not in the root of the unified hierarchy ({unified})")
    base = mount / f"gwt{os.getpid()}"
    try:
        base.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make cgroups in {mount}: {exc.strerror}")
    try:
        yield base, f"/{base.name}"
    finally:
        for directory in sorted(base.rglob("*"), key=lambda p: -len(p.parts)):
            if directory.is_dir():
                with contextlib.suppress(OSError):
                    directory.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()


def delegate(directory: Path, user: User) -> None:
    """What systemd does for a delegated unit (user@UID.service, Delegate=yes with User=):
    the directory and the files that let its owner manage it become the user's."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in (directory, *(directory / f for f in ("cgroup.procs", "cgroup.threads"))):
        os.chown(path, user.uid, user.gid)
    os.chown(directory / "cgroup.subtree_control", user.uid, user.gid)


def join_own_cgroup(parent: Path, inner: str) -> list[str]:
    """mallory's shell, already in the delegated cgroup ``parent``: makes ``inner`` below it,
    moves itself there (the kernel lets her: she owns the common ancestor), then waits."""
    return [
        "bash",
        "-c",
        'mkdir -p "$0/$1" && echo $$ > "$0/$1/cgroup.procs" && exec "$2" -c "$3"',
        str(parent),
        inner,
        PYTHON,
        WAIT,
    ]


def test_a_triton_service_made_under_user_manager_is_not_critical(
    system_users: dict[str, User], start: Start, cgroup_base: tuple[Path, str]
) -> None:
    mallory = system_users["mallory"]
    base, seen = cgroup_base
    manager = f"user.slice/user-{mallory.uid}.slice/user@{mallory.uid}.service"
    delegate(base / manager, mallory)
    argv = join_own_cgroup(base / manager, "app.slice/triton.service")
    job = start(mallory, argv, procs=base / manager / "cgroup.procs")
    info = describe(job.pid)
    assert info.cgroup == f"{seen}/{manager}/app.slice/triton.service"
    assert info.systemd_unit == "triton.service"  # what the rule `unit: triton\.service` reads
    assert not info.cgroup_trusted
    assert info.priority == "normal"
    assert protection(info) is None
    # The real triton.service, which root's system manager made, is what the rule means.
    system = base / "system.slice" / "triton.service"
    system.mkdir(parents=True)
    served = describe(start(mallory, [PYTHON, "-c", WAIT], procs=system / "cgroup.procs").pid)
    assert served.cgroup == f"{seen}/system.slice/triton.service"
    assert served.cgroup_trusted
    assert served.priority == "critical"
    assert protection(served) == "priority class critical is protected"


def test_a_cgroup_chowned_to_its_user_is_untrusted_whatever_its_name(
    system_users: dict[str, User], start: Start, cgroup_base: tuple[Path, str]
) -> None:
    """A Delegate=yes service running as the user: no user@ in the path, but her directory."""
    mallory = system_users["mallory"]
    base, seen = cgroup_base
    lab = base / "system.slice" / "lab.service"
    delegate(lab, mallory)
    argv = join_own_cgroup(lab, "triton.service")
    info = describe(start(mallory, argv, procs=lab / "cgroup.procs").pid)
    assert info.cgroup == f"{seen}/system.slice/lab.service/triton.service"
    assert not parse_cgroup(f"0::{info.cgroup}").delegated  # the name alone would pass
    assert not info.cgroup_trusted  # ownership does not
    assert (info.priority, protection(info)) == ("normal", None)


def test_slurm_says_the_partition_for_a_job_in_its_cgroup(
    system_users: dict[str, User],
    start: Start,
    cgroup_base: tuple[Path, str],
    tmp_path: Path,
) -> None:
    mallory = system_users["mallory"]
    base, _seen = cgroup_base
    squeue = fake_squeue(tmp_path, {"4242": "prod|normal", "4243": "debug|normal"})
    attributor = Attributor(SHIPPED.priorities, slurm=SlurmJobs(str(squeue)))
    jobs = {}
    for job_id, claim in (("4242", "debug"), ("4243", "prod")):
        task = base / "system.slice/slurmstepd.scope" / f"job_{job_id}/step_0/user/task_0"
        task.mkdir(parents=True)
        env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_PARTITION": claim}
        jobs[job_id] = describe(
            start(mallory, [PYTHON, "-c", WAIT], env, task / "cgroup.procs").pid, attributor
        )
    # Slurm put 4242 in prod (whatever its environment says): high, by the shipped rule.
    assert (jobs["4242"].slurm_partition, jobs["4242"].priority) == ("prod", "high")
    # 4243 claims prod, Slurm says debug: Slurm's word counts.
    assert (jobs["4243"].slurm_partition, jobs["4243"].priority) == ("debug", "normal")
    assert asked(squeue) == ["4242", "4243"]  # once each


# -- the ownership rule on a tree owned by the user (needs no cgroup file system) ----------------


def test_cgroup_ownership_on_a_tree_owned_by_the_user(
    system_users: dict[str, User], tmp_path: Path
) -> None:
    mallory = system_users["mallory"]
    (tmp_path / "cgroup.controllers").touch()  # the unified hierarchy is mounted here
    manager = tmp_path / f"user.slice/user-{mallory.uid}.slice/user@{mallory.uid}.service"
    (manager / "app.slice/triton.service").mkdir(parents=True)
    (tmp_path / "system.slice/lab.service/triton.service").mkdir(parents=True)
    (tmp_path / "system.slice/triton.service").mkdir(parents=True)
    for mine in (manager, manager / "app.slice/triton.service"):
        os.chown(mine, mallory.uid, mallory.gid)
    os.chown(tmp_path / "system.slice/lab.service", mallory.uid, mallory.gid)
    trust = CgroupTrust(tmp_path)

    def trusted(path: str) -> bool:
        return trust.trusted(parse_cgroup(f"0::{path}"))

    assert trusted("/system.slice/triton.service")
    assert not trusted(f"/{manager.relative_to(tmp_path)}/app.slice/triton.service")
    assert not trusted("/system.slice/lab.service/triton.service")  # below mallory's directory
    assert not trusted("/system.slice/gone.service")  # cannot be examined: not trusted
    # By its name alone a user manager's subtree is the user's, even if root owned it.
    os.chown(manager, 0, 0)
    os.chown(manager / "app.slice/triton.service", 0, 0)
    assert not trusted(f"/{manager.relative_to(tmp_path)}/app.slice/triton.service")


def test_the_attributor_reads_ownership_where_it_is_pointed(
    system_users: dict[str, User], start: Start, tmp_path: Path
) -> None:
    """The same through the Attributor, with a proc tree naming a cgroup in a test root."""
    mallory = system_users["mallory"]
    job = start(mallory, [PYTHON, "-c", WAIT])
    proc = tmp_path / "proc" / str(job.pid)
    proc.mkdir(parents=True)
    shutil.copyfile(f"/proc/{job.pid}/status", proc / "status")
    cgroups = tmp_path / "cgroup"
    (cgroups / "system.slice/triton.service").mkdir(parents=True)
    (cgroups / "cgroup.controllers").touch()
    (proc / "cgroup").write_text("0::/system.slice/triton.service\n")
    attributor = Attributor(SHIPPED.priorities, proc_root=tmp_path / "proc", cgroup_root=cgroups)
    assert describe(job.pid, attributor).priority == "critical"
    os.chown(cgroups / "system.slice", mallory.uid, mallory.gid)
    attributor = Attributor(SHIPPED.priorities, proc_root=tmp_path / "proc", cgroup_root=cgroups)
    assert describe(job.pid, attributor).priority == "normal"


# -- a renamed argv[0] and the kill --------------------------------------------------------------

TOTAL_MIB = 81920


def kill_targets(cfg: Config, processes: list[GpuProcess], start_at: float) -> list[int]:
    """The shipped memory-pressure ladder on a full GPU until its kill step: whom it kills."""
    playbooks = loader.load([ROOT / "playbooks" / "memory-pressure.yaml"], cfg)
    engine = Engine(playbooks, cfg)
    used = sum(p.gpu_memory_mib or 0 for p in processes) + 1200
    gpu = GpuState(index=0, memory=Memory(TOTAL_MIB, used, TOTAL_MIB - used))
    for second in range(0, 400, 2):
        tick = engine.step(
            Snapshot("node-1", start_at + second, (gpu,), tuple(processes)), start_at + second
        )
        for intent in tick.intents:
            if intent.kind == "kill":
                return [t.pid for t in intent.targets]
            engine.complete(intent.id, Outcome(ok=True, detail="done"))
    raise AssertionError("the ladder never reached its kill step")


def test_a_renamed_argv0_keeps_the_kill_on_the_attackers_notebook(
    system_users: dict[str, User], start: Start
) -> None:
    mallory, bob = system_users["mallory"], system_users["bob"]
    notebook = describe(start(mallory, notebook_argv()).pid)
    sweep = describe(
        start(
            bob, [PYTHON, "-c", WAIT, "sweep.py", "--trial", "17"], {"GPUWARDEN_PRIORITY": "low"}
        ).pid
    )
    assert (notebook.priority, sweep.priority) == ("low", "low")
    processes = [
        GpuProcess(notebook.pid, 0, 60000, notebook, sm_util_pct=0),
        GpuProcess(sweep.pid, 0, 20000, sweep, sm_util_pct=40),
    ]
    assert kill_targets(SHIPPED, processes, time.time()) == [notebook.pid]


def test_the_argv0_drill(tmp_path: Path) -> None:
    """The same as a drill: the scenario states the notebook's uid and executable."""
    result = gpuwarden(
        "drill",
        str(ROOT / "tests" / "fixtures" / "scenarios" / "argv0-renamed-notebook.yaml"),
        "--config",
        str(ROOT / "config" / "gpuwarden.yaml"),
        "--playbooks",
        str(ROOT / "playbooks" / "memory-pressure.yaml"),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    kills = [r for r in records if r["kind"] == "step" and r.get("step") == "kill"]
    assert len(kills) == 1, result.stdout
    assert [t["job"] for t in kills[0]["targets"]] == ["notebook"]
    assert "sweep" not in {t["job"] for r in kills for t in r["targets"]}
