"""Property tests: no text makes ``compile`` raise anything but ExprError (with an offset inside
the text), and nothing it compiles raises when evaluated, with or without history."""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.engine.history import History
from gpuwarden.playbook.expr import Compiler, ExprError
from gpuwarden.playbook.fields import FIELDS
from tests.playbook_envs import ALL_ROOTS, CLASSES, NOW, XID79, env

VOCABULARY = [
    *FIELDS,
    *CLASSES,
    "avg(",
    "min(",
    "max(",
    "rate(",
    "predict(",
    "held_for(",
    "abs(",
    "(",
    ")",
    "[",
    "]",
    ",",
    ".",
    "and",
    "or",
    "not",
    "in",
    "is",
    "None",
    "true",
    "false",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "//",
    "%",
    "**",
    "5m",
    "1h30m",
    "500ms",
    "0",
    "95",
    "0.5",
    "-1",
    "'xid'",
    '"low"',
    "'hw_slowdown'",
    "_t1",
    "__class__",
    "gpu",
    "process",
    "x",
    "lambda",
    ":",
    "if",
    "else",
    ":=",
    "'",
    '"',
    "\\",
    "\n",
    "é",
    "{",
    "}",
    "@",
    "`",
]


def _scopes(compiler: Compiler) -> list[dict[str, object]]:
    history = History()
    scopes = [
        env("hot", "trainer", event=XID79),
        env("unknown", "ghost", event=XID79),
        env("lost", "ghost"),
        env(None, "trainer"),
    ]
    for t in (NOW - 120, NOW - 60, NOW):
        for scope in scopes:
            for series in compiler.series:
                history.observe("scope", series, scope, t)
    for scope in scopes:
        scope["_h"] = history.view("scope", NOW)
    return scopes


def _check(text: str) -> None:
    compiler = Compiler(CLASSES)
    error: ExprError | None = None
    try:
        compiled = compiler.compile(text, roots=ALL_ROOTS)
    except ExprError as exc:
        error = exc
    if error is not None:
        assert 0 <= error.offset <= len(text)
        assert error.message
        return
    for scope in _scopes(compiler):
        assert compiled.test(scope) in (True, False)
        compiled.evaluate(scope)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
def test_random_text_only_raises_expr_error(text: str) -> None:
    _check(text)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=string.printable, max_size=60))
def test_random_printable_text_only_raises_expr_error(text: str) -> None:
    _check(text)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(VOCABULARY), max_size=14))
def test_random_token_soup_compiles_or_explains_and_never_raises_when_run(
    tokens: list[str],
) -> None:
    _check(" ".join(tokens))
