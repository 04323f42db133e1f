"""The acknowledgement spool tried as a hostile user would, with real users and real processes:
a forged acknowledgement, a squatted directory, a symbolic link planted to turn a job's
acknowledgement into an overwrite of its checkpoint, and an acknowledgement of 65,000 ``[``.

Each test runs a job as one test user (the victim) and the attack as another (mallory); both
are made with useradd for the session (``conftest.local_users``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden import config as config_mod
from gpuwarden.actions import checkpoint, spool
from gpuwarden.journal.journal import Journal
from gpuwarden.model import Outcome
from gpuwarden.playbook import loader
from gpuwarden.playbook.schema import CheckpointParams
from gpuwarden.runtime import Runtime
from tests.local_users import Lines, LocalUsers, ProcessSource
from tests.signal_targets import fast, intent, real, target_for
from tests.system_users import User

JOB = """
    import os, sys, time
    from gpuwarden import job

    job.install()
    print("ready", flush=True)
    mode = sys.argv[1]
    while job.wait_for_request(60):
        print("signal", flush=True)
        if mode == "ack":
            try:
                print("acked", job.acknowledge("saved"), flush=True)
            except OSError as exc:
                print("refused", exc, flush=True)
        elif mode == "deep":
            fd = os.open(job.ack_path(), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, b"[" * 65_000)
            os.close(fd)
            print("acked", flush=True)
        if mode != "ack":
            time.sleep(60)  # answered (or not), and waits to be stopped
