"""Whether a path can be trusted: nobody but its trusted owners can change what it leads to.

gpuwarden runs as root and acts on what its config, its playbooks and its acknowledgement spool
say, so whoever can write any of them, or any directory above them, controls what it does. The
rule is OpenSSH's ``StrictModes``, applied to every component of the path from ``/`` down:

- each component is owned by a trusted user (root, or the user gpuwarden runs as; for the
  spool's per-user directory, that user);
- no component is writable by group or others; except a root-owned directory with the sticky
  bit (``/tmp``), in which nobody can rename or remove an entry they do not own, so the next
  component (checked in turn) cannot be replaced.

``path_problems`` (and ``unsafe``, for several) checks a path by name (the config and the
playbooks, at start and at each reload):
the path as written, with each symbolic link's own owner, and the path it resolves to.
``open_directory`` walks a directory one component at a time with ``openat`` and ``O_NOFOLLOW``
and returns a descriptor of the directory it checked (the spool), so that nothing can be
swapped between the check and the use. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Unsafe:
    """One component that others could change, and what to do about it."""

    path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path} is {self.problem}"


def trusted_owners() -> frozenset[int]:
    """Root and the user this process runs as."""
    return frozenset({0, os.geteuid()})


def user_name(uid: int) -> str:
    """``uid 1001 (mallory)``, or ``uid 1001`` when the uid has no name."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _owners(trusted: frozenset[int]) -> str:
    names = [user_name(uid) for uid in sorted(trusted)]
    return " or ".join(names)


def problem(shown: str, st: os.stat_result, trusted: frozenset[int]) -> Unsafe | None:
    """What is wrong with one component (its ``stat``), or None."""
    mode = st.st_mode
    if st.st_uid not in trusted:
        return Unsafe(
            shown,
            f"owned by {user_name(st.st_uid)}, not by {_owners(trusted)}",
            f"chown root {shown} (after checking who put it there and why)",
        )
    if stat.S_ISLNK(mode):
        return None  # a link's own mode means nothing; where it leads is checked on its own
    if mode & 0o022 and not (stat.S_ISDIR(mode) and mode & stat.S_ISVTX and st.st_uid == 0):
        return Unsafe(
            shown,
            f"writable by group or others (mode {stat.filemode(mode)})",
            f"chmod go-w {shown}",
        )
    return None


def _prefixes(path: str) -> list[str]:
    """``/a/b/c`` → ``/``, ``/a``, ``/a/b``, ``/a/b/c``."""
    parts = [p for p in path.split("/") if p]
    return ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def path_problems(path: str | Path, trusted: frozenset[int] | None = None) -> list[Unsafe]:
    """Every component of ``path`` that others could change (see the module's docstring).

    The path as written is checked with ``lstat`` (a symbolic link counts with its own owner)
    and the path it resolves to with ``stat``. A component that does not exist is left out:
    whoever reads the path reports that."""
    owners = trusted if trusted is not None else trusted_owners()
    written = os.path.abspath(path)
    resolved = os.path.realpath(written)
    found: dict[str, Unsafe] = {}
    for shown, follow in [(p, False) for p in _prefixes(written)] + [
        (p, True) for p in _prefixes(resolved)
    ]:
        if shown in found:
            continue
        try:
            st = os.stat(shown) if follow else os.lstat(shown)
        except OSError:
            continue
        bad = problem(shown, st, owners)
        if bad is not None:
            found[shown] = bad
    return list(found.values())


def unsafe(paths: list[Path], trusted: frozenset[int] | None = None) -> list[Unsafe]:
    """``path_problems`` of several paths, each component reported once (a directory shared
    by every playbook is named once)."""
    found: dict[str, Unsafe] = {}
    for path in paths:
        for bad in path_problems(path, trusted):
            found.setdefault(bad.path, bad)
    return list(found.values())


class UnsafePath(OSError):
    """A directory that may not be used; the message says which component and why."""

    def __init__(self, unsafe: Unsafe | None, message: str | None = None) -> None:
        self.unsafe = unsafe
        super().__init__(message or str(unsafe))


def open_directory(
    path: str | Path,
    trusted: frozenset[int] | None = None,
    *,
    create_mode: int | None = None,
) -> int:
    """A descriptor of the directory ``path``, reached from ``/`` one component at a time
    without following a symbolic link, each component checked (see the module's docstring).

    With ``create_mode``, missing components are created with that mode (owned by this
    process's user). Raises ``UnsafePath`` for a component that fails the checks, a symbolic
    link or something not a directory; ``OSError`` for a missing one (without ``create_mode``)
    or another failure. The caller closes the descriptor."""
    owners = trusted if trusted is not None else trusted_owners()
    absolute = os.path.abspath(path)
    fd = os.open("/", _DIR_FLAGS)
    try:
        bad = problem("/", os.fstat(fd), owners)
        if bad is not None:
            raise UnsafePath(bad)
        shown = ""
        for name in [p for p in absolute.split("/") if p]:
            shown += "/" + name
            fd = _step(fd, name, shown, owners, create_mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return fd


def _step(
    parent: int, name: str, shown: str, owners: frozenset[int], create_mode: int | None
) -> int:
    """Open ``name`` under ``parent`` (closing ``parent``) and check it."""
    try:
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if create_mode is None:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, create_mode, dir_fd=parent)
            child = os.open(name, _DIR_FLAGS, dir_fd=parent)
            if os.fstat(child).st_uid == os.geteuid():
                os.fchmod(child, create_mode)  # mkdir's mode went through the umask
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                try:
                    link = stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode)
                except OSError:
                    link = False
                what = "a symbolic link" if link else "not a directory"
                raise UnsafePath(
                    None, f"{shown} is {what}: give the directory's real path"
                ) from None
            raise
    finally:
        os.close(parent)
    try:
        bad = problem(shown, os.fstat(child), owners)
    except OSError:
        os.close(child)
        raise
    if bad is not None:
        os.close(child)
        raise UnsafePath(bad)
    return child
