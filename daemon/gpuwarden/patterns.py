"""Regular expressions from the config, run against text that job owners choose.

The config's match rules and protections hold regexes (``cmdline``, ``cgroup``, ``unit``,
``exe``); the text they run against (a command line, a cgroup path) is chosen by whoever
started the process. Python's ``re`` backtracks: a pattern with nested quantifiers such as
``^(\\w+\\s?)+--prod$`` takes exponential time on a crafted 32-character command line. So:

- the text is cut to ``TEXT_LIMIT`` characters before any pattern sees it;
- when google-re2 is installed (``pip install 'gpuwarden[re2]'``) every pattern RE2 can express
  runs on RE2, whose time is linear in the text; the others (back-references, look-around)
  stay on ``re``. With RE2, ``\\w``, ``\\d``, ``\\s`` and ``\\b`` are ASCII-only;
- ``nested_quantifier`` finds the shape that backtracks exponentially, for ``gpuwarden check``
  to warn about.

Pure: no I/O.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Final, Literal

TEXT_LIMIT: Final = 4096  # characters of a text a config pattern is matched against

Engine = Literal["re2", "re"]


@functools.cache
def _re2_module() -> Any | None:
    """google-re2, imported at the first pattern (it maps ~2.5 MiB of C++ into the process:
    a config without regexes never pays it), or None when the extra is not installed."""
    try:  # the optional linear-time engine
        import re2
    except ImportError:  # pragma: no cover - depends on the installed extras
        return None
    return re2


def re2_available() -> bool:
    """Whether google-re2 is installed (the ``re2`` extra)."""
    return _re2_module() is not None


def _re2_compile(source: str) -> Any | None:
    """RE2's compiled form of ``source``, or None when RE2 is missing or cannot express it."""
    re2 = _re2_module()
    if re2 is None:
        return None
    options = re2.Options()
    options.log_errors = False  # an unsupported pattern is expected, not an error to print
    try:
        return re2.compile(source, options=options)
    except Exception:  # re2.error: back-references, look-around, ...
        return None


class Pattern:
    """One config regex, compiled once. ``search`` and ``fullmatch`` take at most
    ``TEXT_LIMIT`` characters of the text; ``engine`` says which engine runs it."""

    __slots__ = ("_compiled", "engine", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        compiled = _re2_compile(source)
        self.engine: Engine = "re2" if compiled is not None else "re"
        self._compiled: Any = compiled if compiled is not None else re.compile(source)

    def search(self, text: str) -> bool:
        return self._compiled.search(text[:TEXT_LIMIT]) is not None

    def fullmatch(self, text: str) -> bool:
        return self._compiled.fullmatch(text[:TEXT_LIMIT]) is not None

    def __repr__(self) -> str:
        return f"Pattern({self.source!r}, engine={self.engine!r})"


def compile_pattern(source: str) -> Pattern:
    """A config regex, ready to run; raises ``re.error`` when ``re`` cannot compile it."""
    re.compile(source)  # the syntax the config documents is Python's
    return Pattern(source)


# -- nested quantifiers -------------------------------------------------------------------------

_REPEATS: Final = ("MAX_REPEAT", "MIN_REPEAT")  # the backtracking ones (not possessive)
_MAXREPEAT: Final = 2**32 - 1  # re's "no upper bound" (sre_constants.MAXREPEAT)


def nested_quantifier(source: str) -> bool:
    """Whether ``source`` repeats a group that holds another quantifier (``(\\w+\\s?)+``,
    ``(a*)*``): such a group can match one text in exponentially many ways, and ``re`` tries
    them all before it fails. False too when the pattern does not parse."""
    try:
        from re import _parser  # type: ignore[attr-defined]

        tree = _parser.parse(source)
    except Exception:  # an invalid pattern, or a Python whose parser moved
        return False
    return _nested(tree)


def _nested(tree: Any) -> bool:
    for op, av in _items(tree):
        name = str(op)
        if name in _REPEATS and av[1] > 1 and _has_repeat(av[2], unbounded=av[1] < _MAXREPEAT):
            return True
        if any(_nested(child) for child in _children(name, av)):
            return True
    return False


def _has_repeat(tree: Any, *, unbounded: bool) -> bool:
    """Whether ``tree`` holds a backtracking quantifier (an unbounded one if ``unbounded``).
    Atomic groups and possessive quantifiers give nothing back, so they do not count."""
    for op, av in _items(tree):
        name = str(op)
        if name in _REPEATS and av[1] >= (_MAXREPEAT if unbounded else 2):
            return True
        if name in ("ATOMIC_GROUP", "POSSESSIVE_REPEAT"):
            continue
        if any(_has_repeat(child, unbounded=unbounded) for child in _children(name, av)):
            return True
    return False


def _items(tree: Any) -> list[tuple[Any, Any]]:
    return list(getattr(tree, "data", tree))


def _children(name: str, av: Any) -> list[Any]:
    if name in (*_REPEATS, "POSSESSIVE_REPEAT"):
        return [av[2]]
    if name == "SUBPATTERN":
        return [av[3]]
    if name == "BRANCH":
        return list(av[1])
    if name in ("ASSERT", "ASSERT_NOT"):
        return [av[1]]
    if name == "ATOMIC_GROUP":
        return [av]
    if name == "GROUPREF_EXISTS":
        return [branch for branch in av[1:] if branch is not None]
    return []
