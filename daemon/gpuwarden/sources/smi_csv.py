"""Replay a recorded ``nvidia-smi --query-gpu=... --format=csv -l 1`` log as a Source.

The columns come from the header line nvidia-smi writes (``utilization.gpu [%]``, units in
brackets), from a ``# columns: timestamp,index,...`` comment, or from the caller; values may
carry their units (``97 %``, ``52000 MiB``) or not (``nounits``). nvidia-smi's markers for what
it cannot tell (``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``...) become ``None``; a row
that says ``[GPU is lost]``, or nvidia-smi's ``Unable to determine the device handle`` line,
becomes a lost GPU. Unknown columns are ignored.

Rows are grouped into frames, one per sample: a row starts a new frame when its GPU index is
already in the current one, or when it was taken a second or more after the frame's first row
(one sample of all GPUs takes well under a second, so a sample that straddles a second
boundary stays one frame). A frame's time is its first row's. The log has no per-process data:
snapshots carry GPUs only.
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpuwarden.errors import InputError, UsageError
from gpuwarden.model import THROTTLE_REASONS, Ecc, Event, EventKind, GpuState, Memory, Snapshot

_REASON = "clocks_event_reasons."
_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}
_ECC = {  # column -> model.Ecc field
    f"ecc.errors.{kind}.{scope}.total": f"{scope}_{kind}"
    for scope in ("volatile", "aggregate")
    for kind in ("corrected", "uncorrected")
}
_POWER = ("power.draw", "power.draw.instant", "power.draw.average")
_LIMIT = ("enforced.power.limit", "power.limit")
_MEMORY = ("memory.total", "memory.used", "memory.free", "memory.reserved")
# column -> kind: how its values are read; columns not named here are ignored
_KINDS: dict[str, str] = {
    "timestamp": "timestamp",
    "index": "index",
    "pstate": "pstate",
    "temperature.gpu": "temp",
    "mig.mode.current": "enabled",
    _REASON + "active": "mask",
    **dict.fromkeys(("name", "uuid", "pci.bus_id"), "text"),
    **dict.fromkeys(_MEMORY, "mib"),
    **dict.fromkeys(("utilization.gpu", "utilization.memory"), "pct"),
    **dict.fromkeys(_POWER + _LIMIT, "watts"),
    **dict.fromkeys(_ECC, "count"),
    **{_REASON + name: "active" for name in THROTTLE_REASONS.values()},
}
_UNITS: dict[str, dict[str, float]] = {
    "mib": {"mib": 1.0, "gib": 1024.0, "kib": 1 / 1024},
    "pct": {"%": 1.0},
    "temp": {"c": 1.0},
    "watts": {"w": 1.0, "mw": 0.001},
}
_FLAGS = {"active": ("active", "not active"), "enabled": ("enabled", "disabled")}
_EXPECTED = {
    "timestamp": "a time such as 2026/01/10 03:12:01.123 (nvidia-smi) or 2026-01-10T03:12:01Z",
    "index": "a GPU index such as 0",
    "mib": "a memory size such as 52000 MiB (MiB, GiB or KiB)",
    "pct": "a percentage such as 97 %",
    "temp": "a temperature in degrees C such as 45",
    "watts": "a power such as 310.45 W",
    "count": "a whole number",
    "pstate": "a performance state P0 to P15",
    "enabled": "Enabled or Disabled",
    "active": "Active or Not Active",
    "mask": "a bitmask such as 0x0000000000000004",
}
_LOST = {"[gpu is lost]": "GPU is lost", "[gpu requires reset]": "GPU requires reset"}
_UNKNOWN = {"", "n/a", "not supported", "unknown", "unknown error"}
_HEADER_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\s*(\[[^\]]*\])?")
_NUMBER = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(\S+)?")
_MASK = re.compile(r"0x[0-9a-f]+|\d+")
_PSTATE = re.compile(r"p(1[0-5]|\d)")
_SMI_TIME = re.compile(r"(\d{4})/(\d{1,2})/(\d{1,2}) (\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")
_NO_HANDLE = re.compile(
    r"Unable to determine the device handle for GPU\s*(?:(?P<index>\d{1,3})\s*:\s*)?"
    r"(?:(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]))?",
    re.IGNORECASE,
)
_REQUIRED = "the columns timestamp and index (nvidia-smi --query-gpu=timestamp,index,...)"
_LOG = "an nvidia-smi --query-gpu=timestamp,index,... --format=csv log"
_HEADER = "a header line (nvidia-smi --format=csv) or a '# columns:' line"
_NOHEADER = (
    "this log was written with --format=csv,noheader: add a first line "
    "'# columns: timestamp,name,index,...' listing the --query-gpu fields in order, "
    "or pass the column list (columns=...)"
)
_BACK_HINT = (
    "two logs may have been joined, or the clock was set back: replay each part as its own "
    "file; nvidia-smi writes local time, so name the zone it was written in (tz=...)"
)
_CLOCK_SLACK_S = 2.0  # the clock stepping back this little (NTP) is smoothed over


@dataclass(frozen=True, slots=True)
class SmiFrame:
    """One sample of every GPU in the log; ``line`` is where its first record is."""

    time: float
    gpus: tuple[GpuState, ...]
    line: int


@dataclass(frozen=True, slots=True)
class _Column:
    name: str  # canonical: lower case, no unit, aliases resolved
    kind: str | None  # None: a column gpuwarden does not read
    unit: str | None


@dataclass(slots=True)
class _Record:
    """One GPU on one line: a CSV row, or nvidia-smi's message that it cannot reach a GPU."""

    line: int
    time: float | None = None
    index: int | None = None
    bus: str | None = None
    error: str | None = None
    values: dict[str, Any] = field(default_factory=dict)  # column -> value read as its kind


