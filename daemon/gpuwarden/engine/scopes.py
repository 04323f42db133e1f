"""What a rule is evaluated for: each GPU, each process on a GPU, the host, or each event.

A scope's ``key`` is its stable identity across ticks (a process is keyed by PID *and* start
time, so a reused PID is a new scope); ``label`` is how people read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.model import Event, GpuProcess, GpuState, Snapshot


@dataclass(frozen=True, slots=True)
class Scope:
    key: str
    label: str
    gpu: GpuState | None = None
    process: GpuProcess | None = None
    event: Event | None = None


def gpu_key(index: int) -> str:
    return f"gpu:{index}"


def process_key(proc: GpuProcess) -> str:
    created = proc.info.create_time
    stamp = "?" if created is None else f"{created:.2f}"
    return f"gpu:{proc.gpu}/pid:{proc.pid}@{stamp}"


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
