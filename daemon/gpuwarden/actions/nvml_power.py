"""The ``PowerControl`` that ``power_cap`` uses on a real machine: NVML's power-limit calls.

NVML counts milliwatts; this class speaks watts. A reading the device cannot give (not
supported, not permitted, a library without the call) is ``None``. Everything else NVML
refuses, and every failure to *set* a limit, is a :class:`PowerControlError` whose message says
what to do: NO_PERMISSION means the daemon is not root (NVML allows power limits only to
root), NOT_SUPPORTED means the board has no adjustable limit, INVALID_ARGUMENT means a value
outside the board's range. A limit set this way does not survive a reboot or driver reload.

NVML is initialised on first use (pynvml counts initialisations, so this shares the library
with the NVML source) and shut down by :meth:`NvmlPower.close`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from gpuwarden.actions.power_cap import PowerControlError
from gpuwarden.sources.nvml_device import describe_error

_CANNOT_TELL = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NO_DATA,
    }
)
_UNREACHABLE = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_GPU_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_IRQ_ISSUE,
    }
)


def power_error(gpu: int, doing: str, exc: Any) -> PowerControlError:
    """One NVML error as a PowerControlError that says what went wrong and what to do."""
    code = getattr(exc, "value", None)
    why = describe_error(exc)
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return PowerControlError(
            f"GPU {gpu}: {doing} needs root (run gpuwarden as root): {why}", denied=True
        )
    if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
        return PowerControlError(f"GPU {gpu} does not support {doing}: {why}")
    if code == pynvml.NVML_ERROR_INVALID_ARGUMENT:
        return PowerControlError(f"GPU {gpu} refused {doing} (no such GPU, or out of range): {why}")
    if code == pynvml.NVML_ERROR_TIMEOUT:
        return PowerControlError(f"GPU {gpu}: {doing} timed out: {why}", recoverable=True)
    if code in _UNREACHABLE:
        return PowerControlError(f"GPU {gpu} cannot be reached for {doing}: {why}")
    return PowerControlError(f"GPU {gpu}: {doing} failed: {why}")


def _watts(milliwatts: Any) -> float:
    return int(milliwatts) / 1000.0


class NvmlPower:
    """``PowerControl`` over NVML (``gpu`` is the NVML device index)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False

    def close(self) -> None:
        with self._lock:
            if self._open:
                self._open = False
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlShutdown()

    def __enter__(self) -> NvmlPower:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _handle(self, gpu: int) -> Any:
        with self._lock:
            if not self._open:
                try:
                    pynvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_GPUS)
                except pynvml.NVMLError as exc:
                    raise PowerControlError(
                        f"NVML is not available: {describe_error(exc)}"
                    ) from None
                self._open = True
        return pynvml.nvmlDeviceGetHandleByIndex(gpu)

    def _read(self, gpu: int, doing: str, call: Callable[[Any], Any]) -> Any:
        try:
            return call(self._handle(gpu))
        except pynvml.NVMLLibraryMismatchError:
            return None  # this NVML library lacks the call
        except pynvml.NVMLError as exc:
            if exc.value in _CANNOT_TELL:
                return None
            raise power_error(gpu, doing, exc) from None

    def power_limit_w(self, gpu: int) -> float | None:
        value = self._read(gpu, "reading the power limit", pynvml.nvmlDeviceGetPowerManagementLimit)
        return None if value is None else _watts(value)

    def power_limit_range_w(self, gpu: int) -> tuple[float, float] | None:
        value = self._read(
            gpu,
            "reading the power limit range",
            pynvml.nvmlDeviceGetPowerManagementLimitConstraints,
        )
        if value is None:
            return None
        low, high = value
        return _watts(low), _watts(high)

    def default_power_limit_w(self, gpu: int) -> float | None:
        value = self._read(
            gpu, "reading the default power limit", pynvml.nvmlDeviceGetPowerManagementDefaultLimit
        )
        return None if value is None else _watts(value)

    def set_power_limit_w(self, gpu: int, watts: float) -> None:
        milliwatts = round(watts * 1000)
        doing = f"setting the power limit to {milliwatts / 1000:g} W"
        try:
            pynvml.nvmlDeviceSetPowerManagementLimit(self._handle(gpu), milliwatts)
        except pynvml.NVMLLibraryMismatchError as exc:
            raise PowerControlError(f"GPU {gpu}: {doing}: this NVML has no such call") from exc
        except pynvml.NVMLError as exc:
            raise power_error(gpu, doing, exc) from None
