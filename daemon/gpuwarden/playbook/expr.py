"""The playbook expression language: compiled once when playbooks load, evaluated every tick.

    when: gpu.memory.used_pct >= 95 and gpu.temperature_c < 85
    select: process.checkpointable and process.priority <= normal
    when: predict(gpu.memory.used_pct, 10m) >= 100
    when: held_for(process.sm_util_pct == 0) > 2h and process.gpu_memory_mib > 8192
    when: event.kind == "xid" and event.xid in [48, 63, 64, 74, 79, 94, 95]

What may be written (everything else is an ``ExprError`` with the offset of the offending text):

- ``and``, ``or``, ``not`` over true/false values; comparisons ``== != < <= > >=``, chained
  (``0 < x < 10``), ``in`` and ``not in`` (a list literal, a list field such as
  ``gpu.throttle``, or a string for substrings), ``is None`` / ``is not None``;
  ``+ - * / // %`` and unary ``-`` over numbers;
- constants: numbers, strings, ``True``/``true``, ``False``/``false``, ``None``/``null``, and
  durations (``500ms``, ``30s``, ``5m``, ``1h30m``, ``2d``), which are seconds;
- documented fields (``fields.FIELDS``), from the roots this place allows;
- bare priority class names (``normal``), which compare with ``process.priority`` and
  ``process.declared_priority``. Those fields read as the class's rank (higher is more
  important), so ``process.priority <= normal`` means "normal or less important"; a string
  compared with them (``process.priority == "low"``, ``in ["low", "scavenger"]``) is a class
  name too, and an unknown one is an error;
- the functions in ``fields.FUNCTIONS``: ``avg/min/max/rate(field, window)``,
  ``predict(field, horizon[, window=5m])``, ``held_for(condition)``, ``abs(number)``.

Unknown values. A field the device or the OS cannot tell is ``None``. An ordering comparison
or ``in`` / ``not in`` with an unknown side is false; arithmetic with an unknown operand, and
division by zero, is unknown; a history function without enough samples is unknown. ``==`` and
``!=`` keep Python's meaning (``gpu.temperature_c == None`` tests for unknown; an unknown value
``!=`` a number is true). ``and``/``or``/``not`` count unknown as false, so
``not (gpu.temperature_c > 80)`` is true when the temperature is unknown; write
``gpu.temperature_c <= 80`` to mean "known and at most 80". ``Compiled.test`` is true only for
``True``. The guards are written into the compiled code at load time (walrus temporaries named
``_t1``, ``_t2``... that evaluation stores in the environment dict), so a tick pays no helper
calls for them.

Roots. The most specific root a place allows (process, then event, then gpu) is the scope
being evaluated and must be in the environment; a less specific gpu/process/event root may be
``None`` there (a process whose GPU is not in the snapshot, an event without a GPU, a
``select`` outside an event rule), and then its fields are unknown. ``host`` and ``time`` are
always present. A root missing from the environment altogether raises ``NameError``.

History. Each history call registers a ``Series``: the engine records it every tick for every
scope of ``Series.root`` (a GPU, a process, the host) and passes that scope's ``HistoryView``
as ``_h`` (``engine/history.py`` stores them).
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import CodeType
from typing import Protocol

from gpuwarden.playbook.expr_batch import (
    BatchFn,
    Row,
    batch_globals,
    holding_function,
    values_function,
)
from gpuwarden.playbook.expr_rewrite import Translator
from gpuwarden.playbook.expr_text import ExprError, prepare
from gpuwarden.playbook.fields import ROOTS, helper_globals

__all__ = [
    "Compiled",
    "Compiler",
    "ExprError",
    "HistoryView",
    "Row",
    "Series",
    "Shared",
    "number",
    "shared",
]

# What evaluation turns into "unknown" rather than raising. A NameError (a root the engine
# did not put in the environment) is a bug in the caller and is not caught.
_UNKNOWN_ON = (TypeError, ValueError, ArithmeticError, LookupError)
KINDS = ("condition", "value")
_NUMBERS = (int, float)


class HistoryView(Protocol):
    """The history of one scope at one instant, as compiled expressions read it (``_h``)."""

    def avg(self, series: int, window: float) -> float | None: ...
    def min(self, series: int, window: float) -> float | None: ...
    def max(self, series: int, window: float) -> float | None: ...
    def rate(self, series: int, window: float) -> float | None: ...
    def predict(self, series: int, horizon: float, window: float) -> float | None: ...
    def held_for(self, series: int) -> float: ...


def _no_helpers() -> dict[str, object]:
    return {"__builtins__": {}}


Shared = tuple[object, object, float, object]  # what a batch function takes besides the rows


def shared(env: Mapping[str, object]) -> Shared:
    """What a batch function takes from the tick's shared environment besides the rows:
    ``host``, ``time``, ``_now`` and ``_gpu_procs``."""
    now = env["_now"]
    assert isinstance(now, float | int)
    return env["host"], env["time"], now, env["_gpu_procs"]


def number(value: object) -> float | int | None:
    """``value`` when it is a number (not a bool), else None: what a value series records."""
    if isinstance(value, bool) or not isinstance(value, _NUMBERS):
        return None
    return value


def _row_env(env: Mapping[str, object], row: Row) -> dict[str, object]:
    scope = dict(env)
    scope["gpu"], scope["process"], scope["event"], scope["_h"] = row
    return scope


@dataclass(frozen=True)
class Series:
    """A value the engine records each tick, per scope of ``root``, for the history functions.

    ``kind`` "value": a numeric field (``text`` is its path); "held": a condition (``text`` is
    its canonical source) whose since-when-true the history keeps. ``window``: the longest any
    expression needs, in seconds (0 for held). Ids are indexes into ``Compiler.series``, which
    holds the current window of each (a later expression may widen it).
    """

    id: int
    root: str
    kind: str
    code: CodeType
    window: float
    text: str
    helpers: dict[str, object] = field(default_factory=_no_helpers, repr=False, compare=False)
    # The checked tree, for the form that samples many scopes at once (expr_batch), built on
    # first use; None: one scope at a time.
    tree: ast.expr | None = field(default=None, repr=False, compare=False)
    _batch: list[BatchFn] = field(default_factory=list, init=False, repr=False, compare=False)

    def sample_rows(
        self, rows: Sequence[Row], env: Mapping[str, object], common: Shared | None = None
    ) -> list[float | bool | None]:
        """``sample`` in every row's scope (``env``: the tick's shared environment;
        ``common``: ``shared(env)``, when the caller has it already)."""
        raw = self.sample_raw(rows, env, common)
        if self.kind == "held":
            return [value is True for value in raw]
        return [number(value) for value in raw]

    def sample_raw(
        self, rows: Sequence[Row], env: Mapping[str, object], common: Shared | None = None
    ) -> list[object]:
        """What the series' expression gives in every row's scope, as it is (None where it
        raised): ``sample_rows`` before a held series' is made true/false and a value
        series' non-numbers None (``number``), for a caller that does that itself."""
        if not self._batch and self.tree is not None:
            self._batch.append(values_function(self.tree, batch_globals(self.helpers)))
        fn = self._batch[0] if self._batch else None
        if fn is None:
            return [self.sample(_row_env(env, row)) for row in rows]
        args = shared(env) if common is None else common
        try:
            return fn(rows, *args)
        except _UNKNOWN_ON:
            raw: list[object] = []
            for row in rows:
                try:
                    raw.append(fn((row,), *args)[0])
                except _UNKNOWN_ON:
                    raw.append(None)
            return raw

    def sample(self, env: dict[str, object]) -> float | bool | None:
        """This tick's value in a scope's environment: a number or None for "value", whether
        the condition is true for "held"."""
        try:
            value = eval(self.code, self.helpers, env)  # noqa: S307 - our own checked tree
        except _UNKNOWN_ON:
            value = None
        if self.kind == "held":
            return value is True
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return value


