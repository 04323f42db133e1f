"""Real users of this machine for the tests that try what a hostile user would: created with
``useradd`` (the tests run as root in CI), their processes started with their uid, and all of
it removed at the end (``conftest.local_users``)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import textwrap
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

    def python(self, code: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """``code`` (dedented) in a Python this user can run, with gpuwarden.job importable."""
        return self.popen(
            [LocalUsers.interpreter(), "-c", textwrap.dedent(code)],
            {"PYTHONPATH": str(PACKAGE_ROOT), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
        )


@dataclass(frozen=True)
class LocalUsers:
    victim: User  # owns the job gpuwarden acts on
    mallory: User  # another user of the machine, who tries to interfere

    @staticmethod
    def create(suffix: str) -> LocalUsers:
        made = []
        for role in ("gwvictim", "gwmallory"):
            name = f"{role}{suffix}"
            subprocess.run(
                ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "-U", name],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(name)
            made.append(User(name, entry.pw_uid, entry.pw_gid))
        return LocalUsers(made[0], made[1])

    def remove(self) -> None:
        uids = {self.victim.uid, self.mallory.uid}
        for proc in psutil.process_iter(["uids"]):
            with contextlib.suppress(psutil.Error):
                if proc.info["uids"] is not None and proc.info["uids"].real in uids:
                    proc.send_signal(signal.SIGKILL)  # started by these tests, as these users
        for user in (self.victim, self.mallory):
            subprocess.run(["userdel", user.name], check=False, capture_output=True)

    @staticmethod
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
