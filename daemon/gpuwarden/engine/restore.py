"""Taking back, at start, an incident a previous run of the daemon left open.

The journal knows each open incident and which of its steps were planned (some perhaps still
in flight when the daemon died) and which processes they chose. ``restore_incident`` puts such
an incident back into the engine's state so that a restart repeats no step: every step
already planned counts as finished, the ladder resumes after the last of them, and the
processes a kill step chose stay off-limits to later kills.

``Engine.restore`` (engine.py) looks the rule up and calls this with the state it changes —
the lifecycle's states and the ladder's killed set — passed in explicitly; this module
imports nothing of the engine but its data types.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuwarden.engine.incident import Incident, ScopeState
from gpuwarden.playbook.loader import CompiledRule
from gpuwarden.playbook.schema import ENDING_KINDS


def restore_incident(
    states: dict[str, dict[str, ScopeState]],
    killed: set[tuple[int, float | None]],
    rule: CompiledRule,
    *,
    scope: str,
    label: str,
    incident: str,
    opened: float,
    gpu: int | None,
    planned_steps: Iterable[int],
    targeted: Iterable[tuple[str, int, float | None]],
) -> Incident:
    """Make ``incident`` of ``rule`` the open, firing incident of ``scope`` in ``states``
    (rule -> scope key -> state) and add the processes its non-shadow kill steps chose to
    ``killed``. Returns the restored incident."""
    steps = set(planned_steps)
    state = states.setdefault(rule.name, {}).setdefault(scope, ScopeState())
    state.phase = "firing"
    state.label = label
    restored = Incident(
        id=incident,
        rule=rule.name,
        scope=scope,
        label=label,
        opened=opened,
        severity=rule.spec.severity,
        shadow=rule.spec.mode == "shadow",
        gpu=gpu,
        next_step=max(steps) + 1 if steps else 0,
    )
    restored.finished.update(steps)
    restored.targeted.update(targeted)
    for kind, pid, created in restored.targeted:
        if kind in ENDING_KINDS and not restored.shadow:
            killed.add((pid, created))
    state.incident = restored
    return restored