_Fields = list[tuple[str, int]]  # the fields of one line, each with its 1-based column
_Columns = tuple[_Column, ...]


def _split(line: str, start: int = 0) -> list[str]:
    """The fields of a CSV line from ``start`` on, stripped."""
    return [v.strip() for v in next(csv.reader([line[start:]], skipinitialspace=True), [])]


def _starts(line: str, start: int = 0) -> list[int]:
    """The 1-based column where each field of ``_split(line, start)`` begins, found by walking
    the line as the csv module reads it (a quote opens only a field). Used for errors only."""
    cols: list[int] = []
    pos, end = start, len(line) if line[start:].strip() else start - 1
    while pos <= end:
        while pos < end and line[pos] == " ":
            pos += 1
        cols.append(pos + 1)
        quoted = pos < end and line[pos] == '"'
        pos += quoted
        while pos < end and (quoted or line[pos] != ","):
            if quoted and line[pos] == '"':
                quoted = line[pos + 1 : pos + 2] == '"'
                pos += quoted
            pos += 1
        pos += 1
    return cols


def _located(line: str, start: int = 0) -> _Fields:
    return list(zip(_split(line, start), _starts(line, start), strict=True))


def _columns(fields: _Fields, file: str, line: int | None) -> _Columns:
    columns: list[_Column] = []
    for text, col in fields:
        base, _, units = text.partition("[")
        name = base.strip().lower().removeprefix("--query-gpu=")
        name = _ALIASES.get(name, name).replace("clocks_throttle_reasons.", _REASON)
        kind, written = _KINDS.get(name), units.rstrip("]").strip()
        unit = written.lower() or None
        if any(c.name == name for c in columns):
            raise InputError.at(file, line, col, f"column {name} twice", "each column once")
        if kind is not None and unit is not None and unit not in _UNITS.get(kind, {}):
            raise InputError.at(file, line, col, f"unit [{written}] for {name}", _EXPECTED[kind])
        columns.append(_Column(name, kind, unit))
    missing = [n for n in ("timestamp", "index") if all(c.name != n for c in columns)]
    if missing:
        what = f"no {' and no '.join(missing)} column"
        raise InputError.at(file, line, line and 1, what, _REQUIRED)
    return tuple(columns)


