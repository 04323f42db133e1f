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
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

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


def _name_gpus(records: list[Record]) -> None:
    """Give an index to every timed row of a log without an index column: by its bus id, its
    UUID or its place in its round (see the module's text). A lost row of a log that names
    GPUs by bus id or UUID keeps none: ``_frames`` places it after the row before it."""
    timed = [r for r in records if r.time is not None and r.index is None]
    if not timed:
        return
    buses = sorted({_bus_key(r.bus) for r in timed if r.bus}, key=_pci_order)
    bus_index = {bus: i for i, bus in enumerate(buses)}
    uuid_index: dict[str, int] = {}
    for record in timed:
        if record.uuid and not record.bus:
            uuid_index.setdefault(record.uuid, len(uuid_index))
    by_position = not bus_index and not uuid_index
    gap = _round_gap([r.time or 0.0 for r in timed]) if by_position else 0.0
    position, previous = 0, None
    for record in timed:
        time = record.time or 0.0
        position = (
            0
            if previous is None or (time - previous > 0 and time - previous >= gap)
            else position + 1
        )
        previous = time
        if record.bus:
            record.index = bus_index[_bus_key(record.bus)]
        elif record.uuid:
            record.index = uuid_index[record.uuid]
        elif by_position:
            record.index = position


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


def _frames(records: list[Record], file: str) -> tuple[SmiFrame, ...]:
    """Group records into samples. A record without a time (nvidia-smi's "cannot reach this
    GPU" line) joins the sample being read, or the next one if that has its GPU already. A GPU
    named only by its bus id gets the index of the rows with that bus id, else the index after
    the previous record's (nvidia-smi lists GPUs in index order)."""
    _name_gpus(records)
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
        raise InputError.at(file, records[0].line, 1, "no timestamped GPU records", EXPECTED_LOG)
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
    return _frames(Reader(file, columns, tz).records(text.removeprefix("\ufeff")), file)


def load_smi_csv(
    path: str | Path, *, columns: Sequence[str] | None = None, tz: str | None = None
) -> tuple[SmiFrame, ...]:
    """The frames of the nvidia-smi CSV log at ``path`` (see ``parse_smi_csv``)."""
    text = logtext.read(path, EXPECTED_LOG)
    return parse_smi_csv(text, file=str(path), columns=columns, tz=tz)


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
        return self.frames[self._number_at(now) - 1]

    def _number_at(self, now: float) -> int:
        position = bisect.bisect_right(self._offsets, now - self.start_time + 1e-6)
        return max(1, position)

    def sample_offset(self, number: int) -> float:
        """Seconds from the log's start to its ``number``th sample (1 is the first)."""
        if not 1 <= number <= len(self.frames):
            raise UsageError(
                f"{self.name}: there is no sample {number}: the log has {len(self.frames)}",
                f"pick one from 1 to {len(self.frames)}",
            )
        return self._offsets[number - 1]

    def position(self, now: float) -> str:
        """Which sample the snapshot at ``now`` shows, for people: its number, line and time."""
        number = self._number_at(now)
        frame = self.frames[number - 1]
        taken = datetime.fromtimestamp(frame.time, UTC).isoformat(timespec="milliseconds")
        return (
            f"sample {number} of {len(self.frames)} (line {frame.line}), "
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
        """Nothing to release: the log was read whole when the source was made."""

    def __enter__(self) -> SmiCsvSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
