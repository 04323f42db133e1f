"""NVML events (XID errors, ECC errors) caught by a background thread between two snapshots.

NVML delivers events through an event set: register each GPU for the event types it supports,
then wait on the set. The wait blocks in C with the GIL released, so it runs in its own daemon
thread with a short timeout (a timeout is the normal "nothing happened" answer) and hands each
event to the source through a bounded, thread-safe buffer that ``drain()`` empties once per
snapshot. Nothing here may crash the daemon: a GPU that cannot be registered is skipped, and a
failure of the thread is logged in one line and ends the thread, not the process.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from gpuwarden.model import Event, EventKind

logger = logging.getLogger(__name__)

XID_CRITICAL = 0x8
SINGLE_BIT_ECC = 0x1
DOUBLE_BIT_ECC = 0x2
PSTATE_CHANGE = 0x4
CLOCK_CHANGE = 0x10

#: The event types gpuwarden listens for, before masking with what each GPU supports.
WATCHED = XID_CRITICAL | SINGLE_BIT_ECC | DOUBLE_BIT_ECC

_KINDS: dict[int, EventKind] = {
    XID_CRITICAL: EventKind.XID,
    SINGLE_BIT_ECC: EventKind.ECC_SINGLE_BIT,
    DOUBLE_BIT_ECC: EventKind.ECC_DOUBLE_BIT,
    PSTATE_CHANGE: EventKind.PSTATE,
    CLOCK_CHANGE: EventKind.CLOCK,
}

# What on-call staff most often need to know about an XID, after NVIDIA's XID catalogue.
MAX_PENDING = 10_000


def handle_address(handle: Any) -> int | None:
    """The address an NVML device handle points at: how an event names its GPU."""
    address = ctypes.cast(handle, ctypes.c_void_p).value
    return None if address is None else int(address)


def to_event(event_type: int, event_data: int, gpu: int | None, time: float) -> Event | None:
    """One NVML event as a gpuwarden Event; ``None`` for a type gpuwarden has no kind for."""
    kind = _KINDS.get(event_type)
    if kind is None:
        return None
    if kind is EventKind.XID:
        # Its meaning is looked up where it is shown (gpuwarden.xid), not stored twice.
        return Event(kind=kind, time=time, gpu=gpu, xid=int(event_data))
    return Event(kind=kind, time=time, gpu=gpu, detail=kind.value.replace("_", " "))


class EventWatcher:
    """Registers GPUs for events and collects them on a daemon thread until ``stop()``."""

    def __init__(
        self,
        handles: Mapping[int, Any],
        *,
        wall: Callable[[], float],
        wait_ms: int = 1000,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self._handles = dict(handles)
        self._wall = wall
        self._wait_ms = wait_ms
        self._max_pending = max_pending
        self._lock = threading.Lock()
        self._pending: deque[Event] = deque()
        self._dropped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._gpu_by_address: dict[int, int] = {}
        self.registered: dict[int, int] = {}

    def start(self) -> None:
        """Create the event set, register every GPU that allows it, start waiting.

        Registration happens here, before ``start`` returns, so that no event that happens
        after it is missed; the wait runs on the thread. Never raises.
        """
        try:
            self._start()
        except Exception as exc:
            logger.error("nvml events not started: %s: %s", type(exc).__name__, exc)
            self._free()

    def _start(self) -> None:
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            logger.warning("nvml events unavailable: cannot create an event set: %s", exc)
            return
        for index, handle in sorted(self._handles.items()):
            self._register(index, handle)
        if not self.registered:
            logger.warning("nvml events unavailable: no GPU accepted an event registration")
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    def _register(self, index: int, handle: Any) -> None:
        try:
            supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
            mask = WATCHED & supported
            if mask:
                pynvml.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
        except pynvml.NVMLError as exc:
            logger.warning("nvml events gpu=%d not registered: %s", index, exc)
            return
        if not mask:
            logger.info("nvml events gpu=%d supports none of the watched event types", index)
            return
        self.registered[index] = mask
        address = handle_address(handle)
        if address is not None:
            self._gpu_by_address[address] = index

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:
            logger.error("nvml events thread stopped: %s: %s", type(exc).__name__, exc)
        finally:
            self._free()

    def _loop(self) -> None:
        failing: int | None = None
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, self._wait_ms)
            except pynvml.NVMLError_Timeout:
                failing = None
                continue
            except pynvml.NVMLError as exc:
                if exc.value != failing:
                    logger.warning("nvml events wait failed: %s; retrying", exc)
                    failing = exc.value
                self._stop.wait(self._wait_ms / 1000.0)
                continue
            failing = None
            address = handle_address(data.device)
            gpu = None if address is None else self._gpu_by_address.get(address)
            event = to_event(int(data.eventType), int(data.eventData), gpu, self._wall())
            if event is not None:
                self._push(event)

    def _push(self, event: Event) -> None:
        with self._lock:
            self._pending.append(event)
            if len(self._pending) > self._max_pending:
                self._pending.popleft()
                self._dropped += 1
                if self._dropped == 1:
                    logger.warning(
                        "nvml events buffer full (%d): dropping the oldest", self._max_pending
                    )

    def drain(self) -> list[Event]:
        """Every event collected since the last call, oldest first."""
        with self._lock:
            events, self._pending = list(self._pending), deque()
            self._dropped = 0
        return events

    def stop(self, timeout: float | None = None) -> None:
        """Stop waiting and free the event set. Idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return
        thread.join(timeout if timeout is not None else 2.0 * self._wait_ms / 1000.0 + 1.0)
        if thread.is_alive():
            logger.warning("nvml events thread did not stop within its wait timeout")

    def _free(self) -> None:
        event_set, self._event_set = self._event_set, None
        if event_set is None:
            return
        try:
            pynvml.nvmlEventSetFree(event_set)
        except pynvml.NVMLError as exc:
            logger.warning("nvml events: freeing the event set failed: %s", exc)
