"""The real GPUs, read through NVML (``nvidia-ml-py``, imported as ``pynvml``).

``NvmlSource`` starts NVML, reads every GPU once per snapshot (``sources.nvml_device``: one call
funnel, per-GPU fault isolation), joins the processes with their attribution, and hands over the
events a background thread caught since the last snapshot (``sources.nvml_events``), plus one
``GPU_LOST`` event for each GPU that turned lost since the previous snapshot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any, Protocol

import pynvml

from gpuwarden.errors import SourceUnavailable
from gpuwarden.model import (
    Event,
    EventKind,
    GpuProcess,
    GpuState,
    ProcessInfo,
    Snapshot,
    bytes_to_mib,
)
from gpuwarden.sources.nvml_device import (
    DeviceMemo,
    GpuGone,
    RawProcess,
    describe_error,
    nvml_call,
    read_fast,
    read_processes,
    read_state,
)
from gpuwarden.sources.nvml_events import EventWatcher

logger = logging.getLogger(__name__)

_NO_DRIVER_HINT = (
    "install the NVIDIA driver, or use --source scenario:FILE to rehearse without a GPU"
)


class ProcessAttributor(Protocol):
    """Tells who each PID belongs to (implemented by ``sources.procs``)."""

    def describe(self, pids: Iterable[int], now: float) -> dict[int, ProcessInfo]: ...


def unavailable(exc: Any) -> SourceUnavailable:
    """nvmlInit's failure as the one message a person can act on."""
    code = getattr(exc, "value", None)
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return SourceUnavailable(
            "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver is installed on this "
            "machine",
            _NO_DRIVER_HINT,
        )
    if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return SourceUnavailable(
            "NVIDIA driver not loaded: libnvidia-ml.so.1 is installed but the nvidia kernel "
            "module is not running",
            "load it (modprobe nvidia) and check dmesg for why it failed; nvidia-smi must work "
            "before gpuwarden can read the GPUs",
        )
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return SourceUnavailable(
            "no permission to open the NVIDIA devices (/dev/nvidiactl, /dev/nvidia*)",
            "run gpuwarden as root or as a user allowed to open /dev/nvidia*; under systemd, "
            "do not set PrivateDevices= or DevicePolicy=closed",
        )
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return SourceUnavailable(
            "NVML library and NVIDIA kernel driver versions differ (the driver was upgraded "
            "without a reboot?)",
            "reboot, or reload the nvidia kernel modules, so that both come from one driver "
            "release",
        )
    if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND or isinstance(
        exc, pynvml.NVMLLibraryMismatchError
    ):
        return SourceUnavailable(
            "the installed NVML library is too old for gpuwarden (nvmlInitWithFlags is missing)",
            "upgrade the NVIDIA driver",
        )
    return SourceUnavailable(
        f"NVML failed to start: {describe_error(exc)}",
        "check that nvidia-smi works on this machine",
    )


