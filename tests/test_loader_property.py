"""Property tests of the playbook loader: random text never crashes it; a mutated shipped
playbook either loads whole or is refused with every problem at a position; loading is
deterministic; every error line of `gpuwarden check` over broken bytes (not UTF-8, huge
numbers, deep nesting) names file:line:col. Examples are derandomized, so a run in CI sees
what a run here saw."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpuwarden import config
from gpuwarden.errors import InputError, Problem
from gpuwarden.playbook import loader
from gpuwarden.playbook.expr import Compiler, ExprError
from gpuwarden.playbook.fields import FIELDS

ROOT = Path(__file__).resolve().parent.parent
CONFIG = config.load(ROOT / "config" / "gpuwarden.yaml")
SHIPPED = {p.name: p.read_text(encoding="utf-8") for p in sorted(ROOT.glob("playbooks/*.yaml"))}


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


Outcome = tuple[str, tuple[Any, ...]]


def outcome(paths: list[Path]) -> Outcome:
    """What loading gives, in a comparable form; asserts the invariants of a refusal."""
    refused: list[Problem] | None = None
    try:
        playbooks = loader.load(paths, CONFIG)
    except InputError as exc:
        refused = exc.problems
    if refused is not None:
        assert refused, "an InputError names at least one problem"
        for problem in refused:
            assert problem.message
            assert "Traceback" not in problem.render()
        return ("refused", tuple(p.render() for p in refused))
    rules = tuple(
        (r.name, r.file, r.line, r.spec, tuple(s.spec for s in r.steps)) for r in playbooks.rules
    )
    series = tuple((s.root, s.kind, s.text, s.window) for s in playbooks.series)
    return ("loaded", (rules, playbooks.files, series))


def load_text(data: str | bytes) -> Outcome:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "p.yaml"
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
        result = outcome([Path(directory)])
        if result[0] == "refused":
            assert all(r.startswith(str(path)) for r in result[1])
        return result


# -- (a) random text ---------------------------------------------------------------------------

FRAGMENTS = [
    "rules:",
    "\n",
    "\n  ",
    "  ",
    "- ",
    "name: ",
    "when: ",
    "gpu.index == 0",
    "process.priority <= low",
    "for_each: ",
    "process",
    "for: ",
    "30s",
    "steps:",
    "notify: oncall",
    "kill:",
    "provision: burst-a100",
    "power_cap: {percent: 80}",
    "active: Mon-Fri 08:00-20:00",
    "every: Mon 09:00",
    "version: 1",
    "{",
    "}",
    "[",
    "]",
    ": ",
    ", ",
    "'",
    '"',
    "\\",
    "#",
    "|",
    ">-",
    "&a ",
    "*a",
    "<<: ",
    "? ",
    "!!python/object:os.system ",
    "!!binary ",
    "!custom ",
    "---\n",
    "...\n",
    "%YAML 1.1\n",
    "\t",
    "\r\n",
    "\x00",
    "\x07",
    "\ufeff",
    "\u2028",
    "é",
    "💥",
    "~",
    "null",
    "yes",
    "0x1F",
    "1e400",
    "-.inf",
    ".nan",
    "2026-01-05",
    "2026-01-05T10:00:00Z",
]
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=300)
SOUP = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=60).map(
    "".join
)


@_settings(2000)
@given(st.one_of(TEXT, SOUP))
def test_random_text_only_ever_raises_input_error(text: str) -> None:
    load_text(text)


@_settings(200)
@given(st.binary(max_size=300))
def test_random_bytes_only_ever_raise_input_error(data: bytes) -> None:
    load_text(data)


# An expression, written by the YAML emitter in each scalar style and folded at each width: an
# error in it must point at the same character of the file whichever way it is written.
EXPRESSION_WORDS = [
    *(f for f in FIELDS if f.startswith(("gpu.", "host.", "time."))),
    "gpu.memory.usedpct",
    "process.idle",
    "lowest",
    "avg(",
    "predict(",
    "5m",
    ")",
    "(",
    ",",
    "and",
    "or",
    "not",
    "in",
    "==",
    ">=",
    "<",
    "+",
    "95",
    "[48, 79]",
    "'xid'",
    '"a\\"b"',
    "'it''s'",
    "\t",
    "\\",
    "é",
    "__class__",
    "  ",
]
STYLES = [None, "'", '"', "|", ">"]
_STR = "tag:yaml.org,2002:str"


def _playbook(expression: str, style: str | None, width: int) -> str:
    def scalar(value: str, style: str | None = None) -> yaml.ScalarNode:
        return yaml.ScalarNode(_STR, value, style=style)

    rule = yaml.MappingNode(
        "tag:yaml.org,2002:map",
        [(scalar("name"), scalar("r")), (scalar("when"), scalar(expression, style))],
    )
    rules = yaml.SequenceNode("tag:yaml.org,2002:seq", [rule])
    root = yaml.MappingNode("tag:yaml.org,2002:map", [(scalar("rules"), rules)])
    text: str = yaml.serialize(root, Dumper=yaml.SafeDumper, width=width, allow_unicode=True)
    return text


@_settings(600)
@given(
    st.one_of(
        st.lists(st.sampled_from(EXPRESSION_WORDS), min_size=1, max_size=12).map(" ".join),
        st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40),
    ),
    st.sampled_from(STYLES),
    st.integers(min_value=10, max_value=90),
)
def test_an_expression_error_points_at_its_character_in_every_yaml_style(
    expression: str, style: str | None, width: int
) -> None:
    text = _playbook(expression, style, width)
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    assert root is not None
    node = root.value[0][1].value[0].value[1][1]
    assume(node.value == expression)  # PyYAML's emitter cannot write every string (\x85)
    style = node.style  # the emitter quotes what a plain scalar cannot hold
    try:
        Compiler(CONFIG.priorities.names).compile(expression, roots=loader.WHEN_ROOTS["gpu"])
    except ExprError as exc:
        error: ExprError | None = exc
    else:
        error = None
    kind, reported = load_text(text)
    if error is None:
        assert kind == "loaded", reported
        return
    assert kind == "refused"
    (problem,) = reported
    where, message = problem.split(": ", 1)
    assert message.split("\n")[0] == error.message
    line, col = (int(n) for n in where.rsplit(":", 2)[1:])
    lines = text.splitlines()
    assert 1 <= line <= len(lines)
    assert 1 <= col <= len(lines[line - 1]) + 1
    wanted = expression[error.offset : error.offset + 1]
    if wanted and not wanted.isspace():
        found = lines[line - 1][col - 1 : col]
        assert found == wanted or (style == '"' and found == "\\"), (text, line, col)


# -- (b) mutations of the shipped playbooks ----------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=30),
    st.sampled_from(
        [
            "30s",
            "-1s",
            "0",
            "1e9d",
            "oncall",
            "chat",
            "pager",
            "burst-a100",
            "gpu",
            "process",
            "host",
            "event",
            "shadow",
            "critical",
            "SIGKILL",
            "SIGSTOP",
            "priority",
            "-gpu_memory_mib",
            "name",
            "gpu.memory.used_pct >= 95",
            "process.priority <= low",
            "process.idle",
            "event.xid == 79",
            "avg(gpu.power_w, 5m) > 300",
            "gpu.memory.usedpct > 5",
            "Mon-Fri 08:00-20:00",
            "Sat 25:00-26:00",
            "Mon 09:00",
            "6h",
            "daily 99:00",
        ]
    ),
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.sampled_from(["select", "targets", "wait", "percent", "x"]), SCALARS),
)

Path_ = tuple[Any, ...]


def _paths(data: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    """Every path into ``data`` (mapping keys and list indexes), the root excluded."""
    if isinstance(data, dict | list):
        for key, value in data.items() if isinstance(data, dict) else enumerate(data):
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))


def _parent(data: Any, path: Path_) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data


def replace_value(draw: st.DrawFn, data: Any) -> None:
    paths = list(_paths(data))
    if paths:
        path = draw(st.sampled_from(paths))
        _parent(data, path)[path[-1]] = draw(VALUES)


def drop_key(draw: st.DrawFn, data: Any) -> None:
    paths = list(_paths(data))
    if paths:
        path = draw(st.sampled_from(paths))
        del _parent(data, path)[path[-1]]


def rename_key(draw: st.DrawFn, data: Any) -> None:
    keys = [p for p in _paths(data) if isinstance(p[-1], str)]
    if keys:
        path = draw(st.sampled_from(keys))
        parent = _parent(data, path)
        parent[path[-1] + draw(st.sampled_from(["s", "_", "x"]))] = parent.pop(path[-1])


def delete_line(draw: st.DrawFn, lines: list[str]) -> None:
    if lines:
        del lines[draw(st.integers(0, len(lines) - 1))]


def duplicate_line(draw: st.DrawFn, lines: list[str]) -> None:
    if lines:
        i = draw(st.integers(0, len(lines) - 1))
        lines.insert(i, lines[i])


def swap_lines(draw: st.DrawFn, lines: list[str]) -> None:
    if len(lines) > 1:
        i, j = draw(st.lists(st.integers(0, len(lines) - 1), min_size=2, max_size=2, unique=True))
        lines[i], lines[j] = lines[j], lines[i]


def change_character(draw: st.DrawFn, lines: list[str]) -> None:
    text = "".join(lines)
    if text:
        i = draw(st.integers(0, len(text) - 1))
        new = draw(st.one_of(st.sampled_from(list(" \t\n:-[]{}#'\"|>&*!,%@`?\\0")), st.text()))
        lines[:] = (text[:i] + new + text[i + 1 :]).splitlines(keepends=True)


STRUCTURAL: list[Callable[[st.DrawFn, Any], None]] = [replace_value, drop_key, rename_key]
TEXTUAL: list[Callable[[st.DrawFn, list[str]], None]] = [
    delete_line,
    duplicate_line,
    swap_lines,
    change_character,
]


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, str]:
    """A shipped playbook file name and its text after one to four mutations: first edits of
    the data (written back as YAML), then edits of the text."""
    name = draw(st.sampled_from(sorted(SHIPPED)))
    text = SHIPPED[name]
    structural = draw(st.lists(st.sampled_from(STRUCTURAL), max_size=2))
    textual = draw(st.lists(st.sampled_from(TEXTUAL), min_size=not structural, max_size=2))
    if structural:
        data = yaml.safe_load(text)
        for mutate in structural:
            mutate(draw, data)
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    lines = text.splitlines(keepends=True)
    for edit in textual:
        edit(draw, lines)
    return name, "".join(lines)


def _rule_names(text: str) -> list[str]:
    document = yaml.safe_load(text)
    return [rule["name"] for rule in document.get("rules", ())]


@_settings(400)
@given(mutated())
def test_a_mutated_playbook_loads_whole_or_is_refused_with_positions(
    case: tuple[str, str],
) -> None:
    name, text = case
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for other, original in SHIPPED.items():
            (directory / other).write_text(text if other == name else original, encoding="utf-8")
        files = {str(directory / other): (directory / other).read_text() for other in SHIPPED}
        try:
            playbooks = loader.load([directory], CONFIG)
        except InputError as exc:
            for problem in exc.problems:
                assert problem.file in files, problem.render()
                assert problem.line is not None, problem.render()
                assert problem.col is not None, problem.render()
                lines = files[problem.file].splitlines() or [""]
                assert 1 <= problem.line <= len(lines) + 1, problem.render()
                assert problem.col >= 1, problem.render()
            return
        assert playbooks.files == tuple(files)
        for file, content in files.items():
            loaded = [r.name for r in playbooks.rules if r.file == file]
            assert loaded == _rule_names(content), file


# -- (c) determinism ---------------------------------------------------------------------------


@_settings(60)
@given(mutated())
def test_loading_twice_gives_the_same_result(case: tuple[str, str]) -> None:
    name, text = case
    with tempfile.TemporaryDirectory() as tmp:
        first, second = Path(tmp, "first"), Path(tmp, "second")
        for directory, order in ((first, sorted(SHIPPED)), (second, sorted(SHIPPED)[::-1])):
            directory.mkdir()
            for other in order:  # written in opposite orders: the listing order must not matter
                content = text if other == name else SHIPPED[other]
                (directory / other).write_text(content, encoding="utf-8")
        a, b = outcome([first]), outcome([second])
    assert a[0] == b[0]
    assert _relative(a, first) == _relative(b, second)


def _relative(result: Outcome, directory: Path) -> str:
    return repr(result[1]).replace(str(directory), "DIR")


PRINT_OUTCOME = """
import sys
from pathlib import Path
from gpuwarden import config
from gpuwarden.errors import InputError, Problem
from gpuwarden.playbook import loader
from gpuwarden.playbook.expr import Compiler, ExprError
from gpuwarden.playbook.fields import FIELDS
cfg = config.load(sys.argv[1])
try:
    playbooks = loader.load([Path(sys.argv[2])], cfg)