@functools.lru_cache(maxsize=65536)  # logs repeat the same few values row after row
def _value(kind: str, unit: str | None, text: str) -> str | bool | int | float:
    """One field read as its column's kind; ``ValueError`` saying what is wrong otherwise."""
    lower = text.lower()
    if kind == "text":
        return text
    if kind in _FLAGS:
        if lower not in _FLAGS[kind]:
            raise ValueError(f"is {text!r}")
        return lower == _FLAGS[kind][0]
    if kind in ("pstate", "mask"):
        match = (_PSTATE if kind == "pstate" else _MASK).fullmatch(lower)
        if not match:
            raise ValueError(f"is {text!r}")
        return int(match[1]) if kind == "pstate" else int(lower, 0)
    number = _NUMBER.fullmatch(text)
    if not number:
        raise ValueError(f"is not a number: {text!r}")
    units = _UNITS.get(kind, {})
    unit = (number[2] or unit or "").lower()
    if unit and unit not in units:
        raise ValueError(f"has the unit {number[2]!r}")
    value = float(number[1]) * units.get(unit, 1.0)
    if kind in ("index", "count") and not value.is_integer():
        raise ValueError(f"is not a whole number: {text!r}")
    if kind == "watts":
        return value
    return math.floor(value + 1e-9) if kind == "mib" else round(value)


def _datetime(text: str) -> datetime:
    match = _SMI_TIME.fullmatch(text)
    if not match:
        return datetime.fromisoformat(text)
    year, month, day, hour, minute, second = (int(p) for p in match.groups()[:6])
    micro = int((match[7] or "0").ljust(6, "0"))
    return datetime(year, month, day, hour, minute, second, micro)


class _Reader:
    """Turns the lines of one log into records; every error names file:line:col."""

    def __init__(self, file: str, columns: Sequence[str] | None, tz: str | None) -> None:
        self.file = file
        try:
            self.zone = ZoneInfo(tz or "UTC")
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise UsageError(f"unknown time zone {tz!r}", "name one such as Europe/Berlin") from exc
        self.given: _Columns | None = None
        try:
            self.given = _columns([(c, 1) for c in columns], file, None) if columns else None
        except InputError as exc:
            problem = exc.problems[0]
            raise UsageError(f"columns for {file}: {problem.message}", problem.expected) from None
        self.prev_time: float | None = None

    def fail(self, line: int, col: int, what: str, expected: str, hint: str = "") -> InputError:
        """An error at line:col; ``expected`` is a column kind or the words themselves."""
        expected = _EXPECTED.get(expected, expected)
        return InputError.at(self.file, line, col, what, expected, hint or None)

    def records(self, text: str) -> list[_Record]:
        columns, records, last = self.given, [], 0
        for number, text_line in enumerate(text.split("\n"), start=1):
            raw = text_line.rstrip("\r")
            line = raw.strip()
            if not line:
                continue
            last = number
            if line.startswith("#"):
                if line[1:].lstrip().lower().startswith("columns:"):
                    columns = _columns(_located(raw, raw.index(":") + 1), self.file, number)
                continue
            handle = _NO_HANDLE.match(line)
            if handle:
                index = None if handle["index"] is None else int(handle["index"])
                records.append(_Record(number, index=index, bus=handle["bus"], error=line))
                continue
            fields = _split(raw)
            if all(_HEADER_FIELD.fullmatch(t) for t in fields):
                columns = _columns(_located(raw), self.file, number)
            elif columns is None:
                raise self.fail(number, 1, "a record before any column names", _HEADER, _NOHEADER)
            else:
                records.append(self.row(fields, columns, number, raw))
        if not records:
            raise self.fail(last or 1, 1, "no GPU records" if last else "the file is empty", _LOG)
        return records

    def row(self, fields: list[str], columns: _Columns, number: int, raw: str) -> _Record:
        if len(fields) != len(columns):
            col = _starts(raw)[len(columns)] if len(fields) > len(columns) else len(raw) + 1
            what = f"{len(fields)} fields in a row of {len(columns)} columns"
            names = f"{len(columns)} values ({', '.join(c.name for c in columns)})"
            raise self.fail(number, col, what, names)
        record = _Record(number)
        for i, (column, text) in enumerate(zip(columns, fields, strict=True)):
            if column.kind is None:
                continue
            lower = text.lower()
            if lower in _LOST:
                record.error = _LOST[lower]
            elif lower in _UNKNOWN or text.startswith("["):
                continue
            elif column.kind == "timestamp":
                record.time = self.timestamp(text, number, raw, i)
            else:
                try:
                    record.values[column.name] = _value(column.kind, column.unit, text)
                except ValueError as exc:
                    col = _starts(raw)[i]
                    raise self.fail(number, col, f"{column.name} {exc}", column.kind) from None
        record.index, record.bus = record.values.pop("index", None), record.values.get("pci.bus_id")
        for name, got in (("timestamp", record.time), ("index", record.index)):
            if got is None and record.error is None:
                col = _starts(raw)[next(i for i, c in enumerate(columns) if c.name == name)]
                raise self.fail(number, col, f"this row has no {name}", name)
        return record

    def timestamp(self, text: str, line: int, raw: str, field: int) -> float:
        try:
            when = _datetime(text)
        except ValueError:
            col = _starts(raw)[field]
            raise self.fail(line, col, f"not a timestamp: {text!r}", "timestamp") from None
        naive = when.tzinfo is None
        seconds = when.replace(tzinfo=self.zone).timestamp() if naive else when.timestamp()
        prev = self.prev_time if self.prev_time is not None else seconds
        if naive and seconds < prev - _CLOCK_SLACK_S:
            # the hour that repeats when daylight saving time ends: its second pass
            seconds = max(seconds, when.replace(tzinfo=self.zone, fold=1).timestamp())
        if seconds < prev - _CLOCK_SLACK_S:
            what = f"the time goes back to {text}"
            raise self.fail(line, _starts(raw)[field], what, "rows in time order", _BACK_HINT)
        self.prev_time = max(seconds, prev)
        return self.prev_time


