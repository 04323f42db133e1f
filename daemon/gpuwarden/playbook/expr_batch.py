"""One expression over every scope of a tick in one call: the form the engine evaluates ``when``
and records history series in.

``Compiled.test`` evaluates an expression in one scope's environment dict (``eval`` with the
dict as its locals: a dict lookup for every name). A tick evaluates each rule over every scope
of its kind, so the compiler also wraps the same checked tree in a function whose names are
fast locals and which loops over the scopes itself:

    def _holding(_rows, host, time, _now, _gpu_procs):
        return [_i for _i, (gpu, process, event, _h) in _enumerate(_rows) if (<tree>) is True]

``_rows`` holds one ``(gpu, process, event, _h)`` row per scope (``Row``); the other names are
those of the tick's shared environment (``views.tick_env``). The tree is the one ``test`` runs
(the walrus temporaries become the function's locals), so a row holds exactly when ``test``
would be true in that scope's environment. A row whose evaluation raises one of the errors that
``test`` turns into false is evaluated again on its own (``holding_rows``), so one bad value
does not decide the others. Nothing from the person's text reaches the code except constants,
as in ``expr``.
"""

from __future__ import annotations

import ast
import copy
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["BatchFn", "Row", "batch_globals", "holding_function", "values_function"]

Row = tuple[Any, Any, Any, Any]  # (gpu, process, event, _h) of one scope
# (rows, host, time, _now, _gpu_procs) -> indexes of the rows that hold / a value per row
BatchFn = Callable[[Sequence[Row], Any, Any, float, Any], list[Any]]

_PARAMS = "_rows, host, time, _now, _gpu_procs"
_HOLDING = f"""
def _holding({_PARAMS}):
    return [_i for _i, (gpu, process, event, _h) in _enumerate(_rows) if _BODY is True]
"""
_VALUES = f"""
def _values({_PARAMS}):
    return [_BODY for gpu, process, event, _h in _rows]
"""


class _Insert(ast.NodeTransformer):
    def __init__(self, body: ast.expr) -> None:
        self.body = body

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return self.body if node.id == "_BODY" else node


def _function(template: str, body: ast.expr, helpers: dict[str, object]) -> BatchFn:
    module = ast.parse(template)
    module = _Insert(copy.deepcopy(body)).visit(module)
    ast.fix_missing_locations(module)
    for child in ast.walk(module):  # one position for all, as expr._code does
        if "lineno" in child._attributes:
            for name, value in (("lineno", 2), ("col_offset", 0), ("end_lineno", 2)):
                setattr(child, name, value)
            setattr(child, "end_col_offset", 0)  # noqa: B010
    with warnings.catch_warnings():  # e.g. "'x' is None": checked, harmless
        warnings.simplefilter("ignore")
        code = compile(module, "<playbook expression>", "exec", dont_inherit=True)
    function_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    fn: BatchFn = types.FunctionType(function_code, helpers)
    return fn


def batch_globals(helpers: dict[str, object]) -> dict[str, object]:
    """The globals of batch functions: the expression helpers (no builtins) and
    ``_enumerate`` (a reserved name: expressions cannot write it)."""
    return {**helpers, "_enumerate": enumerate}


def holding_function(body: ast.expr, helpers: dict[str, object]) -> BatchFn:
    """The indexes of the rows where the condition ``body`` is True (``helpers``: from
    ``batch_globals``)."""
    return _function(_HOLDING, body, helpers)


def values_function(body: ast.expr, helpers: dict[str, object]) -> BatchFn:
    """The value of ``body`` in each row."""
    return _function(_VALUES, body, helpers)
