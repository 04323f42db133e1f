"""Deciding a condition for a whole stretch of ticks at once, from bounds on its fields.

A drill knows its timeline ahead: between two keyframes of a scenario every GPU and process
field moves one way (or not at all), so its values over the stretch lie between those at the
stretch's first and last tick. ``decide`` evaluates a condition's text over such bounds, in
three-valued logic, and answers ``NEVER`` only when the condition cannot be true at any tick
whose fields lie within them. Anything it does not understand (history functions other than
``held_for`` of a condition that never holds, ``time.*``, ``host.*``, division, a field it was
given no bounds for) is ``MAYBE``: the answer is sound, not complete.

What the engine's compiled form does, and what this relies on: comparisons are Python's, a
comparison with an unknown (None) operand is never true, ``a and b`` is true only when both
are, ``a or b`` only when one is, ``not`` turns only True into False and False into True.

A tree is made once into nested functions of the bounds (kept for the last 512 trees);
each decision runs them. Pure: no I/O; the bounds come from the caller (engine/quiet.py).
"""

from __future__ import annotations

import ast
import enum
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuwarden.playbook.expr_calls import DEFAULT_PREDICT_WINDOW
from gpuwarden.playbook.expr_names import WORDS
from gpuwarden.playbook.expr_text import ExprError, prepare

__all__ = ["Abstract", "Const", "Span", "Truth", "decide", "parse"]


class Truth(enum.Enum):
    """What a condition is over a stretch: always True, always False (never None), never
    True (False or None), or anything."""

    ALWAYS = "always"
    FALSE = "false"
    NEVER = "never"
    MAYBE = "maybe"

    @property
    def never_true(self) -> bool:
        return self in (Truth.FALSE, Truth.NEVER)


@dataclass(frozen=True, slots=True)
class Span:
    """A number somewhere in ``[lo, hi]`` at every tick; ``maybe_none``: or None at some."""

    lo: float
    hi: float
    maybe_none: bool = False


@dataclass(frozen=True, slots=True)
class Const:
    """The same value at every tick (a string, a list of strings, None)."""

    value: object


# The bounds of one value over a stretch; None: nothing is known.
Abstract = Span | Const | Truth | None
_UNKNOWN: Abstract = None
# The bounds of a history function over a stretch in one scope: (function, field path,
# its arguments in seconds: horizon and window for predict, window for the others).
HistoryBounds = Callable[[str, str, tuple[float, ...]], Abstract]
_HISTORY_CALLS = {"avg": 1, "min": 1, "max": 1, "predict": 2}


