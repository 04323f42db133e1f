"""Real users for the tests that play an attacker: created with useradd, removed afterwards.

gpuwarden's trust boundaries are about what another user can and cannot forge, so those tests
run real processes as real unprivileged users. We are root in CI; elsewhere they are skipped.
Names carry this process's PID, so runs in parallel on one machine never share a user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class SystemUser:
    name: str
    uid: int
    gid: int


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
def created_users(*roles: str) -> Iterator[dict[str, SystemUser]]:
    """One user per role (``gwt<pid><role>``, no home, no login shell), removed on exit."""
    made: dict[str, SystemUser] = {}
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
            made[role] = SystemUser(name, entry.pw_uid, entry.pw_gid)
        yield made
    finally:
        for user in made.values():
            _retry(["userdel", user.name])
