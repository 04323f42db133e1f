"""Replay a recorded ``nvidia-smi --query-gpu=... --format=csv -l 1`` log as a Source.

``sources/smi_csv_records.py`` reads the log's lines into per-GPU records (columns, units,
nvidia-smi's markers, lost GPUs); this module turns them into ``GpuState`` and plays them back.

A row names its GPU by its ``index`` column; a log without one names it by ``pci.bus_id`` (GPUs
numbered in PCI bus order, as nvidia-smi numbers them), else by ``uuid`` (numbered in the order
they first appear), else by the row's place in its sampling round. Rounds are told apart by
time: nvidia-smi reads the GPUs of one round a few milliseconds apart, so a row taken at least
``ROUND_GAP_S`` after the previous one (or half the sampling interval, for a log sampled faster
than every 200 ms) begins a new round.

Rows are then grouped into frames, one per sample: a row starts a new frame when its GPU index
is already in the current one, or when it was taken a second or more after the frame's first
row (one sample of all GPUs takes well under a second, so a sample that straddles a second
boundary stays one frame). A frame's time is its first row's. The log has no per-process data:
snapshots carry GPUs only.

A log is never held whole: ``SmiLog`` surveys it once when it opens (checking every row, and
keeping only how its GPUs are named and placed and how many samples it has) and then reads it
again, a chunk at a time, as it plays, so a month of samples plays in the memory of a day.
"""

from __future__ import annotations

import codecs
import functools
import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuwarden.errors import InputError, UsageError
from gpuwarden.model import THROTTLE_REASONS, Ecc, Event, EventKind, GpuState, Memory, Snapshot
from gpuwarden.sources import logtext
from gpuwarden.sources.smi_csv_records import (
    ECC_COLUMNS,
    EXPECTED_LOG,
    LIMIT_COLUMNS,
    MEMORY_COLUMNS,
    POWER_COLUMNS,
    REASON_PREFIX,
    Reader,
    Record,
)


@dataclass(frozen=True, slots=True)
class SmiFrame:
    """One sample of every GPU in the log; ``line`` is where its first record is."""

    time: float
    gpus: tuple[GpuState, ...]
    line: int


ROUND_GAP_S = 0.1  # rows this far apart belong to two sampling rounds (see the module's text)


@functools.lru_cache(maxsize=1024)
def _bus_key(bus: str) -> str:
    """One spelling of a PCI bus id: rows write ``00000000:3B:00.0``, messages ``0000:3b:00.0``."""
    domain, _, rest = bus.lower().partition(":")
    return f"{int(domain, 16):x}:{rest}" if re.fullmatch(r"[0-9a-f]{1,8}", domain) else bus.lower()


def _pci_order(key: str) -> tuple[int, ...]:
    """A bus id's place in PCI order (domain, bus, device, function); unreadable ones last."""
    parts = re.split(r"[:.]", key)
    try:
        return tuple(int(p, 16) for p in parts)
    except ValueError:
        return (1 << 32,)


def _round_gap(times: list[float]) -> float:
    """How far apart two rows must be to belong to two rounds: ``ROUND_GAP_S``, or half the
    sampling interval (read as the 99th percentile of the gaps between rows) when that is
    less; 0 when every row has the same time (one round)."""
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    if not gaps:
        return 0.0
    interval = gaps[math.ceil(0.99 * (len(gaps) - 1))]
    return min(ROUND_GAP_S, interval / 2)


