"""The lines of a recorded ``nvidia-smi --query-gpu=... --format=csv`` log, read into records.

The columns come from the header line nvidia-smi writes (``utilization.gpu [%]``, units in
brackets), from a ``# columns: timestamp,index,...`` comment, or from the caller (a list, or
the ``--query-gpu=...`` argument pasted as is); values may carry their units (``97 %``,
``52000 MiB``) or not (``nounits``). Only ``timestamp`` is required: a GPU is named by its
``index``, else its ``pci.bus_id``, else its ``uuid``, else by its row's place in the sampling
round (``sources/smi_csv.py`` works out which). nvidia-smi's markers for what it cannot tell
(``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``...) become ``None``; a row that says
``[GPU is lost]``, or nvidia-smi's ``Unable to determine the device handle`` line, becomes a
lost GPU. Unknown columns are ignored. A log re-saved by a spreadsheet in a locale that writes
decimal commas (fields separated by ``;``), or one whose numbers carry a decimal comma between
nvidia-smi's ``", "`` separators (``310,45 W``), is read where the comma cannot mean anything
else; a comma that could be a thousands separator (``1,000``) is an error.

``Reader`` turns the text into one ``Record`` per GPU per line (its time, index, bus id, error
and the values read by column kind), every error naming ``file:line:col``;
``sources/smi_csv.py`` groups the records into frames and plays them back.
"""

from __future__ import annotations

import csv
import functools
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpuwarden.errors import InputError, UsageError
from gpuwarden.model import THROTTLE_REASONS

