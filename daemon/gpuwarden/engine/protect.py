"""Which processes no step may ever act on. Pure: the daemon's own PID comes in as an argument."""

from __future__ import annotations

from gpuwarden.config import Protected
from gpuwarden.model import ProcessInfo
from gpuwarden.patterns import compile_pattern


class ProtectedMatcher:
    """``why(info)`` names the protection that covers a process, or returns None.

    Always protected, whatever the config says: PID 1 and 2 (init and kthreadd) and gpuwarden
    itself. The config adds what a process's owner cannot forge: root-owned processes (on by
    default), users, groups, executables (the whole real path, ``/proc/PID/exe``), systemd
    units whose cgroup is trusted (owned by root, outside ``user@UID.service``), priority
    classes and PIDs. A process's name and command line never protect it: its owner chooses
    them.
    """

    def __init__(self, protected: Protected, *, self_pid: int | None = None) -> None:
        self._p = protected
        self._self = self_pid
        self._users = frozenset(protected.users)
        self._groups = frozenset(protected.groups)
        self._classes = frozenset(protected.priorities)
        self._pids = frozenset(protected.pids)
        self._exes = [compile_pattern(p) for p in protected.exes]
        self._units = [compile_pattern(p) for p in protected.units]

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
        for group in info.groups:
            if group in self._groups:
                return f"group {group} is protected"
        if info.exe:
            for pattern in self._exes:
                if pattern.fullmatch(info.exe):
                    return f"executable {info.exe} matches protected pattern {pattern.source!r}"
        if info.priority in self._classes:
            return f"priority class {info.priority} is protected"
        if self._units and info.systemd_unit and info.cgroup_trusted:
            for pattern in self._units:
                if pattern.fullmatch(info.systemd_unit):
                    return f"unit {info.systemd_unit} matches protected pattern {pattern.source!r}"
        return None
