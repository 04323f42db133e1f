"""What ``host.*`` and ``time.*`` read, and the environment shared by every scope of a tick.

Pure functions of a snapshot, a time and a time zone (see ``fields`` for the environment);
``TickEnvs`` gives the same environments tick after tick for less (see there).
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.model import GpuProcess, GpuState, Snapshot, positional_maker

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


class TickEnvs:
    """``tick_env`` for one caller's ticks, one after another, with what does not change
    from tick to tick kept (the engine's fast path; ``tick_env`` is the plain form, which
    ``Engine(reference=True)`` uses and the tests compare this with):

    - ``time``: the fields other than ``epoch`` are those of the last tick while the time
      is in the span of one local minute where they were seen to be the same (see
      ``_minute``), for the same time zone object;
    - ``host`` and the process counts per GPU: reused while the snapshot's GPU and process
      tuples are the very objects of the tick before (and the host name the same).
    """

    __slots__ = ("_counts", "_host", "_minute", "_procs", "_span")

    def __init__(self) -> None:
        # (tz, first, last epoch): every epoch in [first, last] has the fields in _minute
        self._span: tuple[datetime.tzinfo, float, float] | None = None
        self._minute: tuple[int, int, int, int, int, int, str, bool] = (0, 0, 0, 0, 0, 0, "", False)
        self._host: tuple[str, Sequence[GpuState], Sequence[GpuProcess], HostView] | None = None
        self._procs: tuple[Sequence[GpuProcess], dict[int, int]] | None = None

    def __call__(self, snapshot: Snapshot, now: float, tz: datetime.tzinfo) -> dict[str, object]:
        gpus, procs = snapshot.gpus, snapshot.processes
        known = self._host
        if (
            known is not None
            and known[1] is gpus
            and known[2] is procs
            and known[0] == snapshot.host
        ):
            host = known[3]
        else:
            host = _host_view(snapshot.host, gpus, procs)
            self._host = (snapshot.host, gpus, procs, host)
        counted = self._procs
        if counted is not None and counted[0] is procs:
            counts = counted[1]
        else:
            counts = {}
            get = counts.get
            for p in procs:  # gpu_process_counts, in its order
                index = p.gpu
                counts[index] = get(index, 0) + 1
            self._procs = (procs, counts)
        span = self._span
        if span is None or span[0] is not tz or not span[1] <= now <= span[2]:
            self._minute_of(now, tz)
        return {
            "host": host,
            "time": _make_time(now, *self._minute),
            "_now": now,
            "_gpu_procs": counts,
        }

    def _minute_of(self, epoch: float, tz: datetime.tzinfo) -> None:
        """Learn the fields of ``epoch`` and a span around it where they are the same: to
        the end of its local minute, when the zone's offset there is the same as at
        ``epoch`` (an offset changes at most once in a minute, so in between the local time
        moves forward with the epoch and stays in that minute); else ``epoch`` alone."""
        moment = datetime.datetime.fromtimestamp(epoch, tz)
        self._minute = minute = _fields(moment)
        last = epoch + (59 - moment.second)  # the same fraction of a second, in the minute
        try:
            later = datetime.datetime.fromtimestamp(last, tz)
        except (OverflowError, ValueError, OSError):  # past the end of time
            last = epoch
        else:
            if _fields(later) != minute or later.utcoffset() != moment.utcoffset():
                last = epoch
        self._span = (tz, epoch, last)


def _fields(moment: datetime.datetime) -> tuple[int, int, int, int, int, int, str, bool]:
    """What ``time_view`` takes from ``moment``, after ``epoch``, in field order."""
    weekday = moment.isoweekday()
    return (
        moment.year,
        moment.month,
        moment.day,
        moment.hour,
        moment.minute,
        weekday,
        WEEKDAYS[weekday - 1],
        weekday >= 6,
    )


def _host_view(name: str, gpus: Sequence[GpuState], procs: Sequence[GpuProcess]) -> HostView:
    """``host_view``, in one pass over the GPUs."""
    used = total = reporting = lost = 0
    for gpu in gpus:
        memory = gpu.memory
        gpu_used, gpu_total = memory.used_mib, memory.total_mib
        if gpu_used is not None and gpu_total is not None:
            used += gpu_used
            total += gpu_total
            reporting += 1
        if gpu.lost:
            lost += 1
    return _make_host(
        name,
        len(gpus),
        lost,
        used if reporting else None,
        total if reporting else None,
        100.0 * used / total if reporting and total > 0 else None,
        len({p.pid for p in procs}),
    )


_make_time = positional_maker(TimeView)  # made every tick: without the dataclass's __init__
_make_host = positional_maker(HostView)
