"""What a process's cgroup membership says about it: container, pod, Slurm job, systemd unit.

``/proc/PID/cgroup`` has one line per hierarchy, ``ID:CONTROLLERS:PATH``. A cgroup v2 machine has
one line (``0::/...``); a v1 or hybrid machine has a dozen, and they need not agree: on a hybrid
host a Docker container started with the cgroupfs driver sits in ``/docker/<id>`` in every v1
hierarchy while its unified line still names the shim's ``containerd.service``. So every line is
read and the facts are taken from the line that carries them.

This module is pure: it parses text and never reads a file.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# A container runtime's transient scope (systemd cgroup driver): docker, containerd under
# Kubernetes, CRI-O, podman, nerdctl.
_CONTAINER_SCOPE = re.compile(
    r"(?:docker|cri-containerd|crio|libpod|nerdctl)-(?P<id>[0-9a-f]{64})\.scope"
)
# The container monitor CRI-O and podman run beside each container: a runtime scope, but not
# the container itself.
_CONMON_SCOPE = re.compile(r"(?:crio|libpod)-conmon-[0-9a-f]{64}\.scope")
# The cgroupfs driver names the container's directory after its id (``/docker/<id>``,
# ``/kubepods/burstable/pod<uid>/<id>``, ``/default/<id>``); CRI-O prefixes it with ``crio-``.
_CONTAINER_DIR = re.compile(r"(?:crio-)?(?P<id>[0-9a-f]{64})")
_POD_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
# ``kubepods-burstable-pod<uid with _>.slice`` (systemd driver), ``pod<uid>`` (cgroupfs driver).
# Static pods have a 32-hex uid (a hash of the manifest) rather than a UUID.
_POD = re.compile(rf"(?:kubepods(?:-[a-z]+)*-)?pod(?P<uid>{_POD_UID})(?:\.slice)?")
_SLURM_JOB = re.compile(r"job_(?P<id>[0-9]+)")
_UNIT = re.compile(r"[^/]+\.(?:service|scope)")
# systemd's per-user manager: it and everything below it is delegated to that user.
_USER_MANAGER = re.compile(r"user@[^/]*\.service")
_DELETED = " (deleted)"

# Line kinds, in the order their paths are preferred.
_UNIFIED = 0  # "0::/..." (cgroup v2, or the unified line of a hybrid machine)
_SYSTEMD = 1  # "N:name=systemd:/..." (the v1 hierarchy systemd keeps its units in)
_CONTROLLER = 2  # any other v1 hierarchy


@dataclass(frozen=True, slots=True)
class CgroupFacts:
    """What one ``/proc/PID/cgroup`` says; each field is ``None`` when it says nothing about it.

    - ``container``: the Docker / containerd / CRI-O / podman container id (64 hex digits), the
      innermost one when containers nest.
    - ``pod``: the Kubernetes pod uid, with dashes (the systemd driver writes underscores).
    - ``slurm_job``: the Slurm job id (digits).
    - ``systemd_unit``: the innermost ``.service`` or ``.scope`` unit in ``path`` that is not a
      container runtime's scope (``jupyter.service``, ``session-3.scope``,
      ``slurmstepd.scope``). Taken from ``path`` only, so that a container process on a hybrid
      host is not attributed to the ``containerd.service`` its unified line names.
    - ``path``: the most informative cgroup path: the first, in the order unified line,
      ``name=systemd`` line, other lines as written, of those that name a container, pod or
      Slurm job; failing that, the first that is not the root ``/``; failing that, ``/``.
    - ``hierarchy``: the controllers field of ``path``'s line: ``""`` for the unified (v2)
      hierarchy, ``name=systemd``, ``memory``, ``cpu,cpuacct`` ... (where its directory is).
    - ``delegated``: ``path`` lies in a subtree the kernel lets a user write, as far as the
      path tells: under a ``user@UID.service`` (systemd's per-user manager), or outside the
      reader's cgroup namespace (``..``). Ownership of the directories is checked on the file
      system by ``sources.cgroup_trust``.
    """

    container: str | None = None
    pod: str | None = None
    slurm_job: str | None = None
    systemd_unit: str | None = None
    path: str | None = None
    hierarchy: str | None = None
    delegated: bool = False


@dataclass(frozen=True, slots=True)
class _PathFacts:
    kind: int
    order: int
    hierarchy: str
    path: str
    container: str | None
    pod: str | None
    slurm_job: str | None
    unit: str | None

    @property
    def attributed(self) -> bool:
        return self.container is not None or self.pod is not None or self.slurm_job is not None


@functools.lru_cache(maxsize=1024)
def parse_cgroup(text: str) -> CgroupFacts:
    """The facts in the text of one ``/proc/PID/cgroup``. Lines that are not
    ``ID:CONTROLLERS:/PATH`` are skipped; text with no such line gives facts that are all
    ``None``. Results are cached by text: the processes of one job share one cgroup file."""
    lines: list[_PathFacts] = []
    for order, line in enumerate(text.splitlines()):
        parsed = _parse_line(line, order)
        if parsed is not None:
            lines.append(parsed)
    if not lines:
        return CgroupFacts()
    lines.sort(key=lambda p: (p.kind, p.order))
    best = next(
        (p for p in lines if p.attributed),
        next((p for p in lines if p.path != "/"), lines[0]),
    )
    return CgroupFacts(
        container=next((p.container for p in lines if p.container is not None), None),
        pod=next((p.pod for p in lines if p.pod is not None), None),
        slurm_job=next((p.slurm_job for p in lines if p.slurm_job is not None), None),
        systemd_unit=best.unit,
        path=best.path,
        hierarchy=best.hierarchy,
        delegated=delegated_path(best.path),
    )


def delegated_path(path: str) -> bool:
    """Whether a cgroup path lies, by its name alone, where a user may make cgroups: under a
    ``user@UID.service``, or beyond the reader's cgroup namespace (a ``..`` part)."""
    return any(part == ".." or _USER_MANAGER.fullmatch(part) for part in path.split("/"))


def _parse_line(line: str, order: int) -> _PathFacts | None:
    fields = line.split(":", 2)
    if len(fields) != 3:
        return None
    hierarchy, controllers, path = fields
    if not hierarchy.isdigit() or not path.startswith("/"):
        return None
    # The kernel marks a cgroup v2 directory that was removed while a (zombie) task was in it.
    path = path.removesuffix(_DELETED)
    if hierarchy == "0" and controllers == "":
        kind = _UNIFIED
    elif "name=systemd" in controllers.split(","):
        kind = _SYSTEMD
    else:
        kind = _CONTROLLER
    return _facts_of_path(path, kind, order, controllers)


def _facts_of_path(path: str, kind: int, order: int, hierarchy: str) -> _PathFacts:
    container: str | None = None
    pod: str | None = None
    slurm_job: str | None = None
    unit: str | None = None
    in_kubepods = False
    in_slurm = False
    for part in path.split("/"):
        if not part:
            continue
        scope = _CONTAINER_SCOPE.fullmatch(part)
        if scope is not None:
            container = scope.group("id")
            continue
        if _CONMON_SCOPE.fullmatch(part):
            continue
        bare = _CONTAINER_DIR.fullmatch(part)
        if bare is not None:
            container = bare.group("id")
            continue
        if in_kubepods and pod is None:
            found = _POD.fullmatch(part)
            if found is not None:
                pod = _dashed_uid(found.group("uid"))
                continue
        if in_slurm and slurm_job is None:
            job = _SLURM_JOB.fullmatch(part)
            if job is not None:
                slurm_job = job.group("id")
                continue
        if _UNIT.fullmatch(part):
            unit = part
        in_kubepods = in_kubepods or part.startswith("kubepods")
        in_slurm = in_slurm or part.startswith("slurm")
    return _PathFacts(kind, order, hierarchy, path, container, pod, slurm_job, unit)


def _dashed_uid(uid: str) -> str:
    return uid.replace("_", "-")
