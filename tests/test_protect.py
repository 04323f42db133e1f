"""Protected processes: what the config protects, what is protected whatever it says, and the
reason given (people read it in drills and the journal)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.config import Protected
from gpuwarden.engine.protect import ProtectedMatcher
from gpuwarden.model import ProcessInfo

# Nothing protected beyond what always is.
BARE = Protected(root=False, users=())


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
        "a listed group",
        Protected(groups=("inference",)),
        info(groups=("alice", "inference")),
        "group inference is protected",
    ),
    ("a group not listed", Protected(groups=("inference",)), info(groups=("alice",)), None),
    (
        "an executable by its whole real path",
        Protected(exes=(r"/usr/bin/nvidia-persistenced",)),
        info(exe="/usr/bin/nvidia-persistenced"),
        "executable /usr/bin/nvidia-persistenced matches protected pattern "
        "'/usr/bin/nvidia-persistenced'",
    ),
    (
        "an executable pattern does not match a part",
        Protected(exes=(r"/usr/bin/nvidia-persistenced",)),
        info(exe="/home/alice/usr/bin/nvidia-persistenced"),
        None,
    ),
    (
        "a name never protects (exec -a sshd)",
        Protected(),
        info(name="sshd", cmdline=("sshd", "-D"), exe="/usr/bin/python3.11"),
        None,
    ),
    (
        "a unit pattern matches the whole unit of a root-owned cgroup",
        Protected(units=(r"jupyter@.*\.service",)),
        info(systemd_unit="jupyter@alice.service", cgroup_trusted=True),
        "unit jupyter@alice.service matches protected pattern 'jupyter@.*\\\\.service'",
    ),
    (
        "a unit in a cgroup its owner made does not protect",
        Protected(units=(r"triton\.service",)),
        info(systemd_unit="triton.service", cgroup_trusted=False),
        None,
    ),
    (
        "a unit pattern does not match a part",
        Protected(units=(r"jupyter",)),
        info(systemd_unit="jupyter@alice.service", cgroup_trusted=True),
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
        Protected(exes=("x",), units=("y",), groups=("z",)),
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


def test_the_defaults_protect_root_and_nothing_a_user_can_name() -> None:
    matcher = ProtectedMatcher(Protected())
    assert matcher.why(info(uid=0, user=None)) is not None
    for name in ("nvidia-persistenced", "sshd", "Xorg", "slurmstepd"):
        renamed = info(name=name, cmdline=(f"/usr/bin/{name}",), exe="/usr/bin/python3")
        assert matcher.why(renamed) is None, name
    assert matcher.why(info()) is None


@pytest.mark.parametrize("key", ["names", "cmdline"])
def test_names_and_command_lines_are_refused_with_what_to_use(key: str) -> None:
    with pytest.raises(ValueError, match="cannot protect: the process's owner chooses them"):
        Protected.model_validate({key: ["sshd"]})
    assert Protected.model_validate({key: []}).root  # an empty list is accepted


def test_without_a_self_pid_only_pid_1_and_2_are_protected_by_number() -> None:
    matcher = ProtectedMatcher(BARE)
    assert [pid for pid in range(6) if matcher.why(info(pid)) is not None] == [0, 1, 2]
