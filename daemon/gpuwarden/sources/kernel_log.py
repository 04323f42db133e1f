"""Kernel-log lines about NVIDIA GPUs: the driver's XID reports and GPUs that fell off the bus.

The driver (NVRM) writes, across the 470 to 580 driver series::

    NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.                  (older)
    NVRM: Xid (PCI:0000:3b:00): 31, pid=28145, Ch 00000010, intr 10000000. ...   (470)
    NVRM: Xid (PCI:0000:3b:00): 13, pid=28145, name=python3, Graphics SM ...     (510 on)
    NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An ...      (535 on)
    NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
    NVRM: GPU at 0000:3b:00.0 has fallen off the bus.                            (older)
    NVRM: GPU at PCI:0000:3b:00: GPU-2f6c5d27-...                                (its UUID)

A line is read as the kernel's only when its message *begins* with ``NVRM:`` after a time stamp
of one of the forms below, so text a user controls elsewhere in the log (a file name in an
audit line, a message sent with ``logger``) cannot pass for a driver report; journal entries
and ``/dev/kmsg`` records must also come from the kernel (``_TRANSPORT=kernel``, facility 0).

Time stamps, one form per line (``docs/scenarios.md`` has an example of each):

- ``dmesg``: ``[ 7243.123456] msg`` (seconds since boot); ``dmesg -r``: ``<3>[ 7243.1] msg``;
- ``dmesg -T``: ``[Tue Mar  3 14:00:07 2026] msg`` (local time);
- ``dmesg --time-format=iso``: ``2026-03-03T14:00:07,123456+00:00 msg``;
- ``journalctl -k``: ``Mar 03 14:00:07 host kernel: msg`` (local time, no year), as
  ``/var/log/kern.log`` and ``syslog`` write it too (optionally ``[ 7243.123456]`` after
  ``kernel:``); ``journalctl -k -o short-iso`` or rsyslog's RFC 3339 form:
  ``2026-03-03T14:00:07.123456+00:00 host kernel: msg``; ``-o short-unix``;
- ``journalctl -k -o json``: one JSON object per line (``__REALTIME_TIMESTAMP``, ``MESSAGE``);
- a ``/dev/kmsg`` record: ``3,1234,7243123456,-;msg`` (microseconds since boot).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

from gpuwarden.errors import InputError
from gpuwarden.model import EventKind
from gpuwarden.sources import logtext

EXPECTED = (
    "a kernel log: dmesg, dmesg -T, dmesg --time-format=iso, journalctl -k "
    "(short, short-iso, short-unix or json) or /var/log/kern.log"
)
NAME_MAX = 64  # a process name is at most 15 characters; anything longer is cut here
TEXT_MAX = 300

_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTHS = {name: number for number, name in enumerate(_MONTH_NAMES, start=1)}
_KMSG = re.compile(r"(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)")
_BOOT = re.compile(r"(?:<(?P<prio>\d+)>)?\[\s*(?P<secs>\d+\.\d+)\]\s?(?P<msg>.*)")
_CTIME = re.compile(
    r"\[(?:[A-Z][a-z]{2} )?(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) "
    r"(?P<time>\d{1,2}:\d{2}:\d{2}) (?P<year>\d{4})\]\s?(?P<msg>.*)"
)
_ISO = re.compile(
    r"(?P<iso>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)"
    r"\s+(?P<rest>.*)"
)
_UNIX = re.compile(r"(?P<unix>\d{9,11}\.\d{1,9})\s+(?P<rest>.*)")
_SHORT = re.compile(
    r"(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<time>\d{1,2}:\d{2}:\d{2}(?:\.\d{1,9})?)"
    r"\s+(?P<rest>.*)"
)
_SYSLOG_REST = re.compile(r"\S+ kernel: (?:\[\s*\d+\.\d+\]\s?)?(?P<msg>.*)")

_BUS = r"(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
_XID = re.compile(rf"NVRM: Xid \((?:PCI:)?{_BUS}\): (?P<xid>\d{{1,5}})(?:,\s*(?P<rest>.*))?")
_PID = re.compile(r"pid=(?P<pid>\d+|'?<unknown>'?)\s*(?:,\s*|$)")
_NAME = re.compile(r"name=(?P<name>[^,]*)(?:,\s*|$)")
_LOST = re.compile(rf"NVRM: GPU (?:at )?(?:PCI:)?{_BUS}:? (?:GPU )?has fallen off the bus\.?")
_UUID = re.compile(rf"NVRM: GPU at PCI:{_BUS}: (?P<uuid>GPU-[0-9a-fA-F-]{{36}})")
_PCI = re.compile(r"(?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?")


@dataclass(frozen=True, slots=True)
class Stamp:
    """When a line was written, as the log tells it. ``kind`` is ``epoch`` (``seconds`` since
    1970), ``boot`` (``seconds`` since the machine booted), ``local`` (``local``: a wall-clock
    time without a zone) or ``month-day`` (``local`` with a year to be found)."""

    kind: str
    seconds: float = 0.0
    local: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class Report:
    """What one NVRM line says: an XID, or that a GPU fell off the bus (``EventKind.GPU_LOST``)."""

    kind: EventKind
    bus: str  # as the driver wrote it: 0000:3b:00
    xid: int | None = None
    pid: int | None = None
    name: str | None = None
    text: str = ""

    @property
    def detail(self) -> str:
        """The event's detail: the driver's words, then where it happened."""
        who = ""
        if self.pid is not None:
            who = f", pid {self.pid}" + (f" ({self.name})" if self.name else "")
        return f"{self.text} [kernel: PCI:{self.bus}{who}]".lstrip()


@dataclass(frozen=True, slots=True)
class Uuid:
    """``NVRM: GPU at PCI:...: GPU-...``: the UUID of the GPU at a bus id."""

    bus: str
    uuid: str


@dataclass(frozen=True, slots=True)
class Entry:
    line: int
    stamp: Stamp
    says: Report | Uuid


@functools.lru_cache(maxsize=1024)  # a machine has a few bus ids, read every snapshot
def pci_key(bus: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address in any spelling: ``00000000:3B:00.0`` (NVML,
    nvidia-smi), ``0000:3b:00`` (the driver's messages); ``None`` if it is not one."""
    if not bus or not _PCI.fullmatch(bus.strip()):
        return None
    parts = bus.strip().split(".")[0].split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    return (int(parts[0], 16), int(parts[1], 16), int(parts[2], 16))


