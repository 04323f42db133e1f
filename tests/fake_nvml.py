"""A fake NVML *library*: the C functions, written in Python, behind pynvml's real wrappers.

pynvml finds every C function with ``getattr(pynvml.nvmlLib, name)``. ``installed(fake)`` puts a
``FakeNvml`` there (and empties pynvml's function cache), so the code under test runs pynvml's
own argument packing, struct parsing and error mapping against fake GPUs that answer through
the ctypes ``byref`` pointers, as the driver does. Everything that knows pynvml's internals
lives in this module.

Fake GPUs are declarative: a ``FakeGpu`` holds the values a GPU reports and which C functions
answer with an error (``unsupported``, ``failing``) or whether the whole GPU is ``lost``.
"""

from __future__ import annotations

import contextlib
import ctypes
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pynvml

MIB = 1024 * 1024

SUCCESS: int = pynvml.NVML_SUCCESS
UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION: int = pynvml.NVML_ERROR_NO_PERMISSION
NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
INSUFFICIENT_SIZE: int = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
DRIVER_NOT_LOADED: int = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
LIBRARY_NOT_FOUND: int = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
FUNCTION_NOT_FOUND: int = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
RESET_REQUIRED: int = pynvml.NVML_ERROR_RESET_REQUIRED
LIB_RM_VERSION_MISMATCH: int = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
ARGUMENT_VERSION_MISMATCH: int = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN

EVENT_SINGLE_BIT_ECC: int = pynvml.nvmlEventTypeSingleBitEccError
EVENT_DOUBLE_BIT_ECC: int = pynvml.nvmlEventTypeDoubleBitEccError
EVENT_XID: int = pynvml.nvmlEventTypeXidCriticalError
EVENT_PSTATE: int = pynvml.nvmlEventTypePState

NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long

_HANDLE_BASE = 0x6000  # fake device handles are these addresses plus the GPU index
_EVENT_SET_ADDRESS = 0x7000


@dataclass
class FakeProcess:
    pid: int
    used_bytes: int | None = 1024 * MIB  # None: NVML cannot tell (written as NOT_AVAILABLE)
    sm_util: int | None = None  # None: no utilization sample for this process
    kind: str = "compute"  # "compute", "graphics" or "both"


@dataclass
class FakeEcc:
    volatile_corrected: int = 0
    volatile_uncorrected: int = 0
    aggregate_corrected: int = 0
    aggregate_uncorrected: int = 0


@dataclass
class FakeGpu:
    """One fake GPU. C functions named in ``unsupported`` answer NOT_SUPPORTED, those in
    ``failing`` answer their code; when ``lost`` is set every call on the GPU answers it."""

    index: int = 0
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    pci_bus_id: str = ""
    total_mib: int = 81559
    used_mib: int = 512
    reserved_mib: int = 480
    extra_bytes: int = 0  # added to "used" to check that MiB are rounded down
    gpu_util: int = 0
    mem_util: int = 0
    temperature_c: int = 34
    power_mw: int = 71_250
    power_limit_mw: int = 700_000
    clocks_event_reasons: int = 0x1
    ecc: FakeEcc = field(default_factory=FakeEcc)
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    retired_pages: tuple[list[int], list[int], bool] | None = None  # (single, double, pending)
    pstate: int = 0
    mig_mode: tuple[int, int] = (0, 0)
    sm_clock_mhz: int = 1980
    memory_clock_mhz: int = 2619
    energy_mj: int = 86_400_000_000
    processes: list[FakeProcess] = field(default_factory=list)
    sample_time_us: int = 1_000_000  # timestamp of this GPU's utilization samples
    supported_events: int = EVENT_XID | EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_PSTATE
    unsupported: set[str] = field(default_factory=set)
    failing: dict[str, int] = field(default_factory=dict)
    lost: int | None = None

    def __post_init__(self) -> None:
        self.uuid = self.uuid or f"GPU-{self.index:08x}-0000-4000-8000-{self.index:012x}"
        self.pci_bus_id = self.pci_bus_id or f"00000000:{0x18 + 0x10 * self.index:02X}:00.0"

    def answer(self, function: str) -> int:
        if self.lost is not None:
            return self.lost
        if function in self.failing:
            return self.failing[function]
        if function in self.unsupported:
            return NOT_SUPPORTED
        return SUCCESS


