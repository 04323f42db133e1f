"""What every stage of the expression translator shares: typed nodes, positions, messages,
temporaries and the None guard.

The translator is split by topic: this base, names and fields (``expr_names``), function calls
(``expr_calls``) and operators (``expr_rewrite``, which puts them together).
"""

from __future__ import annotations

import ast
import copy
import functools
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import NoReturn

from gpuwarden.playbook.expr_text import ExprError, Prepared
from gpuwarden.playbook.fields import Field

KIND_NAMES = {
    "number": "a number",
    "string": "a string",
    "boolean": "true/false",
    "list": "a list",
    "priority": "a priority class",
    "none": "null",
}
SCOPE_ORDER = ("process", "event", "gpu", "host")
PLURALS = {"number": "numbers", "string": "strings", "priority": "priority classes"}

# (root, kind, canonical text, body, window) -> series id
Register = Callable[[str, str, str, ast.expr, float], int]


@dataclass(frozen=True)
class Typed:
    """A rewritten node and what is known about it at compile time."""

    node: ast.expr
    kind: str  # a key of KIND_NAMES
    nullable: bool  # may be None when evaluated
    source: ast.expr  # the node as parsed, for messages and positions
    const: bool = False
    value: object = None  # the constant (for a list literal: a tuple of Typed items)
    elem: str | None = None  # kind of a list's items
    field: Field | None = None


@functools.cache
def _accessor_tree(accessor: str) -> ast.expr:
    return ast.parse(accessor, mode="eval").body


def accessor_node(field: Field) -> ast.expr:
    """A fresh copy of the tree of a field's accessor."""
    return copy.deepcopy(_accessor_tree(field.accessor))


def load(name: str) -> ast.Name:
    return ast.Name(id=name, ctx=ast.Load())


def store(name: str, value: ast.expr) -> ast.NamedExpr:
    return ast.NamedExpr(target=ast.Name(id=name, ctx=ast.Store()), value=value)


def is_none(node: ast.expr, *, negate: bool = False) -> ast.Compare:
    op: ast.cmpop = ast.IsNot() if negate else ast.Is()
    return ast.Compare(left=node, ops=[op], comparators=[ast.Constant(None)])


class TranslatorBase:
    """State of one translation. After it: ``fields`` and ``roots`` hold what the expression
    reads, ``series`` the ids of the history series it uses."""

    def __init__(
        self,
        prepared: Prepared,
        ranks: Mapping[str, int],
        roots: Collection[str],
        place: str | None,
        register: Register,
    ) -> None:
        self.prepared = prepared
        self.ranks = ranks
        self.allowed = frozenset(roots)
        # The most specific root allowed is the scope itself, always present; the other
        # gpu/process/event roots may be absent (None) in an environment: a process whose GPU
        # is not in the snapshot, an event with no GPU, a select outside an event rule.
        scope = next((r for r in SCOPE_ORDER if r in self.allowed), None)
        self.optional_roots = frozenset(r for r in SCOPE_ORDER[:3] if r in self.allowed) - {scope}
        self.place = place
        self.register = register
        self.fields: set[str] = set()
        self.roots: set[str] = set()
        self.series: list[int] = []
        self.in_history = False
        self._temps = 0

    def translate(self, node: ast.expr) -> Typed:
        raise NotImplementedError

    # -- positions and messages ---------------------------------------------------------------

    def pos(self, node: ast.AST) -> int:
        return self.prepared.at(getattr(node, "lineno", 1), getattr(node, "col_offset", 0))

    def end(self, node: ast.AST) -> int:
        return self.prepared.at(getattr(node, "end_lineno", 1), getattr(node, "end_col_offset", 0))

    def fail(self, at: ast.AST | int, message: str, hint: str | None = None) -> NoReturn:
        raise ExprError(message, at if isinstance(at, int) else self.pos(at), hint)

    def text_of(self, node: ast.AST) -> str:
        text = self.prepared.original[self.pos(node) : self.end(node)].strip()
        text = " ".join(text.split()) or ast.unparse(node)
        return text if len(text) <= 40 else text[:37] + "..."

    def describe(self, t: Typed, *, paren: bool = False) -> str:
        """``gpu.name is a string``, or with ``paren``: ``gpu.name (a string)``."""
        if paren:
            return f"{self.text_of(t.source)} ({KIND_NAMES[t.kind]})"
        return f"{self.text_of(t.source)} is {KIND_NAMES[t.kind]}"

    def example_class(self) -> str:
        names = sorted(self.ranks, key=self.ranks.__getitem__)
        return names[len(names) // 2] if names else "normal"

    def compare_hint(self, t: Typed) -> str | None:
        text = self.text_of(t.source)
        if t.kind == "number":
            return f"compare it, e.g. {text} > 0"
        if t.kind == "string":
            return f'compare it, e.g. {text} == "..."'
        if t.kind == "priority":
            return f"compare it, e.g. {text} <= {self.example_class()}"
        if t.kind == "list":
            return f'test for an item, e.g. "..." in {text}'
        return None

    def need_number(self, t: Typed, what: str) -> None:
        if t.kind != "number":
            self.fail(t.source, f"{what} needs numbers; {self.describe(t)}")

    @staticmethod
    def finite(t: Typed) -> float | None:
        """The value of a constant, finite number; None when ``t`` is not one."""
        if t.const and t.kind == "number" and isinstance(t.value, int | float):
            value = float(t.value)
            return value if math.isfinite(value) else None
        return None

    # -- code -------------------------------------------------------------------------------

    def temp(self) -> str:
        self._temps += 1
        return f"_t{self._temps}"

    def guarded(
        self,
        operands: list[Typed],
        build: Callable[[list[ast.expr]], ast.expr],
        source: ast.expr,
        *,
        zero_check: bool = False,
    ) -> Typed:
        """``None if <an operand is None> else build(operands)``: each nullable operand is read
        once into a temporary. ``zero_check``: a last operand (a divisor) of 0 gives None too,
        so dividing by zero never raises."""
        tests: list[ast.expr] = []
        refs: list[ast.expr] = []
        for i, t in enumerate(operands):
            divisor = zero_check and i == len(operands) - 1
            if t.const or not (t.nullable or divisor):
                refs.append(t.node)
                continue
            name = self.temp()
            if t.nullable:
                tests.append(is_none(store(name, t.node)))
                if divisor:
                    tests.append(ast.UnaryOp(op=ast.Not(), operand=load(name)))
            else:
                tests.append(ast.UnaryOp(op=ast.Not(), operand=store(name, t.node)))
            refs.append(load(name))
        body = build(refs)
        if not tests:
            return Typed(body, "number", False, source)
        test = tests[0] if len(tests) == 1 else ast.BoolOp(op=ast.Or(), values=tests)
        node = ast.IfExp(test=test, body=ast.Constant(None), orelse=body)
        return Typed(node, "number", True, source)
