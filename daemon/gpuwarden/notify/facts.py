"""What messages say about open incidents, and when a rule's messages go: pure.

``MessageFacts`` gives each open incident's facts for its next message — its GPU's current
values and who and what it is about (``${gpu}``, and for a process rule ``${user}``,
``${pid}``, ``${job}``, ``${command}``); ``timings`` each rule's grouping. The run loop and the
drill use both; nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from gpuwarden.config import Config
from gpuwarden.model import Snapshot
from gpuwarden.notify.grouping import Timing
from gpuwarden.notify.messages import gpu_facts, process_facts
from gpuwarden.playbook.schema import Rule


def timings(config: Config, rules: Sequence[Rule]) -> Callable[[str], Timing]:
    """Each rule's grouping: its own group_wait / group_interval / repeat where it gives one,
    the config's notify section otherwise."""
    notify = config.notify
    default = Timing(notify.group_wait, notify.group_interval, notify.repeat)
    own = {
        r.name: Timing(
            default.group_wait if r.group_wait is None else r.group_wait,
            default.group_interval if r.group_interval is None else r.group_interval,
            default.repeat if r.repeat is None else r.repeat,
        )
        for r in rules
    }
    return lambda rule: own.get(rule, default)


class OpenIncident(Protocol):
    """What the facts of an open incident are read from (the engine's ``Incident``)."""

    id: str
    scope: str
    gpu: int | None


_PROCESS_SCOPE = re.compile(r"^gpu:(\d+)/pid:(\d+)@")


class MessageFacts:
    """The facts each open incident's messages show: its GPU's current values, and who and
    what it is about — the GPU, and for a process rule the process's pid, user, job and
    command, read when the incident is first seen and kept (a killed process is gone from
    later snapshots, but its resolve message still names it)."""

    def __init__(self) -> None:
        self._identity: dict[str, dict[str, str]] = {}

    def of(
        self,
        snapshot: Snapshot,
        incidents: Iterable[OpenIncident],
        wanted: Callable[[str], bool] = lambda incident: True,
    ) -> dict[str, dict[str, str]]:
        """The facts of each of ``incidents`` a message may still show (``wanted``)."""
        gpus = {g.index: g for g in snapshot.gpus}
        out: dict[str, dict[str, str]] = {}
        seen: set[str] = set()
        for incident in incidents:
            seen.add(incident.id)
            if not wanted(incident.id):
                continue
            identity = self._identity.get(incident.id)
            if identity is None:
                identity = self._identify(snapshot, incident)
                if identity is not None:
                    self._identity[incident.id] = identity
            if incident.gpu is not None and incident.gpu not in gpus:
                continue  # nothing new to show: its last values stay
            facts = dict(identity or {})
            if incident.gpu is not None:
                facts.update(gpu_facts(gpus[incident.gpu]))
            if facts:
                out[incident.id] = facts
        for gone in set(self._identity) - seen:
            del self._identity[gone]
        return out

    @staticmethod
    def _identify(snapshot: Snapshot, incident: OpenIncident) -> dict[str, str] | None:
        """None: a process incident whose process this snapshot does not show (yet)."""
        found = _PROCESS_SCOPE.match(incident.scope)
        if found is None:
            return {} if incident.gpu is None else {"gpu": str(incident.gpu)}
        gpu, pid = int(found.group(1)), int(found.group(2))
        proc = next((p for p in snapshot.processes if p.pid == pid and p.gpu == gpu), None)
        return None if proc is None else process_facts(proc)