@dataclass
class _Names:
    """How a log without an index column names its GPUs (see the module's text), gathered
    from all its rows: the PCI order of the bus ids, the order UUIDs first appear in, and
    (only for a log naming GPUs by neither) the times of the rows, for the round gap."""

    buses: set[str] = field(default_factory=set)
    uuids: dict[str, int] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)  # while no row has a bus id or UUID
    unnamed: bool = False  # a timed row without an index

    def see(self, record: Record) -> None:
        if record.time is None or record.index is not None:
            return
        self.unnamed = True
        if record.bus:
            self.buses.add(_bus_key(record.bus))
        elif record.uuid:
            self.uuids.setdefault(record.uuid, len(self.uuids))
        if self.buses or self.uuids:
            self.times.clear()
        else:
            self.times.append(record.time)

    def namer(self) -> Callable[[Record], None] | None:
        """What gives each timed row without an index its index, one row after the other
        from the log's first (a new one for each reading); None when every timed row has
        one."""
        if not self.unnamed:
            return None
        bus_index = {bus: i for i, bus in enumerate(sorted(self.buses, key=_pci_order))}
        uuid_index = self.uuids
        by_position = not bus_index and not uuid_index
        gap = _round_gap(self.times) if by_position else 0.0
        state: list[Any] = [0, None]  # position in the round, the previous row's time

        def name(record: Record) -> None:
            if record.time is None or record.index is not None:
                return
            time = record.time or 0.0
            position, previous = state
            position = (
                0
                if previous is None or (time - previous > 0 and time - previous >= gap)
                else position + 1
            )
            state[:] = [position, time]
            if record.bus:
                record.index = bus_index[_bus_key(record.bus)]
            elif record.uuid:
                record.index = uuid_index[record.uuid]
            elif by_position:
                record.index = position

        return name


def _name_gpus(records: list[Record]) -> None:
    """Give an index to every timed row of a log without an index column: by its bus id, its
    UUID or its place in its round (see the module's text). A lost row of a log that names
    GPUs by bus id or UUID keeps none: ``_frames`` places it after the row before it."""
    names = _Names()
    for record in records:
        names.see(record)
    name = names.namer()
    if name is not None:
        for record in records:
            name(record)


def _gpu(record: Record, index: int, identity: Record | None) -> GpuState:
    v = record.values
    if identity is not None and record.error is not None:  # a lost GPU keeps its name
        v = {k: identity.values.get(k) for k in ("name", "uuid", "pci.bus_id")} | v
    mask = v.get(REASON_PREFIX + "active")
    throttle = None
    if mask is not None or any(k.startswith(REASON_PREFIX) for k in v):
        throttle = tuple(
            n for b, n in THROTTLE_REASONS.items() if (mask or 0) & b or v.get(REASON_PREFIX + n)
        )
    counts = {attr: v.get(name) for name, attr in ECC_COLUMNS.items()}
    return GpuState(
        index=index,
        name=v.get("name"),
        uuid=v.get("uuid"),
        pci_bus_id=v.get("pci.bus_id") or record.bus,
        lost=record.error is not None,
        error=record.error,
        memory=Memory(*(v.get(name) for name in MEMORY_COLUMNS)),
        utilization_pct=v.get("utilization.gpu"),
        memory_utilization_pct=v.get("utilization.memory"),
        temperature_c=v.get("temperature.gpu"),
        power_w=next((v[k] for k in POWER_COLUMNS if k in v), None),
        power_limit_w=next((v[k] for k in LIMIT_COLUMNS if k in v), None),
        throttle=throttle,
        ecc=Ecc(**counts) if any(v is not None for v in counts.values()) else None,
        pstate=v.get("pstate"),
        mig_mode=v.get("mig.mode.current"),
    )


@dataclass
class _Known:
    """What placing a record needs from the whole log: the last record of each bus id and of
    each index (a lost GPU keeps that one's name), and the highest index."""

    by_bus: dict[str, Record] = field(default_factory=dict)
    by_index: dict[int, Record] = field(default_factory=dict)
    highest: int | None = None

    def see(self, record: Record) -> None:
        if record.index is None:
            return
        if record.bus:
            self.by_bus[_bus_key(record.bus)] = record
        if record.error is None:
            self.by_index[record.index] = record
            if self.highest is None or record.index > self.highest:
                self.highest = record.index


# One sample before its GPUs are built: its time, its first line, each GPU's record and the
# record whose name a lost GPU keeps.
_Group = tuple[float, int, dict[int, tuple[Record, Record | None]]]


