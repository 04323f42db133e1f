"""One NVIDIA GPU, read through NVML: the call funnel and the per-device readers.

Every NVML read goes through one funnel, :func:`nvml_call`, which sorts NVML's answers into
three kinds: a value; "the device cannot tell" (not supported, not found, no permission...),
which becomes ``None`` so that an unsupported field is never mistaken for ``0``; and "this GPU
is gone" (lost, needs a reset, unknown error...), which raises :class:`GpuGone` for the caller
to report the GPU as lost while the other GPUs keep reporting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import pynvml

from gpuwarden.model import (
    Ecc,
    GpuState,
    Memory,
    RemappedRows,
    RetiredPages,
    bytes_to_mib,
    throttle_names,
)

logger = logging.getLogger(__name__)

# Answers after which the GPU cannot be read at all this tick.
_GONE_CODES = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_IRQ_ISSUE,
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_OPERATING_SYSTEM,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_GPU_NOT_FOUND,
        pynvml.NVML_ERROR_UNKNOWN,
    }
)

# Answers meaning "this device (or driver, or our permissions) cannot tell this value".
_CANNOT_TELL_CODES = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NO_DATA,
        pynvml.NVML_ERROR_VGPU_ECC_NOT_SUPPORTED,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        pynvml.NVML_ERROR_DEPRECATED,
    }
)

_ERROR_NAMES: dict[int, str] = {
    getattr(pynvml, name): name for name in dir(pynvml) if name.startswith("NVML_ERROR_")
}

_ECC_COUNTERS = (
    (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
    (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
    (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
    (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
)


class GpuGone(Exception):
    """The GPU cannot be read at all; ``reason`` says why, for ``GpuState.error``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def describe_error(exc: Any) -> str:
    """An NVML error as one line: NVML's own words and the error's name."""
    code = getattr(exc, "value", None)
    name = _ERROR_NAMES.get(code, f"NVML error {code}") if isinstance(code, int) else "NVML error"
    return f"{exc} ({name})"


def nvml_call(
    fn: Callable[..., Any],
    *args: Any,
    required: bool = False,
    when_not_found: Any = None,
    **kwargs: Any,
) -> Any:
    """Call one pynvml function: its value, ``None`` when the device cannot tell, or GpuGone.

    ``when_not_found`` is returned instead of ``None`` for NVML_ERROR_NOT_FOUND (for calls where
    "not found" is an answer, such as "no utilization samples since then"). With ``required``,
    every NVML error raises GpuGone: for calls without which nothing else can be read.
    """
    try:
        return fn(*args, **kwargs)
    except pynvml.NVMLLibraryMismatchError as exc:
        # pynvml's name for FUNCTION_NOT_FOUND on calls without a version suffix.
        if required:
            raise GpuGone(f"{fn.__name__}: {exc}") from None
        return None
    except pynvml.NVMLError as exc:
        code = exc.value
        if required or code in _GONE_CODES:
            raise GpuGone(describe_error(exc)) from None
        if code == pynvml.NVML_ERROR_NOT_FOUND:
            return when_not_found
        if code not in _CANNOT_TELL_CODES:
            logger.debug("nvml call=%s error=%s: read as unknown", fn.__name__, describe_error(exc))
        return None


@dataclass
class DeviceMemo:
    """What the source remembers about one GPU between snapshots."""

    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    lost: bool | None = None  # None until the first snapshot
    util_since_us: int = 0  # newest process-utilization sample seen (NVML's CPU microseconds)


@dataclass(frozen=True, slots=True)
class RawProcess:
    """One process on one GPU as NVML tells it, before attribution."""

    pid: int
    used_bytes: int | None
    kind: str
    sm_util_pct: int | None


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else int(milliwatts) / 1000.0


