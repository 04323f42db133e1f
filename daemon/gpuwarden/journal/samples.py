"""Telemetry around incidents, kept for reports: what each GPU in an incident's scope did.

The journal records decisions; a report also draws the curves those decisions were made on.
While an incident is open, and for ``tail`` seconds after it resolves, every tick's reading of
its GPU (of every GPU for an incident without one) is kept: the gauges a rule reads (memory,
temperature, power, utilisation) and each process's GPU memory. So that the chart also shows
the climb before the rule fired, ``SampleRecorder`` keeps the last ``preroll`` seconds of
snapshots in memory (at most ``RING`` of them, thinned evenly, each kept compactly: the
per-tick cost is one comparison and, now and then, one pass over the processes), and writes
that stretch when an incident opens.

Write cost: samples are written in batches, one transaction every ``flush_every`` seconds (and
when an incident opens or resolves), never one per tick; a batch is a row per GPU and tick
plus one row per process the first time it is seen. Samples are drawing material, never
decisions: a daemon killed between batches loses at most ``flush_every`` seconds of them.

Tables (schema version 4): ``samples`` (one row per GPU and instant, unique), ``sample_procs``
(who a PID was: user, priority class, command line, redacted), ``incident_rules`` (the rule's
``when``/``until``/``for`` as they were when the incident opened, so that a report draws the
thresholds that applied, not those of a later edit).
"""

from __future__ import annotations

import json
import sqlite3
from array import array
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuwarden.journal.records import cap, redact_text
from gpuwarden.model import GpuProcess, GpuState, ProcessInfo, Snapshot

RING = 60  # moments kept for the preroll, at most
GAUGES = (
    "used_mib",
    "total_mib",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "utilization_pct",
    "memory_utilization_pct",
)
COMMAND_CHARS = 512  # characters kept of a process's command line


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant: its gauges (``None``: unknown) and each process's memory."""

    time: float
    gpu: int
    used_mib: int | None = None
    total_mib: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: int | None = None
    memory_utilization_pct: int | None = None
    lost: bool = False
    procs: tuple[tuple[int, int | None], ...] = ()  # (pid, GPU memory MiB)

    @classmethod
    def of(cls, state: GpuState, procs: Iterable[GpuProcess], time: float) -> GpuSample:
        return cls.of_state(state, tuple((p.pid, p.gpu_memory_mib) for p in procs), time)

    @classmethod
    def of_state(
        cls, state: GpuState, procs: tuple[tuple[int, int | None], ...], time: float
    ) -> GpuSample:
        memory = state.memory
        return cls(
            time,
            state.index,
            memory.used_mib,
            memory.total_mib,
            state.temperature_c,
            state.power_w,
            state.power_limit_w,
            state.utilization_pct,
            state.memory_utilization_pct,
            state.lost,
            procs,
        )


@dataclass(frozen=True, slots=True)
class ProcFacts:
    """Who a process on a GPU was, as first seen (``seen_at``)."""

    gpu: int
    pid: int
    create_time: float | None
    user: str | None
    priority: str
    command: str
    seen_at: float

    @classmethod
    def of(cls, proc: GpuProcess, time: float) -> ProcFacts:
        return cls.of_info(proc.gpu, proc.pid, proc.info, time)

    @classmethod
    def of_info(cls, gpu: int, pid: int, info: ProcessInfo, time: float) -> ProcFacts:
        return cls(
            gpu,
            pid,
            info.create_time,
            None if info.user is None else cap(info.user, 256),
            info.priority,
            redact_text(cap(info.command, COMMAND_CHARS)),
            time,
        )

    @property
    def key(self) -> tuple[int, int, float | None]:
        return (self.gpu, self.pid, self.create_time)


@dataclass(frozen=True, slots=True)
class RuleFacts:
    """The rule of an incident as it stood when the incident opened."""

    incident: str
    rule: str
    when: str
    until: str | None
    for_s: float
    description: str | None = None


@dataclass
class SampleBatch:
    samples: list[GpuSample] = field(default_factory=list)
    procs: list[ProcFacts] = field(default_factory=list)
    rules: list[RuleFacts] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.samples or self.procs or self.rules)


class WatchedIncident(Protocol):
    """What the recorder reads of an open incident (the engine's ``Incident``)."""

    @property
    def id(self) -> str: ...
    @property
    def rule(self) -> str: ...
    @property
    def gpu(self) -> int | None: ...


Describe = Callable[[str, str], RuleFacts | None]  # (incident id, rule) -> its facts


def split(snapshot: Snapshot, gpus: Iterable[int] | None = None) -> dict[int, list[GpuProcess]]:
    """The snapshot's processes by GPU (only ``gpus``, when given)."""
    wanted = None if gpus is None else set(gpus)
    if wanted is not None and len(wanted) == 1:  # the common case: one incident, one GPU
        (only,) = wanted
        if all(g.index != only for g in snapshot.gpus):
            return {}
        return {only: [p for p in snapshot.processes if p.gpu == only]}
    by_gpu: dict[int, list[GpuProcess]] = {
        g.index: [] for g in snapshot.gpus if wanted is None or g.index in wanted
    }
    for proc in snapshot.processes:
        found = by_gpu.get(proc.gpu)
        if found is not None:
            found.append(proc)
    return by_gpu


