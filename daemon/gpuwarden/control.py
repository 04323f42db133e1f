"""The on-call requests — ``ack``, ``hold``, ``release``, ``abort``, ``silence`` — carried out
on the journal, and the control socket that lets a non-root operator ask for them.

``perform(journal, request, now)`` writes one request into the journal (``journal.control``)
and says in words what will happen; the running daemon reads it at its next tick. Root runs it
directly (``gpuwarden hold …`` opens the journal for writing); anyone else asks the daemon
over its control socket (``operators.socket``, mode 0660, group ``operators.group``), where
``ControlServer`` checks the caller with the kernel's word (``SO_PEERCRED``: uid, then that
user's groups), runs the same ``perform`` on a journal connection of its own, and sends the
answer back. Why not a group-writable journal: whoever can write the journal can add undo rows
that root carries out (resume or renice any process, set a GPU's power limit), queue messages
to every target, and erase the rate limits' counts. Through the socket an operator can do
exactly the five requests and nothing else, and the journal records who really asked.

The socket speaks one JSON object per line each way: a request
``{"op": "hold", "incident": "last", "for": 1800, "reason": "…", "by": "alice"}``, an answer
``{"ok": true, "message": "…"}`` or ``{"ok": false, "error": "…", "hint": "…", "exit": 2}``.
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import math
import os
import pwd
import socket
import stat
import struct
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from gpuwarden.errors import ExitCode, GpuwardenError, HintedError, UsageError
from gpuwarden.journal.control import NotOpen, SilenceRow
from gpuwarden.journal.journal import Journal, JournalError
from gpuwarden.journal.next_view import next_words, targets_words
from gpuwarden.text import iso, safe_text
from gpuwarden.units import format_duration

log = logging.getLogger("gpuwarden.control")

OPS = ("ack", "hold", "release", "abort", "silence", "end-silence")
ENDED = ("killed", "terminated")  # what a kill's outcome says when it ended its target
MAX_SPAN_S = 366 * 86400  # the longest hold or silence
MAX_GPU = 4096
MAX_REQUEST = 16 * 1024  # bytes of one request line
IO_TIMEOUT_S = 5.0  # a client that does not finish its request in time is dropped


class ControlError(HintedError):
    """A request that cannot be carried out, with the exit code it ends the command with."""

    def __init__(self, message: str, hint: str | None = None, code: int = ExitCode.FAILURE) -> None:
        super().__init__(message, hint)
        self.exit_code = ExitCode(code)


@dataclass(frozen=True)
class Request:
    op: str
    by: str
    incident: str | None = None
    for_s: float | None = None  # hold, silence: how long
    reason: str = ""
    comment: str = ""  # ack
    rule: str | None = None  # silence
    gpu: int | None = None
    host: bool = False
    silence: int | None = None  # end-silence

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v not in (None, "", False)})

    @classmethod
    def from_json(cls, text: str) -> Request:
        """A request as a client sent it; ``UsageError`` for anything malformed."""
        try:
            data = json.loads(text)
        except ValueError:
            raise UsageError("the request is not JSON") from None
        if not isinstance(data, dict):
            raise UsageError("the request is not a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"unknown request fields: {', '.join(map(str, unknown))}")
        kinds: dict[str, tuple[type, ...]] = {
            "op": (str,),
            "by": (str,),
            "incident": (str,),
            "for_s": (int, float),
            "reason": (str,),
            "comment": (str,),
            "rule": (str,),
            "gpu": (int,),
            "host": (bool,),
            "silence": (int,),
        }
        for key, value in data.items():
            if not isinstance(value, kinds[key]) or (
                isinstance(value, bool) and kinds[key] != (bool,)
            ):
                raise UsageError(f"request field {key!r} has the wrong type")
        if data.get("op") not in OPS:
            raise UsageError(f"unknown request {data.get('op')!r}; known: {', '.join(OPS)}")
        if "by" not in data:
            raise UsageError("the request does not say who asks (by)")
        return cls(**data)


def invoking_user() -> str:
    """Who runs the command: the user behind sudo (``SUDO_USER``), else the login name, else
    the name of the real uid."""
    sudo = os.environ.get("SUDO_USER")
    if sudo:
        return sudo
    with contextlib.suppress(OSError):
        return os.getlogin()
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


# -- carrying a request out -------------------------------------------------------------------


def find(journal: Journal, text: str) -> Any:
    """The incident ``text`` names: an id, a unique prefix of one, or ``last`` (the newest)."""
    if text == "last":
        rows = journal.incidents()
        if not rows:
            raise UsageError("the journal has no incidents yet")
        return max(rows, key=lambda r: r.opened_at)
    return journal.find_incident(text)


def _not_open(incident: Any, err: NotOpen, doing: str) -> ControlError:
    when = err.args[0] if err.args else None
    if when is None:
        return ControlError(f"no incident {incident.id!r}", code=ExitCode.BAD_INPUT)
    return ControlError(
        f"{incident.id} resolved at {iso(when)}: there is nothing to {doing}",
        hint="`gpuwarden incidents --open` lists the open ones",
        code=ExitCode.BAD_INPUT,
    )


def _next(journal: Journal, incident: Any, now: float) -> tuple[str, dict[str, Any] | None]:
    found = journal.next_steps().get(incident.id)
    if found is None:
        return "", None
    computed, data = found
    return next_words(data, incident.opened_at, now, computed), data


def check_bounds(request: Request) -> None:
    """Numbers a person may mean: a request from the socket is checked like the command
    line (a year at most for a hold or a silence, a GPU index, a silence number)."""
    span = request.for_s
    if span is not None and not (math.isfinite(span) and 0 < span <= MAX_SPAN_S):
        raise UsageError(
            f"--for {span!r} is not a duration gpuwarden takes",
            hint="give a positive duration of at most a year, e.g. 30m or 2h",
        )
    if request.gpu is not None and not 0 <= request.gpu < MAX_GPU:
        raise UsageError(f"--gpu {request.gpu} is not a GPU index", hint="0, 1, ... as in status")
    if request.silence is not None and not 0 < request.silence < 2**63:
        raise UsageError(f"no silence #{request.silence}", hint="`gpuwarden silence --list`")


def perform(journal: Journal, request: Request, now: float) -> str:
    """Write ``request`` into ``journal`` (opened for writing); what will happen, in words.
    Raises ``ControlError`` or ``UsageError`` when it cannot be carried out."""
    check_bounds(request)
    if request.op in ("silence", "end-silence"):
        return _silence(journal, request, now)
    if not request.incident:
        raise UsageError(f"{request.op} needs an incident id")
    incident = find(journal, request.incident)
    ident = safe_text(incident.id)
    if request.op == "ack":
        return _ack(journal, incident, request, now)
    if request.op == "hold":
        until = None if request.for_s is None else now + request.for_s
        try:
            row = journal.hold(incident.id, now, until=until, by=request.by, reason=request.reason)
        except NotOpen as err:
            raise _not_open(incident, err, "hold") from None
        span = f"until {iso(until)}" if until is not None else "until released"
        return (
            f"{ident} on hold {span} (by {safe_text(row.by)}): no further step runs; a step "
            f"already running finishes. The daemon applies it at its next tick.\n"
            f"Resume it: gpuwarden release {ident}"
        )
    if request.op == "release":
        released = journal.release(incident.id, now, by=request.by)
        if released is None:
            return f"{ident} is not on hold: nothing to release"
        return (
            f"released {ident} (held by {safe_text(released.by)}): its ladder goes on at the "
            "daemon's next tick; a step that came due meanwhile runs then"
        )
    if request.op == "abort":
        return _abort(journal, incident, request, now)
    raise UsageError(f"unknown request {request.op!r}")


def _ack(journal: Journal, incident: Any, request: Request, now: float) -> str:
    ident = safe_text(incident.id)
    if not journal.ack(incident.id, now, by=request.by, comment=request.comment):
        if incident.acked_at is None:
            raise ControlError(f"no incident {ident!r}", code=ExitCode.BAD_INPUT)
        by = f" by {safe_text(incident.acked_by)}" if incident.acked_by else ""
        return f"{ident} was already acknowledged{by} at {iso(incident.acked_at)}"
    head = f"acknowledged {ident} (by {safe_text(request.by)}): no more reminders about it."
    if not incident.open:
        return head + " It is resolved: no step of it runs any more."
    words, data = _next(journal, incident, now)
    if data is None:
        return (
            head + " Whether its ladder goes on depends on the rule's pause_on_ack; the daemon "
            "has not reported this incident's next step (is it running?)."
        )
    if data.get("pause_on_ack"):
        return (
            head + f" The ladder stops here: rule {safe_text(incident.rule)} pauses on ack, "
            "so no further step runs (the incident still resolves by itself)."
        )
    if data.get("step") is None:
        return head + " Every step has already run; it stays open until its condition clears."
    if data.get("state") == "held":
        return (
            head + f" The ladder is ON HOLD {safe_text(data.get('detail') or '')}: no further "
            f"step runs until `gpuwarden release {ident}`."
        )
    return (
        head + f" The ladder CONTINUES: next {words}.\n"
        f"To stop it: gpuwarden hold {ident}   (or end it: gpuwarden abort {ident})"
    )


def _abort(journal: Journal, incident: Any, request: Request, now: float) -> str:
    ident = safe_text(incident.id)
    try:
        asked = journal.request_abort(incident.id, now, by=request.by, reason=request.reason)
    except NotOpen as err:
        raise _not_open(incident, err, "abort") from None
    if not asked:
        return f"an abort of {ident} was already asked: the daemon ends it at its next tick"
    undos = journal.pending_undos(incident.id)
    lines = [
        f"abort of {ident} asked (by {safe_text(request.by)}): the daemon ends it at its "
        "next tick, stops its running steps, and puts back what can be put back:"
    ]
    for undo in undos:
        what = f"pid {undo.pid}" if undo.pid is not None else f"GPU {undo.gpu}"
        value = f" to {undo.value}" if undo.value is not None else ""
        lines.append(f"  {undo.kind} {what}{value}")
    if not undos:
        lines.append("  (nothing to put back so far)")
    killed = _killed(journal, incident.id)
    if killed:
        lines.append(f"cannot be undone: the kill of {targets_words(killed)}")
    lines.append(
        f"The rule fires again for {safe_text(incident.label or incident.scope)} only after "
        "its condition has cleared."
    )
    return "\n".join(lines)


def _killed(journal: Journal, incident_id: str) -> list[dict[str, Any]]:
    """The targets the incident's kill steps ended (a kill has no undo)."""
    ended: set[int] = set()
    targets: dict[int, dict[str, Any]] = {}
    for row in journal.timeline(incident_id):
        if row.data.get("step_kind") != "kill" or row.data.get("shadow"):
            continue
        if row.kind == "step":
            targets.update((int(t["pid"]), t) for t in row.data.get("targets") or [])
        elif row.kind == "outcome" and row.data.get("ok") and row.reason in ENDED:
            ended.add(int(row.data.get("pid", -1)))
    return [t for pid, t in targets.items() if pid in ended]


