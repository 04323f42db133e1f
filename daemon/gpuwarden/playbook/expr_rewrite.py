"""Operators in expressions, and the translator that puts every stage together.

``Translator.translate`` walks the tree ``ast.parse`` made of a prepared expression and builds a
new tree that only we wrote: documented field paths become their accessors, class names become
ranks, history functions become calls on ``_h``, and every place an unknown (``None``) value could
meet an ordering, ``in`` or arithmetic gets a guard made of walrus temporaries. Anything not on
the whitelist is an ``ExprError`` pointing at the original text. Nothing from the person's text
reaches the compiled code except constants.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import replace
from typing import NoReturn

from gpuwarden.playbook.expr_base import KIND_NAMES, PLURALS, Typed, is_none, load, store
from gpuwarden.playbook.expr_calls import CallsTranslator
from gpuwarden.playbook.expr_text import ExprError

MAX_DEPTH = 64
_SYMBOLS: dict[type[ast.AST], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.BitAnd: "&",
    ast.MatMult: "@",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
}
_ARITHMETIC: dict[type[ast.AST], Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}
_DIVIDING = (ast.Div, ast.FloorDiv, ast.Mod)
_UNGUARDED = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)
_NOT_ALLOWED: dict[type[ast.AST], str] = {
    ast.Subscript: "subscripts (x[...]) are not allowed",
    ast.Slice: "slices are not allowed",
    ast.Lambda: "lambda is not allowed",
    ast.ListComp: "comprehensions are not allowed",
    ast.SetComp: "comprehensions are not allowed",
    ast.DictComp: "comprehensions are not allowed",
    ast.GeneratorExp: "comprehensions are not allowed",
    ast.JoinedStr: "f-strings are not allowed",
    ast.FormattedValue: "f-strings are not allowed",
    ast.NamedExpr: "assignments (:=) are not allowed",
    ast.IfExp: "conditional expressions (a if c else b) are not allowed",
    ast.Dict: "dicts are not allowed",
    ast.Set: "sets ({...}) are not allowed; after in, write a list [...]",
    ast.Starred: "starred expressions (*x) are not allowed",
    ast.Await: "await is not allowed",
    ast.Yield: "yield is not allowed",
    ast.YieldFrom: "yield is not allowed",
}


class Translator(CallsTranslator):
    """Checks and rewrites one expression (see the module docstring)."""

    _depth = 0

    # -- the walk -----------------------------------------------------------------------------

    def translate(self, node: ast.expr) -> Typed:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                self.fail(node, f"expression nested too deeply (more than {MAX_DEPTH} levels)")
            match node:
                case ast.Constant():
                    return self.constant(node)
                case ast.Name():
                    return self.name(node)
                case ast.Attribute():
                    return self.attribute(node)
                case ast.BoolOp():
                    return self.boolean_op(node)
                case ast.UnaryOp():
                    return self.unary(node)
                case ast.BinOp():
                    return self.arithmetic(node)
                case ast.Compare():
                    return self.compare(node)
                case ast.Call():
                    return self.call(node)
                case ast.List() | ast.Tuple():
                    self.fail(
                        node,
                        "a list can only follow in or not in",
                        "e.g. event.xid in [48, 79]",
                    )
                case ast.Subscript():
                    self.fail(self.end(node.value), _NOT_ALLOWED[ast.Subscript])
            self.fail(node, _NOT_ALLOWED.get(type(node), f"{type(node).__name__} is not allowed"))
        finally:
            self._depth -= 1

    def constant(self, node: ast.Constant) -> Typed:
        value = node.value
        if isinstance(value, bool):
            kind = "boolean"
        elif isinstance(value, int | float):
            kind = "number"
        elif isinstance(value, str):
            kind = "string"
        elif value is None:
            kind = "none"
        elif isinstance(value, bytes):
            self.fail(node, "bytes literals (b'...') are not allowed")
        elif isinstance(value, complex):
            self.fail(node, "complex numbers are not allowed")
        else:
            self.fail(node, f"{self.text_of(node)} is not allowed")
        return Typed(ast.Constant(value), kind, False, node, const=True, value=value)

    def boolean_op(self, node: ast.BoolOp) -> Typed:
        word = "and" if isinstance(node.op, ast.And) else "or"
        values = [self.translate(v) for v in node.values]
        for t in values:
            if t.kind != "boolean":
                self.fail(
                    t.source,
                    f"{word} needs true/false on both sides; {self.describe(t)}",
                    self.compare_hint(t),
                )
        return Typed(
            ast.BoolOp(op=type(node.op)(), values=[t.node for t in values]),
            "boolean",
            any(t.nullable for t in values),
            node,
        )

    def unary(self, node: ast.UnaryOp) -> Typed:
        if isinstance(node.op, ast.Invert):
            self.fail(node, "the operator ~ is not allowed")
        operand = self.translate(node.operand)
        if isinstance(node.op, ast.Not):
            if operand.kind != "boolean":
                self.fail(
                    operand.source,
                    f"not needs true/false; {self.describe(operand)}",
                    self.compare_hint(operand),
                )
            return Typed(ast.UnaryOp(op=ast.Not(), operand=operand.node), "boolean", False, node)
        sign = "-" if isinstance(node.op, ast.USub) else "+"
        self.need_number(operand, sign)
        if operand.const:
            assert isinstance(operand.value, int | float)
            value = -operand.value if sign == "-" else operand.value
            return Typed(ast.Constant(value), "number", False, node, const=True, value=value)
        return self.guarded(
            [operand], lambda refs: ast.UnaryOp(op=type(node.op)(), operand=refs[0]), node
        )

    def arithmetic(self, node: ast.BinOp) -> Typed:
        op_type = type(node.op)
        symbol = _SYMBOLS.get(op_type, "?")
        if op_type not in _ARITHMETIC:
            at = self.prepared.text.find(
                symbol, self.prepared.char(node.left.end_lineno, node.left.end_col_offset)
            )
            self.fail(
                self.prepared.to_original(at) if at >= 0 else self.pos(node),
                f"the operator {symbol} is not allowed",
            )
        left, right = self.translate(node.left), self.translate(node.right)
        self.need_number(left, symbol)
        self.need_number(right, symbol)
        dividing = isinstance(node.op, _DIVIDING)
        if right.const and dividing and right.value == 0:
            self.fail(right.source, "division by zero")
        if left.const and right.const:
            assert isinstance(left.value, int | float)
            assert isinstance(right.value, int | float)
            try:
                value = _ARITHMETIC[op_type](left.value, right.value)
            except OverflowError:
                self.fail(node, "number too large")
            return Typed(ast.Constant(value), "number", False, node, const=True, value=value)
        return self.guarded(
            [left, right],
            lambda refs: ast.BinOp(left=refs[0], op=op_type(), right=refs[1]),
            node,
            zero_check=dividing and not right.const,
        )

    # -- comparisons --------------------------------------------------------------------------

    def compare(self, node: ast.Compare) -> Typed:
        sources = [node.left, *node.comparators]
        operands: list[Typed] = []
        for i, src in enumerate(sources):
            try:
                if isinstance(src, ast.List | ast.Tuple):
                    if i == 0 or not isinstance(node.ops[i - 1], ast.In | ast.NotIn):
                        self.fail(
                            src, "a list can only follow in or not in", "e.g. event.xid in [48, 79]"
                        )
                    operands.append(self.list_literal(src))
                else:
                    operands.append(self.translate(src))
            except ExprError as exc:
                raise self._quote_hint(exc, sources, operands) from None
        guard = [False] * len(operands)
        for i, op in enumerate(node.ops):
            operands[i], operands[i + 1] = self.check_pair(op, operands[i], operands[i + 1])
            if not isinstance(op, _UNGUARDED):
                for j in (i, i + 1):
                    guard[j] = guard[j] or (operands[j].nullable and not operands[j].const)
        if len(node.ops) == 1 and not any(guard):
            body: ast.expr = ast.Compare(
                left=operands[0].node, ops=[type(node.ops[0])()], comparators=[operands[1].node]
            )
            return Typed(body, "boolean", False, node)
        parts: list[ast.expr] = []
        names: dict[int, str] = {}  # operand index -> its temporary, once stored

        def ref(j: int) -> ast.expr:
            """The operand itself, its temporary being stored, or the stored temporary (middle
            operands of a chain are read once, like Python does)."""
            t = operands[j]
            if t.const or not (guard[j] or 0 < j < len(operands) - 1):
                return t.node
            if j in names:
                return load(names[j])
            names[j] = self.temp()
            return store(names[j], t.node)

        for i, op in enumerate(node.ops):
            for j in (i, i + 1):
                if guard[j] and j not in names:
                    parts.append(is_none(ref(j), negate=True))
            left = ref(i)
            parts.append(ast.Compare(left=left, ops=[type(op)()], comparators=[ref(i + 1)]))
        body = parts[0] if len(parts) == 1 else ast.BoolOp(op=ast.And(), values=parts)
        return Typed(body, "boolean", False, node)

    def _quote_hint(self, exc: ExprError, sources: list[ast.expr], done: list[Typed]) -> ExprError:
        """An unknown bare name compared with a string field is a string without quotes:
        ``process.user == bob`` means ``process.user == "bob"``. Say so."""
        if not exc.message.startswith("unknown name "):
            return exc
        name = exc.message.removeprefix("unknown name ")
        strings = [t for t in done if t.kind == "string" or t.elem == "string"]
        for src in sources[len(done) + 1 :]:
            if isinstance(src, ast.Attribute):
                try:
                    typed = self.translate(src)
                except ExprError:
                    continue
                if typed.kind == "string" or typed.elem == "string":
                    strings.append(typed)
        if not strings:
            return exc
        field = self.text_of(strings[0].source)
        return ExprError(
            exc.message,
            exc.offset,
            f'{field} is a string: write "{name}" in quotes',
        )

    def check_pair(self, op: ast.cmpop, a: Typed, b: Typed) -> tuple[Typed, Typed]:
        if isinstance(op, ast.Is | ast.IsNot):
            if "none" not in (a.kind, b.kind):
                self.fail(
                    b.source,
                    "is / is not can only test for null: write x is None",
                    "to compare values, use == or !=",
                )
            return a, b
        if isinstance(op, ast.In | ast.NotIn):
            return self.check_in(a, b)
        a, b = self.priority_pair(a, b)
        self.check_choice(a, b)
        self.check_choice(b, a)
        if isinstance(op, ast.Eq | ast.NotEq):
            if a.kind != b.kind and "none" not in (a.kind, b.kind):
                self.mismatch(a, b)
            return a, b
        symbol = _SYMBOLS[type(op)]
        for t in (a, b):
            if t.kind == "none":
                self.fail(
                    t.source,
                    f"cannot order against null with {symbol}",
                    "to test for an unknown value, write x == None",
                )
            if t.kind in ("boolean", "list"):
                self.fail(t.source, f"{self.describe(t)}; it cannot be ordered with {symbol}")
        if a.kind != b.kind:
            if "priority" in (a.kind, b.kind):
                prio, other = (a, b) if a.kind == "priority" else (b, a)
                self.fail(
                    other.source,
                    f"{self.text_of(prio.source)} compares with a priority class, "
                    f"not {KIND_NAMES[other.kind]}",
                    f"e.g. {self.text_of(prio.source)} <= {self.example_class()}",
                )
            self.mismatch(a, b)
        return a, b

    def mismatch(self, a: Typed, b: Typed) -> NoReturn:
        left, right = self.describe(a, paren=True), self.describe(b, paren=True)
        self.fail(a.source, f"cannot compare {left} with {right}")

    def check_in(self, a: Typed, b: Typed) -> tuple[Typed, Typed]:
        if b.kind == "list" and b.const:
            assert isinstance(b.value, tuple)
            items: tuple[Typed, ...] = b.value
            if a.kind == "priority":
                items = tuple(self.rank_const(t) if t.kind == "string" else t for t in items)
            kinds = {t.kind for t in items}
            if len(kinds) > 1:
                self.fail(
                    b.source, "a list must hold values of one kind (all numbers or all strings)"
                )
            elem = kinds.pop() if kinds else None
            if elem is not None and elem != a.kind:
                self.fail(
                    a.source,
                    f"{self.describe(a)}, but the list after in holds {PLURALS[elem]}",
                )
            for t in items:
                self.check_choice(a, t)
            values = frozenset(t.value for t in items)
            node = ast.Constant(values)  # type: ignore[arg-type]  # compile() takes frozensets
            return a, replace(b, node=node, value=items, elem=elem)
        if b.kind == "list":
            if a.kind != "string":
                self.fail(a.source, f"{self.text_of(b.source)} holds strings; {self.describe(a)}")
            self.check_choice(b, a)
            return a, b
        if b.kind == "string":
            if a.kind != "string":
                self.fail(a.source, f"in a string, look for a string; {self.describe(a)}")
            return a, b
        self.fail(
            b.source,
            f"in needs a list or a string after it; {self.describe(b)}",
            'e.g. event.xid in [48, 79] or "hw_slowdown" in gpu.throttle',
        )

    def list_literal(self, node: ast.List | ast.Tuple) -> Typed:
        items: list[Typed] = []
        for elt in node.elts:
            if isinstance(elt, ast.List | ast.Tuple):
                self.fail(elt, "a list cannot hold another list")
            t = self.translate(elt)
            if not t.const or t.kind not in ("number", "string", "priority"):
                self.fail(elt, "a list may only hold numbers, strings or priority class names")
            items.append(t)
        return Typed(ast.Constant(None), "list", False, node, const=True, value=tuple(items))
