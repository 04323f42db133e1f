"""Priority classes and checkpoint signals: pure decisions over a ``ProcessInfo``.

``PriorityResolver`` puts a process in a class from the config's match rules and the job's own
declaration; ``normalise_signal`` reads the signal a job asked for. No I/O.
"""

from __future__ import annotations

import re
import signal

from gpuwarden.config import MatchRule, Priorities
from gpuwarden.model import ProcessInfo

# A checkpoint signal must be one the job can catch.
_UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})


def normalise_signal(value: str | None) -> str | None:
    """The signal a job asked for, as a name (``"SIGUSR1"``), from ``USR1``, ``sigusr1`` or
    ``10``. ``None`` for anything else, and for SIGKILL and SIGSTOP, which no job can catch."""
    if value is None:
        return None
    text = value.strip().upper()
    try:
        if text.isascii() and text.isdigit():
            sig = signal.Signals(int(text))
        else:
            sig = signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
    except (KeyError, ValueError):
        return None
    return None if sig in _UNCATCHABLE else sig.name


def rule_env_keys(priorities: Priorities) -> tuple[str, ...]:
    """The environment variables the priority rules look at, sorted."""
    return tuple(sorted({k for c in priorities.classes for rule in c.match for k in rule.env}))


class _CompiledRule:
    """A MatchRule with its regular expressions compiled. Every given condition must hold; a
    fact the process does not reveal (``None``) never satisfies a condition on it."""

    def __init__(self, rule: MatchRule) -> None:
        self.users = frozenset(rule.user)
        self.groups = frozenset(rule.group)
        self.cmdline = re.compile(rule.cmdline) if rule.cmdline is not None else None
        self.cgroup = re.compile(rule.cgroup) if rule.cgroup is not None else None
        self.unit = re.compile(rule.unit) if rule.unit is not None else None
        self.env = dict(rule.env)

    def matches(self, info: ProcessInfo) -> bool:
        if self.users and info.user not in self.users:
            return False
        if self.groups and self.groups.isdisjoint(info.groups):
            return False
        if self.cmdline is not None and (
            info.cmdline is None or not self.cmdline.search(" ".join(info.cmdline))
        ):
            return False
        if self.cgroup is not None and (info.cgroup is None or not self.cgroup.search(info.cgroup)):
            return False
        if self.unit is not None and (
            info.systemd_unit is None or not self.unit.fullmatch(info.systemd_unit)
        ):
            return False
        if self.env:
            env = info.env
            if env is None or any(env.get(k) != v for k, v in self.env.items()):
                return False
        return True


class PriorityResolver:
    """Puts processes in priority classes; build it once per config, call ``resolve`` per process.

    A process takes, in this order:

    1. the first class (``priorities.classes`` is highest first) one of whose match rules
       matches. In a rule, ``user`` is any of the names; ``group`` any of the names against any
       of the process's groups; ``cmdline`` is a regex *searched* in the arguments joined with
       single spaces; ``cgroup`` a regex *searched* in the cgroup path; ``unit`` a regex that
       must match the *whole* systemd unit name (``jupyter\\.service``, ``session-.*\\.scope``);
       ``env`` needs every key present with exactly that value;
    2. the class its job declared in ``GPUWARDEN_PRIORITY`` (any case, surrounding blanks
       ignored) when that names a class, lowered to ``declared_max`` when it is above it: a job
       may rank itself lower freely, never higher than ``declared_max``;
    3. ``priorities.default``.
    """

    def __init__(self, priorities: Priorities) -> None:
        self._classes = tuple(
            (c.name, tuple(_CompiledRule(rule) for rule in c.match)) for c in priorities.classes
        )
        self._rank = {name: priorities.rank(name) for name in priorities.names}
        self._default = priorities.default
        self._declared_max = priorities.declared_max

    def resolve(self, info: ProcessInfo) -> str:
        for name, rules in self._classes:
            if any(rule.matches(info) for rule in rules):
                return name
        if info.declared_priority is not None:
            declared = info.declared_priority.strip().lower()
            if declared in self._rank:
                if self._rank[declared] > self._rank[self._declared_max]:
                    return self._declared_max
                return declared
        return self._default


def resolve_priority(priorities: Priorities, info: ProcessInfo) -> str:
    """The priority class of one process (see ``PriorityResolver``, which compiles once)."""
    return PriorityResolver(priorities).resolve(info)