@functools.lru_cache(maxsize=1024)
def _bus_key(bus: str) -> str:
    """One spelling of a PCI bus id: rows write ``00000000:3B:00.0``, messages ``0000:3b:00.0``."""
    domain, _, rest = bus.lower().partition(":")
    return f"{int(domain, 16):x}:{rest}" if re.fullmatch(r"[0-9a-f]{1,8}", domain) else bus.lower()


def _gpu(record: _Record, index: int, identity: _Record | None) -> GpuState:
    v = record.values
    if identity is not None and record.error is not None:  # a lost GPU keeps its name
        v = {k: identity.values.get(k) for k in ("name", "uuid", "pci.bus_id")} | v
    mask = v.get(_REASON + "active")
    throttle = None
    if mask is not None or any(k.startswith(_REASON) for k in v):
        throttle = tuple(
            n for b, n in THROTTLE_REASONS.items() if (mask or 0) & b or v.get(_REASON + n)
        )
    counts = {attr: v.get(name) for name, attr in _ECC.items()}
    return GpuState(
        index=index,
        name=v.get("name"),
        uuid=v.get("uuid"),
        pci_bus_id=v.get("pci.bus_id") or record.bus,
        lost=record.error is not None,
        error=record.error,
        memory=Memory(*(v.get(name) for name in _MEMORY)),
        utilization_pct=v.get("utilization.gpu"),
        memory_utilization_pct=v.get("utilization.memory"),
        temperature_c=v.get("temperature.gpu"),
        power_w=next((v[k] for k in _POWER if k in v), None),
        power_limit_w=next((v[k] for k in _LIMIT if k in v), None),
        throttle=throttle,
        ecc=Ecc(**counts) if any(v is not None for v in counts.values()) else None,
        pstate=v.get("pstate"),
        mig_mode=v.get("mig.mode.current"),
    )


