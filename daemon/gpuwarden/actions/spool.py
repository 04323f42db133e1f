"""The acknowledgement spool: where jobs answer checkpoint requests, and how answers are read.

Layout, like the spools of at and cron::

    /run/gpuwarden/ack/            root, 0755 (the config's ack_spool)
        1000/                      uid 1000, 0700, created by gpuwarden when it first asks
            4242.ack               the answer of PID 4242 of uid 1000
            7-pidns4026532481.ack  PID 7 of a container's PID namespace

The spool is reached from ``/`` one component at a time, never through a symbolic link, each
component owned by root (or the daemon's user) and writable by nobody else (see
``gpuwarden.pathsafety``). A user's directory is created on demand, owned by that user and mode
0700; an existing one is used only while it is a real directory owned by that user and
writable by nobody else. An answer counts only if it is a regular file, reached without a link,
owned by the job's uid and writable by nobody else, at most ``MAX_ACK_BYTES`` long and nested
at most ``MAX_ACK_DEPTH`` deep; anything else fails that one target with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.pathsafety import UnsafePath, open_directory, user_name

MAX_ACK_BYTES = 64 * 1024
MAX_ACK_DEPTH = 8
ROOT_MODE = 0o755
USER_MODE = 0o700
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


class SpoolError(Exception):
    """The spool, or a user's directory in it, cannot be used; the message says why."""


@dataclass(frozen=True)
class Answer:
    """What reading an acknowledgement found: ``state`` is ``none`` (nothing yet), ``ok``
    (``detail`` is the job's own words) or ``rejected`` (``detail`` says why)."""

    state: str
    detail: str = ""


NOTHING = Answer("none")


def open_root(root: Path) -> int:
    """A descriptor of the spool, created (0755) if it is missing. Raises SpoolError."""
    if not root.is_absolute():
        raise SpoolError(f"ack_spool {root} is not an absolute path")
    try:
        return open_directory(root, create_mode=ROOT_MODE)
    except UnsafePath as exc:
        raise SpoolError(f"the acknowledgement spool cannot be trusted: {exc}") from None
    except OSError as exc:
        raise SpoolError(f"the acknowledgement spool {root}: {exc.strerror or exc}") from None


def _checked(fd: int, shown: str, uid: int) -> str | None:
    """Why a user's directory may not be used, or None."""
    st = os.fstat(fd)
    if st.st_uid != uid:
        return f"{shown} is owned by {user_name(st.st_uid)}, not by {user_name(uid)}"
    if st.st_mode & 0o022:
        return f"{shown} is writable by group or others (mode {stat.filemode(st.st_mode)})"
    return None


def _hand_over(fd: int, uid: int) -> None:
    """A directory this daemon has just made becomes ``uid``'s, mode 0700."""
    try:
        if uid != os.geteuid():
            os.fchown(fd, uid, -1)
        os.fchmod(fd, USER_MODE)  # mkdir's mode went through the umask
    except OSError:
        os.close(fd)
        raise


def user_dir(root_fd: int, root: Path, uid: int) -> int:
    """A descriptor of ``<root>/<uid>``, created (owned by ``uid``, 0700) if it is missing.
    Raises SpoolError when it is a link, not a directory, another user's, or writable by
    others: nothing is read from or removed in such a directory."""
    name = str(uid)
    shown = str(root / name)
    try:
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
        except FileNotFoundError:
            made = True
            try:
                os.mkdir(name, USER_MODE, dir_fd=root_fd)
            except FileExistsError:
                made = False  # made meanwhile by another step: checked like any other
            fd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
            if made:
                try:
                    _hand_over(fd, uid)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.rmdir(name, dir_fd=root_fd)
                    raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SpoolError(f"{shown} is a symbolic link or not a directory") from None
        raise SpoolError(f"cannot prepare {shown}: {exc.strerror or exc}") from None
    why = _checked(fd, shown, uid)
    if why is not None:
        os.close(fd)
        raise SpoolError(why + ": refusing it (remove it; gpuwarden creates it again)")
    return fd


def clear(dir_fd: int, name: str) -> None:
    """Remove an old answer (or whatever else has the name). Raises SpoolError."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except IsADirectoryError:
        raise SpoolError(f"{name} in the spool is a directory") from None
    except OSError as exc:
        raise SpoolError(f"cannot remove the old {name}: {exc.strerror or exc}") from None


def nesting(data: bytes, limit: int) -> int:
    """How deep ``[``/``{`` nest in JSON text (strings skipped); stops counting past ``limit``."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def parse(data: bytes, pid: int) -> Answer:
    """An acknowledgement's content: its ``detail``; rejected when nested too deep. Text that
    is not JSON still counts (the file is the answer); JSON naming another ``pid`` does not."""
    if nesting(data, MAX_ACK_DEPTH) > MAX_ACK_DEPTH:
        return Answer("rejected", f"nested deeper than {MAX_ACK_DEPTH} levels: not read")
    try:
        record = json.loads(data.decode("utf-8", errors="replace"))
    except ValueError:
        return Answer("ok")  # an acknowledgement in a format of its own
    if not isinstance(record, dict):
        return Answer("ok")
    if record.get("pid") not in (None, pid):
        return NOTHING  # written by another process of the user: not this job's answer
    detail = record.get("detail")
    return Answer("ok", str(detail) if detail else "")


def read(dir_fd: int, shown: str, name: str, uid: int, pid: int) -> Answer:
    """The answer in ``name`` of the user directory ``dir_fd`` (``shown``: its path), if any.

    The directory is checked again first (its owner may have made it writable since)."""
    why = _checked(dir_fd, shown, uid)
    if why is not None:
        return Answer("rejected", why)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return NOTHING
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return Answer("rejected", f"{shown}/{name} is a symbolic link")
        return Answer("rejected", f"cannot read {shown}/{name}: {exc.strerror or exc}")
    try:
        st = os.fstat(fd)
        path = f"{shown}/{name}"
        if not stat.S_ISREG(st.st_mode):
            return Answer("rejected", f"{path} is not a regular file")
        if st.st_uid != uid:
            return Answer(
                "rejected",
                f"{path} is owned by {user_name(st.st_uid)}, not by the job's "
                f"{user_name(uid)}: a forged acknowledgement",
            )
        if st.st_mode & 0o022:
            return Answer(
                "rejected", f"{path} is writable by group or others ({stat.filemode(st.st_mode)})"
            )
        if st.st_size > MAX_ACK_BYTES:
            return Answer("rejected", f"{path} is larger than {MAX_ACK_BYTES} bytes: not read")
        data = os.read(fd, MAX_ACK_BYTES + 1)
    except OSError as exc:
        return Answer("rejected", f"cannot read {shown}/{name}: {exc.strerror or exc}")
    finally:
        os.close(fd)
    if len(data) > MAX_ACK_BYTES:
        return Answer("rejected", f"{shown}/{name} is larger than {MAX_ACK_BYTES} bytes: not read")
    return parse(data, pid)