class NvmlSource:
    """Snapshots of this machine's NVIDIA GPUs, their processes, and the NVML events between."""

    name = "nvml"

    def __init__(
        self,
        attributor: ProcessAttributor | None,
        *,
        host: str,
        process_utilization: bool = True,
        ecc: bool = True,
        events: bool = True,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._attributor = attributor
        self._host = host
        self._process_utilization = process_utilization
        self._ecc = ecc
        self._closed = False
        self._watcher: EventWatcher | None = None
        try:
            pynvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_GPUS)
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
            raise unavailable(exc) from None
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            self._shutdown()
            raise SourceUnavailable(
                f"NVML started but cannot count the GPUs: {describe_error(exc)}",
                "check that nvidia-smi works on this machine",
            ) from None
        if count == 0:
            logger.warning("nvml found no GPU on this machine")
        self._gpus = [DeviceMemo() for _ in range(count)]
        self._fast_handles: dict[int, Any] = {}  # fast_gpus' device handles, by GPU index
        if events and count:
            handles = {}
            for index in range(count):
                try:
                    handles[index] = nvml_call(
                        pynvml.nvmlDeviceGetHandleByIndex, index, required=True
                    )
                except GpuGone as gone:
                    logger.warning("nvml events gpu=%d not registered: %s", index, gone.reason)
            self._watcher = EventWatcher(handles, wall=wall)
            self._watcher.start()

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    def snapshot(self, now: float) -> Snapshot:
        return self._snapshot(now, consume=True)

    def peek(self, now: float) -> Snapshot:
        """``snapshot`` without events: the watcher keeps them for the next one (``Source``)."""
        return self._snapshot(now, consume=False)

    def fast_gpus(self, now: float, fields: Collection[str]) -> tuple[GpuState, ...]:
        """Between ticks: each GPU's cheap fields (``read_fast``; about 25 µs a GPU through
        pynvml), nothing else; a GPU that cannot be read is left out (the next tick reads it
        in full and reports it lost). Device handles are kept between readings (one that
        fails is looked up afresh). ``now`` is unused: NVML answers for the present."""
        if self._closed:
            return ()
        states: list[GpuState] = []
        handles = self._fast_handles
        for index, memo in enumerate(self._gpus):
            if memo.lost:
                continue
            try:
                handle = handles.get(index)
                if handle is None:
                    handle = nvml_call(pynvml.nvmlDeviceGetHandleByIndex, index, required=True)
                    handles[index] = handle
                states.append(read_fast(index, handle, memo, fields))
            except GpuGone:
                handles.pop(index, None)
        return tuple(states)

    def _snapshot(self, now: float, *, consume: bool) -> Snapshot:
        if self._closed:
            raise RuntimeError("the NVML source is closed")
        states: list[GpuState] = []
        raw: list[tuple[GpuState, list[RawProcess]]] = []
        lost_events: list[Event] = []
        for index, memo in enumerate(self._gpus):
            state, processes = self._read_gpu(index, memo)
            if consume:
                if state.lost and memo.lost is False:
                    lost_events.append(
                        Event(
                            kind=EventKind.GPU_LOST, time=now, gpu=index, detail=state.error or ""
                        )
                    )
                memo.lost = state.lost
            states.append(state)
            raw.append((state, processes))
        drained = self._watcher.drain() if self._watcher and consume else []
        events = drained + lost_events
        return Snapshot(
            host=self._host,
            time=now,
            gpus=tuple(states),
            processes=self._attribute(raw, now),
            events=tuple(events),
            source=self.name,
        )

    def close(self) -> None:
        """Stop the event thread and shut NVML down. Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        self._shutdown()

    def __enter__(self) -> NvmlSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @staticmethod
    def _shutdown() -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            logger.warning("nvml shutdown failed: %s", describe_error(exc))

    # -- one GPU ---------------------------------------------------------------------------

    def _read_gpu(self, index: int, memo: DeviceMemo) -> tuple[GpuState, list[RawProcess]]:
        try:
            handle = nvml_call(pynvml.nvmlDeviceGetHandleByIndex, index, required=True)
            state = read_state(index, handle, memo, ecc=self._ecc)
            processes = read_processes(handle, memo, utilization=self._process_utilization)
        except GpuGone as gone:
            if memo.lost is not True:
                logger.warning("nvml gpu=%d lost: %s", index, gone.reason)
            lost = GpuState(
                index=index,
                name=memo.name,
                uuid=memo.uuid,
                pci_bus_id=memo.pci_bus_id,
                lost=True,
                error=gone.reason,
            )
            return lost, []
        return state, processes

    def _attribute(
        self, raw: list[tuple[GpuState, list[RawProcess]]], now: float
    ) -> tuple[GpuProcess, ...]:
        pids = sorted({proc.pid for _, procs in raw for proc in procs})
        infos: dict[int, ProcessInfo] = {}
        if pids and self._attributor is not None:
            try:
                infos = self._attributor.describe(pids, now)
            except Exception as exc:
                logger.error("process attribution failed: %s: %s", type(exc).__name__, exc)
        return tuple(
            GpuProcess(
                pid=proc.pid,
                gpu=state.index,
                gpu_memory_mib=bytes_to_mib(proc.used_bytes),
                info=infos.get(proc.pid) or ProcessInfo(pid=proc.pid),
                sm_util_pct=proc.sm_util_pct,
                gpu_uuid=state.uuid,
                kind=proc.kind,
            )
            for state, procs in raw
            for proc in procs
        )
