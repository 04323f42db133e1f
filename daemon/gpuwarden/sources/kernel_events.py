"""Kernel-log events in a source's snapshots: live (``sources/kmsg.py``) or replayed from a file.

``WithEvents`` wraps any source: each snapshot carries, besides the source's own events, what
the driver reported in the kernel log since the previous snapshot. The driver names a GPU by
its PCI bus id; it becomes the GPU's index through the bus ids the source's snapshots report
(learned from every snapshot, so a GPU that is lost by now keeps its index), or through the
UUID the driver printed for that bus id. A report about a bus id no GPU of the source has keeps
``gpu`` empty and says so in its detail. XID numbers keep their meaning in ``gpuwarden.xid``.

``ReplayFeed`` plays a saved kernel log (``--events dmesg:FILE``) alongside a replayed
source: its time stamps are placed on the recording's clock (see ``bind``), and each report is
carried once, by the first snapshot at or after its time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psutil

from gpuwarden.errors import UsageError
from gpuwarden.model import Event, EventKind, GpuState, Snapshot
from gpuwarden.sources import Source, kernel_log
from gpuwarden.sources.kernel_log import Report, Uuid, pci_key

Said = Report | Uuid


class EventFeed(Protocol):
    """Kernel-log reports, taken once per snapshot."""

    name: str

    def bind(self, origin: float | None) -> None:
        """Called once, with the start of the recording the feed is played alongside
        (``None`` for a live source), before the first ``take``."""

    def take(self, now: float) -> list[tuple[float, Said]]:
        """The reports due by ``now`` (the recording's own clock) not taken yet, with their
        times on that clock."""

    def close(self) -> None: ...


def zone_of(tz: str | None) -> ZoneInfo:
    try:
        return ZoneInfo(tz or "UTC")
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise UsageError(f"unknown time zone {tz!r}", "name one such as Europe/Berlin") from exc


class ReplayFeed:
    """The reports of a saved kernel log, played back in time order.

    Where its time stamps count seconds since boot (plain ``dmesg``), the boot is at
    ``boot_time`` if given, else at the start of the recording (``bind``'s ``origin``), else,
    alongside a live source, at this machine's boot. Local times (``dmesg -T``,
    ``journalctl -k``) are in ``tz`` (default UTC); a stamp without a year takes the year that
    puts it nearest to the recording's start (or now). Alongside a recording, reports from
    before its start are left out."""

    def __init__(
        self, path: str | Path, *, tz: str | None = None, boot_time: float | None = None
    ) -> None:
        self.name = f"dmesg:{path}"
        self.entries = kernel_log.load(path)
        self._zone = zone_of(tz)
        self._boot_time = boot_time
        self._due: list[tuple[float, Said]] = []
        self._next = 0
        self._floor: float | None = None
        self.bind(None)

    def bind(self, origin: float | None) -> None:
        reference = origin if origin is not None else time.time()
        boot = self._boot_time
        if boot is None:
            boot = origin if origin is not None else psutil.boot_time()
        timed = [
            (
                kernel_log.resolve(e.stamp, zone=self._zone, boot=boot, reference=reference),
                e.says,
            )
            for e in self.entries
        ]
        self._due = sorted(timed, key=lambda item: item[0])
        self._next = 0
        self._floor = origin

    @property
    def times(self) -> list[float]:
        """When each report happened, in order (for tests and ``status``)."""
        return [t for t, _ in self._due]

    def take(self, now: float) -> list[tuple[float, Said]]:
        out: list[tuple[float, Said]] = []
        while self._next < len(self._due) and self._due[self._next][0] <= now + 1e-6:
            when, said = self._due[self._next]
            self._next += 1
            if isinstance(said, Uuid) or self._floor is None or when >= self._floor - 1e-6:
                out.append((when, said))
        return out

    def close(self) -> None:
        """Nothing to release: the file was read whole."""


class WithEvents:
    """``source``'s snapshots with the reports of ``feeds`` as events (see the module's text).
    Anything else (``start_time``, ``duration``, ``job_of``...) is the source's own."""

    def __init__(self, source: Source, feeds: Sequence[EventFeed]) -> None:
        self.inner = source
        self.feeds = list(feeds)
        self.name = f"{source.name} with {', '.join(f.name for f in self.feeds)}"
        self._origin: float | None = getattr(source, "start_time", None)
        self._gpu_by_bus: dict[tuple[int, int, int], int] = {}
        self._gpu_by_uuid: dict[str, int] = {}
        self._uuid_by_bus: dict[tuple[int, int, int], str] = {}
        self._gpus_seen: tuple[GpuState, ...] | None = None
        for feed in self.feeds:
            feed.bind(self._origin)

    @property
    def start_time(self) -> float:
        return float(self.inner.start_time)  # type: ignore[attr-defined]

    @start_time.setter
    def start_time(self, value: float) -> None:
        self.inner.start_time = value  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copying): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    def snapshot(self, now: float) -> Snapshot:
        snap = self.inner.snapshot(now)
        if snap.gpus is not self._gpus_seen:  # the same GPUs as last time: nothing to learn
            self._gpus_seen = snap.gpus
            for gpu in snap.gpus:
                key = pci_key(gpu.pci_bus_id)
                if key is not None:
                    self._gpu_by_bus[key] = gpu.index
                if gpu.uuid:
                    self._gpu_by_uuid[gpu.uuid] = gpu.index
        shift = 0.0 if self._origin is None else self.start_time - self._origin
        taken = [(w, s) for feed in self.feeds for w, s in feed.take(now - shift)]
        if not taken:
            return snap
        lost = {e.gpu for e in snap.events if e.kind is EventKind.GPU_LOST}
        events: list[Event] = []
        for when, said in taken:
            key = pci_key(said.bus)
            if isinstance(said, Uuid):
                if key is not None:
                    self._uuid_by_bus[key] = said.uuid
                continue
            event = self._event(said, when + shift, key)
            if event.kind is EventKind.GPU_LOST and event.gpu is not None:
                if event.gpu in lost:
                    continue  # the source saw it turn lost in this very snapshot
                lost.add(event.gpu)
            events.append(event)
        if not events:
            return snap
        merged = sorted((*snap.events, *events), key=lambda e: e.time)
        return replace(snap, events=tuple(merged))

    def peek(self, now: float) -> Snapshot:
        """The source's own second look; the feeds keep their reports for the next snapshot."""
        look = getattr(self.inner, "peek", self.inner.snapshot)
        snap: Snapshot = look(now)
        return snap

    def _event(self, report: Report, when: float, key: tuple[int, int, int] | None) -> Event:
        gpu = None if key is None else self._gpu_by_bus.get(key)
        if gpu is None and key is not None and key in self._uuid_by_bus:
            gpu = self._gpu_by_uuid.get(self._uuid_by_bus[key])
        detail = report.detail
        if gpu is None:
            detail += " (no GPU of this source has that bus id)"
        return Event(report.kind, when, gpu, report.xid, detail)

    def close(self) -> None:
        try:
            for feed in self.feeds:
                feed.close()
        finally:
            self.inner.close()
