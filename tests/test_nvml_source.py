"""NvmlSource against a fake NVML library (pynvml's real wrappers, fake C functions), and once
against the real driver where there is one."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from gpuwarden.cli.status_view import event_dict
from gpuwarden.errors import ExitCode, SourceUnavailable
from gpuwarden.model import (
    Ecc,
    EventKind,
    GpuState,
    Memory,
    ProcessInfo,
    RemappedRows,
    RetiredPages,
    Snapshot,
)
from gpuwarden.sources.nvml import NvmlSource
from tests.fake_nvml import (
    DRIVER_NOT_LOADED,
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    GPU_IS_LOST,
    LIB_RM_VERSION_MISMATCH,
    LIBRARY_NOT_FOUND,
    MIB,
    NO_PERMISSION,
    RESET_REQUIRED,
    UNKNOWN,
    FakeEcc,
    FakeNvml,
    FakeProcess,
    eight_gpus,
    installed,
)

NOW = 1_767_225_600.0
WALL = 1_767_225_599.25  # the event thread's (injected) clock


class RecordingAttributor:
    """Knows the PIDs it was built with; records every question."""

    def __init__(self, known: Iterable[int] = ()) -> None:
        self.known = set(known)
        self.calls: list[tuple[list[int], float]] = []

    def describe(self, pids: Iterable[int], now: float) -> dict[int, ProcessInfo]:
        asked = list(pids)
        self.calls.append((asked, now))
        return {
            pid: ProcessInfo(pid=pid, name=f"job-{pid}", user="alice")
            for pid in asked
            if pid in self.known
        }


@pytest.fixture
def nvml() -> Iterator[FakeNvml]:
    with installed(FakeNvml(eight_gpus())) as fake:
        yield fake


@pytest.fixture
def open_source(nvml: FakeNvml) -> Iterator[Callable[..., NvmlSource]]:
    """Opens NvmlSources on the fake; closes them (and their threads) before the fake goes."""
    opened: list[NvmlSource] = []

    def open_(attributor: Any = None, **options: Any) -> NvmlSource:
        options.setdefault("wall", lambda: WALL)
        source = NvmlSource(attributor, host="gpu-node-7", **options)
        opened.append(source)
        return source

    yield open_
    for source in opened:
        source.close()


def snapshot_with_events(source: NvmlSource, now: float = NOW) -> Snapshot:
    """The first snapshot that carries events (the thread delivers them asynchronously)."""
    deadline = time.monotonic() + 5.0
    while True:
        snap = source.snapshot(now)
        if snap.events or time.monotonic() > deadline:
            return snap
        time.sleep(0.005)


# -- healthy machine -------------------------------------------------------------------------


def test_eight_healthy_gpus_report_every_field(nvml: FakeNvml, open_source) -> None:
    nvml.gpus[6].extra_bytes = MIB - 1  # part of a MiB is not a MiB
    snap = open_source().snapshot(NOW)

    assert (snap.host, snap.time, snap.source, snap.events) == ("gpu-node-7", NOW, "nvml", ())
    assert [g.index for g in snap.gpus] == list(range(8))
    assert nvml.init_flags == [1]  # nvmlInitWithFlags(NO_GPUS): start even if GPUs are broken
    first = snap.gpus[0]
    assert first == GpuState(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-00000000-0000-4000-8000-000000000000",
        pci_bus_id="00000000:18:00.0",
        memory=Memory(total_mib=81559, used_mib=512, free_mib=80567, reserved_mib=480),
        utilization_pct=0,
        memory_utilization_pct=0,
        temperature_c=34,
        power_w=71.25,
        power_limit_w=700.0,
        throttle=("gpu_idle",),
        ecc=Ecc(0, 0, 0, 0),
        remapped_rows=RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False),
        retired_pages=None,
        pstate=0,
        mig_mode=False,
        sm_clock_mhz=1980,
        memory_clock_mhz=2619,
        energy_mj=86_400_000_000,
    )
    assert len({g.uuid for g in snap.gpus}) == 8
    assert snap.gpus[7].pci_bus_id == "00000000:88:00.0"
    assert snap.gpus[6].memory.used_mib == 512
    assert not any(g.lost for g in snap.gpus)


def test_fields_come_from_the_device_not_defaults(nvml: FakeNvml, open_source) -> None:
    gpu = nvml.gpus[2]
    gpu.gpu_util, gpu.mem_util, gpu.temperature_c = 97, 41, 83
    gpu.power_mw, gpu.pstate, gpu.mig_mode = 655_500, 2, (1, 1)
    state = open_source().snapshot(NOW).gpus[2]
    assert (state.utilization_pct, state.memory_utilization_pct, state.temperature_c) == (
        97,
        41,
        83,
    )
    assert (state.power_w, state.pstate, state.mig_mode) == (655.5, 2, True)


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0x0, ()),
        (0x4 | 0x40, ("sw_power_cap", "hw_thermal_slowdown")),
        (0x8 | 0x20 | 0x80, ("hw_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")),
    ],
)
def test_clock_event_reasons_become_names(nvml: FakeNvml, open_source, mask, names) -> None:
    nvml.gpus[1].clocks_event_reasons = mask
    assert open_source().snapshot(NOW).gpus[1].throttle == names


# -- what a device cannot tell is None, never 0 -------------------------------------------------


@pytest.mark.parametrize(
    ("functions", "read"),
    [
        ({"nvmlDeviceGetPowerUsage"}, lambda g: g.power_w),
        ({"nvmlDeviceGetEnforcedPowerLimit"}, lambda g: g.power_limit_w),
        (
            {"nvmlDeviceGetUtilizationRates"},
            lambda g: (g.utilization_pct, g.memory_utilization_pct),
        ),
        ({"nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"}, lambda g: g.temperature_c),
        (
            {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"},
            lambda g: g.throttle,
        ),
        ({"nvmlDeviceGetTotalEccErrors"}, lambda g: g.ecc),
        ({"nvmlDeviceGetMigMode"}, lambda g: g.mig_mode),
        ({"nvmlDeviceGetPerformanceState"}, lambda g: g.pstate),
        ({"nvmlDeviceGetClockInfo"}, lambda g: (g.sm_clock_mhz, g.memory_clock_mhz)),
        ({"nvmlDeviceGetTotalEnergyConsumption"}, lambda g: g.energy_mj),
        ({"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo"}, lambda g: g.memory),
    ],
)
def test_an_unsupported_field_is_none(nvml: FakeNvml, open_source, functions, read) -> None:
    nvml.gpus[4].unsupported = set(functions)
    snap = open_source().snapshot(NOW)
    unknown = read(snap.gpus[4])
    assert unknown in (None, (None, None), Memory())
    assert read(snap.gpus[5]) not in (None, (None, None), Memory())  # the others still tell
    assert not snap.gpus[4].lost


def test_no_permission_for_one_field_is_none_not_lost(nvml: FakeNvml, open_source) -> None:
    nvml.gpus[0].failing = {"nvmlDeviceGetPowerUsage": NO_PERMISSION}
    state = open_source().snapshot(NOW).gpus[0]
    assert state.power_w is None
    assert state.power_limit_w == 700.0
    assert not state.lost


def test_an_older_driver_falls_back_to_the_older_calls(nvml: FakeNvml, open_source) -> None:
    nvml.missing = {
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetCurrentClocksEventReasons",
    }
    nvml.gpus[3].clocks_event_reasons = 0x4
    state = open_source().snapshot(NOW).gpus[3]
    # v1 counts the reserved memory as used and cannot tell how much is reserved
    assert state.memory == Memory(total_mib=81559, used_mib=992, free_mib=80567, reserved_mib=None)
    assert state.temperature_c == 34
    assert state.throttle == ("sw_power_cap",)
    assert nvml.calls["nvmlDeviceGetTemperature"] == 8


# -- processes ---------------------------------------------------------------------------------


def test_processes_are_joined_with_their_attribution(nvml: FakeNvml, open_source) -> None:
    me = os.getpid()
    nvml.gpus[0].processes = [FakeProcess(me, used_bytes=20_480 * MIB), FakeProcess(4242)]
    nvml.gpus[1].processes = [FakeProcess(me, used_bytes=512 * MIB + 7)]
    nvml.gpus[2].processes = [FakeProcess(1777, kind="graphics"), FakeProcess(1888, kind="both")]
    attributor = RecordingAttributor(known={me, 1777})
    snap = open_source(attributor).snapshot(NOW)

    assert attributor.calls == [(sorted([me, 1777, 1888, 4242]), NOW)]  # once, each PID once
    by_key = {(p.gpu, p.pid): p for p in snap.processes}
    assert set(by_key) == {(0, me), (0, 4242), (1, me), (2, 1777), (2, 1888)}
    on_0 = by_key[(0, me)]
    assert (on_0.gpu_memory_mib, on_0.kind, on_0.gpu_uuid) == (20_480, "compute", snap.gpus[0].uuid)
    assert on_0.info.name == f"job-{me}"
    assert on_0.info is by_key[(1, me)].info  # one ProcessInfo, shared by both GPUs
    assert by_key[(1, me)].gpu_memory_mib == 512
    assert by_key[(0, 4242)].info == ProcessInfo(pid=4242)  # unknown to the attributor
    assert by_key[(2, 1777)].kind == "graphics"
    assert by_key[(2, 1888)].kind == "compute"  # both compute and graphics: listed once


def test_used_gpu_memory_not_available_is_none(nvml: FakeNvml, open_source) -> None:
    nvml.gpus[0].processes = [FakeProcess(501, used_bytes=None), FakeProcess(502, used_bytes=0)]
    procs = {p.pid: p for p in open_source().snapshot(NOW).processes}
    assert procs[501].gpu_memory_mib is None
    assert procs[502].gpu_memory_mib == 0


def test_without_an_attributor_every_process_gets_a_bare_info(nvml: FakeNvml, open_source) -> None:
    nvml.gpus[5].processes = [FakeProcess(9001)]
    (proc,) = open_source(None).snapshot(NOW).processes
    assert (proc.gpu, proc.info) == (5, ProcessInfo(pid=9001))


def test_a_failing_attributor_does_not_lose_the_snapshot(nvml: FakeNvml, open_source, caplog):
    class Broken:
        def describe(self, pids, now):
            raise OSError("procfs unmounted")

    nvml.gpus[0].processes = [FakeProcess(77)]
    with caplog.at_level(logging.ERROR):
        snap = open_source(Broken()).snapshot(NOW)
    assert snap.processes[0].info == ProcessInfo(pid=77)
    assert "procfs unmounted" in caplog.text


def test_sm_utilization_from_samples_then_idle_when_none_since(nvml: FakeNvml, open_source):
    gpu = nvml.gpus[0]
    gpu.processes = [FakeProcess(10, sm_util=87), FakeProcess(11, sm_util=None)]
    gpu.sample_time_us = 5_000_000
    source = open_source()

    first = {p.pid: p.sm_util_pct for p in source.snapshot(NOW).processes}
    assert first == {10: 87, 11: 0}  # 11 had no sample: idle
    second = {p.pid: p.sm_util_pct for p in source.snapshot(NOW + 5).processes}
    assert second == {10: 0, 11: 0}  # NOT_FOUND, nothing newer than 5 s: everybody idle
    assert nvml.util_since[0] == [0, 5_000_000]  # the last timestamp is kept per GPU

    gpu.sample_time_us = 6_000_000
    third = {p.pid: p.sm_util_pct for p in source.snapshot(NOW + 10).processes}
    assert third == {10: 87, 11: 0}


def test_process_utilization_not_supported_is_none(nvml: FakeNvml, open_source) -> None:
    nvml.gpus[0].processes = [FakeProcess(10, sm_util=50)]
    nvml.gpus[0].unsupported = {"nvmlDeviceGetProcessUtilization"}
    (proc,) = open_source().snapshot(NOW).processes
    assert proc.sm_util_pct is None


def test_process_utilization_switch_skips_the_call(nvml: FakeNvml, open_source) -> None:
    for gpu in nvml.gpus:
        gpu.processes = [FakeProcess(100 + gpu.index, sm_util=30)]
    snap = open_source(process_utilization=False).snapshot(NOW)
    assert nvml.calls["nvmlDeviceGetProcessUtilization"] == 0
    assert [p.sm_util_pct for p in snap.processes] == [None] * 8

    open_source().snapshot(NOW)  # the control: with the switch on, it is asked (twice per GPU)
    assert nvml.calls["nvmlDeviceGetProcessUtilization"] == 16


# -- memory health -----------------------------------------------------------------------------


def test_ecc_counters_and_remapped_rows(nvml: FakeNvml, open_source) -> None:
    nvml.gpus[3].ecc = FakeEcc(
        volatile_corrected=12,
        volatile_uncorrected=1,
        aggregate_corrected=340,
        aggregate_uncorrected=2,
    )
    nvml.gpus[3].remapped_rows = (3, 1, 1, 0)
    state = open_source().snapshot(NOW).gpus[3]
    assert state.ecc == Ecc(
        volatile_corrected=12,
        volatile_uncorrected=1,
        aggregate_corrected=340,
        aggregate_uncorrected=2,
    )
    assert state.remapped_rows == RemappedRows(
        correctable=3, uncorrectable=1, pending=True, failure=False
    )
    assert state.retired_pages is None


def test_an_older_gpu_reports_retired_pages(nvml: FakeNvml, open_source) -> None:
    old = nvml.gpus[7]
    old.name = "Tesla V100-SXM2-32GB"
    old.remapped_rows = None
    old.retired_pages = ([0x1000, 0x2000], [0x3000], True)
    state = open_source().snapshot(NOW).gpus[7]
    assert state.remapped_rows is None
    assert state.retired_pages == RetiredPages(single_bit=2, double_bit=1, pending=True)


def test_ecc_switch_skips_every_memory_error_call(nvml: FakeNvml, open_source) -> None:
    state = open_source(ecc=False).snapshot(NOW).gpus[0]
    for name in (
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
    ):
        assert nvml.calls[name] == 0, name
    assert (state.ecc, state.remapped_rows, state.retired_pages) == (None, None, None)

    open_source(ecc=True).snapshot(NOW)  # the control
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == 8 * 4
    assert nvml.calls["nvmlDeviceGetRemappedRows"] == 8


# -- lost GPUs ---------------------------------------------------------------------------------


def test_one_gpu_lost_among_eight(nvml: FakeNvml, open_source) -> None:
    for gpu in nvml.gpus:
        gpu.processes = [FakeProcess(1000 + gpu.index)]
    source = open_source(events=False)
    before = source.snapshot(NOW)
    assert not before.gpus[3].lost
    assert before.events == ()

    nvml.gpus[3].lost = GPU_IS_LOST
    after = source.snapshot(NOW + 5)

    lost = after.gpus[3]
    assert lost.lost
    assert lost.error is not None
    assert "GPU is lost" in lost.error
    assert "NVML_ERROR_GPU_IS_LOST" in lost.error
    assert (lost.name, lost.uuid, lost.pci_bus_id) == (
        before.gpus[3].name,
        before.gpus[3].uuid,
        before.gpus[3].pci_bus_id,
    )
    assert lost.memory == Memory()
    assert lost.temperature_c is None
    others = [g for g in after.gpus if g.index != 3]
    assert len(others) == 7
    assert not any(g.lost for g in others)
    assert all(g.temperature_c == 34 for g in others)
    assert sorted(p.gpu for p in after.processes) == [0, 1, 2, 4, 5, 6, 7]
    (event,) = after.events
    assert (event.kind, event.gpu, event.time) == (EventKind.GPU_LOST, 3, NOW + 5)
    assert "GPU is lost" in event.detail

    assert source.snapshot(NOW + 10).events == ()  # still lost: no second event


def test_a_gpu_that_fails_a_core_read_is_lost(nvml: FakeNvml, open_source) -> None:
    nvml.gpus[6].failing = {"nvmlDeviceGetMemoryInfo_v2": UNKNOWN}
    snap = open_source().snapshot(NOW)
    assert snap.gpus[6].lost
    assert snap.gpus[6].error is not None
    assert "NVML_ERROR_UNKNOWN" in snap.gpus[6].error
    assert snap.gpus[6].name == "NVIDIA H100 80GB HBM3"  # read before the failure
    assert sum(g.lost for g in snap.gpus) == 1


def test_a_gpu_lost_from_the_start_reports_why_and_the_rest_run(nvml: FakeNvml, open_source):
    nvml.gpus[0].lost = RESET_REQUIRED
    source = open_source()
    snap = source.snapshot(NOW)
    assert snap.gpus[0] == GpuState(
        index=0, lost=True, error="GPU requires restart (NVML_ERROR_RESET_REQUIRED)"
    )
    assert [g.lost for g in snap.gpus[1:]] == [False] * 7
    assert snap.events == ()  # never seen healthy: no transition to report
    assert sorted(nvml.registered) == [1, 2, 3, 4, 5, 6, 7]


def test_a_gpu_that_comes_back_and_falls_off_again_is_reported_twice(
    nvml: FakeNvml, open_source
) -> None:
    source = open_source(events=False)
    kinds = []
    for tick, lost in enumerate([None, GPU_IS_LOST, None, GPU_IS_LOST]):
        nvml.gpus[2].lost = lost
        snap = source.snapshot(NOW + tick)
        assert snap.gpus[2].lost is (lost is not None)
        kinds.append([e.kind for e in snap.events])
    assert kinds == [[], [EventKind.GPU_LOST], [], [EventKind.GPU_LOST]]


# -- events ------------------------------------------------------------------------------------


def test_xid_79_reaches_the_next_snapshot(nvml: FakeNvml, open_source) -> None:
    source = open_source()
    assert source.snapshot(NOW).events == ()
    nvml.emit_xid(5, 79)
    snap = snapshot_with_events(source, NOW + 1)
    (event,) = snap.events
    assert (event.kind, event.gpu, event.xid, event.time) == (EventKind.XID, 5, 79, WALL)
    assert event_dict(event)["detail"] == "GPU has fallen off the bus"
    assert source.snapshot(NOW + 2).events == ()  # drained
    assert set(nvml.wait_timeouts_ms) == {1000}


def test_events_register_only_what_each_gpu_supports(nvml: FakeNvml, open_source) -> None:
    nvml.gpus[4].supported_events = EVENT_XID  # a GPU without ECC events
    open_source()
    watched = EVENT_XID | EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC
    assert nvml.registered == {i: (EVENT_XID if i == 4 else watched) for i in range(8)}


def test_an_ecc_event_is_delivered(nvml: FakeNvml, open_source) -> None:
    source = open_source()
    nvml.emit(2, EVENT_DOUBLE_BIT_ECC)
    (event,) = snapshot_with_events(source).events
    assert (event.kind, event.gpu, event.xid) == (EventKind.ECC_DOUBLE_BIT, 2, None)


def test_a_registration_failure_on_one_gpu_spares_the_others(nvml: FakeNvml, open_source):
    nvml.gpus[2].failing = {"nvmlDeviceRegisterEvents": UNKNOWN}
    source = open_source()
    assert 2 not in nvml.registered
    assert len(nvml.registered) == 7
    nvml.emit_xid(6, 48)
    (event,) = snapshot_with_events(source).events
    assert (event.gpu, event.xid) == (6, 48)


def test_a_failing_event_thread_is_logged_and_snapshots_go_on(
    nvml: FakeNvml, open_source, caplog
) -> None:
    nvml.wait_raises = RuntimeError("event set corrupted")
    with caplog.at_level(logging.ERROR, logger="gpuwarden"):
        source = open_source()
        deadline = time.monotonic() + 5.0
        while "event set corrupted" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.005)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "\n" not in errors[0].getMessage()
    assert "event set corrupted" in errors[0].getMessage()
    assert len(source.snapshot(NOW).gpus) == 8


def test_events_switch_starts_no_thread(nvml: FakeNvml, open_source) -> None:
    open_source(events=False).snapshot(NOW)
    assert nvml.calls["nvmlEventSetCreate"] == 0
    assert nvml.calls["nvmlEventSetWait_v2"] == 0


def test_close_stops_the_thread_and_shuts_nvml_down_once(nvml: FakeNvml, open_source) -> None:
    source = open_source()
    source.close()
    waits = nvml.calls["nvmlEventSetWait_v2"]
    source.close()
    assert (nvml.shutdowns, nvml.event_sets_freed) == (1, 1)
    time.sleep(0.05)
    assert nvml.calls["nvmlEventSetWait_v2"] == waits  # nobody waits any more
    with pytest.raises(RuntimeError, match="closed"):
        source.snapshot(NOW)


# -- NVML that does not start ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "says", "hint"),
    [
        (LIBRARY_NOT_FOUND, "NVML library not found (libnvidia-ml.so.1)", "scenario:FILE"),
        (DRIVER_NOT_LOADED, "NVIDIA driver not loaded", "modprobe nvidia"),
        (NO_PERMISSION, "no permission to open the NVIDIA devices", "PrivateDevices"),
        (LIB_RM_VERSION_MISMATCH, "versions differ", "reboot"),
        (UNKNOWN, "NVML failed to start: Unknown Error (NVML_ERROR_UNKNOWN)", "nvidia-smi"),
    ],
)
def test_nvml_that_does_not_start_is_one_clear_message(nvml: FakeNvml, code, says, hint) -> None:
    nvml.init_error = code
    with pytest.raises(SourceUnavailable) as caught:
        NvmlSource(None, host="gpu-node-7")
    error = caught.value
    message, hint_line = error.render().split("\n")
    assert says in message
    assert hint_line.startswith("  hint: ")
    assert hint in hint_line
    assert "Traceback" not in error.render()
    assert "NVMLError" not in error.render()
    assert error.__cause__ is None
    assert error.__suppress_context__
    assert error.exit_code == ExitCode.SOURCE_UNAVAILABLE


def test_a_library_without_init_with_flags_is_too_old(nvml: FakeNvml) -> None:
    nvml.missing = {"nvmlInitWithFlags"}
    with pytest.raises(SourceUnavailable, match="too old"):
        NvmlSource(None, host="h")


def test_counting_the_gpus_fails(nvml: FakeNvml) -> None:
    nvml.count_error = UNKNOWN
    with pytest.raises(SourceUnavailable, match="cannot count the GPUs"):
        NvmlSource(None, host="h")
    assert nvml.shutdowns == 1  # what was started is shut down


# -- the real thing ----------------------------------------------------------------------------


@pytest.mark.gpu
def test_a_real_snapshot_is_consistent() -> None:
    import socket

    with NvmlSource(None, host=socket.gethostname()) as source:
        snap = source.snapshot(time.time())
        assert snap.source == "nvml"
        assert snap.gpus
        assert [g.index for g in snap.gpus] == list(range(len(snap.gpus)))
        for gpu in snap.gpus:
            if gpu.lost:
                assert gpu.error
                continue
            assert gpu.name
            assert gpu.uuid
            assert gpu.uuid.startswith(("GPU-", "MIG-"))
            memory = gpu.memory
            if memory.total_mib is not None and memory.used_mib is not None:
                assert memory.total_mib > 0
                assert 0 <= memory.used_mib <= memory.total_mib
            if gpu.utilization_pct is not None:
                assert 0 <= gpu.utilization_pct <= 100
            if gpu.power_w is not None and gpu.power_limit_w is not None:
                assert 0 <= gpu.power_w <= gpu.power_limit_w * 1.5
        uuids = {g.uuid for g in snap.gpus}
        for proc in snap.processes:
            assert proc.gpu_uuid in uuids
            assert proc.pid > 0
            assert proc.info.pid == proc.pid


def test_a_peek_leaves_the_events_to_the_next_snapshot(nvml: FakeNvml, open_source) -> None:
    source = open_source()
    source.snapshot(NOW)
    nvml.emit_xid(5, 79)
    nvml.gpus[2].lost = GPU_IS_LOST
    watcher = source._watcher
    assert watcher is not None
    deadline = time.monotonic() + 5.0
    while not watcher._pending and time.monotonic() < deadline:  # the thread has it waiting
        time.sleep(0.005)
    peeked = source.peek(NOW + 1)
    assert peeked.events == ()
    assert peeked.gpus[2].lost
    snap = source.snapshot(NOW + 2)
    assert sorted((str(e.kind), e.gpu) for e in snap.events) == [("gpu_lost", 2), ("xid", 5)]