def read_state(index: int, handle: Any, memo: DeviceMemo, *, ecc: bool) -> GpuState:
    """Every field of one GPU; raises GpuGone when the GPU cannot be read."""
    _read_identity(handle, memo)
    util = nvml_call(pynvml.nvmlDeviceGetUtilizationRates, handle)
    pstate = nvml_call(pynvml.nvmlDeviceGetPerformanceState, handle)
    mig = nvml_call(pynvml.nvmlDeviceGetMigMode, handle)
    rows = _read_remapped_rows(handle) if ecc else None
    return GpuState(
        index=index,
        name=memo.name,
        uuid=memo.uuid,
        pci_bus_id=memo.pci_bus_id,
        memory=_read_memory(handle),
        utilization_pct=None if util is None else int(util.gpu),
        memory_utilization_pct=None if util is None else int(util.memory),
        temperature_c=_read_temperature(handle),
        power_w=_watts(nvml_call(pynvml.nvmlDeviceGetPowerUsage, handle)),
        power_limit_w=_watts(nvml_call(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)),
        throttle=_read_throttle(handle),
        ecc=_read_ecc(handle) if ecc else None,
        remapped_rows=rows,
        retired_pages=_read_retired_pages(handle) if ecc and rows is None else None,
        pstate=None if pstate is None or pstate == pynvml.NVML_PSTATE_UNKNOWN else int(pstate),
        mig_mode=None if mig is None else mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE,
        sm_clock_mhz=_int(nvml_call(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)),
        memory_clock_mhz=_int(
            nvml_call(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM)
        ),
        energy_mj=_int(nvml_call(pynvml.nvmlDeviceGetTotalEnergyConsumption, handle)),
    )


def read_fast(index: int, handle: Any, memo: DeviceMemo, fields: Collection[str]) -> GpuState:
    """The cheap, fast-moving fields between ticks: memory always, and utilization,
    temperature and power when one of ``fields`` (``gpu.…`` names) needs them; every other
    field unknown. Tens of µs per GPU against a driver. Raises GpuGone like ``read_state``."""
    util = None
    if "gpu.utilization_pct" in fields or "gpu.memory_utilization_pct" in fields:
        util = nvml_call(pynvml.nvmlDeviceGetUtilizationRates, handle)
    power = any(f.startswith("gpu.power") for f in fields)
    return GpuState(
        index=index,
        name=memo.name,
        uuid=memo.uuid,
        pci_bus_id=memo.pci_bus_id,
        memory=_read_memory(handle),
        utilization_pct=None if util is None else int(util.gpu),
        memory_utilization_pct=None if util is None else int(util.memory),
        temperature_c=_read_temperature(handle) if "gpu.temperature_c" in fields else None,
        power_w=_watts(nvml_call(pynvml.nvmlDeviceGetPowerUsage, handle)) if power else None,
        power_limit_w=(
            _watts(nvml_call(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)) if power else None
        ),
    )


def _read_identity(handle: Any, memo: DeviceMemo) -> None:
    """Name, UUID and PCI bus id never change: read each until it is known."""
    if memo.name is None:
        memo.name = _str(nvml_call(pynvml.nvmlDeviceGetName, handle))
    if memo.uuid is None:
        memo.uuid = _str(nvml_call(pynvml.nvmlDeviceGetUUID, handle))
    if memo.pci_bus_id is None:
        pci = nvml_call(pynvml.nvmlDeviceGetPciInfo, handle)
        memo.pci_bus_id = None if pci is None else _str(pci.busId)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _read_memory(handle: Any) -> Memory:
    info = nvml_call(pynvml.nvmlDeviceGetMemoryInfo, handle, version=pynvml.nvmlMemory_v2)
    if info is not None:
        return Memory(
            total_mib=bytes_to_mib(info.total),
            used_mib=bytes_to_mib(info.used),
            free_mib=bytes_to_mib(info.free),
            reserved_mib=bytes_to_mib(info.reserved),
        )
    info = nvml_call(pynvml.nvmlDeviceGetMemoryInfo, handle)  # older drivers: no "reserved"
    if info is None:
        return Memory()
    return Memory(
        total_mib=bytes_to_mib(info.total),
        used_mib=bytes_to_mib(info.used),
        free_mib=bytes_to_mib(info.free),
    )


