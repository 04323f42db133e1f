"""Real user accounts for tests that need a job owned by someone other than root (we run as
root): created with ``useradd`` for the session and removed with ``userdel`` afterwards."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator

import pytest

CAN_CREATE = os.geteuid() == 0 and shutil.which("useradd") is not None

needs_users = pytest.mark.skipif(not CAN_CREATE, reason="needs root and useradd")


@contextlib.contextmanager
def temporary_user(prefix: str = "gwjob") -> Iterator[str]:
    """A new user without a home or a login shell; removed however the block ends."""
    name = f"{prefix}{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


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
