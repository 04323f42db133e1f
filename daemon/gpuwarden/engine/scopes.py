"""What a rule is evaluated for: each GPU, each process on a GPU, the host, or each event.

A scope's ``key`` is its stable identity across ticks (a process is keyed by PID *and* start
time, so a reused PID is a new scope); ``label`` is how people read it.

A tick holds its scopes per kind as a ``ScopeSet``: the rows batch evaluation reads
(``expr_batch``), the keys, and a ``Scope`` made only for the few scopes that a rule holds in
or has a state for. ``SCOPES`` (one ``Scope`` per scope, every tick) is the plain form.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from gpuwarden.model import Event, GpuProcess, GpuState, Snapshot, positional_maker
from gpuwarden.playbook.expr_batch import Row


@dataclass(frozen=True, slots=True)
class Scope:
    key: str
    label: str
    gpu: GpuState | None = None
    process: GpuProcess | None = None
    event: Event | None = None


_make_scope = positional_maker(Scope)  # Scope(...) without the dataclass's __init__


@functools.cache
def gpu_key(index: int) -> str:
    return f"gpu:{index}"


def process_key(proc: GpuProcess) -> str:
    created = proc.info.create_time
    stamp = "?" if created is None else f"{created:.2f}"
    return f"gpu:{proc.gpu}/pid:{proc.pid}@{stamp}"


@functools.lru_cache(maxsize=64)
def gpu_keys(indexes: tuple[int, ...]) -> tuple[str, ...]:
    """``gpu_key`` of each of ``indexes``."""
    return tuple(gpu_key(i) for i in indexes)


@functools.lru_cache(maxsize=4096)
def history_keys(scope_key: str, gpu: int | None) -> tuple[str, ...]:
    """Where a scope's history functions look after its own series: its GPU's, then the
    host's (``avg(gpu.power_w, 5m)`` in a process rule reads the GPU's series)."""
    return ("host",) if gpu is None or scope_key == gpu_key(gpu) else (gpu_key(gpu), "host")


def event_key(event: Event) -> str:
    return "event:host" if event.gpu is None else f"event:gpu:{event.gpu}"


def gpu_scopes(snapshot: Snapshot) -> list[Scope]:
    return [Scope(gpu_key(g.index), f"GPU {g.index}", gpu=g) for g in snapshot.gpus]


def process_scopes(snapshot: Snapshot) -> list[Scope]:
    gpus = {g.index: g for g in snapshot.gpus}
    return [
        Scope(process_key(p), f"pid {p.pid} on GPU {p.gpu}", gpu=gpus.get(p.gpu), process=p)
        for p in snapshot.processes
    ]


def host_scopes(snapshot: Snapshot) -> list[Scope]:
    return [Scope("host", snapshot.host)]


def event_scopes(snapshot: Snapshot) -> list[Scope]:
    gpus = {g.index: g for g in snapshot.gpus}
    return [
        Scope(
            event_key(e),
            "host" if e.gpu is None else f"GPU {e.gpu}",
            gpu=None if e.gpu is None else gpus.get(e.gpu),
            event=e,
        )
        for e in snapshot.events
    ]


SCOPES = {
    "gpu": gpu_scopes,
    "process": process_scopes,
    "host": host_scopes,
    "event": event_scopes,
}
SCOPE_KINDS = frozenset(SCOPES)


# -- one tick's scopes, kind by kind --------------------------------------------------------


class ScopeSet:
    """The scopes of one kind in one tick, in snapshot order. ``rows`` and ``keys`` are built
    once; a ``Scope`` only when asked for (``scope(i)``); ``index`` (key -> position, the last
    one for a key that repeats) on first use."""

    __slots__ = ("_index", "_label", "_scopes", "_unique", "keys", "kind", "rows")

    def __init__(
        self,
        kind: str,
        rows: list[Row],
        keys: list[str],
        label: Callable[[int], str],
    ) -> None:
        self.kind = kind
        self.rows = rows
        self.keys = keys
        self._label = label
        self._scopes: dict[int, Scope] = {}
        self._index: dict[str, int] | None = None
        self._unique: bool | None = None

    @property
    def unique(self) -> bool:
        """Whether no key repeats (two events of one GPU in a tick share one)."""
        if self._unique is None:
            self._unique = len(self.index) == len(self.keys)
        return self._unique

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def index(self) -> dict[str, int]:
        if self._index is None:
            self._index = {key: i for i, key in enumerate(self.keys)}
        return self._index

    def label(self, i: int) -> str:
        """``scope(i).label``, without making the ``Scope``."""
        found = self._scopes.get(i)
        return self._label(i) if found is None else found.label

    def scope(self, i: int) -> Scope:
        found = self._scopes.get(i)
        if found is None:
            gpu, process, event, _ = self.rows[i]
            found = self._scopes[i] = _make_scope(self.keys[i], self._label(i), gpu, process, event)
        return found

    @classmethod
    def of(cls, kind: str, scopes: Sequence[Scope]) -> ScopeSet:
        """The set of ``scopes`` made the plain way (``SCOPES``), rows without history."""
        rows: list[Row] = [(s.gpu, s.process, s.event, None) for s in scopes]
        made = cls(kind, rows, [s.key for s in scopes], lambda i: scopes[i].label)
        made._scopes = dict(enumerate(scopes))
        return made


class ProcessKeys:
    """``process_key`` remembered across ticks: most processes live for many ticks."""

    def __init__(self) -> None:
        self._keys: dict[tuple[int, int, float | None], str] = {}

    def __call__(self, procs: Sequence[GpuProcess]) -> list[str]:
        none: dict[int, GpuState] = {}
        return self.rows(procs, none.get)[1]

    def rows(
        self, procs: Sequence[GpuProcess], gpu: Callable[[int], GpuState | None]
    ) -> tuple[list[Row], list[str]]:
        """The process rows of ``procs`` (``gpu``: a GPU by index) and their keys."""
        known = self._keys
        rows: list[Row] = []
        out: list[str] = []
        for p in procs:
            index = p.gpu
            ident = (index, p.pid, p.info.create_time)
            key = known.get(ident)
            if key is None:
                key = known[ident] = process_key(p)
            out.append(key)
            rows.append((gpu(index), p, None, None))
        if len(known) > 2 * len(out) + 64:  # forget processes long gone
            live = set(out)
            self._keys = {k: v for k, v in known.items() if v in live}
        return rows, out


def scope_sets(
    snapshot: Snapshot, process_keys: ProcessKeys, kinds: Collection[str] = SCOPE_KINDS
) -> tuple[dict[str, ScopeSet], dict[int, GpuState]]:
    """The ``ScopeSet`` of ``snapshot`` of each of ``kinds`` (rows without history: see
    ``Engine._add_history``), and the snapshot's GPUs by index."""
    gpus = snapshot.gpus
    by_index = {g.index: g for g in gpus}
    get = by_index.get
    sets: dict[str, ScopeSet] = {}
    if "gpu" in kinds:
        indexes = tuple(by_index)
        sets["gpu"] = ScopeSet(
            "gpu",
            [(g, None, None, None) for g in gpus],
            # by_index keeps the GPUs' order: its keys are theirs when no index repeats
            list(gpu_keys(indexes))
            if len(indexes) == len(gpus)
            else [gpu_key(g.index) for g in gpus],
            lambda i: f"GPU {gpus[i].index}",
        )
    if "process" in kinds:
        procs = snapshot.processes
        rows, keys = process_keys.rows(procs, get)
        sets["process"] = ScopeSet(
            "process", rows, keys, lambda i: f"pid {procs[i].pid} on GPU {procs[i].gpu}"
        )
    if "host" in kinds:
        sets["host"] = ScopeSet(
            "host", [(None, None, None, None)], ["host"], lambda i: snapshot.host
        )
    if "event" in kinds:
        events = snapshot.events
        sets["event"] = ScopeSet(
            "event",
            [(None if e.gpu is None else get(e.gpu), None, e, None) for e in events],
            [event_key(e) for e in events],
            lambda i: "host" if events[i].gpu is None else f"GPU {events[i].gpu}",
        )
    return sets, by_index
