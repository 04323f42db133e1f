"""A loaded playbook set: its rules and steps with their expressions compiled once, ready for
the engine. ``loader.py`` makes them; nothing here reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.errors import Problem
from gpuwarden.playbook.expr import Compiled, Compiler, Series
from gpuwarden.playbook.schema import Rule, Step
from gpuwarden.timewindow import ActiveWindows, Schedule


@dataclass(frozen=True)
class OrderKey:
    field: str
    descending: bool
    expr: Compiled


@dataclass(frozen=True)
class CompiledStep:
    index: int
    spec: Step
    select: Compiled | None
    free_until: Compiled | None
    order: tuple[OrderKey, ...]

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def blocking(self) -> bool:
        """Whether the ladder waits for this step's outcome before the next (notify: no)."""
        return self.kind != "notify"


@dataclass(frozen=True)
class Show:
    """A field a condition reads, compiled as a value; ``names``: for a priority field, the
    class names by rank (the expression reads a class as its rank)."""

    field: str
    value: Compiled
    names: tuple[str, ...] | None = None

    def read(self, env: dict[str, object]) -> object:
        found = self.value.evaluate(env)
        if self.names is not None and isinstance(found, int) and 0 <= found < len(self.names):
            return self.names[found]
        return found


@dataclass(frozen=True)
class CompiledRule:
    spec: Rule
    file: str
    line: int | None
    when: Compiled
    until: Compiled | None
    active: ActiveWindows | None
    every: Schedule | None
    steps: tuple[CompiledStep, ...]
    # The fields `when` and `until` read, each compiled as a value: what a transition shows
    # ("the value that met the condition"), evaluated only when the rule changes state.
    shows: tuple[Show, ...] = ()
    until_shows: tuple[Show, ...] = ()
    col: int | None = None  # where the rule starts in its file, beside ``line``
    # The rule's name, read for every evaluation: a plain attribute, not the model's.
    name: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.spec.name)

    @property
    def one_shot(self) -> bool:
        """Event and scheduled rules: their incident closes once the ladder has run."""
        return self.spec.for_each == "event" or self.every is not None


@dataclass(frozen=True)
class PlaybookSet:
    rules: tuple[CompiledRule, ...]
    series: tuple[Series, ...]
    files: tuple[str, ...]
    compiler: Compiler
    # What loads but is probably not what the author meant (``gpuwarden check`` shows them).
    warnings: tuple[Problem, ...] = ()

    def rule(self, name: str) -> CompiledRule | None:
        return next((r for r in self.rules if r.name == name), None)