def _silence(journal: Journal, request: Request, now: float) -> str:
    if request.op == "end-silence":
        if request.silence is None:
            raise UsageError("which silence? give its number (`gpuwarden silence --list`)")
        ended = journal.end_silence(request.silence, now, by=request.by)
        if ended is None:
            raise ControlError(
                f"no silence #{request.silence} in force",
                hint="`gpuwarden silence --list` shows those in force",
                code=ExitCode.BAD_INPUT,
            )
        return f"silence #{ended.id} ({_matcher(ended)}) ended: steps act and page again"
    if not request.host and request.rule is None and request.gpu is None:
        raise UsageError("say what to silence: --rule NAME, --gpu N (or both), or --host")
    if request.host and (request.rule is not None or request.gpu is not None):
        raise UsageError("--host silences everything: give it without --rule or --gpu")
    if request.for_s is None or request.for_s <= 0:
        raise UsageError("a silence needs --for (e.g. --for 2h): it must end by itself")
    if not request.reason.strip():
        raise UsageError("a silence needs --reason (what the maintenance is)")
    row = journal.add_silence(
        now,
        ends=now + request.for_s,
        by=request.by,
        reason=request.reason,
        rule=request.rule,
        gpu=request.gpu,
        host=request.host,
    )
    return (
        f"silence #{row.id} ({_matcher(row)}) until {iso(row.ends_at)}, by {safe_text(row.by)}: "
        f"{safe_text(row.reason)}\n"
        "Rules still evaluate and the journal records every step as silenced; nothing acts "
        "and nothing is sent. The daemon applies it at its next tick.\n"
        f"End it early: gpuwarden silence --end {row.id}"
    )


