"""Load a set of playbook files: validate, compile every expression once, check references.

The set loads whole or not at all: every problem in every file is collected and reported as
``file:line:col: …``, and nothing of a set with a problem is returned. What a loaded set is
(``PlaybookSet``, ``CompiledRule``, ``CompiledStep``) is in ``compiled.py``, re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from gpuwarden import yamlfile
from gpuwarden.config import Config
from gpuwarden.errors import InputError, Problem, in_file_order
from gpuwarden.playbook.compiled import CompiledRule, CompiledStep, OrderKey, PlaybookSet, Show
from gpuwarden.playbook.expr import Compiled, Compiler, ExprError
from gpuwarden.playbook.fields import FIELDS
from gpuwarden.playbook.schema import (
    SELECTING_KINDS,
    CheckpointParams,
    NotifyParams,
    ProvisionParams,
    Rule,
    Selection,
    Step,
)
from gpuwarden.playbook.structure import validated_rules
from gpuwarden.playbook.templates import unknown_placeholders
from gpuwarden.timewindow import (
    WindowError,
    parse_active,
    parse_every,
)

__all__ = [
    "CHECKPOINT_SIGNALS",
    "DEFAULT_ORDER",
    "KILL_SIGNALS",
    "PLAYBOOK_SUFFIXES",
    "SELECT_ROOTS",
    "WHEN_ROOTS",
    "CompiledRule",
    "CompiledStep",
    "OrderKey",
    "PlaybookSet",
    "Show",
    "load",
    "playbook_files",
]

# The roots an expression may read, by where it stands and the rule's for_each.
WHEN_ROOTS = {
    "gpu": frozenset({"gpu", "host", "time"}),
    "process": frozenset({"process", "gpu", "host", "time"}),
    "host": frozenset({"host", "time"}),
    "event": frozenset({"event", "gpu", "host", "time"}),
}
SELECT_ROOTS = frozenset({"process", "gpu", "host", "time", "event"})
DEFAULT_ORDER = ("priority", "-gpu_memory_mib", "age_s")
# Steps that stop work: without `select` in a host rule they may choose any process at all.
UNBOUNDED_KINDS = frozenset({"kill", "suspend"})
PLAYBOOK_SUFFIXES = (".yaml", ".yml")
# Signals a job can catch to save its state, and those a kill may start with.
CHECKPOINT_SIGNALS = frozenset(
    {
        "SIGUSR1",
        "SIGUSR2",
        "SIGHUP",
        "SIGINT",
        "SIGTERM",
        "SIGQUIT",
        "SIGALRM",
        "SIGWINCH",
        "SIGCONT",
    }
)
KILL_SIGNALS = frozenset(
    {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGKILL"}
)


def playbook_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files named directly, and the ``*.yaml``/``*.yml`` files of directories, sorted."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                sorted(
                    p
                    for p in path.iterdir()
                    if p.suffix in PLAYBOOK_SUFFIXES and not p.name.startswith(".") and p.is_file()
                )
            )
        else:
            found.append(path)
    return found


class _FileCompiler:
    """Compiles one validated file, collecting problems instead of stopping at the first."""

    def __init__(self, located: yamlfile.Located, compiler: Compiler, config: Config) -> None:
        self.located = located
        self.compiler = compiler
        self.config = config
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []

    def expr(self, path: yamlfile.KeyPath, text: str, roots: frozenset[str]) -> Compiled | None:
        try:
            return self.compiler.compile(text, roots=roots)
        except ExprError as exc:
            line, col = self.located.inside(path, exc.offset)
            self.problems.append(
                Problem(self.located.file, line, col, str(exc.message), None, exc.hint)
            )
            return None

    def rule(self, index: int, rule: Rule) -> CompiledRule | None:
        at = ("rules", index)
        roots = WHEN_ROOTS[rule.for_each]
        when = self.expr((*at, "when"), rule.when, roots)
        until = self.expr((*at, "until"), rule.until, roots) if rule.until else None
        active = every = None
        if rule.active is not None:
            try:
                active = parse_active(rule.active)
            except WindowError as exc:
                self.problems.append(self._window_problem((*at, "active"), rule.active, exc))
        if rule.every is not None:
            try:
                every = parse_every(rule.every)
            except WindowError as exc:
                self.problems.append(self._window_problem((*at, "every"), rule.every, exc))
        steps = [self.step((*at, "steps", i), i, step, rule) for i, step in enumerate(rule.steps)]
        if when is None or (rule.until and until is None) or any(s is None for s in steps):
            return None
        line, col = self.located.where(at)
        return CompiledRule(
            rule,
            self.located.file,
            line,
            when,
            until,
            active,
            every,
            tuple(s for s in steps if s is not None),
            self.shows(when, roots),
            self.shows(until, roots) if until is not None else (),
            col=col,
        )

    def shows(self, condition: Compiled, roots: frozenset[str]) -> tuple[Show, ...]:
        """The fields ``condition`` reads, in the order its text names them, as values."""
        fields = sorted(condition.fields, key=lambda f: (condition.text.find(f), f))
        ranks = self.compiler.ranks
        names = tuple(sorted(ranks, key=ranks.__getitem__))  # rank r is names[r]
        return tuple(
            Show(
                f,
                self.compiler.compile(f, roots=roots, kind="value"),
                names if FIELDS[f].type == "priority" else None,
            )
            for f in fields
        )

    def loose(self, index: int, raw: object) -> None:
        """The expressions of a rule whose structure is wrong, compiled anyway, so that their
        problems are reported in the same run as the structure's."""
        if not isinstance(raw, dict):
            return
        for_each = raw.get("for_each", "gpu")
        if not isinstance(for_each, str) or for_each not in WHEN_ROOTS:
            return
        at: yamlfile.KeyPath = ("rules", index)
        for key in ("when", "until"):
            if isinstance(raw.get(key), str):
                self.expr((*at, key), raw[key], WHEN_ROOTS[for_each])
        steps = raw.get("steps")
        for i, step in enumerate(steps if isinstance(steps, list) else ()):
            for kind in SELECTING_KINDS & set(step if isinstance(step, dict) else ()):
                params = step[kind]
                if isinstance(params, dict) and isinstance(params.get("select"), str):
                    self.expr((*at, "steps", i, kind, "select"), params["select"], SELECT_ROOTS)

    def _window_problem(self, path: yamlfile.KeyPath, value: object, exc: WindowError) -> Problem:
        if exc.index is not None:  # one window of a list: point at that item
            path, value = (*path, exc.index), exc.text
        line, col = (
            self.located.inside(path, exc.offset)
            if isinstance(value, str)
            else self.located.where(path)
        )
        return Problem(self.located.file, line, col, exc.problem, exc.expected)

    def step(self, at: yamlfile.KeyPath, index: int, step: Step, rule: Rule) -> CompiledStep | None:
        kind_at = (*at, step.kind)
        params = step.params
        ok = True
        if isinstance(params, NotifyParams) and params.message is not None:
            for found in unknown_placeholders(params.message, rule.for_each):
                self.problems.append(self.located.problem((*kind_at, "message"), *found.words()))
                ok = False
        if isinstance(params, NotifyParams):
            for i, target in enumerate(params.targets):
                if target not in self.config.notify.targets:
                    known = sorted(self.config.notify.targets)
                    self.problems.append(
                        self.located.problem(
                            self._written(
                                (*kind_at, "targets", i),
                                (*kind_at, i),
                                (*kind_at, "targets"),
                                kind_at,
                            ),
                            f"unknown notification target {target!r}",
                            f"one of: {', '.join(known)}" if known else None,
                            "define it under notify.targets in the config" if not known else None,
                        )
                    )
                    ok = False
        if isinstance(params, ProvisionParams) and params.profile not in self.config.cloud.profiles:
            known = sorted(self.config.cloud.profiles)
            self.problems.append(
                self.located.problem(
                    self._written((*kind_at, "profile"), kind_at),
                    f"unknown cloud profile {params.profile!r}",
                    f"one of: {', '.join(known)}" if known else None,
                    "define it under cloud.profiles in the config" if not known else None,
                )
            )
            ok = False
        if step.kind == "power_cap" and rule.for_each == "host":
            self.problems.append(
                self.located.problem(
                    kind_at,
                    "power_cap acts on one GPU; a host rule has none",
                    "for_each: gpu, process or event",
                )
            )
            ok = False
        select = free_until = None
        order: list[OrderKey] = []
        if isinstance(params, Selection):
            assert step.kind in SELECTING_KINDS
            if rule.for_each == "host" and step.kind in UNBOUNDED_KINDS and not params.select:
                self.warnings.append(
                    self.located.problem(
                        kind_at,
                        f"{step.kind} without select in a host rule chooses among every "
                        "process on every GPU of the machine",
                        hint=f"say which: {step.kind}: {{select: process.priority <= low}} "
                        "(and free_until or limit to stop early)",
                    )
                )
            free_roots = WHEN_ROOTS["host" if rule.for_each == "host" else "gpu"]
            if params.select is not None:
                select = self.expr((*kind_at, "select"), params.select, SELECT_ROOTS)
                ok = ok and select is not None
            if params.free_until is not None:
                free_until = self.expr((*kind_at, "free_until"), params.free_until, free_roots)
                ok = ok and free_until is not None
            keys = params.order if params.order is not None else DEFAULT_ORDER
            for i, key in enumerate(keys):
                compiled_key = self.order_key((*kind_at, "order", i), key)
                if compiled_key is None:
                    ok = False
                else:
                    order.append(compiled_key)
            if isinstance(params, CheckpointParams) and params.signal is not None:
                ok = self._signal((*kind_at, "signal"), params.signal) and ok
        kill = step.kill
        if kill is not None:
            ok = self._signal((*kind_at, "signal"), kill.signal) and ok
        if not ok:
            return None
        return CompiledStep(index, step, select, free_until, tuple(order))

    def _written(self, *paths: yamlfile.KeyPath) -> yamlfile.KeyPath:
        """The first of ``paths`` that stands in the file (shorthands such as ``notify: [a, b]``
        leave out the parameter's key)."""
        return next((p for p in paths if p in self.located.values), paths[-1])

    def order_key(self, path: yamlfile.KeyPath, key: str) -> OrderKey | None:
        descending = key.startswith("-")
        name = key.lstrip("-+ ")
        field = FIELDS.get(f"process.{name}")
        if field is None or not (field.numeric or field.type == "priority"):
            sortable = sorted(
                f.removeprefix("process.")
                for f, spec in FIELDS.items()
                if f.startswith("process.") and (spec.numeric or spec.type == "priority")
            )
            self.problems.append(
                self.located.problem(
                    path,
                    f"cannot order by {key!r}",
                    f"a numeric process field, '-' first for descending: {', '.join(sortable)}",
                )
            )
            return None
        expr = self.compiler.compile(f"process.{name}", roots=SELECT_ROOTS, kind="value")
        return OrderKey(name, descending, expr)

    def _signal(self, path: yamlfile.KeyPath, name: str) -> bool:
        text = name.strip().upper()
        text = text if text.startswith("SIG") else "SIG" + text
        allowed = CHECKPOINT_SIGNALS if "checkpoint" in path else KILL_SIGNALS
        if text not in allowed:
            self.problems.append(
                self.located.problem(
                    path,
                    f"not a signal this step can send: {name!r}",
                    f"one of {', '.join(sorted(allowed))}",
                )
            )
            return False
        return True