@dataclass
class _Survey:
    """The whole log read once, keeping only what playback needs before its first sample:
    how GPUs are named and placed, how many samples there are, and when."""

    names: _Names | None  # None: every timed row has its index
    known: _Known
    timed: int = 0  # samples with a time of their own
    first: float = 0.0
    last: float = 0.0  # the time of the last of those
    lost_tail: bool = False  # one more sample: GPUs nvidia-smi could not reach at the end

    def count(self, groups: Iterable[_Group]) -> None:
        for time, _line, _gpus in groups:
            if math.isnan(time):
                self.lost_tail = True
            else:
                self.timed, self.first = self.timed + 1, self.first if self.timed else time
                self.last = time

    @property
    def samples(self) -> int:
        return self.timed + self.lost_tail

    def time_of(self, group: _Group) -> _Group:
        """``group`` with its time: the extra sample at the end comes a sampling interval
        after the last one."""
        if not math.isnan(group[0]):
            return group
        step = (self.last - self.first) / (self.timed - 1) if self.timed > 1 else 1.0
        return (self.last + step, group[1], group[2])

    @property
    def end(self) -> float:
        """The time of the last sample."""
        return self.time_of((math.nan, 0, {}))[0] if self.lost_tail else self.last


def _groups(records: Iterable[Record], known: _Known) -> Iterator[_Group]:
    """Records grouped into samples, in order. A record without a time (nvidia-smi's "cannot
    reach this GPU" line) joins the sample being read, or the next one if that has its GPU
    already. A GPU named only by its bus id gets the index of the rows with that bus id, else
    the index after the previous record's (nvidia-smi lists GPUs in index order). A log that
    ends with GPUs nvidia-smi could not reach has one more sample, whose time (``nan`` here)
    is a sampling interval after the last (``_Survey.time_of``)."""
    by_bus, by_index, highest = known.by_bus, known.by_index, known.highest
    current: _Group | None = None
    pending: dict[int, tuple[Record, Record | None]] = {}  # GPUs not reached, for the next
    pending_line = 0
    index: int | None = None
    for record in records:
        found = by_bus.get(_bus_key(record.bus)) if record.bus else None
        if record.index is not None:
            index = record.index
        elif found is not None and found.index is not None:
            index = found.index
        else:
            index = 0 if index is None or highest is None or index >= highest else index + 1
        entry = (record, found or by_index.get(index))
        if record.time is None:
            if pending or current is None or index in current[2]:
                pending_line = pending_line or record.line
                pending[index] = entry
            else:
                current[2][index] = entry
            continue
        if current is None or pending or index in current[2] or record.time - current[0] >= 1.0:
            if current is not None:
                yield current
            current = (record.time, pending_line or record.line, pending)
            pending, pending_line = {}, 0
        current[2][index] = entry
    if current is None:
        return
    yield current
    if pending:
        yield (math.nan, pending_line, pending)


def _frame(group: _Group) -> SmiFrame:
    time, line, gpus = group
    return SmiFrame(
        time, tuple(_gpu(record, i, known) for i, (record, known) in sorted(gpus.items())), line
    )


def _frames(records: list[Record], file: str) -> tuple[SmiFrame, ...]:
    """Group records into samples (see ``_groups``)."""
    _name_gpus(records)
    known = _Known()
    for record in records:
        known.see(record)
    groups = list(_groups(records, known))
    if not groups:
        raise InputError.at(file, records[0].line, 1, "no timestamped GPU records", EXPECTED_LOG)
    survey = _Survey(None, known)
    survey.count(groups)
    return tuple(_frame(survey.time_of(g)) for g in groups)