except InputError as exc:
    print(exc.render())
else:
    for rule in playbooks.rules:
        print(rule.name, rule.line, rule.spec, [s.spec for s in rule.steps])
    for series in playbooks.series:
        print(series.root, series.kind, series.text, series.window)
"""

BROKEN = """rules:
  - name: a
    when: gpu.memory.usedpct > 5 and process.x
    active: Mon-Fry 08:00-20:00
    steps:
      - notify: [pager, oncall, pagr]
      - kill: {order: [colour, -name], signal: STOP, select: process.prio <= lowe}
      - provision: burst
  - name: b
    for_each: process
    when: process.priority in ["gold", "silver"] and avg(process.sm_util_pct, 5m) < 1
"""


def test_loading_does_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "p.yaml").write_text(BROKEN)
    for directory in (ROOT / "playbooks", broken):
        outputs = set()
        for seed in ("0", "1", "12345"):
            result = subprocess.run(
                [sys.executable, "-c", PRINT_OUTCOME, ROOT / "config/gpuwarden.yaml", directory],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "PYTHONHASHSEED": seed},
                check=True,
            )
            assert result.stdout.strip(), result.stderr
            outputs.add(result.stdout)
        assert len(outputs) == 1, outputs


def test_the_mutation_strategy_reaches_both_outcomes() -> None:
    """The property above is only worth something if mutations both break and keep files."""
    seen: set[str] = set()

    @_settings(60)
    @given(mutated())
    def collect(case: tuple[str, str]) -> None:
        name, text = case
        seen.add(load_single(name, text))

    collect()
    assert seen == {"loaded", "refused"}


def load_single(name: str, text: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / name).write_text(text, encoding="utf-8")
        return outcome([Path(tmp)])[0]


# -- (d) every error line of `gpuwarden check` has a position ------------------------------------

CONFIG_TEXT = (ROOT / "config" / "demo.yaml").read_text(encoding="utf-8")  # small: parsed each time
# What a byte-level edit puts in: bytes that are not UTF-8, out-of-range values, deep nesting.
BYTE_EDITS = [
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\x00",
    b"1000000d",
    b"99999999999999999999999999",
    b"1e400",
    b"2026-13-01",
    b"[" * 400,
    b"{a: " * 60,
]
_POSITION = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): \S")


@st.composite
def broken_bytes(draw: st.DrawFn, text: str) -> bytes:
    """``text`` as UTF-8 with up to three byte-level edits."""
    data = bytearray(text.encode("utf-8"))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        edit = draw(st.one_of(st.sampled_from(BYTE_EDITS), st.binary(min_size=1, max_size=4)))
        data[at : at + draw(st.integers(0, 2))] = edit
    return bytes(data)


@st.composite
def checked_set(draw: st.DrawFn) -> tuple[str, bytes, bytes]:
    """A playbook file name, its broken bytes, and the config's bytes (broken now and then)."""
    name, text = draw(mutated())
    playbook = draw(broken_bytes(text))
    config_bytes = CONFIG_TEXT.encode()
    if draw(st.integers(0, 4)) == 0:
        config_bytes = draw(broken_bytes(CONFIG_TEXT))
    return name, playbook, config_bytes


