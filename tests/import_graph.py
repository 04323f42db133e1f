"""The import graph of the package and the benchmarks, read with ``ast`` (nothing is imported).

Every ``import`` counts wherever it stands: at the top of a module, inside a function (a lazy
import is still a dependency) or under ``if TYPE_CHECKING:`` (a circle through type hints is
still a circle for the reader). ``tests/test_architecture.py`` checks the graph against the
layers below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The layers, lowest first. A module belongs to the group of its longest matching prefix (a
# module no prefix matches is an error: a new module is placed here on purpose). A module may
# import its own group, and any group of a lower layer; never another group of its own layer
# or a group of a higher one. So the groups form no circle, and no lower layer reaches a
# command. docs/architecture.md describes the same layers in words.
GROUPS: dict[str, tuple[int, tuple[str, ...]]] = {
    # What every layer shares. cloud/tags.py is the pure vocabulary of EC2 tags and user data
    # (it imports nothing of gpuwarden): the config validates cloud profiles against it.
    "core": (
        0,
        (
            "=gpuwarden",  # the package itself (its version); "=" matches the name alone
            "gpuwarden.model",
            "gpuwarden.errors",
            "gpuwarden.units",
            "gpuwarden.clock",
            "gpuwarden.xid",
            "gpuwarden.text",
            "gpuwarden.yamlfile",
            "gpuwarden.patterns",
            "gpuwarden.yamlfile_keys",
            "gpuwarden.timewindow",
            "gpuwarden.timewindow_parse",
            "gpuwarden.job",
            "gpuwarden.pathsafety",
            "gpuwarden.sdnotify",
            "gpuwarden.cloud.tags",
        ),
    ),
    "config": (1, ("gpuwarden.config", "gpuwarden.config_notify")),
    "playbook": (2, ("gpuwarden.playbook",)),
    "engine": (3, ("gpuwarden.engine",)),
    "sources": (3, ("gpuwarden.sources",)),
    "journal": (3, ("gpuwarden.journal",)),
    "actions": (4, ("gpuwarden.actions",)),
    "notify": (5, ("gpuwarden.notify",)),
    "cloud": (5, ("gpuwarden.cloud",)),
    # The daemon's spine: the live loop and the rehearsal loop, and what they run on.
    "spine": (
        6,
        (
            "gpuwarden.runtime",
            "gpuwarden.control",
            "gpuwarden.dispatch",
            "gpuwarden.safety",
            "gpuwarden.reload",
            "gpuwarden.metrics",
            "gpuwarden.metrics_http",
            "gpuwarden.drill",
            "gpuwarden.drill_text",
        ),
    ),
    # Reports draw what the journal (and the outbox in it) recorded, or what a drill played:
    # above notify, beside the spine (which never needs to draw).
    "report": (6, ("gpuwarden.report",)),
    "cli": (7, ("gpuwarden.cli", "gpuwarden.__main__")),
    "bench": (8, ("bench",)),
}


def group_of(module: str, groups: Mapping[str, tuple[int, tuple[str, ...]]] = GROUPS) -> str:
    """The group whose longest prefix matches ``module``."""
    best, length = "", -1
    for name, (_layer, prefixes) in groups.items():
        for prefix in prefixes:
            exact = prefix.removeprefix("=")
            if exact != prefix:
                matches = module == exact
            else:
                matches = module == prefix or module.startswith(prefix + ".")
            if matches and len(prefix) > length:
                best, length = name, len(prefix)
    if not best:
        raise KeyError(f"{module} belongs to no layer: add it to GROUPS in {__name__}")
    return best


def modules(package_root: Path, flat: Iterable[Path] = ()) -> dict[str, Path]:
    """Module name → file: every ``.py`` under ``package_root`` (a source root such as
    ``daemon/``), plus ``flat`` directories whose files import each other by bare name (bench/,
    named ``bench.<stem>``)."""
    found: dict[str, Path] = {}
    for path in sorted(package_root.rglob("*.py")):
        parts = list(path.relative_to(package_root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    for directory in flat:
        for path in sorted(directory.glob("*.py")):
            found[f"{directory.name}.{path.stem}"] = path
    return found


def _resolve(name: str, known: Mapping[str, Path]) -> str | None:
    """The module ``name`` refers to: itself, or the nearest enclosing module known."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(
    module: str, path: Path, known: Mapping[str, Path], flat: frozenset[str] = frozenset()
) -> set[str]:
    """The known modules that ``module`` imports, anywhere in its file. A module of a ``flat``
    directory may also name its neighbours by their bare names."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    directory = module.partition(".")[0]
    flat_prefix = directory + "." if directory in flat else None
    wanted: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            wanted += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from a import b`` may name module a.b or an attribute b of a
            wanted += [f"{node.module}.{alias.name}" for alias in node.names]
    found: set[str] = set()
    for name in wanted:
        target = _resolve(name, known)
        if target is None and flat_prefix is not None:
            target = _resolve(flat_prefix + name, known)
        if target is not None and target != module:
            found.add(target)
    return found


def graph(package_root: Path, flat: Iterable[Path] = ()) -> dict[str, set[str]]:
    flat = list(flat)
    known = modules(package_root, flat)
    names = frozenset(directory.name for directory in flat)
    return {name: imports(name, path, known, names) for name, path in known.items()}


def circles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Each set of modules that import each other, directly or round about (Tarjan's
    strongly connected components of two or more modules), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # iterative, so a deep graph cannot exhaust the recursion limit
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


@dataclass(frozen=True)
class Violation:
    importer: str
    imported: str
    why: str

    def __str__(self) -> str:
        return f"{self.importer} imports {self.imported}: {self.why}"


def layer_violations(
    edges: Mapping[str, Iterable[str]],
    groups: Mapping[str, tuple[int, tuple[str, ...]]] = GROUPS,
) -> list[Violation]:
    """Every import that goes up a layer, or across to another group of the same layer."""
    found = []
    for importer, targets in sorted(edges.items()):
        mine = group_of(importer, groups)
        for imported in sorted(targets):
            theirs = group_of(imported, groups)
            if theirs == mine:
                continue
            low, high = groups[mine][0], groups[theirs][0]
            if high > low:
                why = f"{mine} (layer {low}) is below {theirs} (layer {high})"
            elif high == low:
                why = f"{mine} and {theirs} share layer {low} and must not import each other"
            else:
                continue
            found.append(Violation(importer, imported, why))
    return found