def _matcher(row: SilenceRow) -> str:
    return safe_text(row.silence().matcher)


def render_silences(rows: list[SilenceRow], now: float) -> str:
    """``silence --list``: a table, oldest first."""
    if not rows:
        return "no silences"
    table = [("ID", "SILENCES", "BY", "FROM", "UNTIL", "STATE", "REASON")]
    for row in rows:
        s = row.silence()
        state = (
            "in force"
            if s.active(now)
            else "ended early"
            if row.ended_at is not None and row.ended_at < row.ends_at
            else "ended"
            if s.ends <= now
            else "starts later"
        )
        until = s.ends
        table.append(
            (
                f"#{row.id}",
                _matcher(row),
                safe_text(row.by),
                iso(row.starts_at),
                f"{iso(until)} (in {format_duration(until - now)})" if until > now else iso(until),
                state,
                safe_text(row.reason),
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    )


# -- the socket -------------------------------------------------------------------------------


def ask(path: Path, request: Request, *, timeout: float = 30.0) -> str:
    """Send ``request`` to the daemon's control socket; its answer, or ``ControlError``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(path))
            conn.sendall(request.to_json().encode() + b"\n")
            data = _read_line(conn)
    except (FileNotFoundError, ConnectionRefusedError):
        raise ControlError(
            f"the daemon's control socket {path} is not there (is gpuwarden running?)",
            hint="run the command as root, or start the daemon with operators.group set",
        ) from None
    except PermissionError:
        raise ControlError(
            f"no permission to use {path}",
            hint="ask an admin to add you to the config's operators.group, then log in again",
        ) from None
    except OSError as exc:
        raise ControlError(f"the daemon did not answer on {path}: {exc}") from None
    try:
        answer = json.loads(data)
    except ValueError:
        raise ControlError(f"the daemon's answer on {path} is not JSON") from None
    if answer.get("ok"):
        return str(answer.get("message", ""))
    raise ControlError(
        str(answer.get("error", "refused")),
        hint=answer.get("hint"),
        code=int(answer.get("exit", ExitCode.FAILURE)),
    )


def _read_line(conn: socket.socket, within: float | None = None) -> str:
    """One line; with ``within``, all of it within that many seconds (a client that drips
    its request byte by byte is dropped as one that sends nothing)."""
    deadline = None if within is None else time.monotonic() + within
    data = b""
    while b"\n" not in data:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive in time")
            conn.settimeout(left)
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST * 4:
            raise OSError("the message is too long")
    return data.split(b"\n", 1)[0].decode("utf-8", errors="replace")


def member(uid: int, gid: int) -> bool:
    """Whether ``uid`` is root or in group ``gid`` (primary or supplementary, as configured
    in the user and group databases)."""
    if uid == 0:
        return True
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    return user.pw_gid == gid or gid in os.getgrouplist(user.pw_name, user.pw_gid)


OWN_FILES = frozenset({"journal.db", "journal.db-wal", "journal.db-shm", "journal.lock"})


def share_journal(state_dir: Path, gid: int) -> list[Path]:
    """Let group ``gid`` read the journal: the state directory 0750, the journal and its
    ``-wal``/``-shm`` 0640, all of that group (SQLite gives ``-wal`` and ``-shm`` the
    journal's mode and owner when it makes them again). By path only: no descriptor of the
    journal is opened here (closing one would drop the daemon's SQLite locks). The lock
    file stays private. A state directory that holds anything else (a ``state_dir`` such as
    ``/var/lib``) is left as it is, with a warning. Returns the paths changed."""
    changed: list[Path] = []
    others = sorted(set(os.listdir(state_dir)) - OWN_FILES)
    if others:
        log.warning(
            "state_dir %s holds more than the journal (%s): its mode is left as it is; "
            "give gpuwarden a directory of its own for operators.group to read the journal",
            state_dir,
            ", ".join(others[:3]),
        )
    for path, mode in (
        *(() if others else ((state_dir, 0o750),)),
        (state_dir / "journal.db", 0o640),
        (state_dir / "journal.db-wal", 0o640),
        (state_dir / "journal.db-shm", 0o640),
    ):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            continue  # never follow a link in the state directory
        os.chown(path, -1, gid, follow_symlinks=False)
        os.chmod(path, mode)
        changed.append(path)
    return changed


class ControlServer:
    """The daemon's control socket: one thread, one short connection at a time."""

    def __init__(self, path: Path, group: str, journal_path: Path) -> None:
        try:
            self.gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise ControlError(
                f"operators.group {group!r} is not a group on this host",
                hint=f"create it (groupadd {group}) or change operators.group in the config",
                code=ExitCode.BAD_INPUT,  # the configuration is wrong: no restart fixes it
            ) from None
        self.group = group
        self.path = path
        self.journal_path = journal_path
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._journal: Journal | None = None
        self.served = 0

    def start(self) -> ControlServer:
        parent = self.path.parent
        parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(os.lstat(self.path).st_mode):
                raise ControlError(
                    f"{self.path} exists and is not a socket",
                    hint="move it away, or set operators.socket to another path",
                    code=ExitCode.UNSAFE_SETUP,
                )
            os.unlink(self.path)  # a socket left by a daemon that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chown(self.path, -1, self.gid, follow_symlinks=False)
        os.chmod(self.path, 0o660)
        sock.listen(16)
        sock.settimeout(0.5)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="gpuwarden-control", daemon=True)
        self._thread.start()
        log.info("control socket %s for group %s", self.path, self.group)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        if self._journal is not None:
            self._journal.close()

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _addr = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    self._answer(conn)
                except Exception:  # one bad client must not end the server
                    log.exception("control request failed")

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(IO_TIMEOUT_S)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        try:
            line = _read_line(conn, IO_TIMEOUT_S)  # read before answering, even a refusal
        except TimeoutError:
            error = f"the request did not arrive in time ({IO_TIMEOUT_S:g}s)"
            self._send(conn, {"ok": False, "error": error, "exit": int(ExitCode.BAD_INPUT)})
            return
        except OSError as exc:
            self._send(conn, {"ok": False, "error": f"reading the request: {exc}", "exit": 1})
            return
        if not member(uid, self.gid):
            log.warning("control: refused uid %d (pid %d): not in group %s", uid, pid, self.group)
            self._send(
                conn,
                {
                    "ok": False,
                    "error": f"uid {uid} is not in group {self.group}",
                    "hint": "ask an admin to add you to the config's operators.group",
                    "exit": int(ExitCode.FAILURE),
                },
            )
            return
        try:
            request = Request.from_json(line)
            request = _as_caller(request, uid)
            if self._journal is None:
                self._journal = Journal.open_writer(self.journal_path)
            message = perform(self._journal, request, time.time())
        except GpuwardenError as exc:
            hint = getattr(exc, "hint", None)
            text = getattr(exc, "message", None) or exc.render()
            self._send(conn, {"ok": False, "error": text, "hint": hint, "exit": int(exc.exit_code)})
            return
        self.served += 1
        log.info(
            "control: %s %s by %s (uid %d)", request.op, request.incident or "", request.by, uid
        )
        self._send(conn, {"ok": True, "message": message})

    @staticmethod
    def _send(conn: socket.socket, answer: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(answer).encode() + b"\n")


def _as_caller(request: Request, uid: int) -> Request:
    """The journal says who really asked: ``alice`` when the caller is alice, ``bob (as uid
    1001 alice)`` when alice's request says ``--by bob``."""
    try:
        real = pwd.getpwuid(uid).pw_name
    except KeyError:
        real = f"uid {uid}"
    if request.by == real:
        return request
    fields_ = asdict(request)
    fields_["by"] = f"{request.by} (as uid {uid} {real})"
    return Request(**fields_)


__all__ = [
    "ControlError",
    "ControlServer",
    "JournalError",
    "Request",
    "ask",
    "invoking_user",
    "member",
    "perform",
    "render_silences",
    "share_journal",
]
