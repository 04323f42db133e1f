"""Function calls in expressions: ``abs`` and the history functions.

A history call registers a *series* (a numeric field, or for ``held_for`` a condition) that the
engine records every tick for each scope of the series' root, and compiles to a method call on
``_h``, the history of the scope being evaluated: ``avg(gpu.power_w, 5m)`` becomes
``_h.avg(<series id>, 300.0)``.
"""

from __future__ import annotations

import ast

from gpuwarden.playbook.expr_base import KIND_NAMES, Typed, accessor_node, load, store
from gpuwarden.playbook.expr_names import RESERVED, NamesTranslator, suggest_value
from gpuwarden.playbook.fields import FUNCTIONS, Field

HISTORY_ROOTS = ("process", "gpu", "host")  # most specific first
DEFAULT_PREDICT_WINDOW = 300.0
_WINDOWED = frozenset({"avg", "min", "max", "rate"})


class CallsTranslator(NamesTranslator):
    def call(self, node: ast.Call) -> Typed:
        func = node.func
        if isinstance(func, ast.Attribute):
            self.dotted(func)
        if not isinstance(func, ast.Name):
            self.fail(
                func,
                "only the documented functions can be called",
                f"functions: {', '.join(FUNCTIONS)}",
            )
        name = func.id
        if name.startswith("_"):
            self.fail(func, f"{name} is not allowed: {RESERVED}")
        if name not in FUNCTIONS:
            self.fail(
                func,
                f"{name}() is not a function here",
                suggest_value(name, list(FUNCTIONS), "functions"),
            )
        signature = FUNCTIONS[name].signature
        if node.keywords:
            self.fail(node.keywords[0], "keyword arguments are not allowed", f"write {signature}")
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                self.fail(arg, "starred arguments (*x) are not allowed")
        counts = {"abs": (1,), "held_for": (1,), "predict": (2, 3)}.get(name, (2,))
        if len(node.args) not in counts:
            wanted = " or ".join(str(c) for c in counts)
            self.fail(
                node, f"{name}() takes {wanted} argument{'s' * (counts[-1] > 1)}: {signature}"
            )
        if name == "abs":
            return self.absolute(node)
        if self.in_history:
            self.fail(node, f"{name}() cannot be used inside held_for()")
        if name == "held_for":
            return self.held_for(node)
        return self.windowed(name, node)

    def absolute(self, node: ast.Call) -> Typed:
        t = self.translate(node.args[0])
        self.need_number(t, "abs()")
        if t.const:
            assert isinstance(t.value, int | float)
            value = abs(t.value)
            return Typed(ast.Constant(value), "number", False, node, const=True, value=value)
        name = self.temp()
        if t.nullable:
            first: ast.expr = load(name)
            test: ast.expr = ast.Compare(
                left=load(name), ops=[ast.GtE()], comparators=[ast.Constant(0)]
            )
        else:
            first = load(name)
            test = ast.Compare(
                left=store(name, t.node), ops=[ast.GtE()], comparators=[ast.Constant(0)]
            )
        result: ast.expr = ast.IfExp(
            test=test, body=first, orelse=ast.UnaryOp(op=ast.USub(), operand=load(name))
        )
        if t.nullable:
            none = ast.Compare(
                left=store(name, t.node), ops=[ast.Is()], comparators=[ast.Constant(None)]
            )
            result = ast.IfExp(test=none, body=ast.Constant(None), orelse=result)
        return Typed(result, "number", t.nullable, node)

    def windowed(self, name: str, node: ast.Call) -> Typed:
        field = self.history_field(name, node.args[0])
        args: list[float] = []
        if name in _WINDOWED:
            window = self.duration(name, node.args[1], "window", zero_ok=False)
            args.append(window)
        else:
            args.append(self.duration(name, node.args[1], "horizon", zero_ok=True))
            window = (
                self.duration(name, node.args[2], "window", zero_ok=False)
                if len(node.args) == 3
                else DEFAULT_PREDICT_WINDOW
            )
            args.append(window)
        sid = self.register(field.root, "value", field.path, accessor_node(field), window)
        self.series.append(sid)
        return Typed(self.history_call(name, sid, args), "number", True, node)

    def history_call(self, name: str, sid: int, args: list[float]) -> ast.expr:
        return ast.Call(
            func=ast.Attribute(value=load("_h"), attr=name, ctx=ast.Load()),
            args=[ast.Constant(sid), *(ast.Constant(a) for a in args)],
            keywords=[],
        )

    def history_field(self, name: str, arg: ast.expr) -> Field:
        if not isinstance(arg, ast.Attribute):
            self.fail(
                arg,
                f"the first argument of {name}() must be a field",
                f"e.g. {name}(gpu.memory.used_pct, 5m)",
            )
        t = self.attribute(arg)
        field = t.field
        assert field is not None
        if not field.numeric:
            self.fail(arg, f"{name}() needs a numeric field; {field.path} is {KIND_NAMES[t.kind]}")
        if field.root not in HISTORY_ROOTS:
            self.fail(arg, f"{name}() keeps history of gpu.*, process.* and host.* fields only")
        return field

    def duration(self, name: str, arg: ast.expr, what: str, *, zero_ok: bool) -> float:
        value = self.finite(self.translate(arg))
        if value is None:
            self.fail(arg, f"the {what} of {name}() must be a constant duration such as 5m")
        if value < 0 or (value == 0 and not zero_ok):
            self.fail(
                arg, f"the {what} of {name}() must be {'0 or more' if zero_ok else 'more than 0'}"
            )
        return value

    def held_for(self, node: ast.Call) -> Typed:
        arg = node.args[0]
        outer = self.roots
        self.roots = set()
        self.in_history = True
        try:
            inner = self.translate(arg)
        finally:
            self.in_history = False
            inner_roots = self.roots
            self.roots = outer | inner_roots
        if inner.kind != "boolean":
            self.fail(
                arg,
                f"held_for() needs a condition (true/false); {self.describe(inner)}",
                self.compare_hint(inner),
            )
        if "event" in inner_roots:
            self.fail(arg, "held_for() cannot watch event.* fields: events have no history")
        root = next((r for r in HISTORY_ROOTS if r in inner_roots), "host")
        sid = self.register(root, "held", ast.unparse(arg), inner.node, 0.0)
        self.series.append(sid)
        return Typed(self.history_call("held_for", sid, []), "number", False, node)
