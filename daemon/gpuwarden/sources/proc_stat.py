"""One read of ``/proc/PID/stat``: a process's identity and the facts that change.

Pure: it parses bytes and never reads a file.
"""

from __future__ import annotations

from typing import Final, NamedTuple

# What a one-letter state in /proc/PID/stat is called (the names psutil gives them).
STATES: Final = {
    b"R": "running",
    b"S": "sleeping",
    b"D": "disk-sleep",
    b"T": "stopped",
    b"t": "tracing-stop",
    b"Z": "zombie",
    b"X": "dead",
    b"x": "dead",
    b"K": "wake-kill",
    b"W": "waking",
    b"I": "idle",
    b"P": "parked",
}
# A process in one of these states has lost its command line and environment: read afresh.
ENDING: Final = frozenset({b"Z", b"X", b"x"})


class Stat(NamedTuple):
    """What one read of ``/proc/PID/stat`` gives."""

    start: int  # clock ticks from boot to the process's start: with the PID, its identity
    state: bytes
    nice: int
    cpu_ticks: int  # user + system
    rss_pages: int
    program: tuple[bytes, ...]  # command name and memory layout, both changed by exec()


def parse_stat(data: bytes) -> Stat | None:
    """``pid (comm) state ppid ...`` (proc(5)); the name may hold spaces and parentheses, so
    the fields are counted from the last ``)``. ``None`` when the text is not such a line."""
    left, right = data.find(b"("), data.rfind(b")")
    if left < 0 or right < left:
        return None
    fields = data[right + 2 :].split()  # fields[n - 3] is field n of proc(5)
    if len(fields) < 26:
        return None
    try:
        return Stat(
            start=int(fields[19]),
            state=fields[0],
            nice=int(fields[16]),
            cpu_ticks=int(fields[11]) + int(fields[12]),
            rss_pages=int(fields[21]),
            program=(data[left + 1 : right], *fields[23:26], *fields[45:49]),
        )
    except ValueError:
        return None