@dataclass(frozen=True)
class Compiled:
    """One compiled expression. ``roots``/``fields``: what it reads; ``series``: the history
    series it reads; ``result``: its type ("boolean" for conditions); ``python``: the checked,
    rewritten code as Python source (for ``check --verbose`` and for reading)."""

    text: str
    code: CodeType
    roots: frozenset[str]
    series: tuple[Series, ...]
    fields: frozenset[str]
    result: str = "boolean"
    python: str = field(default="", repr=False, compare=False)  # the code, as Python source
    helpers: dict[str, object] = field(default_factory=_no_helpers, repr=False, compare=False)
    # The checked tree, for the form that evaluates many scopes at once (expr_batch), built
    # on first use; None: one scope at a time.
    tree: ast.expr | None = field(default=None, repr=False, compare=False)
    _batch: list[BatchFn] = field(default_factory=list, init=False, repr=False, compare=False)

    def holding(
        self, rows: Sequence[Row], env: Mapping[str, object], common: Shared | None = None
    ) -> list[int]:
        """The indexes of the rows in whose scope ``test`` is true (``env``: the tick's shared
        environment, ``common``: ``shared(env)`` when the caller has it already; a row is
        ``(gpu, process, event, _h)``)."""
        if not self._batch and self.tree is not None:
            self._batch.append(holding_function(self.tree, batch_globals(self.helpers)))
        fn = self._batch[0] if self._batch else None
        if fn is None:
            return [i for i, row in enumerate(rows) if self.test(_row_env(env, row))]
        args = shared(env) if common is None else common
        try:
            return fn(rows, *args)
        except _UNKNOWN_ON:
            pass
        found: list[int] = []
        for i, row in enumerate(rows):  # a row raised: each on its own, as ``test`` would
            try:
                if fn((row,), *args):
                    found.append(i)
            except _UNKNOWN_ON:
                continue
        return found

    def evaluate(self, env: dict[str, object]) -> object:
        """The value in ``env``; None when it is unknown. Never raises for bad data."""
        try:
            return eval(self.code, self.helpers, env)  # noqa: S307 - our own checked tree
        except _UNKNOWN_ON:
            return None

    def test(self, env: dict[str, object]) -> bool:
        """Whether the condition holds: true only when it evaluates to True."""
        try:
            return eval(self.code, self.helpers, env) is True  # noqa: S307 - our own checked tree
        except _UNKNOWN_ON:
            return False