def _value(arg: Any) -> int:
    return int(arg.value) if hasattr(arg, "value") else int(arg)


def _target(pointer: Any) -> Any:
    """The ctypes object a ``byref`` argument points at."""
    return pointer._obj


def _write_address(pointer: Any, address: int) -> None:
    ctypes.c_void_p.from_buffer(_target(pointer)).value = address


class FakeNvml:
    """The fake library. ``calls`` counts every C function called, by name."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.init_error: int | None = None
        self.count_error: int | None = None
        self.missing: set[str] = set()  # C functions this library does not export
        self.calls: Counter[str] = Counter()
        self.init_flags: list[int] = []
        self.shutdowns = 0
        self.registered: dict[int, int] = {}
        self.event_sets_freed = 0
        self.util_since: dict[int, list[int]] = {}
        self.wait_timeouts_ms: list[int] = []
        self.max_wait_s = 0.02  # a wait returns TIMEOUT after this, whatever it asked for
        self.wait_error: int | None = None  # every wait answers this code
        self.wait_raises: Exception | None = None  # the wait itself blows up
        self._events: queue.Queue[tuple[int, int, int]] = queue.Queue()
        self._lock = threading.Lock()

    # -- what tests call --------------------------------------------------------------------

    def emit(self, gpu: int, event_type: int, data: int = 0) -> None:
        """An event happens on a GPU; delivered if that GPU registered for its type."""
        self._events.put((gpu, event_type, data))

    def emit_xid(self, gpu: int, xid: int) -> None:
        self.emit(gpu, EVENT_XID, xid)

    def lookup(self, name: str) -> Callable[..., int]:
        """What ``getattr(nvmlLib, name)`` gives pynvml."""
        if name in self.missing or not name.startswith("nvml"):
            raise AttributeError(name)
        impl = getattr(self, f"_c_{name}", None)
        if impl is None:
            raise AttributeError(name)

        def call(*args: Any) -> int:
            with self._lock:
                self.calls[name] += 1
            return int(impl(*args))

        call.__name__ = name
        return call

    def _gpu(self, handle: Any) -> FakeGpu:
        address = ctypes.cast(handle, ctypes.c_void_p).value or 0
        return self.gpus[address - _HANDLE_BASE]

    def _answer(self, handle: Any, function: str) -> tuple[FakeGpu, int]:
        gpu = self._gpu(handle)
        return gpu, gpu.answer(function)

    # -- library ----------------------------------------------------------------------------

    def _c_nvmlInitWithFlags(self, flags: Any) -> int:
        self.init_flags.append(_value(flags))
        return self.init_error or SUCCESS

    def _c_nvmlShutdown(self) -> int:
        self.shutdowns += 1
        return SUCCESS

    def _c_nvmlErrorString(self, code: Any) -> bytes:
        return f"fake NVML error {_value(code)}".encode()

    def _c_nvmlDeviceGetCount_v2(self, count: Any) -> int:
        if self.count_error is not None:
            return self.count_error
        _target(count).value = len(self.gpus)
        return SUCCESS

    def _c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, handle: Any) -> int:
        i = _value(index)
        if i >= len(self.gpus):
            return INVALID_ARGUMENT
        code = self.gpus[i].answer("nvmlDeviceGetHandleByIndex_v2")
        if code == SUCCESS:
            _write_address(handle, _HANDLE_BASE + i)
        return code

    # -- identity and load ------------------------------------------------------------------

    def _string(self, handle: Any, function: str, buffer: Any, text: str) -> int:
        _, code = self._answer(handle, function)
        if code == SUCCESS:
            buffer.value = text.encode()
        return code

    def _c_nvmlDeviceGetName(self, handle: Any, buffer: Any, _size: Any) -> int:
        return self._string(handle, "nvmlDeviceGetName", buffer, self._gpu(handle).name)

    def _c_nvmlDeviceGetUUID(self, handle: Any, buffer: Any, _size: Any) -> int:
        return self._string(handle, "nvmlDeviceGetUUID", buffer, self._gpu(handle).uuid)

    def _c_nvmlDeviceGetPciInfo_v3(self, handle: Any, info: Any) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetPciInfo_v3")
        if code == SUCCESS:
            _target(info).busId = gpu.pci_bus_id.encode()
        return code

    def _c_nvmlDeviceGetMemoryInfo_v2(self, handle: Any, memory: Any) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetMemoryInfo_v2")
        target = _target(memory)
        if code == SUCCESS and target.version != pynvml.nvmlMemory_v2:
            return ARGUMENT_VERSION_MISMATCH
        if code == SUCCESS:
            used = gpu.used_mib * MIB + gpu.extra_bytes
            target.total = gpu.total_mib * MIB
            target.reserved = gpu.reserved_mib * MIB
            target.used = used
            target.free = gpu.total_mib * MIB - gpu.reserved_mib * MIB - used
        return code

    def _c_nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetMemoryInfo")
        if code == SUCCESS:
            used = (gpu.used_mib + gpu.reserved_mib) * MIB + gpu.extra_bytes
            target = _target(memory)
            target.total = gpu.total_mib * MIB
            target.used = used
            target.free = gpu.total_mib * MIB - used
        return code

    def _c_nvmlDeviceGetUtilizationRates(self, handle: Any, util: Any) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetUtilizationRates")
        if code == SUCCESS:
            _target(util).gpu = gpu.gpu_util
            _target(util).memory = gpu.mem_util
        return code

    def _c_nvmlDeviceGetTemperatureV(self, handle: Any, reading: Any) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetTemperatureV")
        target = _target(reading)
        if code == SUCCESS and target.version != pynvml.nvmlTemperature_v1:
            return ARGUMENT_VERSION_MISMATCH
        if code == SUCCESS:
            target.temperature = gpu.temperature_c
        return code

    def _c_nvmlDeviceGetTemperature(self, handle: Any, _sensor: Any, value: Any) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetTemperature")
        if code == SUCCESS:
            _target(value).value = gpu.temperature_c
        return code

    def _uint(self, handle: Any, function: str, out: Any, read: Callable[[FakeGpu], int]) -> int:
        gpu, code = self._answer(handle, function)
        if code == SUCCESS:
            _target(out).value = read(gpu)
        return code

    def _c_nvmlDeviceGetPowerUsage(self, handle: Any, out: Any) -> int:
        return self._uint(handle, "nvmlDeviceGetPowerUsage", out, lambda g: g.power_mw)

    def _c_nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, out: Any) -> int:
        return self._uint(
            handle, "nvmlDeviceGetEnforcedPowerLimit", out, lambda g: g.power_limit_mw
        )

    def _c_nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, out: Any) -> int:
        name = "nvmlDeviceGetCurrentClocksEventReasons"
        return self._uint(handle, name, out, lambda g: g.clocks_event_reasons)

    def _c_nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any, out: Any) -> int:
        name = "nvmlDeviceGetCurrentClocksThrottleReasons"
        return self._uint(handle, name, out, lambda g: g.clocks_event_reasons)

    def _c_nvmlDeviceGetClockInfo(self, handle: Any, kind: Any, out: Any) -> int:
        clocks = {pynvml.NVML_CLOCK_SM: "sm_clock_mhz", pynvml.NVML_CLOCK_MEM: "memory_clock_mhz"}
        name = clocks.get(_value(kind))
        if name is None:
            return NOT_SUPPORTED
        return self._uint(handle, "nvmlDeviceGetClockInfo", out, lambda g: getattr(g, name))

    def _c_nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, out: Any) -> int:
        name = "nvmlDeviceGetTotalEnergyConsumption"
        return self._uint(handle, name, out, lambda g: g.energy_mj)

    def _c_nvmlDeviceGetPerformanceState(self, handle: Any, out: Any) -> int:
        return self._uint(handle, "nvmlDeviceGetPerformanceState", out, lambda g: g.pstate)

    def _c_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetMigMode")
        if code == SUCCESS:
            _target(current).value, _target(pending).value = gpu.mig_mode
        return code

    # -- memory health ----------------------------------------------------------------------

    def _c_nvmlDeviceGetTotalEccErrors(
        self, handle: Any, error_type: Any, counter_type: Any, count: Any
    ) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetTotalEccErrors")
        if code == SUCCESS:
            scope = "volatile" if _value(counter_type) == pynvml.NVML_VOLATILE_ECC else "aggregate"
            kind = (
                "corrected"
                if _value(error_type) == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
                else "uncorrected"
            )
            _target(count).value = getattr(gpu.ecc, f"{scope}_{kind}")
        return code

    def _c_nvmlDeviceGetRemappedRows(
        self, handle: Any, corr: Any, unc: Any, pending: Any, failure: Any
    ) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetRemappedRows")
        if code == SUCCESS and gpu.remapped_rows is None:
            return NOT_SUPPORTED
        if code == SUCCESS and gpu.remapped_rows is not None:
            for out, value in zip((corr, unc, pending, failure), gpu.remapped_rows, strict=True):
                _target(out).value = value
        return code

    def _c_nvmlDeviceGetRetiredPages(self, handle: Any, cause: Any, count: Any, pages: Any) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetRetiredPages")
        if code == SUCCESS and gpu.retired_pages is None:
            return NOT_SUPPORTED
        if code != SUCCESS or gpu.retired_pages is None:
            return code
        single, double, _ = gpu.retired_pages
        addresses = single if _value(cause) == 0 else double
        if pages is None:
            _target(count).value = len(addresses)
            return INSUFFICIENT_SIZE if addresses else SUCCESS
        room = _target(count).value
        for i, address in enumerate(addresses[:room]):
            pages[i] = address
        _target(count).value = len(addresses)
        return SUCCESS

    def _c_nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, pending: Any) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        if code == SUCCESS and gpu.retired_pages is None:
            return NOT_SUPPORTED
        if code == SUCCESS and gpu.retired_pages is not None:
            _target(pending).value = int(gpu.retired_pages[2])
        return code

    # -- processes --------------------------------------------------------------------------

    def _processes(self, handle: Any, function: str, kind: str, count: Any, out: Any) -> int:
        gpu, code = self._answer(handle, function)
        if code != SUCCESS:
            return code
        procs = [p for p in gpu.processes if p.kind in (kind, "both")]
        if out is None:
            _target(count).value = len(procs)
            return INSUFFICIENT_SIZE if procs else SUCCESS
        if _target(count).value < len(procs):
            _target(count).value = len(procs)
            return INSUFFICIENT_SIZE
        for i, proc in enumerate(procs):
            out[i].pid = proc.pid
            out[i].usedGpuMemory = NOT_AVAILABLE if proc.used_bytes is None else proc.used_bytes
            out[i].gpuInstanceId = 0xFFFFFFFF
            out[i].computeInstanceId = 0xFFFFFFFF
        _target(count).value = len(procs)
        return SUCCESS

    def _c_nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, out: Any) -> int:
        name = "nvmlDeviceGetComputeRunningProcesses_v3"
        return self._processes(handle, name, "compute", count, out)

    def _c_nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any, count: Any, out: Any) -> int:
        name = "nvmlDeviceGetGraphicsRunningProcesses_v3"
        return self._processes(handle, name, "graphics", count, out)

    def _c_nvmlDeviceGetProcessUtilization(
        self, handle: Any, samples: Any, count: Any, since: Any
    ) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceGetProcessUtilization")
        if code != SUCCESS:
            return code
        last_seen = _value(since)
        if samples is None:
            self.util_since.setdefault(gpu.index, []).append(last_seen)
        fresh = [p for p in gpu.processes if p.sm_util is not None]
        if gpu.sample_time_us <= last_seen or not fresh:
            return NOT_FOUND
        if samples is None:
            _target(count).value = len(fresh)
            return INSUFFICIENT_SIZE
        for i, proc in enumerate(fresh[: _target(count).value]):
            samples[i].pid = proc.pid
            samples[i].timeStamp = gpu.sample_time_us
            samples[i].smUtil = proc.sm_util or 0
            samples[i].memUtil = 0
        return SUCCESS

    # -- events -----------------------------------------------------------------------------

    def _c_nvmlEventSetCreate(self, event_set: Any) -> int:
        _write_address(event_set, _EVENT_SET_ADDRESS)
        return SUCCESS

    def _c_nvmlEventSetFree(self, _event_set: Any) -> int:
        self.event_sets_freed += 1
        return SUCCESS

    def _c_nvmlDeviceGetSupportedEventTypes(self, handle: Any, out: Any) -> int:
        name = "nvmlDeviceGetSupportedEventTypes"
        return self._uint(handle, name, out, lambda g: g.supported_events)

    def _c_nvmlDeviceRegisterEvents(self, handle: Any, mask: Any, _event_set: Any) -> int:
        gpu, code = self._answer(handle, "nvmlDeviceRegisterEvents")
        if code == SUCCESS:
            if _value(mask) & ~gpu.supported_events:
                return NOT_SUPPORTED
            self.registered[gpu.index] = self.registered.get(gpu.index, 0) | _value(mask)
        return code

    def _c_nvmlEventSetWait_v2(self, _event_set: Any, data: Any, timeout_ms: Any) -> int:
        requested = _value(timeout_ms)
        self.wait_timeouts_ms.append(requested)
        if self.wait_raises is not None:
            raise self.wait_raises
        if self.wait_error is not None:
            return self.wait_error
        try:
            gpu, event_type, payload = self._events.get(
                timeout=min(requested / 1000, self.max_wait_s)
            )
        except queue.Empty:
            return TIMEOUT
        if not self.registered.get(gpu, 0) & event_type:
            return TIMEOUT  # NVML would not have delivered it
        target = _target(data)
        target.device = ctypes.cast(ctypes.c_void_p(_HANDLE_BASE + gpu), pynvml.c_nvmlDevice_t)
        target.eventType = event_type
        target.eventData = payload
        target.gpuInstanceId = 0xFFFFFFFF
        target.computeInstanceId = 0xFFFFFFFF
        return SUCCESS


class _Library:
    """The object pynvml sees as the loaded shared library."""

    def __init__(self, fake: FakeNvml) -> None:
        self._fake = fake

    def __getattr__(self, name: str) -> Callable[..., int]:
        return self._fake.lookup(name)


def eight_gpus(**values: Any) -> list[FakeGpu]:
    """Eight healthy, identical GPUs (an 8-way H100 server)."""
    return [FakeGpu(index=i, **values) for i in range(8)]


@contextlib.contextmanager
def installed(fake: FakeNvml) -> Iterator[FakeNvml]:
    """Make pynvml call ``fake``; put the real library state back afterwards."""
    saved_lib = pynvml.nvmlLib
    saved_cache = dict(pynvml._nvmlGetFunctionPointer_cache)
    saved_refcount = pynvml._nvmlLib_refcount
    pynvml.nvmlLib = _Library(fake)
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield fake
    finally:
        pynvml.nvmlLib = saved_lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved_cache)
        pynvml._nvmlLib_refcount = saved_refcount