def _text(value: str, cap: int) -> str:
    value = value.strip()
    return value if len(value) <= cap else value[: cap - 1] + "…"


class NotNvrm(ValueError):
    """An ``NVRM: Xid`` line that does not read as one; ``col`` is where it stops making sense."""

    def __init__(self, message: str, col: int) -> None:
        super().__init__(message)
        self.col = col


def read_message(message: str) -> Report | Uuid | None:
    """What a kernel message says about a GPU; ``None`` for any other message. A message that
    begins like an XID report but does not read as one raises ``NotNvrm``."""
    if not message.startswith("NVRM: "):
        return None
    xid = _XID.match(message)
    if xid:
        rest = xid["rest"] or ""
        pid: int | None = None
        name: str | None = None
        found = _PID.match(rest)
        if found:
            pid = int(found["pid"]) if found["pid"].isdigit() else None
            pid = pid or None  # pid=0: no process (the driver's own context)
            rest = rest[found.end() :]
            named = _NAME.match(rest)
            if named:
                name = _text(named["name"], NAME_MAX)
                name = None if name in ("<unknown>", "") else name
                rest = rest[named.end() :]
        number = int(xid["xid"])
        return Report(EventKind.XID, xid["bus"].lower(), number, pid, name, _text(rest, TEXT_MAX))
    if message.startswith("NVRM: Xid "):
        where = message.find("(")
        raise NotNvrm("an XID report that does not read as one", max(where, 0) + 1)
    lost = _LOST.match(message)
    if lost:
        return Report(EventKind.GPU_LOST, lost["bus"].lower(), text="GPU has fallen off the bus")
    uuid = _UUID.match(message)
    if uuid:
        return Uuid(uuid["bus"].lower(), uuid["uuid"])
    return None


def _clock(text: str) -> tuple[int, int, int, int]:
    hms, _, fraction = text.partition(".")
    hour, minute, second = (int(p) for p in hms.split(":"))
    return hour, minute, second, int((fraction or "0")[:6].ljust(6, "0"))


def _local(year: int, month: str, day: str, time: str) -> dt.datetime | None:
    number = _MONTHS.get(month)
    if number is None:
        return None
    hour, minute, second, micro = _clock(time)
    try:
        return dt.datetime(year, number, int(day), hour, minute, second, micro)
    except ValueError:
        return None


def _iso(text: str) -> float | None:
    text = text.replace(",", ".")
    if re.search(r"[+-]\d{4}$", text):
        text = f"{text[:-2]}:{text[-2:]}"
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _journal_entry(line: str) -> tuple[Stamp, str] | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    transport = entry.get("_TRANSPORT")
    if transport is not None and transport != "kernel":
        return None  # written by a program, not by the kernel
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # journald stores text that is not UTF-8 as bytes
        message = bytes(b for b in message if isinstance(b, int) and 0 <= b < 256)
        message = message.decode("utf-8", errors="replace")
    stamp = str(entry.get("__REALTIME_TIMESTAMP", ""))
    if not isinstance(message, str) or not stamp.isdigit():
        return None
    return Stamp("epoch", int(stamp) / 1e6), message