class Compiler:
    """Compiles expressions for one set of priority classes (highest first). ``series`` is every
    history series registered so far, shared and de-duplicated across expressions."""

    def __init__(self, priority_names: Sequence[str]) -> None:
        names = tuple(priority_names)
        if len(set(names)) != len(names):
            raise ValueError(f"priority class names repeat: {names}")
        self.priority_names = names
        self.ranks: dict[str, int] = {n: len(names) - 1 - i for i, n in enumerate(names)}
        self.globals = helper_globals(names)  # the eval globals: helpers, no builtins
        self.series: list[Series] = []
        self._series_ids: dict[tuple[str, str, str], int] = {}

    def compile(
        self,
        text: str,
        *,
        roots: Collection[str],
        place: str | None = None,
        kind: str = "condition",
    ) -> Compiled:
        """Compile ``text``; raises ``ExprError``. ``roots``: the roots this place may read;
        ``place``: how messages name it ("in a rule with for_each: gpu"); ``kind``: "condition"
        (the result must be true/false) or "value" (any type, e.g. a sort key)."""
        unknown = set(roots) - set(ROOTS)
        if unknown or kind not in KINDS:
            raise ValueError(f"bad compile arguments: roots {sorted(unknown)}, kind {kind!r}")
        if "\0" in text:
            raise ExprError("a NUL character is not allowed", text.index("\0"))
        prepared = prepare(text)
        if not prepared.text.strip():
            raise ExprError("empty expression", 0, "e.g. gpu.memory.used_pct >= 95")
        try:
            with warnings.catch_warnings():  # "0in [..]", "'\\d'": Python's leniency is ours
                warnings.simplefilter("ignore")
                tree = ast.parse(prepared.text, mode="eval")
        except SyntaxError as exc:
            if exc.offset:
                offset = prepared.at(exc.lineno, exc.offset - 1, col_in_bytes=False)
                hint = _syntax_hint(text)
            else:  # the text ended where more was expected
                offset = len(text.rstrip())
                hint = _syntax_hint(text) or "the expression is incomplete"
            raise ExprError(f"not a valid expression: {exc.msg}", offset, hint) from None
        except (ValueError, MemoryError, RecursionError) as exc:
            raise ExprError(f"not a valid expression: {exc}", 0) from None
        mark = (len(self.series), [s.window for s in self.series])
        translator = Translator(prepared, self.ranks, roots, place, self._register)
        try:
            typed = translator.translate(tree.body)
            if kind == "condition" and typed.kind != "boolean":
                raise ExprError(
                    f"a condition must be true or false; {translator.describe(typed)}",
                    translator.pos(tree.body),
                    translator.compare_hint(typed),
                )
            code = _code(typed.node)
        except ExprError:
            self._rollback(*mark)
            raise
        except RecursionError:
            self._rollback(*mark)
            raise ExprError("expression nested too deeply", 0) from None
        return Compiled(
            text=text,
            code=code,
            roots=frozenset(translator.roots),
            series=tuple(self.series[i] for i in dict.fromkeys(translator.series)),
            fields=frozenset(translator.fields),
            result=typed.kind,
            python=ast.unparse(typed.node),
            helpers=self.globals,
            tree=typed.node if typed.kind == "boolean" else None,
        )

    def _register(self, root: str, kind: str, text: str, body: ast.expr, window: float) -> int:
        key = (root, kind, text)
        sid = self._series_ids.get(key)
        if sid is None:
            sid = len(self.series)
            self.series.append(
                Series(sid, root, kind, _code(body), window, text, self.globals, body)
            )
            self._series_ids[key] = sid
        elif window > self.series[sid].window:
            self.series[sid] = replace(self.series[sid], window=window)
        return sid

    def _rollback(self, count: int, windows: list[float]) -> None:
        """Forget what a failed compile registered: a bad expression leaves no series."""
        del self.series[count:]
        for i, window in enumerate(windows):
            if self.series[i].window != window:
                self.series[i] = replace(self.series[i], window=window)
        self._series_ids = {k: v for k, v in self._series_ids.items() if v < count}


def _code(node: ast.expr) -> CodeType:
    expression = ast.Expression(body=node)
    for child in ast.walk(expression):
        if "lineno" in child._attributes:  # our own nodes: one position for all
            for name, value in (("lineno", 1), ("col_offset", 0), ("end_lineno", 1)):
                setattr(child, name, value)
            setattr(child, "end_col_offset", 0)  # noqa: B010
    with warnings.catch_warnings():  # e.g. "'x' is None": checked, harmless
        warnings.simplefilter("ignore")
        return compile(expression, "<playbook expression>", "eval", dont_inherit=True)


def _syntax_hint(text: str) -> str | None:
    if "&&" in text or "||" in text:
        return "write and / or instead of && / ||"
    if re.search(r"![^=]", text):
        return "write not instead of !"
    if re.search(r"(?<![=!<>])=(?!=)", text):
        return "compare with ==, not ="
    return None
