"""Protected processes: what the config protects, what is protected whatever it says, and the
reason given (people read it in drills and the journal)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.config import Protected
from gpuwarden.engine.protect import ProtectedMatcher
from gpuwarden.model import ProcessInfo

# Nothing protected beyond what always is.
BARE = Protected(root=False, users=(), names=())


def info(pid: int = 4242, **fields: Any) -> ProcessInfo:
    values: dict[str, Any] = {
        "name": "python3",
        "cmdline": ("python3", "train.py"),
        "user": "alice",
        "uid": 1000,
    }
    values.update(fields)
    return ProcessInfo(pid=pid, **values)


CASES: list[tuple[str, Protected, ProcessInfo, str | None]] = [
    ("an ordinary job", Protected(), info(), None),
    ("pid 1", BARE, info(1), "pid 1 is part of the kernel or init"),
    ("pid 2", BARE, info(2), "pid 2 is part of the kernel or init"),
    ("pid 0", BARE, info(0), "pid 0 is part of the kernel or init"),
    ("pid 3", BARE, info(3), None),
    ("the daemon itself", BARE, info(777), "gpuwarden itself"),
    ("a listed pid", Protected(pids=(4242,)), info(), "pid 4242 is listed in protected.pids"),
    ("root by uid", Protected(), info(uid=0, user="svc"), "owned by root (protected.root)"),
    ("root by name", Protected(), info(uid=None, user="root"), "user root is protected"),
    ("root allowed", Protected(root=False, users=()), info(uid=0, user="root"), None),
    ("a listed user", Protected(users=("bob",)), info(user="bob"), "user bob is protected"),
    ("a user not listed", Protected(users=("bob",)), info(user="bobby"), None),
    (
        "a protected name",
        Protected(),
        info(name="nvidia-persistenced", cmdline=None),
        "nvidia-persistenced is a protected process name",
    ),
    (
        "a protected program by its command's base name",
        Protected(),
        info(name="X", cmdline=("/usr/lib/xorg/Xorg", ":0")),
        "Xorg is a protected process name",
    ),
    ("names match whole", Protected(), info(name="sshd-helper", cmdline=("sshd-helper",)), None),
    ("names are case-sensitive", Protected(), info(name="xorg", cmdline=("xorg",)), None),
    (
        "a command-line pattern anywhere in the command",
        Protected(cmdline=(r"--role=(ps|chief)\b",)),
        info(cmdline=("python3", "worker.py", "--role=chief")),
        "command line matches protected pattern '--role=(ps|chief)\\\\b'",
    ),
    (
        "a command-line pattern that does not match",
        Protected(cmdline=(r"--role=(ps|chief)\b",)),
        info(cmdline=("python3", "worker.py", "--role=chiefly")),
        None,
    ),
    (
        "a unit pattern matches the whole unit",
        Protected(units=(r"jupyter@.*\.service",)),
        info(systemd_unit="jupyter@alice.service"),
        "unit jupyter@alice.service matches protected pattern 'jupyter@.*\\\\.service'",
    ),
    (
        "a unit pattern does not match a part",
        Protected(units=(r"jupyter",)),
        info(systemd_unit="jupyter@alice.service"),
        None,
    ),
    (
        "a protected priority class",
        Protected(priorities=("critical",)),
        info(priority="critical"),
        "priority class critical is protected",
    ),
    ("an unprotected priority class", Protected(priorities=("critical",)), info(), None),
    (
        "nothing known about the process",
        Protected(cmdline=("x",), units=("y",)),
        ProcessInfo(pid=4242),
        None,
    ),
]


@pytest.mark.parametrize(
    ("protected", "process", "why"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_why_a_process_is_protected(
    protected: Protected, process: ProcessInfo, why: str | None
) -> None:
    assert ProtectedMatcher(protected, self_pid=777).why(process) == why


def test_the_defaults_protect_root_and_the_gpu_plumbing() -> None:
    matcher = ProtectedMatcher(Protected())
    for name in ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "Xorg", "slurmstepd"):
        assert matcher.why(info(name=name, cmdline=(f"/usr/bin/{name}",))) is not None, name
    assert matcher.why(info(uid=0, user=None)) is not None
    assert matcher.why(info()) is None


def test_without_a_self_pid_only_pid_1_and_2_are_protected_by_number() -> None:
    matcher = ProtectedMatcher(BARE)
    assert [pid for pid in range(6) if matcher.why(info(pid)) is not None] == [0, 1, 2]
