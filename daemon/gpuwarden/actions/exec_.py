"""``exec``: run a command the playbook names, with the incident's facts in its environment.

(The module is ``exec_`` because ``exec`` is a Python builtin; the registry maps the step kind
``exec`` here.)

The command is an argv list run without a shell, in its own session and process group, with
stdin from /dev/null. Its environment is built from scratch, so nothing of the daemon's own
environment (tokens, cloud keys) leaks into it:

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
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO

from gpuwarden.actions.base import Context, log_action
from gpuwarden.model import Intent, Outcome
from gpuwarden.playbook.schema import ExecParams

MAX_OUTPUT_BYTES = 4096
MAX_FACT_BYTES = 32 * 1024
KILL_GRACE_S = 2.0
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_LANG = "C.UTF-8"
TRUNCATED = "…[truncated]"

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
    problem = _missing(argv[0], env["PATH"])
    if problem is not None:
        log_action(intent, ctx, argv=shown, outcome="missing")
        return Outcome(ok=False, detail=problem, dry_run=dry_run)
    if dry_run:
        log_action(intent, ctx, argv=shown, outcome="would")
        return Outcome(ok=True, detail=f"would run: {shown}", dry_run=True)
    try:
        proc = subprocess.Popen(
            argv,
            shell=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except (OSError, ValueError) as exc:
        log_action(intent, ctx, argv=shown, outcome="failed")
        return Outcome(ok=False, detail=f"cannot run {argv[0]}: {exc}")
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