def parse(text: str) -> ast.expr | None:
    """The tree ``decide`` reads (durations already in seconds); None when the text does not
    parse (then nothing is decided)."""
    try:
        return ast.parse(prepare(text).text, mode="eval").body
    except (ExprError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def decide(
    tree: ast.expr | None,
    fields: Mapping[str, Abstract],
    ranks: Mapping[str, int],
    history: HistoryBounds | None = None,
) -> Truth:
    """What the condition ``tree`` (from ``parse``) is at every tick whose fields lie within
    ``fields`` (field path -> bounds; a path not there is unknown). ``ranks``: the priority
    class names and the ranks the expression reads them as. ``history``: bounds of ``avg``,
    ``min``, ``max`` and ``predict`` in the scope (without it they are unknown)."""
    if tree is None:
        return Truth.MAYBE
    try:
        return _truth(_compiled(tree)(_Ctx(fields, ranks, history)))
    except RecursionError:
        return Truth.MAYBE


def _truth(value: Abstract) -> Truth:
    """A value used as a condition: only True is true."""
    if isinstance(value, Truth):
        return value
    if isinstance(value, Const):
        return Truth.NEVER if value.value is None else Truth.MAYBE
    return Truth.MAYBE


def _span_of(value: Abstract) -> Span | None:
    return value if isinstance(value, Span) else None


class _Ctx:
    """What a compiled tree reads its bounds from."""

    __slots__ = ("fields", "history", "ranks")

    def __init__(
        self,
        fields: Mapping[str, Abstract],
        ranks: Mapping[str, int],
        history: HistoryBounds | None,
    ) -> None:
        self.fields = fields
        self.ranks = ranks
        self.history = history


# A tree made into a function of the bounds: the tree is read once, each decision only runs
# the functions (a drill decides every rule in every scope of every stretch).
_Fn = Callable[[_Ctx], Abstract]


@functools.lru_cache(maxsize=512)
def _compiled(tree: ast.expr) -> _Fn:
    return _compile(tree)


def _fixed(value: Abstract) -> _Fn:
    return lambda ctx: value


def _compile(node: ast.expr) -> _Fn:
    method = _COMPILERS.get(type(node))
    return _fixed(_UNKNOWN) if method is None else method(node)


# -- leaves -----------------------------------------------------------------------------------


def _constant(node: ast.expr) -> _Fn:
    assert isinstance(node, ast.Constant)
    value = node.value
    if isinstance(value, bool):
        return _fixed(Truth.ALWAYS if value else Truth.FALSE)
    if isinstance(value, int | float):
        return _fixed(Span(float(value), float(value)))
    if isinstance(value, str):
        return _fixed(Const(value))
    return _fixed(_UNKNOWN)


def _name(node: ast.expr) -> _Fn:
    assert isinstance(node, ast.Name)
    if node.id in WORDS:
        word = WORDS[node.id]
        return _fixed(Const(None) if word is None else (Truth.ALWAYS if word else Truth.FALSE))
    name = node.id

    def rank(ctx: _Ctx) -> Abstract:
        found = ctx.ranks.get(name)
        return _UNKNOWN if found is None else Span(float(found), float(found))

    return rank


def _attribute(node: ast.expr) -> _Fn:
    path = _path(node)
    if path is None:
        return _fixed(_UNKNOWN)
    if path == "process.idle":  # derived from a number that ramps: decided from it
        return lambda ctx: _is_zero(ctx.fields.get("process.sm_util_pct"))
    return lambda ctx: ctx.fields.get(path, _UNKNOWN)


def _list(node: ast.expr) -> _Fn:
    assert isinstance(node, ast.List | ast.Tuple)
    elements = [_compile(elt) for elt in node.elts]

    def items(ctx: _Ctx) -> Abstract:
        found: list[object] = []
        for element in elements:
            item = element(ctx)
            if isinstance(item, Const) and isinstance(item.value, str):
                found.append(item.value)
            elif isinstance(item, Span) and item.lo == item.hi and not item.maybe_none:
                found.append(item.lo)
            else:
                return _UNKNOWN
        return Const(tuple(found))

    return items


# -- operators --------------------------------------------------------------------------------


def _boolop(node: ast.expr) -> _Fn:
    assert isinstance(node, ast.BoolOp)
    operands = [_compile(v) for v in node.values]
    conjunction = isinstance(node.op, ast.And)

    # Kleene logic, with FALSE (false at every tick) told from NEVER (false or unknown): an
    # `and` is never true when one operand is, and FALSE only when all are FALSE; once one
    # operand is never true and one is not FALSE, the rest cannot change the answer (NEVER).
    # An `or` is never true only when all operands are, and (as decided here) always true only
    # when all are: once one may hold and one is not always true, it is MAYBE.
    def conjunction_truth(ctx: _Ctx) -> Abstract:
        never = not_false = False
        always = True
        for operand in operands:
            t = _truth(operand(ctx))
            if t is not Truth.ALWAYS:
                always = False
            if t is not Truth.FALSE:
                not_false = True
            if t is Truth.FALSE or t is Truth.NEVER:
                never = True
            if never and not_false:
                return Truth.NEVER
        if never:
            return Truth.FALSE  # every operand FALSE
        return Truth.ALWAYS if always else Truth.MAYBE

    def disjunction_truth(ctx: _Ctx) -> Abstract:
        may_hold = not_always = not_false = False
        for operand in operands:
            t = _truth(operand(ctx))
            if t is not Truth.ALWAYS:
                not_always = True
            if t is not Truth.FALSE:
                not_false = True
            if t is not Truth.FALSE and t is not Truth.NEVER:
                may_hold = True
            if may_hold and not_always:
                return Truth.MAYBE
        if not may_hold:
            return Truth.NEVER if not_false else Truth.FALSE
        return Truth.MAYBE if not_always else Truth.ALWAYS

    return conjunction_truth if conjunction else disjunction_truth


def _unaryop(node: ast.expr) -> _Fn:
    assert isinstance(node, ast.UnaryOp)
    operand = _compile(node.operand)
    op = node.op
    if isinstance(op, ast.Not):

        def negation(ctx: _Ctx) -> Abstract:
            t = _truth(operand(ctx))
            if t is Truth.ALWAYS:
                return Truth.FALSE
            return Truth.ALWAYS if t is Truth.FALSE else Truth.MAYBE

        return negation

    def sign(ctx: _Ctx) -> Abstract:
        span = _span_of(operand(ctx))
        if span is None:
            return _UNKNOWN
        if isinstance(op, ast.USub):
            return Span(-span.hi, -span.lo, span.maybe_none)
        return span if isinstance(op, ast.UAdd) else _UNKNOWN

    return sign


def _binop(node: ast.expr) -> _Fn:
    assert isinstance(node, ast.BinOp)
    left, right, op = _compile(node.left), _compile(node.right), node.op

    def arithmetic(ctx: _Ctx) -> Abstract:
        a, b = _span_of(left(ctx)), _span_of(right(ctx))
        if a is None or b is None:
            return _UNKNOWN
        none = a.maybe_none or b.maybe_none
        if isinstance(op, ast.Add):
            return Span(a.lo + b.lo, a.hi + b.hi, none)
        if isinstance(op, ast.Sub):
            return Span(a.lo - b.hi, a.hi - b.lo, none)
        if isinstance(op, ast.Mult):
            ends = (a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi)
            return Span(min(ends), max(ends), none)
        return _UNKNOWN

    return arithmetic


def _call(node: ast.expr) -> _Fn:
    assert isinstance(node, ast.Call)
    func = node.func
    name = func.id if isinstance(func, ast.Name) else None
    held = (
        _compile(node.args[0])
        if name == "held_for" and len(node.args) == 1 and not node.keywords
        else None
    )
    # A history function: its field path and arguments in seconds, or None for anything else.
    asked: tuple[str, str, tuple[float, ...]] | None = None
    if name is not None and not node.keywords:
        wanted = _HISTORY_CALLS.get(name)
        path = _path(node.args[0]) if node.args else None
        numbers = [_number(arg) for arg in node.args[1:]]
        if wanted is not None and path is not None:
            if name == "predict" and len(numbers) == 1:
                numbers.append(DEFAULT_PREDICT_WINDOW)
            args = tuple(n for n in numbers if n is not None)
            if len(args) == len(numbers) == wanted:
                asked = (name, path, args)

    def call(ctx: _Ctx) -> Abstract:
        if held is not None and _truth(held(ctx)).never_true:
            # The condition is false (or unknown) at every tick, and the engine records it
            # before it evaluates: it has held for 0 s at each of them.
            return Span(0.0, 0.0)
        if asked is None or ctx.history is None:
            return _UNKNOWN
        return ctx.history(*asked)

    return call


def _compare(node: ast.expr) -> _Fn:
    assert isinstance(node, ast.Compare)
    if len(node.ops) != 1:
        return _fixed(Truth.MAYBE)
    op = node.ops[0]
    left, right = _compile(node.left), _compile(node.comparators[0])
    if isinstance(op, ast.In | ast.NotIn):
        negate = isinstance(op, ast.NotIn)
        return lambda ctx: _membership(left(ctx), right(ctx), negate=negate)
    equality = isinstance(op, ast.Eq | ast.NotEq)
    identity = equality or isinstance(op, ast.Is | ast.IsNot)

    def comparison(ctx: _Ctx) -> Abstract:
        a, b = left(ctx), right(ctx)
        if isinstance(a, Span) and isinstance(b, Span):
            found = _order(op, a, b)
            if a.maybe_none or b.maybe_none:  # None at some tick: never true there
                return Truth.NEVER if found.never_true else Truth.MAYBE
            return found
        if isinstance(a, Const) and isinstance(b, Const):
            if a.value is None or b.value is None:
                # An unknown value never orders; == and != with null are left undecided.
                return Truth.MAYBE if equality else Truth.NEVER
            return _exact(op, a.value, b.value)
        if isinstance(a, Const | Span) and isinstance(b, Const | Span):
            # A number and an unknown value: no ordering is ever true.
            none = (isinstance(a, Const) and a.value is None) or (
                isinstance(b, Const) and b.value is None
            )
            if none and not identity:
                return Truth.NEVER
        return Truth.MAYBE

    return comparison


# Node type -> how it is compiled.
_COMPILERS: dict[type[ast.expr], Callable[[ast.expr], _Fn]] = {
    ast.Constant: _constant,
    ast.Name: _name,
    ast.Attribute: _attribute,
    ast.List: _list,
    ast.Tuple: _list,
    ast.BoolOp: _boolop,
    ast.UnaryOp: _unaryop,
    ast.BinOp: _binop,
    ast.Call: _call,
    ast.Compare: _compare,
}


def _path(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _number(node: ast.expr) -> float | None:
    value = node.value if isinstance(node, ast.Constant) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _is_zero(value: Abstract) -> Abstract:
    if isinstance(value, Const) and value.value is None:
        return value  # unknown utilization: unknown idleness
    if not isinstance(value, Span) or value.maybe_none:
        return _UNKNOWN
    if value.lo > 0 or value.hi < 0:
        return Truth.FALSE
    return Truth.ALWAYS if value.lo == value.hi == 0 else Truth.MAYBE


def _order(op: ast.cmpop, a: Span, b: Span) -> Truth:
    if isinstance(op, ast.Lt):
        return _both(a.hi < b.lo, a.lo >= b.hi)
    if isinstance(op, ast.LtE):
        return _both(a.hi <= b.lo, a.lo > b.hi)
    if isinstance(op, ast.Gt):
        return _both(a.lo > b.hi, a.hi <= b.lo)
    if isinstance(op, ast.GtE):
        return _both(a.lo >= b.hi, a.hi < b.lo)
    disjoint = a.hi < b.lo or b.hi < a.lo
    same = a.lo == a.hi == b.lo == b.hi
    if isinstance(op, ast.Eq):
        return _both(same, disjoint)
    if isinstance(op, ast.NotEq):
        return _both(disjoint, same)
    return Truth.MAYBE


def _both(always: bool, never: bool) -> Truth:
    if always:
        return Truth.ALWAYS
    return Truth.FALSE if never else Truth.MAYBE


def _exact(op: ast.cmpop, a: object, b: object) -> Truth:
    """Two values fixed for the stretch: the comparison as the engine makes it (Python's)."""
    if isinstance(a, str) and isinstance(b, str):
        found = {
            ast.Eq: a == b,
            ast.NotEq: a != b,
            ast.Lt: a < b,
            ast.LtE: a <= b,
            ast.Gt: a > b,
            ast.GtE: a >= b,
        }.get(type(op))
    elif isinstance(a, tuple) and isinstance(b, tuple) and isinstance(op, ast.Eq | ast.NotEq):
        found = (a == b) == isinstance(op, ast.Eq)
    else:
        found = None
    if found is None:
        return Truth.MAYBE
    return Truth.ALWAYS if found else Truth.FALSE


def _membership(item: Abstract, container: Abstract, *, negate: bool) -> Truth:
    if not isinstance(container, Const) or not isinstance(container.value, tuple | str):
        return Truth.MAYBE
    if isinstance(item, Const) and isinstance(item.value, str):
        inside = item.value in container.value
    elif isinstance(item, Span) and isinstance(container.value, tuple) and not item.maybe_none:
        numbers = [v for v in container.value if isinstance(v, int | float)]
        if len(numbers) != len(container.value):
            return Truth.MAYBE
        if item.lo == item.hi:
            inside = item.lo in numbers
        elif any(item.lo <= v <= item.hi for v in numbers):
            return Truth.MAYBE
        else:
            inside = False
    else:
        return Truth.MAYBE
    return Truth.ALWAYS if inside != negate else Truth.FALSE