@dataclass(frozen=True, slots=True)
class _Moment:
    """One snapshot as the preroll keeps it: the GPU states (immutable, by reference) and each
    GPU's processes as ``[pid, MiB, pid, MiB, ...]`` (-1: unknown), a few bytes each."""

    time: float
    gpus: tuple[GpuState, ...]
    procs: dict[int, array[int]]

    @classmethod
    def of(cls, snapshot: Snapshot, time: float) -> _Moment:
        procs: dict[int, array[int]] = {g.index: array("q") for g in snapshot.gpus}
        for proc in snapshot.processes:
            pairs = procs.get(proc.gpu)
            if pairs is not None:
                mib = proc.gpu_memory_mib
                pairs.extend((proc.pid, -1 if mib is None else mib))
        return cls(time, snapshot.gpus, procs)

    def sample(self, state: GpuState) -> GpuSample:
        pairs = self.procs.get(state.index) or array("q")
        procs = tuple(
            (pairs[k], None if pairs[k + 1] < 0 else pairs[k + 1]) for k in range(0, len(pairs), 2)
        )
        return GpuSample.of_state(state, procs, self.time)


class SampleRecorder:
    """Decides which readings the journal keeps (see the module doc). The run loop calls
    ``observe`` once per tick with the engine's open incidents, and writes ``take()`` to the
    journal when ``due``, and once more at shutdown.

    Memory: the preroll holds at most ``RING`` moments — the GPU states by reference and
    16 bytes per process — and the identity of each process seen in them (its latest
    ``ProcessInfo``, by reference): about 0.1 MiB for 8 GPUs and 64 processes, 1.3 MiB for
    16 GPUs and 1,024 (``bench/report.py``)."""

    def __init__(
        self,
        describe: Describe | None = None,
        *,
        preroll: float = 600.0,
        tail: float = 120.0,
        flush_every: float = 30.0,
    ) -> None:
        self.describe = describe
        self.preroll = preroll
        self.tail = tail
        self.flush_every = flush_every
        self._ring: deque[_Moment] = deque()
        self._seen: dict[tuple[int, int], tuple[float, ProcessInfo]] = {}  # (GPU, pid)
        self._watching: dict[str, tuple[int | None, float | None]] = {}  # id -> (gpu, until)
        self._last: dict[int, float] = {}  # GPU -> time of its last sample queued
        self._known: set[tuple[int, int, float | None]] = set()
        self._batch = SampleBatch()
        self._flushed_at: float | None = None
        self._urgent = False

    @property
    def watching(self) -> int:
        return len(self._watching)

    def observe(self, snapshot: Snapshot, now: float, incidents: Iterable[WatchedIncident]) -> None:
        """One tick: remember the snapshot for the preroll, and queue the readings of every
        GPU an open (or just resolved) incident is about."""
        self._remember(snapshot, now)
        open_now: set[str] = set()
        for incident in incidents:
            open_now.add(incident.id)
            if incident.id not in self._watching:
                self._watching[incident.id] = (incident.gpu, None)
                self._urgent = True
                self._begin(incident, now)
        for incident_id, (gpu, until) in list(self._watching.items()):
            if incident_id in open_now:
                continue
            if until is None:
                self._watching[incident_id] = (gpu, now + self.tail)
                self._urgent = True
            elif now > until:
                del self._watching[incident_id]
        if not self._watching:
            self._known.clear()  # the next incident records who its processes are afresh
            return
        gpus = {gpu for gpu, _ in self._watching.values()}
        self._queue(snapshot, now, None if None in gpus else {g for g in gpus if g is not None})

    def due(self, now: float) -> bool:
        """Whether the queued readings should be written now."""
        if not self._batch:
            return False
        if self._urgent or self._flushed_at is None:
            return True
        return now - self._flushed_at >= self.flush_every

    def take(self, now: float) -> SampleBatch:
        """Everything queued, for one write; the queue starts empty again."""
        batch, self._batch = self._batch, SampleBatch()
        self._flushed_at = now
        self._urgent = False
        return batch

    # -- inside -----------------------------------------------------------------------------

    def _remember(self, snapshot: Snapshot, now: float) -> None:
        ring = self._ring
        if ring and now - ring[-1].time < self.preroll / RING:
            return
        ring.append(_Moment.of(snapshot, now))
        seen = self._seen
        for proc in snapshot.processes:
            seen[(proc.gpu, proc.pid)] = (now, proc.info)
        while ring and (now - ring[0].time > self.preroll or len(ring) > RING):
            ring.popleft()
        oldest = ring[0].time
        if len(seen) > 2 * len(snapshot.processes) + 64:  # forget who left before the ring
            self._seen = {k: v for k, v in seen.items() if v[0] >= oldest}

    def _begin(self, incident: WatchedIncident, now: float) -> None:
        if self.describe is not None:
            facts = self.describe(incident.id, incident.rule)
            if facts is not None:
                self._batch.rules.append(facts)
        for moment in self._ring:
            if moment.time >= now:
                continue
            for state in moment.gpus:
                if incident.gpu is not None and state.index != incident.gpu:
                    continue
                if self._last.get(state.index, float("-inf")) >= moment.time:
                    continue
                self._last[state.index] = moment.time
                sample = moment.sample(state)
                self._batch.samples.append(sample)
                for pid, _ in sample.procs:
                    found = self._seen.get((state.index, pid))
                    if found is not None:
                        self._note(ProcFacts.of_info(state.index, pid, found[1], moment.time))

    def _note(self, facts: ProcFacts) -> None:
        if facts.key not in self._known:
            self._known.add(facts.key)
            self._batch.procs.append(facts)

    def _queue(self, snapshot: Snapshot, now: float, gpus: set[int] | None) -> None:
        by_gpu = split(snapshot, gpus)
        for state in snapshot.gpus:
            procs = by_gpu.get(state.index)
            if procs is None or self._last.get(state.index, float("-inf")) >= now:
                continue
            self._last[state.index] = now
            self._batch.samples.append(GpuSample.of(state, procs, now))
            for proc in procs:
                if (proc.gpu, proc.pid, proc.info.create_time) not in self._known:
                    self._note(ProcFacts.of(proc, now))