def load(paths: Sequence[str | Path], config: Config) -> PlaybookSet:
    """Load every playbook file under ``paths``; raises ``InputError`` listing every problem."""
    files = playbook_files(paths)
    compiler = Compiler(config.priorities.names)
    problems: list[Problem] = []
    rules: list[CompiledRule] = []
    first_seen: dict[str, tuple[str, int | None]] = {}
    if not files:
        where = ", ".join(str(p) for p in paths) or "(nothing given)"
        raise InputError.at(where, None, None, "no playbook files found", "*.yaml or *.yml files")
    warnings: list[Problem] = []
    for path in files:
        try:
            located = yamlfile.load(path)
            if not isinstance(located.data, dict):
                raise located.error((), "a playbook file must be a mapping", "rules: [...]")
        except InputError as exc:
            problems.extend(exc.problems)
            continue
        valid, found = validated_rules(located)
        fc = _FileCompiler(located, compiler, config)
        fc.problems.extend(found)
        rule_items = located.data.get("rules")
        if isinstance(rule_items, list):
            good = {index for index, _ in valid}
            for index, raw in enumerate(rule_items):
                if index not in good:
                    fc.loose(index, raw)
        for index, rule in valid:
            compiled = fc.rule(index, rule)
            if rule.name in first_seen:
                file, line = first_seen[rule.name]
                fc.problems.append(
                    located.problem(
                        ("rules", index, "name"),
                        f"rule {rule.name!r} is defined twice (first at {file}:{line})",
                        "each rule name once across all playbook files",
                    )
                )
            else:
                first_seen[rule.name] = (located.file, located.where(("rules", index))[0])
            if compiled is not None:
                rules.append(compiled)
        problems.extend(in_file_order(fc.problems))
        warnings.extend(in_file_order(fc.warnings))
    if problems:
        raise InputError(problems)
    return PlaybookSet(
        tuple(rules),
        tuple(compiler.series),
        tuple(str(f) for f in files),
        compiler,
        tuple(warnings),
    )
