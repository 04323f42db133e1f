"""YAML files with positions: every value knows its file:line:col, duplicate keys are errors.

PyYAML keeps the last of two equal keys without a word and forgets positions once it has built
Python objects. Here the document is composed into nodes first, walked to record where every
key path starts, checked for duplicate keys, and only then constructed. ``validate`` runs a
pydantic model over the data and maps each validation error back to a position.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from gpuwarden.errors import InputError, Problem

KeyPath = tuple[str | int, ...]
M = TypeVar("M", bound=pydantic.BaseModel)


@dataclass(frozen=True)
class Located:
    """A constructed YAML document and where each of its key paths starts (1-based)."""

    file: str
    data: Any
    values: dict[KeyPath, tuple[int, int]]
    keys: dict[KeyPath, tuple[int, int]]
    styles: dict[KeyPath, str | None] = field(default_factory=dict)

    def where(self, path: KeyPath, *, key: bool = False) -> tuple[int | None, int | None]:
        """The position of the longest prefix of ``path`` that exists in the file."""
        table = self.keys if key else self.values
        for end in range(len(path), -1, -1):
            prefix = path[:end]
            if prefix in table:
                return table[prefix]
            if key and prefix in self.values:
                return self.values[prefix]
        return (None, None)

    def inside(self, path: KeyPath, offset: int) -> tuple[int | None, int | None]:
        """The position of character ``offset`` of the string value at ``path``.

        Exact for plain and quoted scalars on one line; a block scalar (``|``, ``>``) points
        at its indicator.
        """
        line, col = self.where(path)
        if line is None or col is None or path not in self.values:
            return (line, col)
        style = self.styles.get(path)
        if style in ("|", ">"):
            return (line, col)
        return (line, col + offset + (1 if style in ("'", '"') else 0))

    def problem(
        self,
        path: KeyPath,
        message: str,
        expected: str | None = None,
        hint: str | None = None,
        *,
        key: bool = False,
    ) -> Problem:
        line, col = self.where(path, key=key)
        return Problem(self.file, line, col, message, expected, hint)

    def error(
        self,
        path: KeyPath,
        message: str,
        expected: str | None = None,
        hint: str | None = None,
        *,
        key: bool = False,
    ) -> InputError:
        return InputError([self.problem(path, message, expected, hint, key=key)])


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _walk(
    node: yaml.Node,
    path: KeyPath,
    located: Located,
    problems: list[Problem],
    file: str,
) -> None:
    values, keys = located.values, located.keys
    values[path] = _mark(node)
    if isinstance(node, yaml.ScalarNode):
        located.styles[path] = node.style
    if isinstance(node, yaml.MappingNode):
        seen: dict[Hashable, tuple[int, int]] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                line, col = _mark(key_node)
                problems.append(Problem(file, line, col, "a key must be a plain value"))
                continue
            key: str | int = key_node.value
            if key_node.tag.endswith(":int"):
                try:
                    key = int(key_node.value)
                except ValueError:
                    key = key_node.value
            if key == "<<":
                line, col = _mark(key_node)
                problems.append(
                    Problem(file, line, col, "merge keys (<<) are not supported", "plain keys")
                )
                continue
            if key in seen:
                line, col = _mark(key_node)
                first = seen[key]
                problems.append(
                    Problem(
                        file,
                        line,
                        col,
                        f"duplicate key {key!r} (first at line {first[0]})",
                        "each key once per mapping",
                        "YAML would silently keep only the last one; remove or merge them",
                    )
                )
                continue
            seen[key] = _mark(key_node)
            keys[(*path, key)] = _mark(key_node)
            _walk(value_node, (*path, key), located, problems, file)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            keys[(*path, index)] = _mark(item)
            _walk(item, (*path, index), located, problems, file)


def parse(text: str, file: str) -> Located:
    """Parse one YAML document from ``text``; ``file`` names it in errors."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise InputError.at(file, 1, 1, "the file is empty", "a YAML mapping")
        shape = Located(file, None, {}, {})
        problems: list[Problem] = []
        _walk(node, (), shape, problems, file)
        if problems:
            raise InputError(problems)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        col = mark.column + 1 if mark else None
        what = exc.problem or exc.context or "malformed YAML"
        raise InputError.at(file, line, col, f"YAML syntax error: {what}") from None
    except yaml.YAMLError as exc:
        raise InputError.at(file, None, None, f"YAML error: {exc}") from None
    finally:
        loader.dispose()
    return Located(file, data, shape.values, shape.keys, shape.styles)


def load(path: str | Path) -> Located:
    """Read and parse a YAML file; a missing or unreadable file is an ``InputError``."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError.at(name, None, None, "no such file") from None
    except IsADirectoryError:
        raise InputError.at(name, None, None, "is a directory", "a YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError.at(name, None, None, f"cannot read the file: {reason}") from None
    return parse(text, name)


def _describe(error: Any) -> tuple[str, str | None]:
    kind = error["type"]
    msg = str(error["msg"])
    if kind == "missing":
        return ("missing required field", None)
    if kind == "extra_forbidden":
        return ("unknown field", None)
    if kind in ("value_error", "assertion_error"):
        msg = msg.split(", ", 1)[1] if ", " in msg else msg
        return (msg, None)
    got = error.get("input")
    shown = repr(got)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return (f"{msg[0].lower()}{msg[1:]} (got {shown})", None)


def validate(model: type[M], located: Located, path: KeyPath = ()) -> M:
    """Validate ``located.data`` (or the part at ``path``) with a pydantic model.

    Each validation error becomes a Problem at the position of the value it is about; a
    missing field points at the mapping it is missing from, an unknown field at its key.
    """
    data = located.data
    for part in path:
        data = data[part]
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        problems: list[Problem] = []
        for error in exc.errors(include_url=False):
            loc = tuple(p for p in error["loc"] if isinstance(p, str | int))
            full = (*path, *loc)
            message, expected = _describe(error)
            field = ".".join(str(p) for p in full) if full else "document"
            if error["type"] == "missing":
                problems.append(located.problem(full[:-1], f"{field}: {message}", expected))
            elif error["type"] == "extra_forbidden":
                problems.append(located.problem(full, f"{field}: {message}", expected, key=True))
            else:
                problems.append(located.problem(full, f"{field}: {message}", expected))
        raise InputError(problems) from None