"""


@pytest.fixture
def area() -> Iterator[Path]:
    """A scratch directory like /tmp (root-owned, world-writable, sticky) for the attacks."""
    path = Path(tempfile.mkdtemp(prefix="gpuwarden-area-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def spool_root() -> Iterator[Path]:
    """The daemon's spool for one test: root-owned, 0755."""
    path = Path(tempfile.mkdtemp(prefix="gpuwarden-spool-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def jobs() -> Iterator[list[Lines]]:
    started: list[Lines] = []
    yield started
    for job in started:
        job.stop()


def start_job(user: User, ack_dir: Path, jobs: list[Lines], mode: str = "ack") -> Lines:
    env = {"GPUWARDEN_CHECKPOINT_SIGNAL": "SIGUSR1", "GPUWARDEN_ACK_DIR": str(ack_dir)}
    job = Lines(user.python(JOB, mode, env=env))
    jobs.append(job)
    job.expect("ready")
    return job


def ask(
    job: Lines, root: Path, wait: float = 20.0, clock: str = "real", ack_dir: Path | None = None
) -> Outcome:
    """Run a checkpoint step on ``job`` with the spool ``root``; the target as the planner
    makes it (``ack_dir``: what the job declared)."""
    declared = None if ack_dir is None else str(ack_dir)
    target = target_for(job.proc.pid, checkpoint_signal="SIGUSR1", ack_dir=declared)
    ctx = real(ack_spool=root) if clock == "real" else fast(ack_spool=root)
    return checkpoint.execute(intent("checkpoint", target, params=CheckpointParams(wait=wait)), ctx)


def as_user(user: User, *argv: str) -> str:
    """Run a command as ``user``; its output (the test fails if it failed)."""
    done = user.run(list(argv))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_job_answers_in_its_own_directory_of_the_spool(
    local_users: LocalUsers, spool_root: Path, jobs: list[Lines]
) -> None:
    victim = local_users.victim
    job = start_job(victim, spool_root, jobs)
    outcome = ask(job, spool_root)
    assert [(t.state, t.detail.split(": ", 1)[-1]) for t in outcome.targets] == [
        ("acknowledged", "saved")
    ]
    own = spool_root / str(victim.uid)
    assert (own.stat().st_uid, stat.S_IMODE(own.stat().st_mode)) == (victim.uid, 0o700)
    ack = own / f"{job.proc.pid}.ack"
    assert (ack.stat().st_uid, stat.S_IMODE(ack.stat().st_mode)) == (victim.uid, 0o600)
    assert (spool_root.stat().st_uid, stat.S_IMODE(spool_root.stat().st_mode)) == (0, 0o755)
    assert json.loads(ack.read_text())["detail"] == "saved"


def test_a_forged_ack_is_rejected_with_the_reason_in_the_journal(
    local_users: LocalUsers, spool_root: Path, jobs: list[Lines], tmp_path: Path
) -> None:
    victim, mallory = local_users.victim, local_users.mallory
    job = start_job(victim, spool_root, jobs, mode="never")
    pid = job.proc.pid
    cfg = config_mod.Config(ack_spool=spool_root)
    rules = tmp_path / "ask.yaml"
    rules.write_text(
        "rules:\n  - name: ask\n    for_each: gpu\n    when: gpu.memory.used_pct >= 80\n"
        "    steps:\n      - checkpoint: {select: process.checkpointable, wait: 30s}\n"
    )
    source = ProcessSource(cfg.priorities)
    source.hold(pid, 70_000)
    journal_path = tmp_path / "journal.db"
    runtime = Runtime(cfg, source, loader.load([rules], cfg), Journal(journal_path), host="node")
    try:
        runtime.tick()  # the checkpoint step starts on a worker thread
        job.expect("signal")
        victims_dir = spool_root / str(victim.uid)
        forged = json.dumps({"pid": pid, "signal": "SIGUSR1", "detail": "forged"})
        # Mallory cannot write into the victim's directory of the spool...
        refused = mallory.run(["/bin/sh", "-c", f"echo '{forged}' > {victims_dir}/{pid}.ack"])
        assert refused.returncode != 0
        assert "Permission denied" in refused.stderr
        # ...only into her own. Should her file reach the victim's directory, it is not the
        # victim's answer: its owner says who wrote it.
        root_fd = spool.open_root(spool_root)
        os.close(spool.user_dir(root_fd, spool_root, mallory.uid))
        os.close(root_fd)
        own = spool_root / str(mallory.uid) / f"{pid}.ack"
        as_user(mallory, "/bin/sh", "-c", f"umask 077; echo '{forged}' > {own}")
        os.rename(own, victims_dir / f"{pid}.ack")
        runtime.steps.settle(60)
    finally:
        runtime.shutdown()
    reader = Journal.open_readonly(journal_path)
    try:
        (incident,) = reader.incidents()
        (result,) = [r.data for r in reader.timeline(incident.id) if r.kind == "outcome"]
    finally:
        reader.close()
    assert result["pid"] == pid
    assert result["state"] == "rejected"
    assert (
        f"is owned by uid {mallory.uid} ({mallory.name}), not by the job's uid {victim.uid} "
        f"({victim.name}): a forged acknowledgement" in result["detail"]
    )
    assert job.proc.poll() is None  # it was only asked


def test_the_old_shared_directory_is_not_read(
    local_users: LocalUsers, spool_root: Path, area: Path, jobs: list[Lines]
) -> None:
    victim, mallory = local_users.victim, local_users.mallory
    shared = area / "gpuwarden-ack"
    as_user(mallory, "/bin/mkdir", "-m", "1777", str(shared))
    job = start_job(victim, shared, jobs, mode="never")
    as_user(mallory, "/bin/sh", "-c", f"echo '{{}}' > {shared}/{job.proc.pid}.ack")
    outcome = ask(job, spool_root, wait=60, clock="fast", ack_dir=shared)
    (result,) = outcome.targets
    assert result.state == "timed_out"
    assert f"the job's GPUWARDEN_ACK_DIR is {shared}, but gpuwarden reads only its spool" in (
        result.detail
    )


def test_a_squatted_spool_is_refused_and_the_job_is_not_asked(
    local_users: LocalUsers, area: Path, jobs: list[Lines]
) -> None:
    victim, mallory = local_users.victim, local_users.mallory
    squat = area / "ack"
    as_user(mallory, "/bin/mkdir", "-m", "0755", str(squat))  # before the daemon
    job = start_job(victim, squat, jobs)
    outcome = ask(job, squat)
    (result,) = outcome.targets
    assert result.state == "refused"
    assert result.detail.startswith("not signalled: the acknowledgement spool cannot be trusted")
    assert f"{squat} is owned by uid {mallory.uid} ({mallory.name})" in result.detail
    assert os.listdir(squat) == []


def test_the_job_refuses_a_directory_squatted_by_another_user(
    local_users: LocalUsers, area: Path, jobs: list[Lines]
) -> None:
    victim, mallory = local_users.victim, local_users.mallory
    squat = area / "spool"
    as_user(mallory, "/bin/mkdir", "-m", "0755", str(squat), f"{squat}/{victim.uid}")
    job = start_job(victim, squat, jobs)
    os.kill(job.proc.pid, signal.SIGUSR1)
    line = job.expect("refused")
    assert f"is owned by uid {mallory.uid}, not by this job's uid {victim.uid}" in line
    assert os.listdir(squat / str(victim.uid)) == []


@pytest.mark.parametrize("made_by", ["mallory", "the victim"])
def test_a_planted_symlink_cannot_turn_an_ack_into_an_overwrite(
    local_users: LocalUsers, area: Path, jobs: list[Lines], made_by: str
) -> None:
    victim, mallory = local_users.victim, local_users.mallory
    home = area / "victim"
    as_user(victim, "/bin/mkdir", "-m", "0700", str(home))
    as_user(victim, "/bin/sh", "-c", f"umask 077; printf weights > {home}/model.ckpt")
    before = (home / "model.ckpt").stat()
    shared = area / "spool"
    owner = mallory if made_by == "mallory" else victim
    as_user(owner, "/bin/mkdir", "-m", "0777", str(shared), f"{shared}/{victim.uid}")
    as_user(owner, "/bin/chmod", "0777", f"{shared}/{victim.uid}")  # past the umask
    job = start_job(victim, shared, jobs)
    pid = job.proc.pid
    as_user(
        mallory,
        "/bin/ln",
        "-s",
        f"{home}/model.ckpt",
        f"{shared}/{victim.uid}/.{pid}.ack.{pid}.tmp",
    )
    os.kill(pid, signal.SIGUSR1)
    line = job.expect("refused")
    why = "owned by uid" if made_by == "mallory" else "writable by group or others"
    assert why in line
    after = (home / "model.ckpt").stat()
    assert (home / "model.ckpt").read_bytes() == b"weights"
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)
    assert not (shared / str(victim.uid) / f"{pid}.ack").exists()


def test_a_link_at_the_temporary_name_in_the_jobs_own_directory_is_not_followed(
    local_users: LocalUsers, spool_root: Path, jobs: list[Lines]
) -> None:
    victim = local_users.victim
    root_fd = spool.open_root(spool_root)
    os.close(spool.user_dir(root_fd, spool_root, victim.uid))
    os.close(root_fd)
    own = spool_root / str(victim.uid)
    precious = own / "model.ckpt"
    precious.write_bytes(b"weights")
    job = start_job(victim, spool_root, jobs)
    pid = job.proc.pid
    (own / f".{pid}.ack.{pid}.tmp").symlink_to(precious)  # however it got there
    os.kill(pid, signal.SIGUSR1)
    assert job.expect("acked").endswith(f"{own}/{pid}.ack")
    assert precious.read_bytes() == b"weights"
    assert json.loads((own / f"{pid}.ack").read_text())["detail"] == "saved"


def test_an_ack_of_65000_brackets_fails_that_target_only(
    local_users: LocalUsers, spool_root: Path, jobs: list[Lines]
) -> None:
    victim = local_users.victim
    bomb = start_job(victim, spool_root, jobs, mode="deep")
    fine = start_job(victim, spool_root, jobs, mode="ack")
    targets = [target_for(j.proc.pid, checkpoint_signal="SIGUSR1") for j in (bomb, fine)]
    outcome = checkpoint.execute(
        intent("checkpoint", *targets, params=CheckpointParams(wait=20)),
        real(ack_spool=spool_root),
    )
    assert [(t.pid, t.state) for t in outcome.targets] == [
        (bomb.proc.pid, "rejected"),
        (fine.proc.pid, "acknowledged"),
    ]
    assert "nested deeper than 8 levels" in outcome.targets[0].detail
    assert not outcome.ok
