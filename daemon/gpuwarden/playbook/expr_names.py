"""Names in expressions: documented field paths, priority class names, true/false/null, and
"did you mean" for everything else."""

from __future__ import annotations

import ast
import difflib
from collections.abc import Sequence

from gpuwarden.playbook.expr_base import TranslatorBase, Typed, accessor_node, is_none, load
from gpuwarden.playbook.fields import FIELDS, FUNCTIONS, ROOTS

RESERVED = "names starting with _ are reserved"
WORDS: dict[str, bool | None] = {"true": True, "false": False, "null": None}
_FIELD_KIND = {
    "number": "number",
    "integer": "number",
    "string": "string",
    "boolean": "boolean",
    "list[string]": "list",
    "priority": "priority",
}


def _last(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def or_list(names: Sequence[str]) -> str:
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " or " + names[-1]


def suggest_value(value: str, choices: Sequence[str], label: str = "one of") -> str:
    """``did you mean 'x'? (one of: ...)`` or just the listing."""
    listing = f"{label}: {', '.join(choices)}"
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? ({listing})" if close else listing


class NamesTranslator(TranslatorBase):
    def name(self, node: ast.Name) -> Typed:
        ident = node.id
        if ident.startswith("_"):
            self.fail(node, f"{ident} is not allowed: {RESERVED}")
        if ident in WORDS:
            value = WORDS[ident]
            kind = "none" if value is None else "boolean"
            return Typed(ast.Constant(value), kind, False, node, const=True, value=value)
        if ident in ROOTS:
            example = next(p for p in FIELDS if p.startswith(ident + "."))
            self.fail(
                node, f"{ident} alone is not a value", f"use one of its fields, e.g. {example}"
            )
        if ident in self.ranks:
            rank = self.ranks[ident]
            return Typed(ast.Constant(rank), "priority", False, node, const=True, value=rank)
        if ident in FUNCTIONS:
            self.fail(node, f"{ident} is a function: call it", f"e.g. {FUNCTIONS[ident].signature}")
        self.fail(node, f"unknown name {ident}", self.suggest_name(ident))

    def suggest_name(self, ident: str) -> str | None:
        words = [*self.ranks, *WORDS, *FUNCTIONS]
        close = difflib.get_close_matches(ident, words, n=1, cutoff=0.75)
        if close:
            return f"did you mean {close[0]}?"
        fields = self._readable([p for p in FIELDS if _last(p) == ident])
        if not fields:
            by_last: dict[str, list[str]] = {}
            for path in FIELDS:
                by_last.setdefault(_last(path), []).append(path)
            close = difflib.get_close_matches(ident, list(by_last), n=1, cutoff=0.75)
            fields = self._readable(by_last[close[0]]) if close else []
        if fields:
            return f"did you mean {or_list(fields[:3])}?"
        close = difflib.get_close_matches(ident, words, n=1, cutoff=0.6)
        return f"did you mean {close[0]}?" if close else None

    def _readable(self, paths: list[str]) -> list[str]:
        """``paths`` whose root this expression may read first."""
        return sorted(paths, key=lambda p: (p.split(".", 1)[0] not in self.allowed, paths.index(p)))

    def dotted(self, node: ast.Attribute) -> tuple[str, ast.expr]:
        """The dotted name ``node`` spells and the node it starts from; any part starting
        with ``_`` is an error pointing at that part."""
        parts: list[tuple[str, int]] = []
        current: ast.expr = node
        while isinstance(current, ast.Attribute):
            parts.append((current.attr, self.end(current) - len(current.attr)))
            current = current.value
        if isinstance(current, ast.Name):
            parts.append((current.id, self.pos(current)))
        parts.reverse()
        for part, offset in parts:
            if part.startswith("_"):
                self.fail(offset, f"{part} is not allowed: {RESERVED}")
        return ".".join(p for p, _ in parts), current

    def attribute(self, node: ast.Attribute) -> Typed:
        path, base = self.dotted(node)
        if not isinstance(base, ast.Name):
            self.fail(
                node,
                "only documented fields can be read with a dot",
                "fields start with " + ", ".join(f"{r}." for r in ROOTS),
            )
        return self.field(path, node)

    def field(self, path: str, node: ast.expr) -> Typed:
        spec = FIELDS.get(path)
        root = path.split(".", 1)[0]
        if spec is None:
            group = [p for p in FIELDS if p.startswith(path + ".")]
            if group:
                more = ", ..." if len(group) > 6 else ""
                self.fail(
                    node,
                    f"{path} is a group of fields, not a value",
                    f"use one of {', '.join(group[:6])}{more}",
                )
            self.fail(node, f"unknown field {path}", self.suggest_field(path))
        if root not in self.allowed:
            readable = ", ".join(f"{r}.*" for r in ROOTS if r in self.allowed)
            self.fail(
                node,
                f"{root}.* is not available {self.place or 'here'}",
                f"this expression can read {readable}" if readable else None,
            )
        self.fields.add(path)
        self.roots.add(root)
        kind = _FIELD_KIND[spec.type]
        code = accessor_node(spec)
        nullable = spec.nullable
        if root in self.optional_roots:
            code = ast.IfExp(test=is_none(load(root)), body=ast.Constant(None), orelse=code)
            nullable = True
        return Typed(
            code,
            kind,
            nullable,
            node,
            elem="string" if kind == "list" else None,
            field=spec,
        )

    def suggest_field(self, path: str) -> str | None:
        root = path.split(".", 1)[0]
        same = [p for p in FIELDS if p.startswith(root + ".") and _last(p) == _last(path)]
        if same:
            return f"did you mean {or_list(same[:3])}?"
        close = difflib.get_close_matches(path, FIELDS, n=1, cutoff=0.6)
        if close:
            return f"did you mean {close[0]}?"
        anywhere = self._readable([p for p in FIELDS if _last(p) == _last(path)])
        if anywhere:
            return f"did you mean {or_list(anywhere[:3])}?"
        if root in ROOTS:
            return f"the {root}.* fields are listed in docs/playbooks.md"
        return None

    # -- priority classes and fixed choices ---------------------------------------------------

    def rank_const(self, t: Typed) -> Typed:
        """A string constant naming a priority class, as that class's rank."""
        name = t.value
        if not isinstance(name, str) or name not in self.ranks:
            classes = sorted(self.ranks, key=self.ranks.__getitem__, reverse=True)
            self.fail(
                t.source,
                f"unknown priority class {name!r}",
                suggest_value(str(name), classes, "classes"),
            )
        rank = self.ranks[name]
        return Typed(ast.Constant(rank), "priority", False, t.source, const=True, value=rank)

    def priority_pair(self, a: Typed, b: Typed) -> tuple[Typed, Typed]:
        if a.kind == "priority" and b.kind == "string" and b.const:
            return a, self.rank_const(b)
        if b.kind == "priority" and a.kind == "string" and a.const:
            return self.rank_const(a), b
        return a, b

    def check_choice(self, field: Typed, value: Typed) -> None:
        """A string constant compared with a field that has fixed values must be one of them."""
        spec = field.field
        if spec is None or not spec.choices or not value.const or value.kind != "string":
            return
        if value.value not in spec.choices:
            self.fail(
                value.source,
                f"unknown value {value.value!r} for {spec.path}",
                suggest_value(str(value.value), spec.choices),
            )
