"""What ``host.*`` and ``time.*`` read, and the environment shared by every scope of a tick.

Pure functions of a snapshot, a time and a time zone (see ``fields`` for the environment).
"""

from __future__ import annotations

import datetime
from collections import Counter
from dataclasses import dataclass

from gpuwarden.model import Snapshot

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


@dataclass(frozen=True, slots=True)
class HostView:
    """What ``host.*`` reads: the machine as a whole. Memory is GPU memory, summed over the GPUs
    that report both used and total (``None`` when none does)."""

    name: str
    gpu_count: int
    gpus_lost: int
    memory_used_mib: int | None
    memory_total_mib: int | None
    memory_used_pct: float | None
    process_count: int


def host_view(snapshot: Snapshot) -> HostView:
    used = total = 0
    reporting = 0
    for gpu in snapshot.gpus:
        if gpu.memory.used_mib is not None and gpu.memory.total_mib is not None:
            used += gpu.memory.used_mib
            total += gpu.memory.total_mib
            reporting += 1
    return HostView(
        name=snapshot.host,
        gpu_count=len(snapshot.gpus),
        gpus_lost=sum(1 for gpu in snapshot.gpus if gpu.lost),
        memory_used_mib=used if reporting else None,
        memory_total_mib=total if reporting else None,
        memory_used_pct=100.0 * used / total if reporting and total > 0 else None,
        process_count=len({p.pid for p in snapshot.processes}),
    )


@dataclass(frozen=True, slots=True)
class TimeView:
    """What ``time.*`` reads: the tick's time in the configured time zone."""

    epoch: float
    year: int
    month: int
    day: int
    hour: int
    minute: int
    weekday: int  # ISO: 1 = Monday ... 7 = Sunday
    weekday_name: str
    is_weekend: bool


def time_view(epoch: float, tz: datetime.tzinfo) -> TimeView:
    moment = datetime.datetime.fromtimestamp(epoch, tz)
    weekday = moment.isoweekday()
    return TimeView(
        epoch=epoch,
        year=moment.year,
        month=moment.month,
        day=moment.day,
        hour=moment.hour,
        minute=moment.minute,
        weekday=weekday,
        weekday_name=WEEKDAYS[weekday - 1],
        is_weekend=weekday >= 6,
    )


def gpu_process_counts(snapshot: Snapshot) -> dict[int, int]:
    """GPU index -> how many processes use it (what ``gpu.process_count`` reads)."""
    return dict(Counter(p.gpu for p in snapshot.processes))


def tick_env(snapshot: Snapshot, now: float, tz: datetime.tzinfo) -> dict[str, object]:
    """The part of the environment shared by every scope of one tick: ``host``, ``time``,
    ``_now`` and ``_gpu_procs``. Copy it per scope and add ``gpu`` / ``process`` / ``event``
    and that scope's ``_h``."""
    return {
        "host": host_view(snapshot),
        "time": time_view(now, tz),
        "_now": now,
        "_gpu_procs": gpu_process_counts(snapshot),
    }