def parse_smi_csv(
    text: str, *, file: str, columns: Sequence[str] | None = None, tz: str | None = None
) -> tuple[SmiFrame, ...]:
    """The frames in the text of an nvidia-smi CSV log, in time order; ``file`` names it in
    errors. ``columns`` is the column list for a log without a header; ``tz`` the zone of its
    naive timestamps (nvidia-smi writes the host's local time; default UTC)."""
    return _frames(Reader(file, columns, tz).records(text.removeprefix("\ufeff")), file)


def load_smi_csv(
    path: str | Path, *, columns: Sequence[str] | None = None, tz: str | None = None
) -> tuple[SmiFrame, ...]:
    """The frames of the nvidia-smi CSV log at ``path`` (see ``parse_smi_csv``), all at once;
    ``SmiLog`` reads them one at a time."""
    return tuple(SmiLog(path, columns=columns, tz=tz).frames())


_CHUNK = 1 << 16  # bytes read at a time


def _lines(path: str | Path) -> Iterator[str]:
    """The lines of a log file (split at ``\\n``), decoded as ``logtext.read`` decodes the
    whole file, read a chunk at a time."""
    file = str(path)
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise InputError.at(
            file, None, None, f"cannot read it ({exc.strerror})", EXPECTED_LOG
        ) from exc
    with handle:
        data = handle.read(_CHUNK)
        encoding, skip = logtext.encoding_of(data)
        decoder = codecs.getincrementaldecoder(encoding)()
        data, pending, started = data[skip:], "", False
        while True:
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError:
                logtext.read(path, EXPECTED_LOG)  # says where, line and column
                raise
            if not started and text:
                text, started = text.removeprefix("\ufeff"), True
            parts = (pending + text).split("\n")
            pending = parts.pop()
            yield from parts
            if not data:
                break
            data = handle.read(_CHUNK)
    yield pending


class SmiLog:
    """An nvidia-smi CSV log on disk, read as a stream: ``frames()`` yields its samples one
    at a time, so a month of a large node plays back in the memory a day takes. Opening it
    surveys the whole log (every row is checked, so an error is raised before playback
    starts) and keeps only how GPUs are named and placed, how many samples there are and
    when; each playback reads the file again. A log that names GPUs by bus id, UUID or
    position instead of by index, or that has rows nvidia-smi could not read, is surveyed
    twice (how a row is named or placed depends on the rows after it)."""

    def __init__(
        self, path: str | Path, *, columns: Sequence[str] | None = None, tz: str | None = None
    ) -> None:
        self.path, self.file, self.columns, self.tz = path, str(path), columns, tz
        self.survey = self._survey()

    def _records(self, names: _Names | None = None) -> Iterator[Record]:
        namer = names.namer() if names is not None else None
        for record in Reader(self.file, self.columns, self.tz).iter_records(_lines(self.path)):
            if namer is not None:
                namer(record)
            yield record

    def _survey(self) -> _Survey:
        names, known = _Names(), _Known()
        first_line = 0
        guessed = False  # a row placed by what the rows after it may change

        def seen(records: Iterator[Record]) -> Iterator[Record]:
            nonlocal first_line, guessed
            for record in records:
                first_line = first_line or record.line
                names.see(record)
                guessed = guessed or (record.index is None and record.time is None)
                known.see(record)
                yield record

        survey = _Survey(None, known)
        survey.count(_groups(seen(self._records()), known))
        if names.unnamed or guessed:  # again, with the whole log's names and places
            named = names if names.unnamed else None
            known = _Known()
            for record in self._records(named):
                known.see(record)
            survey = _Survey(named, known)
            survey.count(_groups(self._records(named), known))
        if not survey.samples:
            raise InputError.at(
                self.file, first_line, 1, "no timestamped GPU records", EXPECTED_LOG
            )
        return survey

    def frames(self) -> Iterator[SmiFrame]:
        """The log's samples, in order, read from the file as they are asked for."""
        survey = self.survey
        for group in _groups(self._records(survey.names), survey.known):
            yield _frame(survey.time_of(group))


