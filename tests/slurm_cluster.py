"""A real single-node Slurm on 127.0.0.1 for the Slurm tests: one cluster per test session.

Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them): munged with a key of its own,
slurmctld and slurmd on free ports, one node and one partition
``gpu``, state, spool, logs and the munge socket in a temporary directory, ``SlurmUser=root``,
``JobRequeue=1``. Job tracking is ``proctrack/cgroup`` where the cgroup file system lets slurmd
make its hierarchy, else ``proctrack/linuxproc``. There is no accounting database (slurmdbd):
Slurm's view of a job is read with ``scontrol show job`` (kept ``MinJobAge`` after the job
ends) and finished jobs are also written by ``jobcomp/filetxt``.

Import both fixtures where one is needed: ``slurm_cluster`` (session) is the running cluster,
``slurm`` the same for one test, with the jobs it left cancelled afterwards::

    from tests.slurm_cluster import fixture_slurm, fixture_slurm_cluster  # noqa: F401

Where Slurm or munge is not installed the tests that use it are skipped with the reason; with
``CI=true`` in the environment they fail instead (CI must run them). Jobs are ``sbatch`` scripts
that ``exec`` the stand-in (``gpuwarden.sources.standin``), which logs every signal it gets.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuwarden.config import SlurmConfig

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue", "sinfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")
START_TIMEOUT_S = 60.0
CPUS = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(predicate: object, timeout: float = 20.0, what: str = "it") -> None:
    """Poll ``predicate`` (a callable) until it is true; fail the test after ``timeout``."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class Job:
    """One submitted job and the stand-ins it runs (one log per stand-in)."""

    id: str
    logs: tuple[Path, ...]
    ack_dir: Path

    def lines(self, index: int = 0) -> list[str]:
        """What stand-in ``index`` logged: ``ready pid=…``, ``signal SIGUSR1``, ``ack …``."""
        try:
            text = self.logs[index].read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [line.split(" ", 1)[1] for line in text.splitlines() if " " in line]

    def pid(self, index: int = 0) -> int | None:
        for line in self.lines(index):
            if line.startswith("ready pid="):
                return int(line.removeprefix("ready pid="))
        return None

    def signals(self, index: int = 0) -> list[str]:
        return [line for line in self.lines(index) if not line.startswith("ready")]


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str
    proctrack: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _jobs: int = 0

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": str(self.conf)}

    @property
    def spool(self) -> Path:
        """The acknowledgement spool every job of the cluster answers in (the daemon's
        ``ack_spool`` in these tests): root's, not writable by others."""
        spool = self.root / "ack-spool"
        spool.mkdir(mode=0o755, exist_ok=True)
        return spool

    def config(self, **changes: object) -> SlurmConfig:
        """The daemon's ``slurm`` config for this cluster."""
        return SlurmConfig.model_validate({"conf": self.conf, **changes})

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=30, check=False
        )
        if check and done.returncode != 0:
            pytest.fail(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done

    def show(self, job: Job | str) -> dict[str, str]:
        """Slurm's own view of the job: ``scontrol show job -o`` as fields."""
        job_id = job.id if isinstance(job, Job) else job
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        fields: dict[str, str] = {}
        for word in out.split():
            key, sep, value = word.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def state(self, job: Job | str) -> str:
        return self.show(job).get("JobState", "?")

    def wait_state(self, job: Job, *states: str, timeout: float = 30.0) -> str:
        wait_for(lambda: self.state(job) in states, timeout, f"job {job.id} to be {states}")
        return self.state(job)

    def submit(
        self,
        tmp: Path,
        *,
        standins: int = 1,
        srun: bool = False,
        on_term: str = "exit",
        ack: str = "0",
        checkpoint_signal: str = "SIGUSR1",
    ) -> Job:
        """Submit a batch job running ``standins`` stand-ins and wait until every one is
        ready. The script ``exec``s a single one (it is then the job's batch process), or with
        ``srun`` starts it as step 0 of the job and waits for it, trapping no signal (as most
        batch scripts do); several run in the background of a script that traps USR1, USR2
        and CONT."""
        self._jobs += 1
        workdir = tmp / f"slurm-job{self._jobs}"
        workdir.mkdir(parents=True)
        ack_dir = self.spool
        logs = tuple(workdir / f"standin{i}.log" for i in range(standins))
        python = sys.executable
        if standins == 1:
            launch = "srun" if srun else "exec"
            body = f'export GPUWARDEN_STANDIN_LOG="{logs[0]}"\n{launch} "{python}" -m {STANDIN}\n'
        else:
            body = "trap 'true' USR1 USR2 CONT\n"  # the script lives on until they end
            for log in logs:
                body += f'GPUWARDEN_STANDIN_LOG="{log}" "{python}" -m {STANDIN} &\n'
            body += 'while [ -n "$(jobs -p)" ]; do wait; done\n'
        script = workdir / "job.sh"
        script.write_text("#!/bin/bash\n" + body)
        env = {
            **self.env,
            "PYTHONPATH": str(ROOT / "daemon"),
            "GPUWARDEN_CHECKPOINT_SIGNAL": checkpoint_signal,
            "GPUWARDEN_ACK_DIR": str(ack_dir),
            "GPUWARDEN_STANDIN_ACK": ack,
            "GPUWARDEN_STANDIN_ON_TERM": on_term,
        }
        done = subprocess.run(
            ["sbatch", "--parsable", f"--output={workdir / 'out'}", f"--chdir={workdir}", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"sbatch: exit {done.returncode}: {done.stderr.strip()}")
        job = Job(done.stdout.strip().split(";")[0], logs, ack_dir)
        for index in range(standins):
            wait_for(lambda i=index: job.pid(i) is not None, 30, f"job {job.id} to start")
        return job

    def queue(self) -> list[str]:
        """The ids of the jobs Slurm still holds (pending, running, completing...)."""
        return self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()

    def cancel_all(self) -> None:
        ids = self.queue()
        if ids:
            self.run("scancel", *ids, check=False)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.cancel_all()
        for process in reversed(self.processes):  # slurmd, slurmctld, then munged
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)
        # slurmd leaves its empty per-node directory in each cgroup v1 hierarchy
        for hierarchy in CGROUP_ROOT.glob("*"):
            mine = hierarchy / f"slurm_{self.node}"
            for directory in sorted(mine.glob("**/"), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    directory.rmdir()


STANDIN = "gpuwarden.sources.standin"


def which(name: str) -> str | None:
    """Where a Slurm or munge program is: the PATH, then the sbin directories (where Debian puts
    the daemons, and which a non-root PATH may lack)."""
    path = os.pathsep.join((os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"))
    return shutil.which(name, path=path)


def _absent() -> str | None:
    missing = [p for p in PROGRAMS if which(p) is None]
    if missing:
        return (
            f"Slurm is not installed here ({', '.join(missing)} not found): "
            "apt-get install slurm-wlm munge (as .ci/run does)"
        )
    if os.geteuid() != 0:
        return "the Slurm tests start slurmd, which must run as root"
    return None


def _program(name: str) -> str:
    found = which(name)
    if found is None:
        raise RuntimeError(f"{name} not found")
    return found


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the Slurm tests must run)")
    pytest.skip(reason)


def _write_conf(root: Path, node: str, proctrack: str) -> Path:
    ctld, slurmd = _free_port(), _free_port()
    host = socket.gethostname()
    lines = [
        "ClusterName=gwtest",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld}",
        f"SlurmdPort={slurmd}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={root / 'munge' / 'sock'}",
        "CredType=cred/munge",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        f"ProctrackType=proctrack/{proctrack}",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/builtin",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={root / 'log' / 'jobcomp.txt'}",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "JobRequeue=1",
        "KillWait=5",
        "MessageTimeout=5",
        "ReturnToService=2",
        # Job ids of their own, so that cgroups never meet those of another cluster's jobs.
        f"FirstJobId={random.randint(100_000, 900_000)}",
        # More CPUs than the machine has (config_overrides), so that the jobs of one test
        # never wait for each other's.
        "SlurmdParameters=config_overrides",
        f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={CPUS} State=UNKNOWN",
        f"PartitionName=gpu Nodes={node} Default=YES MaxTime=INFINITE State=UP",
    ]
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    (root / "cgroup.conf").write_text(f"CgroupMountpoint={CGROUP_ROOT}\n")
    return conf


def _start(root: Path, node: str, proctrack: str, munged: subprocess.Popen[bytes]) -> SlurmCluster:
    conf = _write_conf(root, node, proctrack)
    cluster = SlurmCluster(root, conf, node, proctrack, [munged])
    log = root / "log"
    env = {**cluster.env}
    for argv, name in (
        ([_program("slurmctld"), "-D", "-i", "-f", str(conf)], "slurmctld"),
        ([_program("slurmd"), "-D", "-N", node, "-f", str(conf)], "slurmd"),
    ):
        out = (log / f"{name}.{proctrack}.out").open("wb")
        cluster.processes.append(
            subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        )
        out.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in cluster.processes):
            break
        state = cluster.run("sinfo", "-h", "-n", node, "-o", "%T", check=False).stdout.strip()
        if state == "idle":
            return cluster
        time.sleep(0.2)
    for process in cluster.processes[1:]:
        if process.poll() is None:
            process.terminate()
            process.wait(10)
    cluster.processes[1:] = []
    raise RuntimeError(f"the node did not come up idle with proctrack/{proctrack}")


def start_cluster(root: Path) -> SlurmCluster:
    """munged, then slurmctld and slurmd; proctrack/cgroup if slurmd can use it."""
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "munge", 0o711)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o400)
    munged = subprocess.Popen(
        [
            _program("munged"),
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={root / 'munge' / 'sock'}",
            f"--pid-file={root / 'munge' / 'pid'}",
            f"--log-file={root / 'log' / 'munged.log'}",
            f"--seed-file={root / 'munge' / 'seed'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for((root / "munge" / "sock").exists, 20, "munged's socket")
    node = f"gw{os.getpid()}"
    problems = []
    for proctrack in ("cgroup", "linuxproc"):
        try:
            return _start(root, node, proctrack, munged)
        except RuntimeError as err:
            problems.append(str(err))
    munged.terminate()
    munged.wait(10)
    raise RuntimeError("; ".join(problems))


@pytest.fixture(scope="session", name="slurm_cluster")
def fixture_slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = _absent()
    if reason is not None:
        _unavailable(reason)
    root = tmp_path_factory.mktemp("slurm")
    try:
        cluster = start_cluster(root)
    except RuntimeError as err:
        logs = "\n".join(
            f"{p.name}: {p.read_text(errors='replace')[-2000:]}" for p in (root / "log").glob("*")
        )
        pytest.fail(f"Slurm did not start: {err}\n{logs}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(name="slurm")
def fixture_slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster, with every job a test leaves cancelled after it."""
    yield slurm_cluster
    slurm_cluster.cancel_all()
    wait_for(lambda: not slurm_cluster.queue(), 30, "the queue to empty")
