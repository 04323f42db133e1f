"""Where Snapshots come from: ``nvml`` (the real GPUs), ``scenario`` (a YAML timeline) and
``smi-csv`` (a recorded ``nvidia-smi --query-gpu`` log)."""

from __future__ import annotations

from typing import Protocol

from gpuwarden.model import Snapshot


class Source(Protocol):
    """Produces one Snapshot per call. ``now`` comes from the caller's (injected) clock.

    A snapshot hands out the events seen since the previous one, once. A source may also offer
    ``peek(now)``: the machine as ``snapshot`` would show it, without events and without
    taking any, for a second look between ticks (a kill step re-reading the GPUs) that must not
    swallow an event the next tick's rules should see."""

    name: str

    def snapshot(self, now: float) -> Snapshot: ...

    def close(self) -> None: ...


class ReplaySource(Source, Protocol):
    """A source that plays back a recording: the snapshot at ``now`` is the one recorded
    ``now - start_time`` seconds after its beginning. ``start_time`` is the recording's own
    start (so time windows in rules see the original times); set it to the clock's ``now`` to
    play the recording back from this instant in real time."""

    start_time: float
    duration: float
