"""Live processes a scenario's jobs attach to, instead of spawning stand-ins.

``attach: {pid: N}`` names a process; ``attach: {match: REGEX}`` finds the one process whose
command line (its arguments joined with spaces) the regex is found in. The harness that
started it (a Slurm job, a container) owns it: closing the scenario leaves it running.

What a scenario may reach is bounded by who wrote it:

- the file must be writable by its owner only, and a file not owned by root attaches only to
  processes whose *real* uid is the file owner's (root's file: any process);
- nothing about the process is declared: its owner, command line, environment and priority
  class are read from it like any other process's (``sources/procs.py``), so a scenario can
  never lend a process more trust than its real uid gives it;
- command lines are attacker-controlled and a pattern may be careless: the pattern is at most
  ``ATTACH_PATTERN_MAX`` characters, each command line is cut to ``CMDLINE_MATCH_MAX``, and the
  search runs in a child interpreter that is killed after ``MATCH_TIMEOUT_S``, so no pattern
  can hang the daemon (Python's ``re`` cannot be interrupted).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpuwarden.sources.scenario_format import AttachSpec

CMDLINE_MATCH_MAX = 4096
MATCH_TIMEOUT_S = 5.0
_LISTED = 5  # candidates named in an error
_SEARCH = (
    "import json, re, sys\n"
    "job = json.load(sys.stdin)\n"
    "pattern = re.compile(job['pattern'])\n"
    "print(json.dumps([pid for pid, line in job['lines'] if pattern.search(line)]))\n"
)


class AttachError(Exception):
    """Why a job cannot attach; ``expected`` and ``hint`` for the error at its ``attach`` key."""

    def __init__(self, message: str, expected: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message, self.expected, self.hint = message, expected, hint


@dataclass
class Attached:
    """A job's live process, pinned by its start time (a reused PID is not it)."""

    job_id: str
    pid: int
    process: psutil.Process

    def alive(self) -> bool:
        try:
            return self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


def trusted_uid(path: str | Path | None, info: os.stat_result | None = None) -> int:
    """The uid whose processes a scenario file may attach to (0: any): its owner's. A file
    others can write is trusted with nothing. ``info``: the facts of the file as it was read
    (``os.fstat`` of the descriptor it was read from); ``None`` path (a scenario built in
    code): ours."""
    if path is None:
        return os.getuid()
    info = info or os.stat(path)
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise AttachError(
            f"{path} can be changed by other users (mode {stat.S_IMODE(info.st_mode):04o})",
            "a scenario that attaches to live processes writable by its owner only",
            f"chmod go-w {path}",
        )
    return info.st_uid


def _uid(process: psutil.Process) -> int | None:
    try:
        return int(process.uids().real)
    except psutil.Error:
        return None


def _ours() -> set[int]:
    """This process and its ancestors: a shell that started gpuwarden may carry the pattern."""
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return pids


def _check_owner(process: psutil.Process, trusted: int, file: str) -> None:
    uid = _uid(process)
    if trusted not in (0, uid):
        raise AttachError(
            f"pid {process.pid} belongs to uid {uid}, and {file} to uid {trusted}",
            "a process of the scenario file's owner (a file root owns may attach to any)",
            "run the harness as the file's owner, or have root own the scenario",
        )


def by_pid(job_id: str, pid: int, trusted: int, file: str) -> Attached:
    try:
        process = psutil.Process(pid)
        zombie = process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        raise AttachError(
            f"no process {pid}", "the PID of a running process", "is the harness running?"
        ) from None
    except psutil.Error as exc:
        raise AttachError(
            f"pid {pid} cannot be read: {exc}", "a process gpuwarden may read"
        ) from None
    if zombie or pid in _ours():
        raise AttachError(f"pid {pid} cannot be attached to", "a running process of a job")
    _check_owner(process, trusted, file)
    return Attached(job_id, pid, process)


def search(
    pattern: str, lines: list[tuple[int, str]], timeout: float = MATCH_TIMEOUT_S
) -> list[int]:
    """The PIDs whose line ``pattern`` is found in, searched by a child interpreter that is
    given ``timeout`` seconds; a pattern that needs longer is an ``AttachError``."""
    job = json.dumps({"pattern": pattern, "lines": lines})
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _SEARCH],
            input=job,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise AttachError(
            f"the pattern {pattern!r} took more than {timeout:g}s over the command lines",
            "a pattern that reads a line once (no nested repeats such as (a+)+)",
        ) from None
    if done.returncode != 0:
        raise AttachError(f"the pattern {pattern!r} could not be searched", "a valid pattern")
    found: list[int] = json.loads(done.stdout)
    return found


def by_match(job_id: str, pattern: str, trusted: int, file: str) -> Attached:
    ours = _ours()
    candidates: dict[int, psutil.Process] = {}
    lines: list[tuple[int, str]] = []
    for process in psutil.process_iter(["cmdline", "status"]):
        info = process.info
        if process.pid in ours or not info.get("cmdline") or info["status"] == "zombie":
            continue
        if trusted != 0 and _uid(process) != trusted:
            continue  # not the file owner's: never a candidate
        candidates[process.pid] = process
        lines.append((process.pid, " ".join(info["cmdline"])[:CMDLINE_MATCH_MAX]))
    found = sorted(search(pattern, lines))
    if not found:
        whose = "" if trusted == 0 else f" of uid {trusted}"
        raise AttachError(
            f"no process{whose} matches {pattern!r}",
            "one running process whose command line it is found in",
            "is the harness running? attach: {pid: N} names one exactly",
        )
    if len(found) > 1:
        named = ", ".join(str(p) for p in found[:_LISTED]) + (
            ", ..." if len(found) > _LISTED else ""
        )
        raise AttachError(
            f"{len(found)} processes match {pattern!r} (pids {named})",
            "a pattern that only one process matches",
            "make it more specific, or attach: {pid: N}",
        )
    return Attached(job_id, found[0], candidates[found[0]])


def attach(job_id: str, spec: AttachSpec, trusted: int, file: str) -> Attached:
    """The live process ``spec`` names for job ``job_id``; an ``AttachError`` says why not."""
    if spec.pid is not None:
        return by_pid(job_id, spec.pid, trusted, file)
    assert spec.match is not None
    return by_match(job_id, spec.match, trusted, file)
