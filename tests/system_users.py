"""Real users for the tests that play an attacker or need a job owned by someone else: created
with useradd once per session (``conftest.session_users``), removed afterwards with whatever
processes the tests left running as them.

gpuwarden's trust boundaries are about what another user can and cannot forge, so those tests
run real processes as real unprivileged users. We are root in CI; elsewhere they are skipped.
Names carry this process's PID, so runs in parallel on one machine never share a user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "daemon"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def popen(
        self, argv: list[str], env: dict[str, str] | None = None, **kw: object
    ) -> subprocess.Popen[str]:
        """Start ``argv`` as this user (no supplementary groups), stdout piped as text."""
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            argv,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd="/",
            **kw,
        )

    def run(self, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as this user to its end."""
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            argv,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            capture_output=True,
            text=True,
            cwd="/",
            timeout=30,
            check=False,
            **kw,
        )

    def python(
        self, code: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """``code`` (dedented) in a Python this user can run, with gpuwarden.job importable."""
        return self.popen(
            [interpreter(), "-c", textwrap.dedent(code), *args],
            {"PYTHONPATH": str(PACKAGE_ROOT), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
        )


def unavailable() -> str | None:
    """Why users cannot be created here, or None."""
    if os.geteuid() != 0:
        return "needs root to create users"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "needs useradd and userdel"
    return None


def _retry(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """useradd and userdel lock /etc/passwd; another run may hold the lock for a moment."""
    for _attempt in range(20):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode == 0 or "lock" not in done.stderr.lower():
            return done
        time.sleep(0.25)
    return done


@contextlib.contextmanager
def created_users(*roles: str) -> Iterator[dict[str, User]]:
    """One user per role (``gwt<pid><role>``, no home, no login shell, its own group). On
    exit every process still running as one of them is killed and the users are removed."""
    made: dict[str, User] = {}
    try:
        for role in roles:
            name = f"gwt{os.getpid()}{role}"[:32]
            done = _retry(
                [
                    "useradd",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    "--user-group",
                    name,
                ]
            )
            if done.returncode != 0:
                raise RuntimeError(f"useradd {name} failed: {done.stderr.strip()}")
            entry = pwd.getpwnam(name)
            made[role] = User(name, entry.pw_uid, entry.pw_gid)
        yield made
    finally:
        uids = {user.uid for user in made.values()}
        for proc in psutil.process_iter(["uids"]):
            with contextlib.suppress(psutil.Error):
                if proc.info["uids"] is not None and proc.info["uids"].real in uids:
                    proc.send_signal(signal.SIGKILL)  # started by the tests, as these users
        for user in made.values():
            _retry(["userdel", user.name])


def interpreter() -> str:
    """A Python 3.11+ every user can run (the tests' own may live under /root)."""
    for candidate in (
        os.path.realpath(sys.executable),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ):
        path = Path(candidate)
        if path.exists() and _world_reachable(path):
            return str(path)
    found = shutil.which("python3")
    if found and _world_reachable(Path(found)):
        return found
    raise RuntimeError("no Python interpreter that other users may run")


def _world_reachable(path: Path) -> bool:
    """Every directory above ``path`` can be searched, and the file run, by anyone."""
    real = Path(os.path.realpath(path))
    if not os.stat(real).st_mode & 0o001:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in real.parents)


def run_as(scenario_text: str, users: dict[str, str]) -> str:
    """A scenario's text with each spawned job in ``users`` (job id -> user) run as that
    user (``run_as:``)."""
    out = []
    job = None
    for line in scenario_text.splitlines(keepends=True):
        if line.startswith("  - id: "):
            job = line.split(":", 1)[1].strip()
        out.append(line)
        if line == "    spawn: true\n" and job in users:
            out.append(f"    run_as: {users[job]}\n")
    return "".join(out)