class SmiCsvSource:
    """A recorded nvidia-smi log played back: the snapshot at ``now`` holds the last frame
    recorded at or before ``now - start_time`` seconds into the log (the first frame before
    the log starts, the last one after it ends). A GPU that is lost where the previous
    snapshot had it working also yields a ``gpu_lost`` event.

    The log is read as it plays (``SmiLog``): moving forward reads on, moving back reads it
    again from the start, so memory stays the same however long the log is."""

    def __init__(
        self,
        path: str | Path,
        *,
        host: str | None = None,
        columns: Sequence[str] | None = None,
        tz: str | None = None,
    ) -> None:
        self.log = SmiLog(path, columns=columns, tz=tz)
        survey = self.log.survey
        self.name = f"smi-csv:{path}"
        self.host = host or Path(path).stem
        self.start_time = survey.first
        self.duration = self._offset(survey.end)
        self.samples = survey.samples
        self._lost: dict[int, bool] | None = None
        self._reading: Iterator[tuple[int, SmiFrame]] = iter(())
        self._at: tuple[int, SmiFrame] | None = None  # the frame last shown, and its number
        self._next: tuple[int, SmiFrame] | None = None  # the one after it, read ahead

    @property
    def frames(self) -> tuple[SmiFrame, ...]:
        """Every frame of the log (read whole: for looking at a short log, not for playing)."""
        return tuple(self.log.frames())

    def _offset(self, time: float) -> float:
        """Seconds into the log (``start_time`` may be moved: the log's own start stays)."""
        return round(time - self.log.survey.first, 6)

    def _rewind(self) -> None:
        self._reading = enumerate(self.log.frames(), start=1)
        self._at = next(self._reading)
        self._next = next(self._reading, None)

    def _seek(self, target: float) -> tuple[int, SmiFrame]:
        """The last frame at or before ``target`` seconds into the log (the first before it
        starts), and its number."""
        if self._at is None or (self._at[0] > 1 and self._offset(self._at[1].time) > target):
            self._rewind()
        assert self._at is not None
        while self._next is not None and self._offset(self._next[1].time) <= target:
            self._at, self._next = self._next, next(self._reading, None)
        return self._at

    def frame_at(self, now: float) -> SmiFrame:
        """The frame the snapshot at ``now`` shows."""
        return self._seek(now - self.start_time + 1e-6)[1]

    def sample_offset(self, number: int) -> float:
        """Seconds from the log's start to its ``number``th sample (1 is the first)."""
        if not 1 <= number <= self.samples:
            raise UsageError(
                f"{self.name}: there is no sample {number}: the log has {self.samples}",
                f"pick one from 1 to {self.samples}",
            )
        frame = next(itertools.islice(self.log.frames(), number - 1, None))
        return self._offset(frame.time)

    def position(self, now: float) -> str:
        """Which sample the snapshot at ``now`` shows, for people: its number, line and time."""
        number, frame = self._seek(now - self.start_time + 1e-6)
        taken = datetime.fromtimestamp(frame.time, UTC).isoformat(timespec="milliseconds")
        return (
            f"sample {number} of {self.samples} (line {frame.line}), "
            f"taken {taken.replace('+00:00', 'Z')}"
        )

    def job_of(self, pid: int) -> str | None:
        """A --query-gpu log names no process."""
        del pid
        return None

    def vanish(self, pid: int) -> bool:
        """Drills: there is no process to take away."""
        del pid
        return False

    def snapshot(self, now: float) -> Snapshot:
        return self._snapshot(now, consume=True)

    def peek(self, now: float) -> Snapshot:
        """``snapshot`` without events, leaving them to the next one (see ``Source``)."""
        return self._snapshot(now, consume=False)

    def _snapshot(self, now: float, *, consume: bool) -> Snapshot:
        gpus = self.frame_at(now).gpus
        events: tuple[Event, ...] = ()
        if consume:
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
        """Nothing to release: the log is opened for each reading and closed after it."""
        self._reading = iter(())
        self._at = self._next = None

    def __enter__(self) -> SmiCsvSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