def check_lines(directory: Path, config_file: Path) -> tuple[int, list[str]]:
    """``gpuwarden check`` as the command runs it; its exit code and stderr lines."""
    from gpuwarden.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["check", "--config", str(config_file), str(directory)])
    return code, err.getvalue().splitlines()


@_settings(200)
@given(checked_set())
def test_every_error_line_of_check_has_a_position(case: tuple[str, bytes, bytes]) -> None:
    name, playbook, config_bytes = case
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp, "playbooks")
        directory.mkdir()
        (directory / name).write_bytes(playbook)  # alone: its problems are what is checked
        config_file = Path(tmp, "gpuwarden.yaml")
        config_file.write_bytes(config_bytes)
        code, lines = check_lines(directory, config_file)
        files = {str(p): p.read_bytes() for p in [config_file, *directory.iterdir()]}
    problems = [
        line
        for line in lines
        if line.strip() and not line.startswith(("  hint: ", "check failed: ", "warning: "))
    ]
    assert (code == 0) == (not problems), lines
    for line in problems:
        found = _POSITION.match(line)
        assert found is not None, line
        assert found["file"] in files, line
        size = files[found["file"]].count(b"\n") + 1
        assert 1 <= int(found["line"]) <= size + 1, line
        assert int(found["col"]) >= 1, line
