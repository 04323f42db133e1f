"""``exec``: run a command the playbook names, with the incident's facts in its environment.

(The module is ``exec_`` because ``exec`` is a Python builtin; the registry maps the step kind
``exec`` here.)

The command is an argv list run without a shell, in its own session and process group, with
stdin from /dev/null. It runs as the config's ``exec.user`` (``nobody`` by default; its group
``exec.group`` or the user's own, and the user's supplementary groups), from ``/``: the change
of user leaves it no capability, and it starts with ``no_new_privs`` set, so no setuid program
or file capability gives any back. A step that must run as root says ``as_root: true``. The
user is looked up when the step runs; an unknown one fails the step with the reason. Its
environment is built from scratch, so nothing of the daemon's own environment (tokens, cloud
keys) leaks into it:

1. ``PATH`` (the daemon's, else a standard one) and ``LANG`` (the daemon's, else
   ``C.UTF-8``), so the command reads and writes text as the daemon does;
2. the step's ``env``;
3. the incident's facts as ``GPUWARDEN_*`` variables: every ``ctx.facts`` key upper-cased with
   anything but letters, digits and ``_`` turned into ``_``, then ``GPUWARDEN_INCIDENT``,
   ``GPUWARDEN_RULE``, ``GPUWARDEN_SEVERITY``, ``GPUWARDEN_HOST``, ``GPUWARDEN_GPU``,
   ``GPUWARDEN_SCOPE`` (as people read it: ``GPU 1``), ``GPUWARDEN_STEP`` and
   ``GPUWARDEN_TARGET_PIDS`` (space-separated, for ``for pid in $GPUWARDEN_TARGET_PIDS``) from
   the intent. Later layers win; a fact the intent does not know (no GPU, no targets) is left
   out rather than set to a made-up value.

Facts are data: a process name such as ``$(touch /tmp/x)`` reaches the command byte for byte
as the value of a variable and is never part of its argv or seen by a shell. NUL bytes, which
an environment cannot carry, are dropped, and each fact is cut at ``MAX_FACT_BYTES``.

stdout and stderr are captured together; the first ``MAX_OUTPUT_BYTES`` go into the outcome's
detail, control characters other than newline and tab shown escaped (``\\x1b``). A command that
runs past ``timeout`` (or is still running when the daemon stops) has its whole process group
sent SIGTERM, then SIGKILL ``KILL_GRACE_S`` later. A command that exits while something it
started keeps the output open is waited for until the same deadline.
"""

from __future__ import annotations

import contextlib
import ctypes
import grp
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from gpuwarden.actions.base import Context, log_action
from gpuwarden.model import Intent, Outcome
from gpuwarden.playbook.schema import ExecParams

MAX_OUTPUT_BYTES = 4096
MAX_FACT_BYTES = 32 * 1024
KILL_GRACE_S = 2.0
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_LANG = "C.UTF-8"
TRUNCATED = "…[truncated]"

