"""Time, injected. Nothing outside this module and the run loop asks the OS what time it is."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (wall-clock time, for records and time windows)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for intervals)."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class SimClock:
    """A simulated clock: ``sleep`` advances it at once. Drills and tests run on it."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._now = start
        self._mono = 0.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._now += seconds
        self._mono += seconds


class ScaledClock:
    """Real time, sped up: ``speed`` simulated seconds pass per real second, and ``sleep``
    sleeps for the real share. Replays of scenarios with real processes run on it, so that a
    ten-minute incident takes thirty seconds while the processes still get real time to react.
    """

    def __init__(self, speed: float, start: float | None = None) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = speed
        self._t0 = time.monotonic()
        self._start = time.time() if start is None else start

    def now(self) -> float:
        return self._start + (time.monotonic() - self._t0) * self.speed

    def monotonic(self) -> float:
        return (time.monotonic() - self._t0) * self.speed

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)
