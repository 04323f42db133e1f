"""The package's shape: no import circles, no import up a layer (tests/import_graph.py).

The banned-api rule in pyproject.toml keeps I/O out of the engine and the playbook language;
this keeps the layers in order: sources → engine → executors → journal, commands on top.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import import_graph
from tests.import_graph import ROOT, circles, graph, group_of, layer_violations

EDGES = graph(ROOT / "daemon", [ROOT / "bench"])


def test_the_package_and_the_benchmarks_have_no_import_circle() -> None:
    found = circles(EDGES)
    assert found == [], "modules that import each other:\n" + "\n".join(map(str, found))


def test_no_module_imports_up_a_layer_or_across_to_a_sibling() -> None:
    found = layer_violations(EDGES)
    assert found == [], "imports against the layers:\n" + "\n".join(map(str, found))


def test_every_module_is_placed_in_a_layer() -> None:
    placed = {name: group_of(name) for name in EDGES}
    assert placed["gpuwarden"] == "core"
    assert placed["gpuwarden.cli.main"] == "cli"
    assert placed["gpuwarden.journal.schema"] == "journal"
    assert placed["bench.harness"] == "bench"
    with pytest.raises(KeyError, match="belongs to no layer"):
        group_of("gpuwarden.newcomer")  # a new top-level module must be placed on purpose


def test_the_graph_is_read_from_the_real_files() -> None:
    # a few edges known to exist, so an empty or broken graph cannot pass the tests above
    assert "gpuwarden.engine.engine" in EDGES["gpuwarden.runtime"]
    assert "gpuwarden.journal.schema" in EDGES["gpuwarden.cloud.store"]
    assert "bench.harness" in EDGES["bench.engine"]  # bench modules import by bare name
    assert len(EDGES) > 100


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_a_planted_circle_through_a_lazy_or_type_only_import_is_found(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "src/pkg/__init__.py": "",
            "src/pkg/a.py": "def f():\n    from pkg.b import g\n    return g\n",
            "src/pkg/b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg import a\n"
                "def g(): ...\n"
            ),
            "src/pkg/c.py": "import pkg.a\n",  # depends on the circle, is not in it
            "flat/run.py": "import harness\n",
            "flat/harness.py": "from run import main\n",
        },
    )
    found = circles(graph(root / "src", [root / "flat"]))
    assert found == [["flat.harness", "flat.run"], ["pkg.a", "pkg.b"]]


def test_a_circle_planted_in_the_real_package_is_found() -> None:
    planted = {name: set(targets) for name, targets in EDGES.items()}
    planted["gpuwarden.journal.schema"].add("gpuwarden.journal.journal")
    [found] = circles(planted)
    assert {"gpuwarden.journal.schema", "gpuwarden.journal.journal"} <= set(found)


def test_an_upward_or_sideways_import_planted_in_the_real_package_is_found() -> None:
    planted = {name: set(targets) for name, targets in EDGES.items()}
    planted["gpuwarden.model"].add("gpuwarden.cli.main")  # core reaching for a command
    planted["gpuwarden.engine.planner"].add("gpuwarden.sources.procs")  # sibling of layer 3
    found = [str(v) for v in layer_violations(planted)]
    assert found == [
        "gpuwarden.engine.planner imports gpuwarden.sources.procs: "
        "engine and sources share layer 3 and must not import each other",
        "gpuwarden.model imports gpuwarden.cli.main: core (layer 0) is below cli (layer 7)",
    ]


def test_groups_are_listed_lowest_layer_first() -> None:
    layers = [layer for layer, _prefixes in import_graph.GROUPS.values()]
    assert layers == sorted(layers)