def read_line(line: str) -> tuple[Stamp, str] | None:
    """The time stamp and the kernel's message of one log line (see the module's text);
    ``None`` for a line that is not a kernel line in a form read here."""
    line = line.strip()
    if line.startswith("{"):
        return _journal_entry(line)
    kmsg = _KMSG.fullmatch(line)
    if kmsg:
        if int(kmsg["prio"]) >> 3 != 0:
            return None  # not the kernel's facility: written to /dev/kmsg by a program
        return Stamp("boot", int(kmsg["usec"]) / 1e6), kmsg["msg"]
    boot = _BOOT.fullmatch(line)
    if boot:
        if boot["prio"] is not None and int(boot["prio"]) >> 3 != 0:
            return None
        return Stamp("boot", float(boot["secs"])), boot["msg"]
    ctime = _CTIME.fullmatch(line)
    if ctime:
        local = _local(int(ctime["year"]), ctime["mon"], ctime["day"], ctime["time"])
        return None if local is None else (Stamp("local", local=local), ctime["msg"])
    for pattern, kind in ((_ISO, "iso"), (_UNIX, "unix"), (_SHORT, "short")):
        found = pattern.fullmatch(line)
        if not found:
            continue
        rest = found["rest"]
        syslog = _SYSLOG_REST.fullmatch(rest)
        if kind == "short":
            local = _local(2000, found["mon"], found["day"], found["time"])
            if local is None or syslog is None:
                return None
            return Stamp("month-day", local=local), syslog["msg"]
        seconds = _iso(found["iso"]) if kind == "iso" else float(found["unix"])
        if seconds is None:
            return None
        if syslog is not None:
            return Stamp("epoch", seconds), syslog["msg"]
        if kind == "iso" and rest.startswith("NVRM: "):  # dmesg --time-format=iso
            return Stamp("epoch", seconds), rest
        return None
    return None


def resolve(stamp: Stamp, *, zone: ZoneInfo, boot: float, reference: float) -> float:
    """Seconds since 1970 of a stamp: ``boot`` is when the machine booted, ``zone`` the zone
    of local times, ``reference`` a time near the log's (a stamp without a year takes the year
    that puts it nearest to it)."""
    if stamp.kind == "epoch":
        return stamp.seconds
    if stamp.kind == "boot":
        return boot + stamp.seconds
    assert stamp.local is not None
    local = stamp.local
    if stamp.kind == "month-day":
        year = dt.datetime.fromtimestamp(reference, zone).year
        candidates = []
        for y in (year - 1, year, year + 1):
            try:
                candidates.append(local.replace(year=y, tzinfo=zone).timestamp())
            except ValueError:  # 29 February of a year without one
                continue
        return min(candidates, key=lambda t: abs(t - reference))
    return local.replace(tzinfo=zone).timestamp()


def parse(text: str, file: str) -> list[Entry]:
    """Every NVRM report in the text of a kernel log, in the log's order. A file in which no
    line is a kernel line, or an XID line that does not read, is an ``InputError``."""
    entries: list[Entry] = []
    kernel_lines = 0
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("-- "):  # journalctl's own notes
            continue
        read = read_line(line)
        if read is None:
            if line.startswith("NVRM: Xid"):  # grep -o, or a stamp cut off (indented: dmesg's
                # continuation of the line before, which needs no stamp of its own)
                col = line.index("NVRM") + 1
                raise InputError.at(
                    file,
                    number,
                    col,
                    "a driver message without a time stamp",
                    EXPECTED,
                    "keep the whole lines (dmesg -T | grep NVRM, not grep -o)",
                )
            continue
        kernel_lines += 1
        stamp, message = read
        try:
            says = read_message(message.strip())
        except NotNvrm as exc:
            col = line.find(message.strip()) + exc.col
            raise InputError.at(
                file,
                number,
                col,
                str(exc),
                "NVRM: Xid (PCI:0000:3b:00): 79, ...",
                "cut the file at the bad line, or report the line to us if the driver wrote it",
            ) from None
        if says is not None:
            entries.append(Entry(number, stamp, says))
    if kernel_lines == 0:
        what = "no kernel log lines" if text.strip() else "the file is empty"
        raise InputError.at(file, 1, 1, what, EXPECTED, "dmesg -T > FILE writes one")
    return entries


def load(path: str | Path) -> list[Entry]:
    """The NVRM reports of the kernel log at ``path`` (see ``parse``)."""
    return parse(logtext.read(path, EXPECTED), str(path))