# -- the tables -------------------------------------------------------------------------------


def write_batch(conn: sqlite3.Connection, batch: SampleBatch) -> None:
    """One batch (inside the caller's transaction). A sample already stored for its GPU and
    instant, or rule facts already stored for an incident, are left as they are."""
    conn.executemany(
        "INSERT OR IGNORE INTO samples (time, gpu, used_mib, total_mib, temperature_c, power_w,"
        " power_limit_w, utilization_pct, memory_utilization_pct, lost, procs)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                s.time,
                s.gpu,
                s.used_mib,
                s.total_mib,
                s.temperature_c,
                s.power_w,
                s.power_limit_w,
                s.utilization_pct,
                s.memory_utilization_pct,
                int(s.lost),
                json.dumps(s.procs, separators=(",", ":")),
            )
            for s in batch.samples
        ],
    )
    conn.executemany(
        "INSERT INTO sample_procs (gpu, pid, create_time, user, priority, command, seen_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (p.gpu, p.pid, p.create_time, p.user, p.priority, p.command, p.seen_at)
            for p in batch.procs
        ],
    )
    conn.executemany(
        "INSERT OR IGNORE INTO incident_rules (incident, rule, when_text, until_text, for_s,"
        " description) VALUES (?, ?, ?, ?, ?, ?)",
        [(r.incident, r.rule, r.when, r.until, r.for_s, r.description) for r in batch.rules],
    )


def _sample(row: tuple[Any, ...]) -> GpuSample:
    procs = tuple((int(pid), None if mib is None else int(mib)) for pid, mib in json.loads(row[10]))
    time, gpu, used, total, temperature, power, limit, util, mem_util = row[:9]
    return GpuSample(
        time, gpu, used, total, temperature, power, limit, util, mem_util, bool(row[9]), procs
    )


def read_samples(
    conn: sqlite3.Connection, start: float, end: float, gpu: int | None = None
) -> list[GpuSample]:
    """The samples between ``start`` and ``end`` (inclusive), of one GPU or all, by time."""
    query = (
        "SELECT time, gpu, used_mib, total_mib, temperature_c, power_w, power_limit_w,"
        " utilization_pct, memory_utilization_pct, lost, procs FROM samples"
        " WHERE time >= ? AND time <= ?"
    )
    args: list[object] = [start, end]
    if gpu is not None:
        query += " AND gpu = ?"
        args.append(gpu)
    return [_sample(r) for r in conn.execute(query + " ORDER BY time, gpu", args)]


def read_procs(conn: sqlite3.Connection, end: float) -> list[ProcFacts]:
    """Who each (GPU, PID) was, as seen at or before ``end``, latest first."""
    rows = conn.execute(
        "SELECT gpu, pid, create_time, user, priority, command, seen_at FROM sample_procs"
        " WHERE seen_at <= ? ORDER BY seen_at DESC, rowid DESC",
        (end,),
    )
    return [ProcFacts(*r) for r in rows]


def read_rule(conn: sqlite3.Connection, incident: str) -> RuleFacts | None:
    row = conn.execute(
        "SELECT incident, rule, when_text, until_text, for_s, description FROM incident_rules"
        " WHERE incident = ?",
        (incident,),
    ).fetchone()
    return None if row is None else RuleFacts(*row)


def prune(conn: sqlite3.Connection, before: float, incidents: Iterable[str]) -> None:
    """Forget samples older than ``before`` and the rule facts of forgotten incidents."""
    conn.execute("DELETE FROM samples WHERE time < ?", (before,))
    conn.execute("DELETE FROM sample_procs WHERE seen_at < ?", (before,))
    conn.executemany("DELETE FROM incident_rules WHERE incident = ?", [(i,) for i in incidents])
