"""Priority classes and checkpoint signals: pure decisions over a ``ProcessInfo``.

``PriorityResolver`` puts a process in a class from the config's match rules and the job's own
declaration, letting each rule move a process only as far as its conditions are beyond the
reach of the job's owner (docs/security.md); ``normalise_signal`` reads the signal a job asked
for. No I/O.
"""

from __future__ import annotations

import enum
import signal
from typing import Final

from gpuwarden.config import MatchRule, Priorities
from gpuwarden.model import ProcessInfo
from gpuwarden.patterns import Pattern, compile_pattern

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


class Trust(enum.IntEnum):
    """How far a matched rule may move a process: as far as its weakest condition allows."""

    LOWERS = 0  # its owner chooses it (argv, a cgroup they made): only lowers the class
    DECLARES = 1  # the job's environment: up to declared_max, like GPUWARDEN_PRIORITY
    PLACES = 2  # the kernel enforces it (uid, groups, executable, a root-owned cgroup)


# Environment variables that claim what Slurm decides; the attributor asks Slurm instead.
SLURM_FACTS: Final = {"SLURM_JOB_PARTITION": "slurm_partition", "SLURM_JOB_QOS": "slurm_qos"}


def rule_conditions(rule: MatchRule) -> str:
    """A rule's conditions in words: ``group ml-prod and cmdline 'train'``."""
    parts = []
    if rule.user:
        parts.append("user " + ", ".join(rule.user))
    if rule.group:
        parts.append("group " + ", ".join(rule.group))
    for key in ("exe", "unit", "cgroup", "cmdline"):
        value = getattr(rule, key)
        if value is not None:
            parts.append(f"{key} '{value}'")
    parts += [f"env {key}={value}" for key, value in rule.env.items()]
    return " and ".join(parts)


def rule_reach(rule: MatchRule, declared_max: str) -> str:
    """What a match of ``rule`` may do to a class, in words (``gpuwarden check``): "can
    raise", "can raise, to declared_max at most", or "only lowers", with the cases in which a
    raising rule only lowers."""
    unconfirmed = [k for k in rule.env if k.startswith("SLURM_") and k not in SLURM_FACTS]
    if rule.cmdline is not None or unconfirmed:
        return "only lowers"
    declared = any(not key.startswith("SLURM_") for key in rule.env)
    reach = f"can raise, to {declared_max} at most" if declared else "can raise"
    cases = []
    if rule.unit is not None or rule.cgroup is not None:
        cases.append("a cgroup its owner made only lowers")
    if any(key in SLURM_FACTS for key in rule.env):
        cases.append("a partition or QOS Slurm does not report only lowers")
    return reach + (f" ({'; '.join(cases)})" if cases else "")


class _CompiledRule:
    """A MatchRule with its regular expressions compiled. Every given condition must hold; a
    fact the process does not reveal (``None``) never satisfies a condition on it."""

    def __init__(self, rule: MatchRule) -> None:
        self.users = frozenset(rule.user)
        self.groups = frozenset(rule.group)
        self.exe = _compiled(rule.exe)
        self.cmdline = _compiled(rule.cmdline)
        self.cgroup = _compiled(rule.cgroup)
        self.unit = _compiled(rule.unit)
        self.env = dict(rule.env)

    def match(self, info: ProcessInfo) -> Trust | None:
        """None when a condition fails; else how far this match may move this process."""
        trust = Trust.PLACES
        if self.users and info.user not in self.users:
            return None
        if self.groups and self.groups.isdisjoint(info.groups):
            return None
        if self.exe is not None and (info.exe is None or not self.exe.fullmatch(info.exe)):
            return None
        if self.cmdline is not None:
            if info.cmdline is None or not self.cmdline.search(" ".join(info.cmdline)):
                return None
            trust = Trust.LOWERS
        if self.cgroup is not None:
            if info.cgroup is None or not self.cgroup.search(info.cgroup):
                return None
            trust = min(trust, _cgroup_trust(info))
        if self.unit is not None:
            if info.systemd_unit is None or not self.unit.fullmatch(info.systemd_unit):
                return None
            trust = min(trust, _cgroup_trust(info))
        for key, wanted in self.env.items():
            value, key_trust = _env_value(info, key)
            if value != wanted:
                return None
            trust = min(trust, key_trust)
        return trust


