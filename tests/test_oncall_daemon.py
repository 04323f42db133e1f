"""The on-call commands against a real `gpuwarden run`, used by a real non-root operator.

The daemon runs as root over a scenario with real stand-in jobs, with ``operators.group``
set. A user made by the test, in that group, reads the open incident and what comes next
from the group-readable journal, holds the ladder, releases it, aborts the incident (the
suspended job is resumed) and silences the host, all through the daemon's control socket;
another user is refused, whether or not the socket lets it in. Users and the group are
removed afterwards.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.local_users import LocalUsers
from tests.notify_receivers import JsonReceiver
from tests.system_users import PACKAGE_ROOT, User, interpreter
from tests.test_oncall import SCENARIO, proc_state

ROOT = Path(__file__).resolve().parent.parent

PLAYBOOK = """rules:
  - name: squeeze
    for_each: gpu
    when: gpu.memory.used_pct >= 95
    until: gpu.memory.used_pct < 10
    severity: critical
    steps:
      - notify: oncall
      - after: 10s
        suspend: {select: process.priority <= low}
      - after: 1h
        kill: {select: process.priority <= low, grace: 1s, settle: 0s}
"""


def until(what: str, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


@dataclass
class Operators:
    group: str
    gid: int
    operator: User


@pytest.fixture
def operators() -> Iterator[Operators]:
    if os.geteuid() != 0 or shutil.which("groupadd") is None:
        pytest.skip("needs root, groupadd and useradd")
    suffix = str(os.getpid() % 1_000_000)
    group, name = f"gwops{suffix}", f"gwop{suffix}"
    subprocess.run(["groupadd", group], check=True, capture_output=True)
    try:
        subprocess.run(
            [
                "useradd",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "-U",
                "-G",
                group,
                name,
            ],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(name)
        yield Operators(group, grp.getgrnam(group).gr_gid, User(name, entry.pw_uid, entry.pw_gid))
    finally:
        for proc in psutil.process_iter(["uids"]):
            with contextlib.suppress(psutil.Error):
                uids = proc.info["uids"]
                if uids is not None and uids.real == pwd.getpwnam(name).pw_uid:
                    proc.kill()  # started by this test, as this user
        subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", group], check=False, capture_output=True)


@pytest.fixture
def base() -> Iterator[Path]:
    """A root-owned directory others may enter (the test's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="gpuwarden-oncall-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def others_may_enter(path: Path) -> bool:
    real = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & 0o001 for p in (real, *real.parents))


@pytest.fixture(scope="module")
def pythonpath() -> str:
    """What another user's Python needs to import gpuwarden and its dependencies."""
    packages = Path(sysconfig.get_paths()["purelib"])
    if not (others_may_enter(packages) and others_may_enter(PACKAGE_ROOT)):
        pytest.skip(f"other users cannot read {packages} or {PACKAGE_ROOT}")
    return f"{PACKAGE_ROOT}:{packages}"