def _read_temperature(handle: Any) -> int | None:
    sensor = pynvml.NVML_TEMPERATURE_GPU
    temperature = nvml_call(pynvml.nvmlDeviceGetTemperatureV, handle, sensor)
    if temperature is None:
        temperature = nvml_call(pynvml.nvmlDeviceGetTemperature, handle, sensor)
    return _int(temperature)


def _read_throttle(handle: Any) -> tuple[str, ...] | None:
    reasons = nvml_call(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
    if reasons is None:  # drivers before the "clock event" rename
        reasons = nvml_call(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
    return None if reasons is None else throttle_names(int(reasons))


def _read_ecc(handle: Any) -> Ecc | None:
    counts = [
        _int(nvml_call(pynvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter_type))
        for error_type, counter_type in _ECC_COUNTERS
    ]
    if all(count is None for count in counts):
        return None
    return Ecc(
        volatile_corrected=counts[0],
        volatile_uncorrected=counts[1],
        aggregate_corrected=counts[2],
        aggregate_uncorrected=counts[3],
    )


def _read_remapped_rows(handle: Any) -> RemappedRows | None:
    rows = nvml_call(pynvml.nvmlDeviceGetRemappedRows, handle)
    if rows is None:
        return None
    correctable, uncorrectable, pending, failure = rows
    return RemappedRows(
        correctable=int(correctable),
        uncorrectable=int(uncorrectable),
        pending=bool(pending),
        failure=bool(failure),
    )


def _read_retired_pages(handle: Any) -> RetiredPages | None:
    single = nvml_call(
        pynvml.nvmlDeviceGetRetiredPages,
        handle,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    )
    if single is None:
        return None
    double = nvml_call(
        pynvml.nvmlDeviceGetRetiredPages,
        handle,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    )
    pending = nvml_call(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    if double is None or pending is None:
        return None
    return RetiredPages(single_bit=len(single), double_bit=len(double), pending=bool(pending))


def read_processes(handle: Any, memo: DeviceMemo, *, utilization: bool) -> list[RawProcess]:
    """The compute and graphics processes on one GPU, by PID, with their SM utilization."""
    found: dict[int, tuple[int | None, str]] = {}
    for fn, kind in (
        (pynvml.nvmlDeviceGetComputeRunningProcesses, "compute"),
        (pynvml.nvmlDeviceGetGraphicsRunningProcesses, "graphics"),
    ):
        for proc in nvml_call(fn, handle) or ():
            # A process doing both appears in both lists: one entry, as "compute".
            found.setdefault(int(proc.pid), (_int(proc.usedGpuMemory), kind))
    if not found:
        return []
    sm_util = _read_sm_util(handle, memo) if utilization else None
    return [
        RawProcess(
            pid=pid,
            used_bytes=used,
            kind=kind,
            sm_util_pct=None if sm_util is None else sm_util.get(pid, 0),
        )
        for pid, (used, kind) in sorted(found.items())
    ]


def _read_sm_util(handle: Any, memo: DeviceMemo) -> dict[int, int] | None:
    """SM % per PID from the samples newer than the newest seen before on this GPU.

    No samples since then (NVML_ERROR_NOT_FOUND) means every process was idle: an empty
    mapping, so each PID reads 0. ``None`` when the device cannot tell at all.
    """
    samples = nvml_call(
        pynvml.nvmlDeviceGetProcessUtilization, handle, memo.util_since_us, when_not_found=[]
    )
    if samples is None:
        return None
    newest: dict[int, tuple[int, int]] = {}
    for sample in samples:
        stamp, pid = int(sample.timeStamp), int(sample.pid)
        if pid not in newest or stamp >= newest[pid][0]:
            newest[pid] = (stamp, int(sample.smUtil))
        memo.util_since_us = max(memo.util_since_us, stamp)
    return {pid: util for pid, (_, util) in newest.items()}