def _compiled(source: str | None) -> Pattern | None:
    return compile_pattern(source) if source is not None else None


def _cgroup_trust(info: ProcessInfo) -> Trust:
    return Trust.PLACES if info.cgroup_trusted else Trust.LOWERS


def _env_value(info: ProcessInfo, key: str) -> tuple[str | None, Trust]:
    """The value an ``env`` condition compares, and how far it counts: Slurm's own answer for
    the variables Slurm decides, when Slurm gave one; else the environment's claim."""
    field = SLURM_FACTS.get(key)
    if field is not None and info.slurm_partition is not None:
        return getattr(info, field), Trust.PLACES
    claimed = info.env.get(key) if info.env is not None else None
    return claimed, Trust.LOWERS if key.startswith("SLURM_") else Trust.DECLARES


class PriorityResolver:
    """Puts processes in priority classes; build it once per config, call ``resolve`` per process.

    A rule matches when all its conditions hold. In a rule, ``user`` is any of the names;
    ``group`` any of the names against any of the process's groups; ``exe`` a regex that must
    match the *whole* real path of the executable; ``cmdline`` a regex *searched* in the
    arguments joined with single spaces; ``cgroup`` a regex *searched* in the cgroup path;
    ``unit`` a regex that must match the *whole* systemd unit name (``jupyter\\.service``,
    ``session-.*\\.scope``); ``env`` needs every key present with exactly that value.

    What a match may do depends on who can forge its weakest condition (``Trust``):

    - ``user``, ``group``, ``exe``, and ``unit``/``cgroup`` on a trusted cgroup (owned by root,
      outside ``user@UID.service``), and ``SLURM_JOB_PARTITION``/``SLURM_JOB_QOS`` as Slurm
      reports them: the rule **places** the process in its class;
    - other ``env`` keys: the class, but never above ``declared_max``;
    - ``cmdline``, ``unit``/``cgroup`` on a cgroup its owner could make, other ``SLURM_*``
      keys and Slurm keys Slurm did not confirm: the rule only **lowers**: it is taken only
      when its class is not above the class the process gets without such rules.

    A process takes, classes highest first, the first rule that may act on it; failing that,
    the class its job declared in ``GPUWARDEN_PRIORITY`` (any case, blanks ignored) when that
    names a class, lowered to ``declared_max`` when above it; failing that, ``default``.
    """

    def __init__(self, priorities: Priorities) -> None:
        self._classes = tuple(
            (c.name, tuple(_CompiledRule(rule) for rule in c.match)) for c in priorities.classes
        )
        self._rank = {name: priorities.rank(name) for name in priorities.names}
        self._default = priorities.default
        self._declared_max = priorities.declared_max

    def resolve(self, info: ProcessInfo) -> str:
        lowering: list[str] = []  # classes of matching rules that only lower, in rule order
        baseline: str | None = None
        for name, rules in self._classes:
            for rule in rules:
                trust = rule.match(info)
                if trust is None:
                    continue
                if trust == Trust.LOWERS:
                    lowering.append(name)
                    continue
                baseline = self._granted(name, trust)
                break
            if baseline is not None:
                break  # rules of lower classes can no longer come first
        if baseline is None:
            baseline = self._declared(info)
        rank = self._rank[baseline]
        return next((name for name in lowering if self._rank[name] <= rank), baseline)

    def _granted(self, name: str, trust: Trust) -> str:
        if trust == Trust.DECLARES and self._rank[name] > self._rank[self._declared_max]:
            return self._declared_max
        return name

    def _declared(self, info: ProcessInfo) -> str:
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
