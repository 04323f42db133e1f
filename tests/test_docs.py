"""The reference docs cover what the code accepts: every field, function, step kind, scenario."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuwarden import config
from gpuwarden.cloud import tags
from gpuwarden.config import Cloud, CloudProfile
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


CLOUD_DOC = (ROOT / "docs" / "cloud.md").read_text()


def _fenced(text: str, language: str) -> list[str]:
    """The bodies of the ```language blocks of a Markdown text, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def _policy_actions(policy: dict[str, Any]) -> set[str]:
    actions: set[str] = set()
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow", statement
        action = statement["Action"]
        actions.update([action] if isinstance(action, str) else action)
    return actions


def _conditions(policy: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [
        s.get("Condition", {})
        for s in policy["Statement"]
        if action == s["Action"] or action in s["Action"]
    ]


def test_the_cloud_iam_policy_parses_and_names_exactly_the_calls_gpuwarden_makes() -> None:
    # What the EC2 adapter calls, read from its source: every boto3 operation goes through
    # Ec2._call("operation", ...). A launch with TagSpecifications also needs CreateTags.
    source = (ROOT / "daemon" / "gpuwarden" / "cloud" / "ec2.py").read_text()
    operations = set(re.findall(r'_call\(\s*"([a-z_]+)"', source))
    assert operations == {"run_instances", "describe_instances", "terminate_instances"}
    called = {"ec2:" + op.title().replace("_", "") for op in operations}
    assert "TagSpecifications" in source
    blocks = [json.loads(block) for block in _fenced(CLOUD_DOC, "json")]
    policy, budget_policy, pass_role = blocks
    assert policy["Version"] == "2012-10-17"
    assert _policy_actions(policy) == called | {"ec2:CreateTags"}
    managed = {"StringEquals": {f"ec2:ResourceTag/{tags.MANAGED}": "true"}}
    assert _conditions(policy, "ec2:TerminateInstances") == [managed]
    assert {"StringEquals": {f"aws:RequestTag/{tags.MANAGED}": "true"}} in _conditions(
        policy, "ec2:RunInstances"
    )
    on_launch = {"StringEquals": {"ec2:CreateAction": "RunInstances"}}
    assert _conditions(policy, "ec2:CreateTags") == [on_launch]
    assert _policy_actions(pass_role) == {"iam:PassRole"}
    # The fleet budget's item: what cloud/budget.py calls through FleetBudget._call.
    source = (ROOT / "daemon" / "gpuwarden" / "cloud" / "budget.py").read_text()
    operations = set(re.findall(r'_call\(\s*"([a-z_]+)"', source))
    assert operations == {"get_item", "put_item", "update_item"}
    called = {"dynamodb:" + op.title().replace("_", "") for op in operations}
    assert _policy_actions(budget_policy) == called
    [statement] = budget_policy["Statement"]
    assert statement["Resource"].startswith("arn:aws:dynamodb:")
    assert statement["Resource"].endswith(":table/gpuwarden-budget")


def test_the_cloud_doc_example_profile_loads(tmp_path: Path) -> None:
    example, without_template = _fenced(CLOUD_DOC.split("## An example profile")[1], "yaml")[:2]
    path = tmp_path / "cloud.yaml"
    path.write_text(example)
    profile = config.load(path).cloud.profiles["burst-a100"]
    assert profile.launch_template is not None
    assert profile.user_data is not None
    assert "${expires}" in profile.user_data
    path.write_text(
        example.replace("      launch_template: lt-0123456789abcdef0\n", without_template)
    )
    assert config.load(path).cloud.profiles["burst-a100"].ami == "ami-0123456789abcdef0"


def test_every_cloud_profile_key_is_documented() -> None:
    reference = CLOUD_DOC.split("## Profile reference")[1].split("\n## ")[0]
    for name in [*CloudProfile.model_fields, *Cloud.model_fields]:
        if name != "profiles":
            assert f"| `{name}` |" in reference, name
    for key in tags.OWN_KEYS:
        assert f"| `{key}` |" in CLOUD_DOC, key


def test_the_reports_page_shows_the_demo_screenshot_and_the_readme_links_it() -> None:
    reports = (ROOT / "docs" / "reports.md").read_text()
    (image,) = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", reports)
    png = (ROOT / "docs" / image).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert "(docs/reports.md)" in (ROOT / "README.md").read_text()
    assert "report last" in (ROOT / "Makefile").read_text()


FLEET_DOC = (ROOT / "docs" / "fleet.md").read_text()


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n")[1].split("\n## ", maxsplit=1)[0]


def test_the_fleet_doc_examples_load(tmp_path: Path) -> None:
    target, _alertmanager = _fenced(_section(FLEET_DOC, "Alertmanager"), "yaml")[:2]
    path = tmp_path / "fleet.yaml"
    path.write_text(target)
    spec = config.load(path).notify.targets["oncall"]
    assert (spec.type, spec.ack_on_silence, spec.resend) == ("alertmanager", True, 60.0)
    [profile] = _fenced(_section(FLEET_DOC, "A fleet-wide burst budget"), "yaml")
    path.write_text(profile)
    budget = config.load(path).cloud.profiles["burst-a100"].budget
    assert budget is not None
    assert (budget.table, budget.max_instances) == ("gpuwarden-budget", 8)


def test_every_alertmanager_and_budget_key_is_documented() -> None:
    targets = _section(FLEET_DOC, "Alertmanager")
    for name in ("type", "urls", "min_severity", "resend", "labels", "link", "ack_on_silence"):
        assert f"| `{name}` |" in targets, name
    assert {"resend", "labels", "link", "ack_on_silence"} <= set(config.NotifyTarget.model_fields)
    budget = _section(FLEET_DOC, "A fleet-wide burst budget")
    for name in config.Budget.model_fields:
        assert f"| `{name}` |" in budget, name
    for label in config.ALERT_OWN_LABELS:
        assert f"| `{label}` |" in targets, label
