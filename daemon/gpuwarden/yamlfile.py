"""YAML files with positions: every value knows its file:line:col, duplicate keys are errors.

PyYAML keeps the last of two equal keys without a word and forgets positions once it has built
Python objects. Here the document is composed into nodes first, walked to record where every
key path starts, checked for duplicate keys, and only then constructed. ``validate`` runs a
pydantic model over the data and maps each validation error back to a position.

The text is scanned and parsed by libyaml where PyYAML was built with it (about three times
faster than PyYAML's own parser on a day's scenario); its events carry the same marks. The
nodes are composed by PyYAML's own composer either way, so a document nested too deeply
still stops with a ``RecursionError`` (reported below) rather than exhausting the C stack. A
document libyaml refuses is parsed again by PyYAML's parser, so every syntax error reads and
points where it always has; so is a text with a tab or a byte order mark, where the two
parsers differ.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from gpuwarden.errors import InputError, Problem, in_file_order
from gpuwarden.yamlfile_keys import unknown_key

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
    # Each scalar's source text as written: quotes, escapes, block header, line breaks.
    sources: dict[KeyPath, str] = field(default_factory=dict)

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

        Exact for plain, quoted and block scalars, on one line or folded over several.
        """
        line, col = self.where(path)
        if line is None or col is None or path not in self.values:
            return (line, col)
        raw = self.sources.get(path)
        value = self._value(path)
        if raw is None or not isinstance(value, str):
            return (line, col)
        index = _source_index(raw, self.styles.get(path), value, offset)
        if index is None:
            return (line, col)
        before = raw[:index]
        breaks = before.count("\n")
        if not breaks:
            return (line, col + index)
        return (line + breaks, index - before.rfind("\n"))

    def _value(self, path: KeyPath) -> object:
        data: Any = self.data
        try:
            for part in path:
                data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
        return data

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


def _source_chars(raw: str, style: str | None) -> list[tuple[int, int, str]]:
    """The characters of a scalar's value as ``(start, end, char)`` spans of its source
    text: quotes and a block header skipped, ``''`` and backslash escapes decoded."""
    chars: list[tuple[int, int, str]] = []
    i, stop = 0, len(raw)
    if style in ("|", ">"):
        i = raw.find("\n") + 1 if "\n" in raw else stop
    elif style in ("'", '"'):
        i, stop = 1, max(1, len(raw) - 1)
    escapes = yaml.scanner.Scanner.ESCAPE_REPLACEMENTS
    codes = yaml.scanner.Scanner.ESCAPE_CODES
    while i < stop:
        ch = raw[i]
        if style == "'" and raw.startswith("''", i):
            chars.append((i, i + 2, "'"))
            i += 2
        elif style == '"' and ch == "\\" and i + 1 < stop:
            code = raw[i + 1]
            if code in escapes:
                chars.append((i, i + 2, escapes[code]))
                i += 2
            elif code in codes:
                end = i + 2 + codes[code]  # the parser has checked the hex digits
                chars.append((i, end, chr(int(raw[i + 2 : end], 16))))
                i = end
            else:  # an escaped line break joins the lines
                i += 2
        else:
            chars.append((i, i + 1, ch))
            i += 1
    return chars


def _source_index(raw: str, style: str | None, value: str, offset: int) -> int | None:
    """Where character ``offset`` of a scalar's ``value`` stands in its source text ``raw``.

    Folding lines and stripping indentation change only whitespace, so the n-th non-space
    character of the value is the n-th non-space character of the source.
    """
    wanted = sum(1 for ch in value[:offset] if not ch.isspace())
    seen = 0
    after_last: int | None = None
    for start, end, ch in _source_chars(raw, style):
        if ch.isspace():
            continue
        if seen == wanted:
            return start
        seen += 1
        after_last = end
    return after_last


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


# Aliases may repeat a node; this many repeated values means aliases that multiply aliases.
MAX_REPEATS = 10_000


@dataclass
class _Aliases:
    """What the walk needs to survive aliases: the collections it is inside, those of them
    written out rather than reached through an alias, the nodes seen, the repeats so far."""

    inside: set[int] = field(default_factory=set)
    written: list[yaml.Node] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)
    repeats: int = 0


