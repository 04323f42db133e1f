"""The reference docs cover what the code accepts: every field, function, step kind, scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.playbook.fields import FIELDS, FUNCTIONS
from gpuwarden.playbook.schema import STEP_KINDS, Rule, Step
from gpuwarden.sources.scenario_format import GpuFrame, GpuSpec, JobSpec, Keyframe, Scenario

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOKS_DOC = (ROOT / "docs" / "playbooks.md").read_text()
SCENARIOS_DOC = (ROOT / "docs" / "scenarios.md").read_text()


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_every_field_is_documented(path: str) -> None:
    assert f"`{path}`" in PLAYBOOKS_DOC


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_every_function_is_documented(name: str) -> None:
    assert f"`{FUNCTIONS[name].signature}`" in PLAYBOOKS_DOC


@pytest.mark.parametrize("kind", STEP_KINDS)
def test_every_step_kind_is_documented(kind: str) -> None:
    assert f"| `{kind}` |" in PLAYBOOKS_DOC


def test_every_rule_and_step_key_is_documented() -> None:
    keys = {f.alias or name for name, f in Rule.model_fields.items()}
    keys |= {"after", "name"} & set(Step.model_fields)
    for key in keys:
        assert f"{key}:" in PLAYBOOKS_DOC, key


@pytest.mark.parametrize("model", [Scenario, GpuSpec, JobSpec, Keyframe, GpuFrame])
def test_every_scenario_key_is_documented(model: type) -> None:
    for name in model.model_fields:  # type: ignore[attr-defined]
        assert f"{name}" in SCENARIOS_DOC, f"{model.__name__}.{name}"


def test_every_shipped_scenario_and_playbook_is_listed() -> None:
    for path in (ROOT / "scenarios").glob("*.yaml"):
        assert f"`{path.name}`" in SCENARIOS_DOC, path.name
    for path in (ROOT / "playbooks").glob("*.yaml"):
        assert f"`{path.name}`" in PLAYBOOKS_DOC, path.name