def _frames(records: list[_Record], file: str) -> tuple[SmiFrame, ...]:
    """Group records into samples. A record without a time (nvidia-smi's "cannot reach this
    GPU" line) joins the sample being read, or the next one if that has its GPU already. A GPU
    named only by its bus id gets the index of the rows with that bus id, else the index after
    the previous record's (nvidia-smi lists GPUs in index order)."""
    by_bus = {_bus_key(r.bus): r for r in records if r.bus and r.index is not None}
    by_index = {r.index: r for r in records if r.index is not None and r.error is None}
    highest = max(by_index, default=None)
    groups: list[tuple[float, int, dict[int, GpuState]]] = []
    pending: dict[int, GpuState] = {}  # GPUs nvidia-smi could not reach, for the next sample
    pending_line = 0
    index: int | None = None
    for record in records:
        known = by_bus.get(_bus_key(record.bus)) if record.bus else None
        if record.index is not None:
            index = record.index
        elif known is not None and known.index is not None:
            index = known.index
        else:
            index = 0 if index is None or highest is None or index >= highest else index + 1
        gpu = _gpu(record, index, known or by_index.get(index))
        if record.time is None:
            if pending or not groups or index in groups[-1][2]:
                pending_line = pending_line or record.line
                pending[index] = gpu
            else:
                groups[-1][2][index] = gpu
            continue
        if not groups or pending or index in groups[-1][2] or record.time - groups[-1][0] >= 1.0:
            groups.append((record.time, pending_line or record.line, pending))
            pending, pending_line = {}, 0
        groups[-1][2][index] = gpu
    if not groups:
        raise InputError.at(file, records[0].line, 1, "no timestamped GPU records", _LOG)
    if pending:  # the log ends with GPUs nvidia-smi could not reach: one more sample
        step = (groups[-1][0] - groups[0][0]) / (len(groups) - 1) if len(groups) > 1 else 1.0
        groups.append((groups[-1][0] + step, pending_line, pending))
    return tuple(SmiFrame(t, tuple(g[k] for k in sorted(g)), n) for t, n, g in groups)


def parse_smi_csv(
    text: str, *, file: str, columns: Sequence[str] | None = None, tz: str | None = None
) -> tuple[SmiFrame, ...]:
    """The frames in the text of an nvidia-smi CSV log, in time order; ``file`` names it in
    errors. ``columns`` is the column list for a log without a header; ``tz`` the zone of its
    naive timestamps (nvidia-smi writes the host's local time; default UTC)."""
    return _frames(_Reader(file, columns, tz).records(text.removeprefix("\ufeff")), file)


def load_smi_csv(
    path: str | Path, *, columns: Sequence[str] | None = None, tz: str | None = None
) -> tuple[SmiFrame, ...]:
    """The frames of the nvidia-smi CSV log at ``path`` (see ``parse_smi_csv``)."""
    file = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError.at(file, None, None, f"cannot read it ({exc.strerror})", _LOG) from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - data.rfind(b"\n", 0, exc.start)
        raise InputError.at(file, line, col, "this is not UTF-8 text", _LOG) from exc
    return parse_smi_csv(text, file=file, columns=columns, tz=tz)


class SmiCsvSource:
    """A recorded nvidia-smi log played back: the snapshot at ``now`` holds the last frame
    recorded at or before ``now - start_time`` seconds into the log (the first frame before
    the log starts, the last one after it ends). A GPU that is lost where the previous
    snapshot had it working also yields a ``gpu_lost`` event."""

    def __init__(
        self,
        path: str | Path,
        *,
        host: str | None = None,
        columns: Sequence[str] | None = None,
        tz: str | None = None,
    ) -> None:
        self.frames = load_smi_csv(path, columns=columns, tz=tz)
        self.name = f"smi-csv:{path}"
        self.host = host or Path(path).stem
        self.start_time = self.frames[0].time
        self._offsets = [round(f.time - self.start_time, 6) for f in self.frames]
        self.duration = self._offsets[-1]
        self._lost: dict[int, bool] | None = None

    def frame_at(self, now: float) -> SmiFrame:
        """The frame the snapshot at ``now`` shows."""
        position = bisect.bisect_right(self._offsets, now - self.start_time + 1e-6)
        return self.frames[max(0, position - 1)]

    def snapshot(self, now: float) -> Snapshot:
        gpus = self.frame_at(now).gpus
        before = self._lost or {}
        events = tuple(
            Event(EventKind.GPU_LOST, now, g.index, None, g.error or "GPU is lost")
            for g in gpus
            if g.lost and before.get(g.index) is False
        )
        self._lost = {g.index: g.lost for g in gpus}
        return Snapshot(
            host=self.host,
            time=now,
            gpus=gpus,
            events=events,
            source=self.name,
            processes_visible=False,  # a --query-gpu log has no per-process data
        )

    def close(self) -> None:
        """Nothing to release: the log was read whole when the source was made."""

    def __enter__(self) -> SmiCsvSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