def _walk(
    node: yaml.Node,
    path: KeyPath,
    located: Located,
    problems: list[Problem],
    file: str,
    aliases: _Aliases,
    text: str,
) -> None:
    located.values[path] = _mark(node)
    repeat = id(node) in aliases.seen
    if repeat:
        aliases.repeats += 1
        if id(node) in aliases.inside:
            message = "this anchored value contains an alias of itself"
            problems.append(Problem(file, *_mark(node), message))
            return
        if aliases.repeats > MAX_REPEATS:
            if aliases.repeats == MAX_REPEATS + 1:  # once, where the aliases stand
                message = f"the aliases here repeat more than {MAX_REPEATS} values"
                expected = "aliases that do not multiply other aliases"
                problems.append(Problem(file, *_mark(aliases.written[-1]), message, expected))
            return
    aliases.seen.add(id(node))
    if isinstance(node, yaml.CollectionNode):
        aliases.inside.add(id(node))
        if not repeat:
            aliases.written.append(node)
        _walk_children(node, path, located, problems, file, aliases, text)
        if not repeat:
            aliases.written.pop()
        aliases.inside.discard(id(node))
    elif isinstance(node, yaml.ScalarNode):
        located.styles[path] = node.style or None  # libyaml writes a plain scalar's as ''
        located.sources[path] = text[node.start_mark.index : node.end_mark.index]


# Keys are compared as YAML constructs them: `true` and `True`, `1` and `0x1`, `~` and `null`
# are one key each (the loaded mapping would silently keep only the last of them).
_KEY_TAGS = tuple(f"tag:yaml.org,2002:{t}" for t in ("int", "bool", "null", "float"))


_CONSTRUCTOR = yaml.constructor.SafeConstructor()


def _key(node: yaml.ScalarNode) -> tuple[Hashable, str | int]:
    """A mapping key: (what it is once loaded, for the duplicate check; how a key path names
    it: an int for an integer key, else its text)."""
    text = node.value
    if node.tag not in _KEY_TAGS:
        return text, text
    try:
        value = _CONSTRUCTOR.construct_object(node)
    except (yaml.YAMLError, ValueError):
        return text, text
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    return value, text


def _walk_children(
    node: yaml.CollectionNode,
    path: KeyPath,
    located: Located,
    problems: list[Problem],
    file: str,
    aliases: _Aliases,
    text: str,
) -> None:
    keys = located.keys
    if isinstance(node, yaml.MappingNode):
        seen: dict[Hashable, tuple[int, int]] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                line, col = _mark(key_node)
                problems.append(Problem(file, line, col, "a key must be a plain value"))
                continue
            ident, key = _key(key_node)
            if key == "<<":
                line, col = _mark(key_node)
                problems.append(
                    Problem(file, line, col, "merge keys (<<) are not supported", "plain keys")
                )
                continue
            if ident in seen:
                line, col = _mark(key_node)
                first = seen[ident]
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
            seen[ident] = _mark(key_node)
            keys[(*path, key)] = _mark(key_node)
            _walk(value_node, (*path, key), located, problems, file, aliases, text)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            keys[(*path, index)] = _mark(item)
            _walk(item, (*path, index), located, problems, file, aliases, text)


def _bad_character(text: str, file: str, exc: yaml.reader.ReaderError) -> InputError:
    at = exc.position
    return InputError.at(
        file,
        text.count("\n", 0, at) + 1,
        at - text.rfind("\n", 0, at),
        f"YAML syntax error: character U+{exc.character:04X} is not allowed",
        "printable text",
    )


# Collections inside collections: deeper than this is refused where it happens (PyYAML builds
# nodes recursively, so a deeper file would exhaust Python's stack before that).
MAX_DEPTH = 100


def _too_deep(text: str) -> tuple[int, int]:
    """Where ``text`` first nests collections deeper than ``MAX_DEPTH`` (the parser's events
    are read one by one, without recursion)."""
    loader = yaml.SafeLoader(text)
    depth = 0
    try:
        while loader.check_event():
            event = loader.get_event()  # type: ignore[no-untyped-call]
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH and event.start_mark is not None:
                    return (event.start_mark.line + 1, event.start_mark.column + 1)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        pass
    finally:
        loader.dispose()
    return (1, 1)


def _unconstructible(node: yaml.Node) -> tuple[tuple[int, int], str]:
    """The first scalar YAML cannot make a value of (a date such as 2026-13-01), and why."""
    todo: list[yaml.Node] = [node]
    seen: set[int] = set()
    constructor = yaml.constructor.SafeConstructor()
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, yaml.MappingNode):
            todo.extend(n for pair in reversed(item.value) for n in reversed(pair))
        elif isinstance(item, yaml.SequenceNode):
            todo.extend(reversed(item.value))
        else:
            try:
                constructor.construct_object(item)
            except (ValueError, OverflowError, TypeError, yaml.YAMLError) as exc:
                return _mark(item), str(exc)
    return (1, 1), "a value YAML cannot read"


