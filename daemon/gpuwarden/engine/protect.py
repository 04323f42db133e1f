"""Which processes no step may ever act on. Pure: the daemon's own PID comes in as an argument."""

from __future__ import annotations

import re

from gpuwarden.config import Protected
from gpuwarden.model import ProcessInfo


class ProtectedMatcher:
    """``why(info)`` names the protection that covers a process, or returns None.

    Always protected, whatever the config says: PID 1 and 2 (init and kthreadd) and gpuwarden
    itself. The config adds root-owned processes (on by default), users, process names, command
    line and systemd unit patterns, priority classes and PIDs.
    """

    def __init__(self, protected: Protected, *, self_pid: int | None = None) -> None:
        self._p = protected
        self._self = self_pid
        self._names = frozenset(protected.names)
        self._users = frozenset(protected.users)
        self._classes = frozenset(protected.priorities)
        self._pids = frozenset(protected.pids)
        self._cmdline = [re.compile(p) for p in protected.cmdline]
        self._units = [re.compile(p) for p in protected.units]

    def why(self, info: ProcessInfo) -> str | None:
        pid = info.pid
        if pid <= 2:
            return f"pid {pid} is part of the kernel or init"
        if pid == self._self:
            return "gpuwarden itself"
        if pid in self._pids:
            return f"pid {pid} is listed in protected.pids"
        if self._p.root and info.uid == 0:
            return "owned by root (protected.root)"
        if info.user is not None and info.user in self._users:
            return f"user {info.user} is protected"
        for name in self._process_names(info):
            if name in self._names:
                return f"{name} is a protected process name"
        if info.priority in self._classes:
            return f"priority class {info.priority} is protected"
        if self._cmdline and info.cmdline:
            joined = " ".join(info.cmdline)
            for pattern in self._cmdline:
                if pattern.search(joined):
                    return f"command line matches protected pattern {pattern.pattern!r}"
        if self._units and info.systemd_unit:
            for pattern in self._units:
                if pattern.fullmatch(info.systemd_unit):
                    return f"unit {info.systemd_unit} matches protected pattern {pattern.pattern!r}"
        return None

    @staticmethod
    def _process_names(info: ProcessInfo) -> tuple[str, ...]:
        names = []
        if info.name:
            names.append(info.name)
        if info.cmdline:
            names.append(info.cmdline[0].rsplit("/", 1)[-1])
        return tuple(names)