PR_SET_NO_NEW_PRIVS = 38  # linux/prctl.h
_POLL_S = 0.05
_NOT_NAME = re.compile(r"[^A-Z0-9_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def fact_variable(key: str) -> str | None:
    """The environment variable a fact is passed in: ``gpu.memory`` → ``GPUWARDEN_GPU_MEMORY``.

    ``None`` for a key with nothing usable in it."""
    name = _NOT_NAME.sub("_", key.strip().upper()).strip("_")
    name = name.removeprefix("GPUWARDEN_")
    return f"GPUWARDEN_{name}" if name else None


def _fact_value(value: object) -> str:
    text = str(value).replace("\x00", "")
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_FACT_BYTES:
        text = raw[:MAX_FACT_BYTES].decode("utf-8", "ignore")
    return text


def environment(
    params: ExecParams, intent: Intent, ctx: Context, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The whole environment the command runs with (see the module's docstring)."""
    source = os.environ if base is None else base
    env = {"PATH": source.get("PATH") or DEFAULT_PATH, "LANG": source.get("LANG") or DEFAULT_LANG}
    env.update(params.env)
    for key, value in ctx.facts.items():
        name = fact_variable(key)
        if name is not None:
            env[name] = _fact_value(value)
    from_intent: dict[str, object | None] = {
        "INCIDENT": intent.incident,
        "RULE": intent.rule,
        "SEVERITY": intent.severity,
        "HOST": ctx.host or None,
        "GPU": intent.gpu,
        "SCOPE": intent.where or intent.scope or None,
        "STEP": intent.step,
        "TARGET_PIDS": " ".join(str(t.pid) for t in intent.targets) or None,
    }
    for key, known in from_intent.items():
        if known is not None:
            env[f"GPUWARDEN_{key}"] = _fact_value(known)
    return env


def printable_output(data: bytes, total: int) -> str:
    """Captured output for the journal: decoded, control characters escaped, marked when cut."""
    text = data.decode("utf-8", "replace")
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    if total > len(data):
        text += f"{TRUNCATED} ({total} bytes in all)"
    return text


class _Capture(threading.Thread):
    """Reads a pipe to its end, keeping the first ``limit`` bytes and counting the rest."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        super().__init__(name="gpuwarden-exec-output", daemon=True)
        self._stream = stream
        self._limit = limit
        self.head = bytearray()
        self.total = 0

    def run(self) -> None:
        fd = self._stream.fileno()
        try:
            while chunk := os.read(fd, 65536):
                self.total += len(chunk)
                room = self._limit - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
        except OSError:
            pass
        finally:
            self._stream.close()

    def text(self) -> str:
        return printable_output(bytes(self.head), self.total)


@dataclass
class _Finished:
    how: str  # "exited" | "timed_out" | "cancelled"
    returncode: int | None


@dataclass(frozen=True)
class RunAs:
    """Whom a command runs as."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]


def run_as(user: str, group: str | None = None) -> RunAs:
    """The identity ``user`` (and ``group``, default its own) stands for on this host.
    LookupError, saying what to do, for an unknown user or group."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise LookupError(
            f"exec.user {user!r} is not a user on this host: create it, or name another "
            "in the config's exec.user"
        ) from None
    gid = entry.pw_gid
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise LookupError(f"exec.group {group!r} is not a group on this host") from None
    return RunAs(user, entry.pw_uid, gid, tuple(os.getgrouplist(user, gid)))


def _no_new_privs() -> None:
    """Set no_new_privs on the calling thread (a child it starts inherits it). OSError if
    it cannot be set and is not set already."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        return
    failed = ctypes.get_errno()
    with contextlib.suppress(OSError), open("/proc/thread-self/status", encoding="ascii") as st:
        if any(line.split() == ["NoNewPrivs:", "1"] for line in st):
            return  # set already (systemd's NoNewPrivileges=yes)
    raise OSError(failed, f"cannot set no_new_privs: {os.strerror(failed)}")


def _start(argv: list[str], env: dict[str, str], who: RunAs | None) -> subprocess.Popen[bytes]:
    """Start the command, as ``who`` when given. The change of user is done by the child
    between fork and exec (``subprocess``'s own, no Python code runs there); no_new_privs is
    set on a thread of its own that starts the child and ends, so no other step inherits it."""
    options: dict[str, Any] = {}
    if who is not None:
        options = {"user": who.uid, "group": who.gid, "extra_groups": list(who.groups), "cwd": "/"}

    def popen() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            shell=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
            **options,
        )

    if who is None:
        return popen()
    started: list[subprocess.Popen[bytes]] = []
    failed: list[BaseException] = []

    def spawn() -> None:
        try:
            _no_new_privs()
            started.append(popen())
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=spawn, name="gpuwarden-exec-start")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return started[0]


def _missing(argv0: str, path: str) -> str | None:
    """Why ``argv0`` cannot be run, or None when it can (checked in dry-run too)."""
    if "/" in argv0:
        if not os.path.exists(argv0):
            return f"cannot run {argv0}: no such file"
        if os.path.isdir(argv0) or not os.access(argv0, os.X_OK):
            return f"cannot run {argv0}: not an executable file"
        return None
    if shutil.which(argv0, path=path) is None:
        return f"cannot run {argv0}: not found on PATH={path}"
    return None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the command's process group, SIGKILL after KILL_GRACE_S (children too)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        if sig == signal.SIGTERM:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(KILL_GRACE_S)
    proc.wait()


def _wait(
    proc: subprocess.Popen[bytes], capture: _Capture, timeout: float, cancel: threading.Event
) -> _Finished:
    """Wait for the command and its output, in short slices so a stopping daemon is noticed.

    The slices count the time (each ``wait`` that times out has waited its slice), so the
    timeout is real time whatever clock the daemon runs on."""
    left = timeout
    returncode: int | None = None
    how = "cancelled"
    while not cancel.is_set():
        step = max(0.0, min(_POLL_S, left))
        if returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                returncode = proc.wait(step)
        else:  # it exited; something it started may still hold the output open
            capture.join(step)
        if returncode is not None and not capture.is_alive():
            return _Finished("exited", returncode)
        left -= step
        if left <= 0:
            how = "timed_out"
            break
    _kill_group(proc)
    capture.join(KILL_GRACE_S)
    return _Finished(how, proc.returncode if returncode is None else returncode)


def _status(returncode: int | None) -> str:
    if returncode is None:
        return "did not exit"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited {returncode}"


def execute(intent: Intent, ctx: Context) -> Outcome:
    params = intent.params
    dry_run = ctx.dry_run or intent.shadow
    if not isinstance(params, ExecParams):
        return Outcome(ok=False, detail="exec: the step has no argv", dry_run=dry_run)
    argv = list(params.argv)
    shown = shlex.join(argv)  # for people to read; never run by a shell
    env = environment(params, intent, ctx)
    who = None
    if ctx.exec_user is not None and not params.as_root:
        try:
            who = run_as(ctx.exec_user, ctx.exec_group)
        except LookupError as exc:
            log_action(intent, ctx, argv=shown, outcome="no_user")
            return Outcome(ok=False, detail=str(exc), dry_run=dry_run)
    user = who.user if who is not None else "root" if params.as_root else "-"
    as_user = "" if user == "-" else f" as {user}"
    problem = _missing(argv[0], env["PATH"])
    if problem is not None:
        log_action(intent, ctx, argv=shown, outcome="missing", user=user)
        return Outcome(ok=False, detail=problem, dry_run=dry_run)
    if dry_run:
        log_action(intent, ctx, argv=shown, outcome="would", user=user)
        return Outcome(ok=True, detail=f"would run{as_user}: {shown}", dry_run=True)
    try:
        proc = _start(argv, env, who)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        log_action(intent, ctx, argv=shown, outcome="failed", user=user)
        return Outcome(ok=False, detail=f"cannot run {argv[0]}{as_user}: {exc}")
    assert proc.stdout is not None
    capture = _Capture(proc.stdout, MAX_OUTPUT_BYTES)
    capture.start()
    finished = _wait(proc, capture, params.timeout, ctx.cancel)
    output = capture.text()
    tail = f"; output:\n{output}" if output else "; no output"
    log_action(
        intent,
        ctx,
        argv=shown,
        pid=proc.pid,
        user=user,
        outcome=finished.how,
        exit=finished.returncode,
    )
    if finished.how == "timed_out":
        return Outcome(
            ok=False,
            recoverable=True,
            detail=f"timed out after {params.timeout:g}s; process group killed{tail}",
        )
    if finished.how == "cancelled":
        return Outcome(
            ok=False,
            recoverable=True,
            detail=f"stopped: gpuwarden is shutting down; process group killed{tail}",
        )
    ok = finished.returncode == 0
    return Outcome(
        ok=ok,
        recoverable=not ok,
        detail=f"{argv[0]} {_status(finished.returncode)}{tail}",
    )
