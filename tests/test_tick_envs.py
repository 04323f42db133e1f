"""``TickEnvs`` (the engine's tick environment, with what does not change kept from tick to
tick) gives exactly what ``tick_env`` (the plain form) gives, tick after tick: the same
snapshot objects at another time, snapshots whose GPUs and processes come and go, the clock
standing still, jumping and going back, fractions of a second next to a minute's end,
daylight saving changes, zones with odd offsets, and the zone changing between ticks."""

from __future__ import annotations

import datetime
from typing import Any
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.model import GpuProcess, GpuState, Memory, ProcessInfo, Snapshot
from gpuwarden.playbook.views import TickEnvs, tick_env

ZONES: tuple[datetime.tzinfo, ...] = (
    datetime.UTC,
    ZoneInfo("Europe/London"),  # DST at 01:00 UTC
    ZoneInfo("America/New_York"),
    ZoneInfo("Australia/Lord_Howe"),  # a 30-minute DST shift
    ZoneInfo("Asia/Kathmandu"),  # +05:45
    ZoneInfo("Europe/Amsterdam"),  # +00:19:32 before 1937: an offset in seconds
    datetime.timezone(datetime.timedelta(hours=-3, minutes=-30)),
)
# Instants next to changes of offset: London's spring and autumn 2026, Lord Howe's April
# 2026, Amsterdam's summer time of 1920 and its change to +00:20 in 1937.
INSTANTS = (
    datetime.datetime(2026, 3, 29, 1, 0, tzinfo=datetime.UTC).timestamp(),
    datetime.datetime(2026, 10, 25, 1, 0, tzinfo=datetime.UTC).timestamp(),
    datetime.datetime(2026, 4, 4, 15, 0, tzinfo=datetime.UTC).timestamp(),
    datetime.datetime(1920, 4, 5, 1, 40, 28, tzinfo=datetime.UTC).timestamp(),
    datetime.datetime(1937, 6, 30, 22, 40, 28, tzinfo=datetime.UTC).timestamp(),
    datetime.datetime(2026, 1, 3, 23, 59, 0, tzinfo=datetime.UTC).timestamp(),  # a weekend ends
)


def _gpu(index: int, used: int | None, lost: bool) -> GpuState:
    memory = Memory(80000, used, None if used is None else 80000 - used)
    return GpuState(index=index, memory=memory, lost=lost)


def _proc(pid: int, gpu: int) -> GpuProcess:
    return GpuProcess(pid=pid, gpu=gpu, gpu_memory_mib=1000, info=ProcessInfo(pid=pid))


gpu_frames = st.lists(
    st.tuples(st.one_of(st.none(), st.integers(0, 80000)), st.booleans()), max_size=3
)
proc_frames = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 2)), max_size=4)
steps = st.lists(
    st.tuples(
        st.sampled_from((0.0, 1.0, 1.0, 0.25, 59.0, 61.0, 3600.0, -1.0, -0.5, 1e-7, 0.9999999)),
        st.booleans(),  # a new snapshot (else the one before, the very same objects)
        gpu_frames,
        proc_frames,
        st.integers(0, len(ZONES) - 1),
        st.booleans(),  # the zone changes
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(start=st.sampled_from(INSTANTS), offset=st.floats(-120, 120), draw=steps)
def test_tick_envs_give_what_tick_env_gives(start: float, offset: float, draw: list[Any]) -> None:
    envs = TickEnvs()
    now = start + offset
    zone: datetime.tzinfo = ZONES[0]
    snapshot = Snapshot("node-1", now, (), (), ())
    for gap, fresh, gpus, procs, zone_at, rezone in draw:
        now += gap
        if rezone:
            zone = ZONES[zone_at]
        if fresh:
            states = tuple(_gpu(i, used, lost) for i, (used, lost) in enumerate(gpus))
            listed = tuple(_proc(pid, gpu) for pid, gpu in procs)
            snapshot = Snapshot(f"node-{len(gpus)}", now, states, listed, ())
        assert envs(snapshot, now, zone) == tick_env(snapshot, now, zone)


def test_each_tick_of_a_day_across_a_change_of_offset() -> None:
    """Every second of the night London's clocks go back, fractions of a second included."""
    envs = TickEnvs()
    zone = ZoneInfo("Europe/London")
    snapshot = Snapshot("node-1", 0.0, (_gpu(0, 1000, False),), (_proc(1, 0),), ())
    start = INSTANTS[1] - 3 * 3600 + 0.5
    for n in range(6 * 3600):
        now = start + n + (0.4999999 if n % 7 == 0 else 0.0)
        assert envs(snapshot, now, zone) == tick_env(snapshot, now, zone)
