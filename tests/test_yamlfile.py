"""YAML loading with positions: the foundation of every file:line:col message."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from gpuwarden import yamlfile
from gpuwarden.errors import InputError


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int
    label: str = ""


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    items: list[Inner]


def problems(text: str, model: type[BaseModel] = Outer) -> list[str]:
    with pytest.raises(InputError) as info:
        yamlfile.validate(model, yamlfile.parse(text, "f.yaml"))
    return [p.render() for p in info.value.problems]


def test_positions_of_nested_keys_and_items() -> None:
    located = yamlfile.parse("name: a\nitems:\n  - size: 1\n  - {size: 2, label: x}\n", "f.yaml")
    assert located.values[("name",)] == (1, 7)
    assert located.values[("items", 0, "size")] == (3, 11)
    assert located.values[("items", 1, "label")] == (4, 22)
    assert located.keys[("items", 1, "label")] == (4, 15)


def test_duplicate_key_is_an_error_with_both_lines() -> None:
    with pytest.raises(InputError) as info:
        yamlfile.parse("name: a\nitems: []\nname: b\n", "f.yaml")
    (problem,) = info.value.problems
    assert (problem.line, problem.col) == (3, 1)
    assert "duplicate key 'name' (first at line 1)" in problem.message


@pytest.mark.parametrize(
    ("first", "second"),
    [("true", "True"), ("yes", "on"), ("1", "0x1"), ("~", "null"), ("1.5", "1.50"), ("1", "true")],
)
def test_keys_that_load_as_one_value_are_duplicates(first: str, second: str) -> None:
    """YAML would keep only the last of them: spelled differently, they are still one key."""
    with pytest.raises(InputError) as info:
        yamlfile.parse(f"{first}: a\n{second}: b\n", "f.yaml")
    (problem,) = info.value.problems
    assert (problem.line, problem.col) == (2, 1)
    assert "duplicate key" in problem.message
    assert "(first at line 1)" in problem.message


def test_a_quoted_key_is_text_not_the_value_it_spells() -> None:
    located = yamlfile.parse("true: a\n'true': b\n2: c\n'2': d\n", "f.yaml")  # no error
    assert (2,) in located.keys
    assert ("2",) in located.keys


def test_wrong_type_points_at_the_value() -> None:
    assert problems("name: a\nitems:\n  - size: big\n")[0].startswith(
        "f.yaml:3:11: items.0.size: input should be a valid integer"
    )


def test_missing_field_points_at_its_mapping() -> None:
    assert problems("name: a\nitems:\n  - label: x\n") == [
        "f.yaml:3:5: items.0.size: missing required field"
    ]


def test_unknown_field_points_at_its_key() -> None:
    assert problems("name: a\nitems: []\ncolour: red\n") == [
        "f.yaml:3:1: colour: unknown field 'colour' — expected one of name, items"
    ]


def test_every_problem_is_reported_at_once() -> None:
    assert len(problems("name: a\nitems:\n  - size: x\n  - size: y\n")) == 2


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("name: [unclosed\n", "f.yaml:2:1"),
        ("name: a\n  bad: indent\n", "f.yaml:2:6"),
        ("a: 1\n---\nb: 2\n", "f.yaml:2:1"),
    ],
)
def test_syntax_errors_have_positions(text: str, where: str) -> None:
    with pytest.raises(InputError) as info:
        yamlfile.parse(text, "f.yaml")
    assert info.value.render().startswith(where + ": YAML syntax error")


def test_empty_file() -> None:
    with pytest.raises(InputError, match=r"f\.yaml:1:1: the file is empty"):
        yamlfile.parse("# only a comment\n", "f.yaml")


def test_merge_keys_are_refused() -> None:
    with pytest.raises(InputError, match="merge keys"):
        yamlfile.parse("base: &b {x: 1}\nother:\n  <<: *b\n", "f.yaml")


def test_missing_file(tmp_path) -> None:
    with pytest.raises(InputError, match="no such file"):
        yamlfile.load(tmp_path / "absent.yaml")


def test_read_gives_the_facts_of_the_file_it_read(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("a: 1\n")
    path.chmod(0o640)
    text, facts = yamlfile.read(path)
    assert text == "a: 1\n"
    assert (facts.st_mode & 0o777, facts.st_ino) == (0o640, path.stat().st_ino)
    with pytest.raises(InputError, match="is a directory"):
        yamlfile.read(tmp_path)


@pytest.mark.parametrize(
    ("data", "where", "byte"),
    [
        (b"\xffname: a\n", "1:1", "0xff"),
        (b"name: caf\xc3\n", "1:10", "0xc3"),  # a character cut short
        (  # the column counts characters, as YAML does: é is one
            "name: a\nitems: [\n  {size: 1, label: 'éx".encode() + b"\xe2\x82'}]\n",
            "3:23",
            "0xe2",
        ),
    ],
    ids=["first-byte", "cut-short", "columns-in-characters"],
)
def test_a_byte_that_is_not_utf8_is_at_its_line_and_column(
    tmp_path, data: bytes, where: str, byte: str
) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(data)
    with pytest.raises(InputError) as info:
        yamlfile.load(path)
    assert info.value.render().startswith(
        f"{path}:{where}: the file is not UTF-8 text: byte {byte} here"
    )


def test_a_value_yaml_cannot_make_is_at_its_position() -> None:
    with pytest.raises(InputError) as info:
        yamlfile.parse("name: a\nitems:\n  - {size: 1, label: 2026-02-30}\n", "f.yaml")
    assert info.value.render() == "f.yaml:3:22: not a valid value: day is out of range for month"


@pytest.mark.parametrize(
    "text",
    ["name: " + "[" * 2000 + "]" * 2000 + "\n", "".join("  " * i + "-\n" for i in range(800))],
    ids=["flow", "block"],
)
def test_nesting_too_deep_is_at_the_level_past_the_limit(text: str) -> None:
    with pytest.raises(InputError) as info:
        yamlfile.parse(text, "f.yaml")
    (problem,) = info.value.problems
    assert problem.message == f"YAML nested too deeply (more than {yamlfile.MAX_DEPTH} levels)"
    assert problem.line is not None
    assert problem.col is not None
    line = text.splitlines()[problem.line - 1]
    assert line[problem.col - 1] in "[-"


ROOT = Path(__file__).resolve().parent.parent
SHIPPED_YAML = sorted(
    [*ROOT.glob("scenarios/*.yaml"), *ROOT.glob("playbooks/*.yaml"), ROOT / "config/gpuwarden.yaml"]
)


@pytest.mark.parametrize("path", SHIPPED_YAML, ids=lambda p: p.name)
def test_libyaml_and_pyyaml_give_the_same_document_and_positions(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libyaml parses where it is there; every position, style and source text it gives is
    the one PyYAML's own parser gives."""
    assert yamlfile.FAST is not None, "PyYAML without libyaml: the fast path is not tested"
    text = path.read_text(encoding="utf-8")
    fast = yamlfile.parse(text, str(path))
    monkeypatch.setattr(yamlfile, "FAST", None)
    pure = yamlfile.parse(text, str(path))
    assert fast.data == pure.data
    assert fast.values == pure.values
    assert fast.keys == pure.keys
    assert fast.styles == pure.styles
    assert fast.sources == pure.sources


def test_a_syntax_error_reads_as_pyyaml_words_it() -> None:
    """libyaml refuses the text too, in other words; the message is PyYAML's."""
    with pytest.raises(InputError) as info:
        yamlfile.parse("name: a\nitems: [1, 2\nother: 3\n", "f.yaml")
    (problem,) = info.value.problems
    assert problem.render().startswith("f.yaml:3:")
    assert "YAML syntax error: expected ',' or ']', but got ':'" in problem.render()