_RESOLVE: Any = yaml.resolver.Resolver.resolve

if hasattr(yaml, "CSafeLoader"):
    from yaml._yaml import CParser

    class _FastLoader(
        CParser,
        yaml.composer.Composer,
        yaml.constructor.SafeConstructor,
        yaml.resolver.Resolver,
    ):
        """libyaml's scanner and parser; PyYAML's composer, constructor and resolver."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._tags: dict[tuple[str, Any], str] = {}

        def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
            """A plain scalar's tag depends on its text alone (the safe loader has no path
            resolvers): each text is matched against the implicit resolvers once."""
            if kind is not yaml.ScalarNode or self.yaml_path_resolvers:
                return str(_RESOLVE(self, kind, value, implicit))
            key = (value, implicit)
            tag = self._tags.get(key)
            if tag is None:
                tag = self._tags[key] = str(_RESOLVE(self, kind, value, implicit))
            return tag

        get_single_node = yaml.composer.Composer.get_single_node
        compose_document = yaml.composer.Composer.compose_document
        compose_node = yaml.composer.Composer.compose_node

    FAST: type[Any] | None = _FastLoader
else:  # pragma: no cover - PyYAML without libyaml
    FAST = None


def _compose(text: str, pure: yaml.SafeLoader) -> tuple[yaml.Node | None, Any]:
    """The document's root node and the loader that composed it: libyaml's parser where it
    is there and takes the text, else PyYAML's own (``pure``), whose errors are raised."""
    # libyaml counts marks after a byte order mark, PyYAML from the text's start; libyaml
    # takes a tab where PyYAML refuses one (after a key's colon): such texts go to PyYAML.
    if FAST is not None and not text.startswith("\ufeff") and "\t" not in text:
        fast = FAST(text)
        try:
            return fast.get_single_node(), fast
        except (yaml.YAMLError, RecursionError):
            pass  # the same text again through PyYAML, for the error as it has always read
    return pure.get_single_node(), pure


def parse(text: str, file: str) -> Located:
    """Parse one YAML document from ``text``; ``file`` names it in errors. Every error has a
    line and a column."""
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow, anywhere
        raise _bad_character(text, file, exc) from None
    node: yaml.Node | None = None
    composer: Any = loader
    try:
        node, composer = _compose(text, loader)
        if node is None:
            raise InputError.at(file, 1, 1, "the file is empty", "a YAML mapping")
        shape = Located(file, None, {}, {})
        problems: list[Problem] = []
        _walk(node, (), shape, problems, file, _Aliases(), text)
        if problems:
            raise InputError(problems)
        data = composer.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what = exc.problem or exc.context or "malformed YAML"
        raise InputError.at(file, line, col, f"YAML syntax error: {what}") from None
    except yaml.YAMLError as exc:
        raise InputError.at(file, 1, 1, f"YAML error: {exc}") from None
    except RecursionError:
        raise InputError.at(
            file,
            *_too_deep(text),
            f"YAML nested too deeply (more than {MAX_DEPTH} levels)",
            "fewer levels of [ ], { } or indentation",
        ) from None
    except (ValueError, OverflowError, TypeError):
        assert node is not None  # only constructing values raises these
        (line, col), why = _unconstructible(node)
        raise InputError.at(file, line, col, f"not a valid value: {why}") from None
    finally:
        loader.dispose()
        if composer is not loader:
            composer.dispose()
    return Located(file, data, shape.values, shape.keys, shape.styles, shape.sources)