REASON_PREFIX = "clocks_event_reasons."
_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}
ECC_COLUMNS = {  # column -> model.Ecc field
    f"ecc.errors.{kind}.{scope}.total": f"{scope}_{kind}"
    for scope in ("volatile", "aggregate")
    for kind in ("corrected", "uncorrected")
}
POWER_COLUMNS = ("power.draw", "power.draw.instant", "power.draw.average")
LIMIT_COLUMNS = ("enforced.power.limit", "power.limit")
MEMORY_COLUMNS = ("memory.total", "memory.used", "memory.free", "memory.reserved")
# column -> kind: how its values are read; columns not named here are ignored
_KINDS: dict[str, str] = {
    "timestamp": "timestamp",
    "index": "index",
    "pstate": "pstate",
    "temperature.gpu": "temp",
    "mig.mode.current": "enabled",
    REASON_PREFIX + "active": "mask",
    **dict.fromkeys(("name", "uuid", "pci.bus_id"), "text"),
    **dict.fromkeys(MEMORY_COLUMNS, "mib"),
    **dict.fromkeys(("utilization.gpu", "utilization.memory"), "pct"),
    **dict.fromkeys(POWER_COLUMNS + LIMIT_COLUMNS, "watts"),
    **dict.fromkeys(ECC_COLUMNS, "count"),
    **{REASON_PREFIX + name: "active" for name in THROTTLE_REASONS.values()},
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
_NUMBER = re.compile(r"(\d+,\d+|\d+(?:\.\d*)?|\.\d+)\s*(\S+)?")
_DECIMAL_COMMA = re.compile(r"(?<=\d),(?=\d)")  # 310,45: one number, not two fields
_PROTECTED = "\x1f"  # stands in for a decimal comma while a line is split into fields
_MASK = re.compile(r"0x[0-9a-f]+|\d+")
_PSTATE = re.compile(r"p(1[0-5]|\d)")
_SMI_TIME = re.compile(r"(\d{4})/(\d{1,2})/(\d{1,2}) (\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")
_NO_HANDLE = re.compile(
    r"Unable to determine the device handle for GPU\s*(?:(?P<index>\d{1,3})\s*:\s*)?"
    r"(?:(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]))?",
    re.IGNORECASE,
)
_REQUIRED = "a timestamp column (nvidia-smi --query-gpu=timestamp,index,...)"
#: How a GPU is named in a log, best first; "position" is its row's place in its round.
IDENTITIES = ("index", "pci.bus_id", "uuid")
EXPECTED_LOG = "an nvidia-smi --query-gpu=timestamp,index,... --format=csv log"
_HEADER = "a header line (nvidia-smi --format=csv) or a '# columns:' line"
_NOHEADER = (
    "this log was written with --format=csv,noheader: give the --query-gpu fields in order "
    "with --columns (the --query-gpu=... argument pasted as is works), or add a first line "
    "'# columns: timestamp,name,index,...'"
)
_BACK_HINT = (
    "two logs may have been joined, or the clock was set back: replay each part as its own "
    "file; nvidia-smi writes local time, so name the zone it was written in (tz=...)"
)
_CLOCK_SLACK_S = 2.0  # the clock stepping back this little (NTP) is smoothed over


@dataclass(frozen=True, slots=True)
class _Column:
    name: str  # canonical: lower case, no unit, aliases resolved
    kind: str | None  # None: a column gpuwarden does not read
    unit: str | None


@dataclass(slots=True)
class Record:
    """One GPU on one line: a CSV row, or nvidia-smi's message that it cannot reach a GPU."""

    line: int
    time: float | None = None
    index: int | None = None
    bus: str | None = None
    uuid: str | None = None
    error: str | None = None
    values: dict[str, Any] = field(default_factory=dict)  # column -> value read as its kind


_Fields = list[tuple[str, int]]  # the fields of one line, each with its 1-based column
_Columns = tuple[_Column, ...]


def delimiter_of(line: str) -> str:
    """``;`` for a line a spreadsheet re-saved in a decimal-comma locale, else ``,``
    (nothing nvidia-smi writes contains a semicolon)."""
    return ";" if ";" in line else ","


def protect_decimal_commas(line: str) -> str:
    """In a line separated the way nvidia-smi separates fields (``", "``), a comma between two
    digits cannot be a separator: it is a decimal comma, kept inside its field. Same length."""
    if ", " not in line or "," not in line.replace(", ", ""):
        return line
    return _DECIMAL_COMMA.sub(_PROTECTED, line)


def _split(line: str, start: int = 0, delimiter: str = ",") -> list[str]:
    """The fields of a CSV line from ``start`` on, stripped."""
    text = line[start:]
    if '"' not in text and text.strip():  # what nvidia-smi writes: no quoting to undo
        fields = [v.strip() for v in text.split(delimiter)]
    else:
        reader = csv.reader([text], skipinitialspace=True, delimiter=delimiter)
        fields = [v.strip() for v in next(reader, [])]
    if _PROTECTED in text:
        fields = [v.replace(_PROTECTED, ",") for v in fields]
    return fields


def _starts(line: str, start: int = 0, delimiter: str = ",") -> list[int]:
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
        while pos < end and (quoted or line[pos] != delimiter):
            if quoted and line[pos] == '"':
                quoted = line[pos + 1 : pos + 2] == '"'
                pos += quoted
            pos += 1
        pos += 1
    return cols


def _located(line: str, start: int = 0) -> _Fields:
    delimiter = delimiter_of(line)
    fields = _split(line, start, delimiter)
    return list(zip(fields, _starts(line, start, delimiter), strict=True))


_QUERY_ARGUMENT = re.compile(r"""--query-gpu(?:=|\s+)(["']?)(?P<list>[^"'\s]+)\1""")


def split_columns(text: str) -> list[str]:
    """The column names in ``--columns``: a comma-separated list (``timestamp,index,memory.used
    [MiB]``), or a command line or ``--query-gpu=...`` argument pasted as is."""
    query = _QUERY_ARGUMENT.search(text)
    listed = query["list"] if query else text
    return [name.strip() for name in listed.split(",") if name.strip()]


def identity_of(columns: Sequence[_Column]) -> str:
    """How the rows of a log with these columns name their GPU (see ``IDENTITIES``)."""
    names = {c.name for c in columns}
    return next((n for n in IDENTITIES if n in names), "position")


def _columns(fields: _Fields, file: str, line: int | None) -> _Columns:
    columns: list[_Column] = []
    for text, col in fields:
        base, _, units = text.partition("[")
        name = base.strip().lower().removeprefix("--query-gpu=")
        name = _ALIASES.get(name, name).replace("clocks_throttle_reasons.", REASON_PREFIX)
        kind, written = _KINDS.get(name), units.rstrip("]").strip()
        unit = written.lower() or None
        if any(c.name == name for c in columns):
            raise InputError.at(file, line, col, f"column {name} twice", "each column once")
        if kind is not None and unit is not None and unit not in _UNITS.get(kind, {}):
            raise InputError.at(file, line, col, f"unit [{written}] for {name}", _EXPECTED[kind])
        columns.append(_Column(name, kind, unit))
    if all(c.name != "timestamp" for c in columns):
        hint = "nvidia-smi writes the time of each row only when the query asks for it"
        raise InputError.at(file, line, line and 1, "no timestamp column", _REQUIRED, hint)
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
    digits = number[1]
    if "," in digits:
        whole, fraction = digits.split(",")
        if len(fraction) == 3 or kind in ("index", "count", "pct", "temp"):
            raise ValueError(f"has a comma that may separate thousands: {text!r}")
        digits = f"{whole}.{fraction}"
    value = float(digits) * units.get(unit, 1.0)
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


class Reader:
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
        self.delimiter = ","  # the file's (a spreadsheet's re-save uses ";")

    def fail(self, line: int, col: int, what: str, expected: str, hint: str = "") -> InputError:
        """An error at line:col; ``expected`` is a column kind or the words themselves."""
        expected = _EXPECTED.get(expected, expected)
        return InputError.at(self.file, line, col, what, expected, hint or None)

    def records(self, text: str) -> list[Record]:
        return list(self.iter_records(text.split("\n")))

    def iter_records(self, lines: Iterable[str]) -> Iterator[Record]:
        """The records of the log's lines (split at ``\\n``), one at a time, as they are
        read; an error is raised where its line is reached."""
        columns, last, any_record = self.given, 0, False
        for number, text_line in enumerate(lines, start=1):
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
                any_record = True
                yield Record(number, index=index, bus=handle["bus"], error=line)
                continue
            if not any_record:  # the file's delimiter, told by its first lines
                self.delimiter = delimiter_of(raw)
            if self.delimiter == ",":
                raw = protect_decimal_commas(raw)
            fields = _split(raw, 0, self.delimiter)
            if all(_HEADER_FIELD.fullmatch(t) for t in fields):
                columns = _columns(_located(raw), self.file, number)
            elif columns is None:
                raise self.fail(number, 1, "a record before any column names", _HEADER, _NOHEADER)
            else:
                any_record = True
                yield self.row(fields, columns, number, raw)
        if not any_record:
            raise self.fail(
                last or 1, 1, "no GPU records" if last else "the file is empty", EXPECTED_LOG
            )

    def starts(self, raw: str) -> list[int]:
        return _starts(raw, 0, self.delimiter)

    def row(self, fields: list[str], columns: _Columns, number: int, raw: str) -> Record:
        if len(fields) != len(columns):
            more = len(fields) > len(columns)
            col = self.starts(raw)[len(columns)] if more else len(raw) + 1
            what = f"{len(fields)} fields in a row of {len(columns)} columns"
            names = f"{len(columns)} values ({', '.join(c.name for c in columns)})"
            raise self.fail(number, col, what, names)
        record = Record(number)
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
                    col = self.starts(raw)[i]
                    raise self.fail(number, col, f"{column.name} {exc}", column.kind) from None
        record.index, record.bus = record.values.pop("index", None), record.values.get("pci.bus_id")
        record.uuid = record.values.get("uuid")
        for name, got in (("timestamp", record.time), ("index", record.index)):
            if got is not None or record.error is not None:
                continue
            where = next((i for i, c in enumerate(columns) if c.name == name), None)
            if where is not None:
                col = self.starts(raw)[where]
                raise self.fail(number, col, f"this row has no {name}", name)
        return record

    def timestamp(self, text: str, line: int, raw: str, field: int) -> float:
        try:
            when = _datetime(text)
        except ValueError:
            col = self.starts(raw)[field]
            raise self.fail(line, col, f"not a timestamp: {text!r}", "timestamp") from None
        naive = when.tzinfo is None
        seconds = when.replace(tzinfo=self.zone).timestamp() if naive else when.timestamp()
        prev = self.prev_time if self.prev_time is not None else seconds
        if naive and seconds < prev - _CLOCK_SLACK_S:
            # the hour that repeats when daylight saving time ends: its second pass
            seconds = max(seconds, when.replace(tzinfo=self.zone, fold=1).timestamp())
        if seconds < prev - _CLOCK_SLACK_S:
            what = f"the time goes back to {text}"
            raise self.fail(line, self.starts(raw)[field], what, "rows in time order", _BACK_HINT)
        self.prev_time = max(seconds, prev)
        return self.prev_time
