"""Durations as people write them: ``90``, ``30s``, ``2m30s``, ``1h``, ``3d2h``.

Every duration is at most ``MAX_DURATION`` (ten years): a longer one is a typo, and would
overflow what it is handed to at run time (``time.sleep``, a thread's wait, a date), so it is
refused where it is read, with the file position of the value.
"""

from __future__ import annotations

import math
import re

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_DURATION = 3650 * 86400.0  # 3650d; threading.TIMEOUT_MAX is about 292 years


class DurationTooLong(ValueError):
    """A duration longer than ``MAX_DURATION``."""


def _finite(value: float) -> float:
    try:
        seconds = float(value)
    except OverflowError:
        raise DurationTooLong(f"duration too long: {_shown(value)} (at most 3650d)") from None
    if not math.isfinite(seconds):
        raise ValueError(f"not a finite duration: {value!r}")
    return seconds


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bounded(seconds: float, value: object) -> float:
    if not seconds <= MAX_DURATION:  # also catches inf and nan
        if math.isnan(seconds):
            raise ValueError(f"not a finite duration: {value!r}")
        raise DurationTooLong(f"duration too long: {_shown(value)} (at most 3650d)")
    return seconds


def parse_duration(value: object) -> float:
    """Seconds in ``value``; raises ``ValueError`` with what was expected."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a duration cannot be negative: {_shown(value)}")
        return _bounded(_finite(value), value)
    if not isinstance(value, str):
        raise ValueError(f"not a duration: {value!r}")
    text = value.strip().replace(" ", "")
    if not text:
        raise ValueError("empty duration")
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if seconds < 0:
            raise ValueError(f"a duration cannot be negative: {value!r}")
        return _bounded(_finite(seconds), value)
    total = 0.0
    pos = 0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"not a duration: {value!r} (write e.g. 30s, 2m, 1h30m)")
    return _bounded(total, value)


def format_duration(seconds: float, *, exact: bool = False) -> str:
    """A short human form: ``45s``, ``2m30s``, ``3h05m``, ``2d04h``.

    ``exact`` keeps what a person wrote in a config or playbook readable as written: under a
    minute nothing is rounded away (``500ms``, ``1.5s``, ``1m30.5s``)."""
    if exact and seconds != int(seconds):
        if seconds < 1:
            return f"{seconds * 1000:.6g}ms"
        if seconds < 60:
            return f"{seconds:.6g}s"
        if seconds < 3600:
            m, rest = divmod(seconds, 60)
            return f"{int(m)}m{rest:.6g}s"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        m, rest = divmod(s, 60)
        return f"{m}m{rest:02d}s" if rest else f"{m}m"
    if s < 86400:
        h, rest = divmod(s, 3600)
        return f"{h}h{rest // 60:02d}m"
    d, rest = divmod(s, 86400)
    return f"{d}d{rest // 3600:02d}h"
