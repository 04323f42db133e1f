"""The lines a condition draws: which fields it reads and the numbers it compares them with.

``gpu.memory.used_pct >= 95`` compares one field with one number; a report draws that number
as a line on the field's chart. ``thresholds`` finds every such comparison in a ``when`` or
``until`` text: a field (or ``avg``/``min``/``max``/``predict`` of a field, which read in the
field's own unit) on one side, a number on the other. ``rate(...)`` (a unit per second),
arithmetic and comparisons between two fields draw nothing. ``fields_read`` names every
documented field a condition mentions, so a report can draw the curves the rule reads even
where it compares them with nothing it can draw.

Works on the text as people wrote it (durations such as ``10m`` included); a text that does not
parse gives no thresholds rather than an error (the loader has already checked it).
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass

from gpuwarden.playbook.expr_text import ExprError, Prepared, prepare
from gpuwarden.playbook.fields import FIELDS, ROOTS

# Functions whose result is in the unit of the field they read.
SAME_UNIT = frozenset({"avg", "min", "max", "predict"})
# op as written -> the op with the sides swapped (``95 <= x`` is ``x >= 95``)
_MIRROR = {">=": "<=", "<=": ">=", ">": "<", "<": ">", "==": "==", "!=": "!="}
_OPS: dict[type[ast.cmpop], str] = {
    ast.GtE: ">=",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.Lt: "<",
    ast.Eq: "==",
    ast.NotEq: "!=",
}


@dataclass(frozen=True)
class Threshold:
    """``field op value``, as ``text`` (the comparison as written, e.g.
    ``predict(gpu.memory.used_pct, 10m) >= 100``); ``via`` is the history function the field
    is read through (``predict``), or ``""`` for the field itself."""

    field: str
    op: str
    value: float
    text: str
    via: str = ""


def _path(node: ast.expr) -> str | None:
    """``gpu.memory.used_pct`` for an attribute chain from a root; None otherwise."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in ROOTS or not parts:
        return None
    return ".".join([node.id, *reversed(parts)])


def _number(node: ast.expr) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _number(node.operand)
        if inner is None:
            return None
        return -inner if isinstance(node.op, ast.USub) else inner
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _measured(node: ast.expr) -> tuple[str, str] | None:
    """(field, via) for a field, or a same-unit history function of one."""
    path = _path(node)
    if path is not None:
        return (path, "") if path in FIELDS and FIELDS[path].numeric else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in SAME_UNIT
        and node.args
    ):
        inner = _path(node.args[0])
        if inner is not None and inner in FIELDS and FIELDS[inner].numeric:
            return inner, node.func.id
    return None


def _tree(text: str) -> tuple[ast.expr, Prepared] | None:
    """The parsed tree and the prepared text it was parsed from."""
    try:
        prepared = prepare(text)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(prepared.text, mode="eval")
    except (ExprError, SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return tree.body, prepared


def _span(node: ast.expr, last: ast.expr, prepared: Prepared) -> tuple[int, int]:
    """Where ``node`` .. ``last`` stand in the original text (character offsets)."""
    data = prepared.text.encode()
    end = last.end_col_offset if last.end_col_offset is not None else len(data)
    start = len(data[: node.col_offset].decode(errors="ignore"))
    stop = len(data[:end].decode(errors="ignore"))
    return prepared.to_original(start), prepared.to_original(stop)


def thresholds(text: str | None) -> list[Threshold]:
    """Every field-versus-number comparison in ``text``, in the order written."""
    if not text:
        return []
    parsed = _tree(text)
    if parsed is None:
        return []
    body, prepared = parsed
    found: list[tuple[int, Threshold]] = []
    for node in ast.walk(body):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for i, op_node in enumerate(node.ops):
            op = _OPS.get(type(op_node))
            if op is None:
                continue
            left, right = sides[i], sides[i + 1]
            measured, value = _measured(left), _number(right)
            if measured is None or value is None:
                measured, value, op = _measured(right), _number(left), _MIRROR[op]
            if measured is None or value is None:
                continue
            start, stop = _span(left, right, prepared)
            written = " ".join(text[start:stop].split())
            found.append((start, Threshold(measured[0], op, value, written, measured[1])))
    return [t for _, t in sorted(found, key=lambda pair: pair[0])]


def fields_read(text: str | None) -> list[str]:
    """The documented fields ``text`` mentions, in the order written, each once."""
    if not text:
        return []
    parsed = _tree(text)
    if parsed is None:
        return []
    body = parsed[0]
    seen: dict[str, int] = {}
    for node in ast.walk(body):
        if not isinstance(node, ast.Attribute):
            continue
        path = _path(node)
        if path is not None and path in FIELDS and path not in seen:
            seen[path] = node.col_offset
    return sorted(seen, key=lambda p: seen[p])
