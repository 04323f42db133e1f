"""YAML loading with positions: the foundation of every file:line:col message."""

from __future__ import annotations

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
