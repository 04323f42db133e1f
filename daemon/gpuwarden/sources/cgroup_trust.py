"""Whether a process's cgroup is one its owner could have made: the rule systemd-oomd applies.

A user may create cgroups wherever the kernel lets them write: in the subtree systemd delegates
to their ``user@UID.service`` (whose directories it chowns to them), and in any other cgroup
directory chowned to them. A cgroup name found there (``app.slice/triton.service``) says nothing
an administrator vouched for. systemd-oomd honours ``ManagedOOMPreference=`` only on cgroups
owned by root (or by the monitored cgroup's owner); gpuwarden lets a unit or cgroup match raise
a priority or protect only when

- the path has no ``user@*.service`` part and no ``..`` (``cgroups.delegated_path``), and
- every directory from the hierarchy's mount down to the cgroup itself is owned by root.

A directory that cannot be examined (the process moved, the cgroup file system is not mounted
where expected, a cgroup namespace hides it) makes the cgroup untrusted: the check fails
closed.

Where each hierarchy is mounted follows systemd's layout under ``root`` (``/sys/fs/cgroup``):
the unified hierarchy at ``root`` itself (cgroup v2) or at ``root/unified`` (hybrid); a v1
hierarchy at ``root/<controllers>`` (``root/systemd`` for ``name=systemd``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpuwarden.sources.cgroups import CgroupFacts

DEFAULT_ROOT = Path("/sys/fs/cgroup")


class CgroupTrust:
    """Decides ``ProcessInfo.cgroup_trusted``; keep one per attributor (mounts are looked up
    once)."""

    def __init__(self, root: Path = DEFAULT_ROOT) -> None:
        self._root = root
        self._mounts: dict[str, Path] = {}

    def mount(self, hierarchy: str) -> Path:
        """The directory a hierarchy's root cgroup is, by its controllers field."""
        found = self._mounts.get(hierarchy)
        if found is None:
            if hierarchy == "":
                v2 = (self._root / "cgroup.controllers").exists()
                found = self._root if v2 else self._root / "unified"
            else:
                found = self._root / hierarchy.removeprefix("name=")
            self._mounts[hierarchy] = found
        return found

    def trusted(self, facts: CgroupFacts) -> bool:
        """True when ``facts.path`` is outside any delegated subtree and owned by root all the
        way down; False when it is not, or when that cannot be told."""
        if facts.path is None or facts.hierarchy is None or facts.delegated:
            return False
        return self.owned_by_root(facts.hierarchy, facts.path)

    def owned_by_root(self, hierarchy: str, path: str) -> bool:
        parts = [part for part in path.split("/") if part]
        if any(part in (".", "..") for part in parts):
            return False
        current = self.mount(hierarchy)
        for part in ("", *parts):
            try:  # the mount may be a symbolic link (cpu -> cpu,cpuacct); a cgroup never is
                info = os.lstat(current := current / part) if part else os.stat(current)
            except OSError:
                return False
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
                return False
        return True