def as_user(
    user: User, *argv: str, groups: list[int], cwd: Path, pythonpath: str
) -> subprocess.CompletedProcess[str]:
    """``gpuwarden ARGV`` run by ``user`` with the supplementary ``groups`` a login gives."""
    return subprocess.run(
        [interpreter(), "-m", "gpuwarden", *argv],
        user=user.uid,
        group=user.gid,
        extra_groups=groups,
        env={
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": pythonpath,
        },
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def rows(journal: Path, query: str, *args: object) -> list[tuple[Any, ...]]:
    try:
        conn = sqlite3.connect(f"{journal.as_uri()}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error:
        return []
    try:
        return list(conn.execute(query, args))
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def test_a_non_root_operator_holds_releases_aborts_and_silences_a_running_daemon(
    base: Path, operators: Operators, local_users: LocalUsers, pythonpath: str
) -> None:
    receiver = JsonReceiver().start()
    (base / "playbooks").mkdir(mode=0o755)
    (base / "playbooks" / "squeeze.yaml").write_text(PLAYBOOK)
    (base / "scenario.yaml").write_text(SCENARIO)
    sock = base / "control.sock"
    config = base / "gpuwarden.yaml"
    config.write_text(
        "host: test-node\ntick: 200ms\ntimezone: UTC\n"
        f"playbooks: {base / 'playbooks'}\nstate_dir: {base / 'state'}\n"
        "protected: {root: false, users: []}\n"
        "notify:\n  group_wait: 0s\n  group_interval: 1s\n"
        f"  targets:\n    oncall:\n      urls: ['{receiver.url('oncall')}']\n"
        f"operators: {{group: {operators.group}, socket: {sock}}}\n"
    )
    for path in base.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    journal = base / "state" / "journal.db"
    log = base / "daemon.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwarden",
                "run",
                "--config",
                str(config),
                "--source",
                f"scenario:{base / 'scenario.yaml'}",
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    op = operators.operator
    ops = [operators.gid]
    try:
        until(
            "the daemon wrote the incident's next step",
            lambda: bool(rows(journal, "SELECT 1 FROM next_steps")),
        )
        (incident,) = (r[0] for r in rows(journal, "SELECT id FROM incidents"))
        sweep = next(
            p
            for p in psutil.Process(daemon.pid).children(recursive=True)
            if "sweep.py" in " ".join(p.cmdline())
        )

        # The journal is the group's to read, and no one else's; the socket the group's.
        for path, mode in ((base / "state", 0o750), (journal, 0o640)):
            info = path.stat()
            assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (
                mode,
                0,
                operators.gid,
            ), path
        info = sock.stat()
        assert stat.S_ISSOCK(info.st_mode)
        assert (stat.S_IMODE(info.st_mode), info.st_gid) == (0o660, operators.gid)

        seen = as_user(
            op,
            "incidents",
            "--open",
            "--config",
            str(config),
            groups=ops,
            cwd=base,
            pythonpath=pythonpath,
        )
        assert seen.returncode == 0, seen.stderr
        assert f"{incident}\n  next: suspend at +0:10 (in " in seen.stdout
        assert f"would target pid {sweep.pid} (root, low, 29.3 GiB)" in seen.stdout

        held = as_user(
            op,
            "hold",
            "last",
            "--reason",
            "asking bob",
            "--config",
            str(config),
            groups=ops,
            cwd=base,
            pythonpath=pythonpath,
        )
        assert held.returncode == 0, held.stderr
        assert f"{incident} on hold until released" in held.stdout
        (by,) = (r[0] for r in rows(journal, "SELECT by FROM holds"))
        assert op.name in by  # the kernel's word for who asked, whatever --by said
        until(
            "the suspend came due and waits",
            lambda: bool(
                rows(journal, "SELECT 1 FROM records WHERE kind = 'waiting' AND reason = 'held'")
            ),
        )
        assert rows(journal, "SELECT 1 FROM intents WHERE kind = 'suspend'") == []
        assert proc_state(sweep.pid) != "T"

        released = as_user(
            op,
            "release",
            "last",
            "--config",
            str(config),
            groups=ops,
            cwd=base,
            pythonpath=pythonpath,
        )
        assert released.returncode == 0, released.stderr
        until("the suspend ran", lambda: proc_state(sweep.pid) == "T")

        aborted = as_user(
            op,
            "abort",
            "last",
            "--reason",
            "bob is on it",
            "--config",
            str(config),
            groups=ops,
            cwd=base,
            pythonpath=pythonpath,
        )
        assert aborted.returncode == 0, aborted.stderr
        assert f"  resume pid {sweep.pid}" in aborted.stdout
        until(
            "the incident ended",
            lambda: rows(journal, "SELECT resolve_reason FROM incidents") == [("aborted",)],
        )
        until("the job was resumed", lambda: proc_state(sweep.pid) != "T")

        silenced = as_user(
            op,
            "silence",
            "--host",
            "--for",
            "1h",
            "--reason",
            "driver update",
            "--config",
            str(config),
            groups=ops,
            cwd=base,
            pythonpath=pythonpath,
        )
        assert silenced.returncode == 0, silenced.stderr
        listed = as_user(
            op,
            "silence",
            "--list",
            "--config",
            str(config),
            groups=ops,
            cwd=base,
            pythonpath=pythonpath,
        )
        assert "#1  host" in listed.stdout
        assert "driver update" in listed.stdout

        # Someone else: the socket does not let them in; and let in, the daemon refuses.
        mallory = local_users.mallory
        shut = as_user(
            mallory,
            "ack",
            "last",
            "--config",
            str(config),
            groups=[],
            cwd=base,
            pythonpath=pythonpath,
        )
        assert shut.returncode == 1
        assert f"no permission to use {sock}" in shut.stderr
        refused = as_user(
            mallory,
            "ack",
            "last",
            "--config",
            str(config),
            groups=ops,
            cwd=base,
            pythonpath=pythonpath,
        )
        assert refused.returncode == 1
        assert f"uid {mallory.uid} is not in group {operators.group}" in refused.stderr
        assert rows(journal, "SELECT acked_at FROM incidents") == [(None,)]
        unread = as_user(
            mallory,
            "incidents",
            "--config",
            str(config),
            groups=[],
            cwd=base,
            pythonpath=pythonpath,
        )
        assert unread.returncode == 1
        assert f"cannot read the journal {journal}: permission denied" in unread.stderr
        for done in (seen, held, released, aborted, silenced, listed, shut, refused, unread):
            assert "Traceback" not in done.stderr
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        receiver.stop()
    assert daemon.returncode == 0, log.read_text()
    assert not sock.exists()
    text = log.read_text()
    assert f"incident {incident}: aborted by " in text