def decode(data: bytes, file: str) -> str:
    """UTF-8 text (a BOM is kept for YAML to skip); a byte that is not UTF-8 is an
    ``InputError`` at the line and column (in characters, as YAML counts) where it stands."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        col = len(data[start : exc.start].decode("utf-8", "replace")) + 1
        raise InputError.at(
            file,
            line,
            col,
            f"the file is not UTF-8 text: byte 0x{data[exc.start]:02x} here ({exc.reason})",
            "UTF-8 text",
            "save the file as UTF-8",
        ) from None


def load(path: str | Path) -> Located:
    """Read and parse a YAML file; a missing or unreadable file is an ``InputError``."""
    return parse(read(path)[0], str(path))


def read(path: str | Path) -> tuple[str, os.stat_result]:
    """The text of a file and the facts of the very file it was read from (owner, mode): a
    decision about who wrote it is made on what was read, not on what the path names later.
    A missing or unreadable file is an ``InputError``."""
    name = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as file:
            facts = os.fstat(file.fileno())
            if stat.S_ISDIR(facts.st_mode):
                raise IsADirectoryError(21, "Is a directory")
            data = file.read()
    except FileNotFoundError:
        raise InputError.at(name, None, None, "no such file") from None
    except IsADirectoryError:
        raise InputError.at(name, None, None, "is a directory", "a YAML file") from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise InputError.at(name, None, None, f"cannot read the file: {reason}") from None
    return decode(data, name), facts


# Pydantic's words for a wrong container, in the words of a YAML file.
_SHAPES = {
    "model_type": "input should be a mapping",
    "model_attributes_type": "input should be a mapping",
    "dict_type": "input should be a mapping",
    "tuple_type": "input should be a list",
    "list_type": "input should be a list",
}


def _describe(error: Any) -> tuple[str, str | None]:
    kind = error["type"]
    msg = _SHAPES.get(kind, str(error["msg"]))
    if kind == "missing":
        return ("missing required field", None)
    if kind == "extra_forbidden":
        return ("unknown field", None)
    if kind in ("value_error", "assertion_error"):
        msg = msg.split(", ", 1)[1] if ", " in msg else msg
        return (msg, None)
    if kind == "too_short" and "min_length" in error.get("ctx", {}):
        least = error["ctx"]["min_length"]
        msg = f"input should have at least {least} item{'s' if least != 1 else ''}"
    return (f"{msg[0].lower()}{msg[1:]}", None)


def _shown(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _in_data(data: Any, loc: tuple[Any, ...], *, missing: bool) -> tuple[KeyPath, bool]:
    """The parts of a pydantic ``loc`` that are keys of ``data`` (a missing field's last part
    too), and whether any were dropped: the names of union members (``str``, ``tuple[...]``)
    and of keys a shorthand adds (``notify: [a]`` is validated as ``{targets: [a]}``)."""
    kept: list[str | int] = []
    for i, part in enumerate(loc):
        is_item = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if is_item or (isinstance(data, dict) and part in data):
            data = data[part]
        elif not (missing and i == len(loc) - 1 and isinstance(part, str | int)):
            continue
        kept.append(part)
    return tuple(kept), len(kept) != len(loc)


def validate(model: type[M], located: Located, path: KeyPath = ()) -> M:
    """Validate ``located.data`` (or the part at ``path``) with a pydantic model.

    Each validation error becomes a Problem at the position of the value it is about; a
    missing field points at the mapping it is missing from, an unknown field at its key.
    The errors of the members of a union (``str | list``) become one problem.
    """
    data = located.data
    for part in path:
        data = data[part]
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
    found: dict[tuple[KeyPath, str], list[tuple[str, Any]]] = {}
    for error in errors:
        kind = error["type"]
        loc, dropped = _in_data(data, tuple(error["loc"]), missing=kind == "missing")
        group = kind if kind in ("missing", "extra_forbidden") or not dropped else "union"
        found.setdefault(((*path, *loc), group), []).append((_describe(error)[0], error))
    # A list whose only item is wrong is also "too short": say only what is wrong with the item.
    wrong = [full for full, _ in found]
    problems: list[Problem] = []
    for (full, group), described in found.items():
        kinds = {error["type"] for _, error in described}
        if kinds == {"too_short"} and any(w[: len(full)] == full != w for w in wrong):
            continue
        field = ".".join(str(p) for p in full) if full else "document"
        messages = list(dict.fromkeys(message for message, _ in described))
        lead = "input should be "
        if len(messages) > 1 and all(m.startswith(lead) for m in messages):
            messages = [lead + " or ".join(m.removeprefix(lead) for m in messages)]
        message = "; ".join(messages)
        error = described[0][1]
        if error["type"] not in ("missing", "extra_forbidden", "value_error", "assertion_error"):
            message += f" (got {_shown(error.get('input'))})"
        if group == "missing":
            problems.append(located.problem(full[:-1], f"{field}: {message}"))
        elif group == "extra_forbidden":
            words = unknown_key(model, full[len(path) : -1], str(full[-1]), field)
            problems.append(located.problem(full, *words, key=True))
        else:
            problems.append(located.problem(full, f"{field}: {message}"))
    raise InputError(in_file_order(problems)) from None
