"""Crossings between ticks: which rules with ``for`` a fast reading of the GPUs could start.

The run loop reads the cheap GPU fields (memory, utilization, temperature, power) every
``fast_sample`` seconds between ticks. ``FastWatch`` says when such a reading makes the
``when`` of a rule with ``for`` true for a GPU where the last reading (fast or the tick's) did
not: the loop then runs a tick at once, so the rule's pending clock starts at the reading that
crossed, not up to a tick later. A rule is watched when it is a GPU rule with ``for``, not
scheduled, and its ``when`` reads only those fields (and ``time``), without history functions:
anything else needs the full snapshot and waits for the tick, as before.

Pure: no I/O, no clock; the watch decides nothing about incidents. A crossing only asks for an
early tick, in which the engine decides as at any other tick; a crossing that is gone by then
changes nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from gpuwarden.model import GpuState, Snapshot
from gpuwarden.playbook.fields import tick_env
from gpuwarden.playbook.loader import CompiledRule, PlaybookSet

# The fields a fast reading fills in (the rest of its GpuState stays unknown).
FAST_FIELDS = frozenset(
    {
        "gpu.index",
        "gpu.memory.used_mib",
        "gpu.memory.total_mib",
        "gpu.memory.free_mib",
        "gpu.memory.reserved_mib",
        "gpu.memory.used_pct",
        "gpu.memory.free_pct",
        "gpu.utilization_pct",
        "gpu.memory_utilization_pct",
        "gpu.temperature_c",
        "gpu.power_w",
        "gpu.power_limit_w",
        "gpu.power_pct",
    }
)
_ROOTS = frozenset({"gpu", "time"})


def watched(rule: CompiledRule) -> bool:
    """Whether a fast reading can decide ``rule``'s ``when`` (see the module doc)."""
    when = rule.when
    return (
        rule.spec.for_each == "gpu"
        and rule.every is None
        and rule.spec.for_ > 0
        and not when.series
        and when.roots <= _ROOTS
        and {f for f in when.fields if f.startswith("gpu.")} <= FAST_FIELDS
    )


class FastWatch:
    """The watched rules of one playbook set and what the last reading said for each GPU."""

    def __init__(self, playbooks: PlaybookSet, tz: dt.tzinfo) -> None:
        self.rules = tuple(r for r in playbooks.rules if watched(r))
        self.fields = frozenset(
            f for r in self.rules for f in r.when.fields if f.startswith("gpu.")
        )
        self.tz = tz
        self._reads_time = any("time" in r.when.roots for r in self.rules)
        self._held: dict[tuple[str, int], bool] = {}  # (rule, gpu) -> `when` at the last reading

    def __bool__(self) -> bool:
        return bool(self.rules)

    def crossed(self, gpus: Iterable[GpuState], now: float, host: str = "") -> list[str]:
        """Read ``gpus`` (a fast reading at ``now``); the ``rule@GPU`` pairs whose ``when`` it
        made true (false or unseen at the reading before)."""
        return self._read(gpus, now, host)

    def seen(self, snapshot: Snapshot, now: float) -> None:
        """A tick's full snapshot: the state the next fast reading is compared with."""
        self._read(snapshot.gpus, now, snapshot.host)

    def _read(self, gpus: Iterable[GpuState], now: float, host: str) -> list[str]:
        if not self.rules:
            return []
        states = tuple(g for g in gpus if not g.lost)
        if self._reads_time:
            snapshot = Snapshot(host=host, time=now, gpus=states)
            base = tick_env(snapshot, now, self.tz)
            base.update(process=None, event=None, _snapshot=snapshot, _gpus={})
        else:  # a `when` over gpu.* alone reads nothing else
            base = {"_now": now, "process": None, "event": None}
        out: list[str] = []
        held = self._held
        for gpu in states:
            env = dict(base)
            env["gpu"] = gpu
            for rule in self.rules:
                key = (rule.name, gpu.index)
                now_holds = rule.when.test(env)
                if now_holds and not held.get(key, False):
                    out.append(f"{rule.name}@gpu{gpu.index}")
                held[key] = now_holds
        return out
