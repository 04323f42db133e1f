"""``gpuwarden check`` and ``gpuwarden schema`` as a user runs them: real subprocesses, exit
codes, what lands on stdout and what on stderr."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml

from gpuwarden import config
from tests.cli_runner import gpuwarden

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yaml"))
RULES = [
    ("burst-for-critical-work", "cloud-burst.yaml"),
    ("gpu-fatal-error", "gpu-lost-fatal-xid.yaml"),
    ("idle-process-holding-memory", "idle-holding-memory.yaml"),
    ("gpu-memory-full-soon", "memory-full-soon.yaml"),
    ("gpu-memory-pressure", "memory-pressure.yaml"),
    ("orphaned-gpu-memory", "orphaned-memory.yaml"),
    ("gpu-thermal-throttling", "thermal-throttling.yaml"),
    ("weekly-gpu-memory-health", "weekly-health-check.yaml"),
    ("large-low-priority-job-in-working-hours", "working-hours-large-jobs.yaml"),
]
NO_CONFIG_NOTE = (
    "note: no config file was read (no --config, no GPUWARDEN_CONFIG, no "
    f"{config.DEFAULT_PATH}): there are no notification targets or cloud profiles, and the "
    "priority classes are the built-in ones"
)


def position(path: Path, needle: str, *, after: str = "") -> str:
    """``line:col`` of the first ``needle`` that follows ``after`` in the file, found
    independently of gpuwarden."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if after + needle in line:
            return f"{number}:{line.index(after + needle) + len(after) + 1}"
    raise AssertionError(f"{after + needle!r} is not in {path}")


def broken_copy(tmp_path: Path, file: str, old: str, new: str) -> tuple[Path, Path]:
    directory = tmp_path / "playbooks"
    shutil.copytree(ROOT / "playbooks", directory)
    path = directory / file
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    return directory, path


def test_the_shipped_set_passes_and_is_listed() -> None:
    # The config's cloud profile needs AWS credentials, or check warns (test_cloud_cli.py).
    credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    result = gpuwarden(
        "check", "--strict", "--config", "config/gpuwarden.yaml", "playbooks/", env=credentials
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == "config     config/gpuwarden.yaml"
    assert "playbooks  9 file(s), 9 rule(s)" in lines
    for name, file in RULES:
        line = position(ROOT / "playbooks" / file, name, after="name: ").split(":")[0]
        assert any(
            row.startswith(f"  {name}  (") and row.endswith(f"  playbooks/{file}:{line}")
            for row in lines
        ), name
    listed = [row.split()[0] for row in lines if row.startswith("  ") and not row.startswith("   ")]
    assert listed == [name for name, _ in RULES]
    assert (
        "notify     oncall: 1 url (1 from a file or the environment), ≥warning, fallback chat"
        in lines
    )
    assert lines[-1] == "ok: 9 rule(s) in 9 file(s)"


def test_a_single_file_can_be_checked() -> None:
    result = gpuwarden(
        "check", "--config", "config/gpuwarden.yaml", "playbooks/memory-pressure.yaml"
    )
    assert result.returncode == 0, result.stderr
    assert "steps notify oncall → checkpoint [process.checkpointable] → +2m kill" in result.stdout
    assert result.stdout.splitlines()[-1] == "ok: 1 rule(s) in 1 file(s)"


def test_a_broken_copy_fails_at_the_break_and_prints_nothing_on_stdout(tmp_path: Path) -> None:
    directory, path = broken_copy(
        tmp_path, "memory-pressure.yaml", "gpu.memory.used_pct >= 95", "gpu.memory.usedpct >= 95"
    )
    result = gpuwarden("check", "--config", ROOT / "config/gpuwarden.yaml", directory)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{path}:{position(path, 'gpu.memory.usedpct')}: unknown field gpu.memory.usedpct",
        "  hint: did you mean gpu.memory.used_pct?",
        "check failed: 1 problem",
    ]


def test_every_problem_is_reported_then_counted(tmp_path: Path) -> None:
    directory, pressure = broken_copy(tmp_path, "memory-pressure.yaml", "for: 30s", "for: 30 sec")
    thermal = directory / "thermal-throttling.yaml"
    thermal.write_text(thermal.read_text().replace("power_cap: {percent: 80}", "power_cap: {}"))
    result = gpuwarden("check", "--config", ROOT / "config/gpuwarden.yaml", directory)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith(
        f"{pressure}:{position(pressure, '30 sec', after='for: ')}: rules.0.for: "
    )
    assert lines[1].startswith(
        f"{thermal}:{position(thermal, '{}', after='power_cap: ')}: rules.0.steps.1.power_cap: "
    )
    assert lines[2:] == ["check failed: 2 problems"]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [["check", "--bogus"], ["check", "--config"], ["chek", "playbooks"]],
    ids=["unknown-option", "option-without-value", "unknown-command"],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = gpuwarden(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("usage: gpuwarden")


def test_without_a_config_a_reference_to_oncall_fails_with_a_hint(tmp_path: Path) -> None:
    if config.DEFAULT_PATH.is_file():
        pytest.skip(f"{config.DEFAULT_PATH} exists on this machine")
    (tmp_path / "pb").mkdir()
    playbook = tmp_path / "pb" / "page.yaml"
    playbook.write_text("rules:\n  - name: page\n    when: gpu.lost\n    steps: [notify: oncall]\n")
    result = gpuwarden("check", "pb", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "pb/page.yaml:4:21: unknown notification target 'oncall'",
        "  hint: define it under notify.targets in the config",
        NO_CONFIG_NOTE,
        "check failed: 1 problem",
    ]


def test_without_a_config_or_paths_the_missing_directory_is_named(tmp_path: Path) -> None:
    if config.DEFAULT_PATH.is_file():
        pytest.skip(f"{config.DEFAULT_PATH} exists on this machine")
    default = config.Config().playbooks
    if default.exists():
        pytest.skip(f"{default} exists on this machine")
    result = gpuwarden("check", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{default}: no such playbook directory",
        "  hint: name playbook files or directories (gpuwarden check PATH...), or set playbooks:"
        " in the config",
        NO_CONFIG_NOTE,
        "check failed: 1 problem",
    ]


def test_in_a_checkout_without_a_config_the_local_playbooks_are_used(tmp_path: Path) -> None:
    if config.DEFAULT_PATH.is_file() or config.Config().playbooks.exists():
        pytest.skip("this machine has an installed gpuwarden configuration")
    shutil.copytree(ROOT / "playbooks", tmp_path / "playbooks")
    result = gpuwarden("check", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == f"gpuwarden: {config.Config().playbooks} does not exist; using ./playbooks"
    unknown = [line for line in lines if "unknown notification target" in line]
    assert len(unknown) == 9  # every shipped playbook notifies oncall or chat
    burst = position(ROOT / "playbooks" / "cloud-burst.yaml", "burst-a100", after="provision: ")
    assert [line for line in lines if "unknown cloud profile" in line] == [
        f"playbooks/cloud-burst.yaml:{burst}: unknown cloud profile 'burst-a100'"
    ]
    assert lines[-2:] == [NO_CONFIG_NOTE, "check failed: 10 problems"]


def test_the_gpuwarden_config_variable_is_honoured(tmp_path: Path) -> None:
    result = gpuwarden(
        "check", "playbooks/", env={"GPUWARDEN_CONFIG": str(ROOT / "config/gpuwarden.yaml")}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"config     {ROOT / 'config/gpuwarden.yaml'}"
    bad = tmp_path / "bad.yaml"
    bad.write_text("tick: 2s\nnotify:\n  targets:\n    oncall: {urlz: []}\n")
    result = gpuwarden("check", "playbooks/", env={"GPUWARDEN_CONFIG": str(bad)})
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{bad}:4:14: notify.targets.oncall.urlz: unknown field 'urlz' — expected one of type, "
        "urls, config, tags, min_severity, quiet_hours, fallback, body_format, owners, "
        "owner_mail, advice, resend, labels, link, ack_on_silence",
        "  hint: did you mean urls?",
        "check failed: 1 problem",
    ]
    # --config wins over the variable
    result = gpuwarden(
        "check",
        "--config",
        "config/gpuwarden.yaml",
        "playbooks/",
        env={"GPUWARDEN_CONFIG": str(bad)},
    )
    assert result.returncode == 0, result.stderr


def test_a_missing_config_file_is_a_failed_check(tmp_path: Path) -> None:
    result = gpuwarden("check", "--config", tmp_path / "absent.yaml", "playbooks/")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{tmp_path / 'absent.yaml'}: no such file",
        "check failed: 1 problem",
    ]


def test_schema_is_a_json_schema_the_shipped_playbooks_satisfy() -> None:
    result = gpuwarden("schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    validator = jsonschema.Draft202012Validator(schema)
    for path in PLAYBOOKS:
        errors = [
            f"{list(e.absolute_path)}: {e.message}"
            for e in validator.iter_errors(yaml.safe_load(path.read_text()))
        ]
        assert errors == [], path.name
    assert len(PLAYBOOKS) == 9


@pytest.mark.parametrize(
    ("document", "where"),
    [
        ({"rules": [{"name": "a", "when": "gpu.lost", "colour": "red"}]}, ["rules", 0]),
        ({"rules": [{"name": "a"}]}, ["rules", 0]),
        ({"rules": [{"name": "a", "when": "gpu.lost", "for": "soon"}]}, ["rules", 0, "for"]),
        (
            {"rules": [{"name": "a", "when": "gpu.lost", "for_each": "rack"}]},
            ["rules", 0, "for_each"],
        ),
        (
            {"rules": [{"name": "a", "when": "gpu.lost", "steps": [{"notify": 5}]}]},
            ["rules", 0, "steps", 0, "notify"],
        ),
    ],
    ids=["unknown-field", "missing-when", "bad-duration", "bad-for-each", "bad-notify"],
)
def test_schema_refuses_what_the_loader_refuses(document: object, where: list[object]) -> None:
    schema = json.loads(gpuwarden("schema").stdout)
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(document))
    assert [list(e.absolute_path) for e in errors] == [where]


def test_schema_accepts_the_short_forms_the_loader_accepts() -> None:
    schema = json.loads(gpuwarden("schema").stdout)
    steps = [
        {"notify": "oncall"},
        {"notify": ["oncall", "chat"]},
        {"notify": {"targets": "oncall", "message": "hi"}},
        {"kill": None},
        {"kill": {"order": "-gpu_memory_mib", "grace": 30}},
        {"after": "1h30m", "exec": ["/bin/true"]},
        {"provision": "burst-a100"},
    ]
    document = {"rules": [{"name": "a", "when": "gpu.lost", "for": "2m", "steps": steps}]}
    jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)


def test_check_prints_a_sub_second_tick_as_written(tmp_path: Path) -> None:
    config = tmp_path / "fast.yaml"
    config.write_text("tick: 500ms\n")
    playbook = tmp_path / "one.yaml"
    playbook.write_text("rules:\n  - {name: hot, for_each: gpu, when: gpu.temperature_c > 90}\n")
    result = gpuwarden("check", "--config", config, playbook)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].startswith("           tick 500ms, timezone UTC")


# -- arming: mode: enforce and rules that cannot tell anyone ---------------------------------


def armed_config(tmp_path: Path, mode: str = "enforce") -> Path:
    text = (ROOT / "config" / "gpuwarden.yaml").read_text()
    assert "\nmode: shadow " in text  # a fresh install starts in shadow
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(text.replace("\nmode: shadow ", f"\nmode: {mode} "))
    return path


def test_armed_check_fails_with_2_while_a_killing_rule_cannot_tell_anyone(tmp_path: Path) -> None:
    cfg = armed_config(tmp_path)
    playbook = ROOT / "playbooks" / "memory-pressure.yaml"
    line = position(playbook, "gpu-memory-pressure", after="name: ").split(":")[0]
    result = gpuwarden("check", "--config", cfg, playbook)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    # At the rule's line and column, with why the target cannot be resolved (never a secret).
    assert lines[0].startswith(
        f"{playbook}:{line}:5: rule 'gpu-memory-pressure' can kill, and its notification target "
        "'oncall' cannot be resolved: notify target 'oncall' URL 1: environment variable "
    )
    assert "GPUWARDEN_ONCALL_URL is not set" in lines[0]
    assert lines[-1] == (
        "check failed: 1 rule(s) can act but cannot tell anyone (exit 2; --allow-silent "
        "accepts that)"
    )
    # The secret in place: armed and fine. Its value is never printed.
    secret = "json://user:t0ps3cret@127.0.0.1:9/hook"
    told = gpuwarden("check", "--config", cfg, playbook, env={"GPUWARDEN_ONCALL_URL": secret})
    assert told.returncode == 0, told.stderr
    assert "t0ps3cret" not in told.stdout + told.stderr
    assert "mode enforce (steps act)" in told.stdout
    # Accepted on purpose: a warning, exit 0.
    allowed = gpuwarden("check", "--config", cfg, playbook, "--allow-silent")
    assert allowed.returncode == 0, allowed.stderr
    assert f"warning: {lines[0]}" in allowed.stderr.splitlines()


def test_a_rule_that_kills_without_a_notify_step_is_silent(tmp_path: Path) -> None:
    playbook = tmp_path / "quiet.yaml"
    playbook.write_text(
        "rules:\n  - name: quiet\n    when: gpu.memory.used_pct > 99\n"
        "    steps:\n      - kill: {select: process.priority <= low}\n"
    )
    result = gpuwarden("check", "--config", armed_config(tmp_path), playbook)
    assert result.returncode == 2
    assert result.stderr.splitlines()[:2] == [
        f"{playbook}:2:5: rule 'quiet' can kill and has no notify step: nobody is told",
        "  hint: add `- notify: TARGET` as its first step",
    ]


def test_in_shadow_mode_check_passes_and_says_what_arming_needs(tmp_path: Path) -> None:
    result = gpuwarden(
        "check", "--config", armed_config(tmp_path, "shadow"), "playbooks/memory-pressure.yaml"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.endswith("mode shadow (nothing is acted on)") for line in lines)
    assert (
        "shadow mode: nothing is acted on; once armed (mode: enforce), check fails until these "
        "rules can tell someone:" in lines
    )
    assert lines[-1] == "ok: 1 rule(s) in 1 file(s)"


@pytest.mark.parametrize(
    ("keys", "shadow"),
    [("mode: shadow", True), ("mode: enforce", False), ("dry_run: true", True), ("", False)],
)
def test_mode_and_its_older_spelling(tmp_path: Path, keys: str, shadow: bool) -> None:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(f"tick: 2s\n{keys}\n")
    assert config.load(path).shadow is shadow


def test_mode_and_dry_run_that_disagree_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text("mode: enforce\ndry_run: true\n")
    result = gpuwarden("check", "--config", path, "playbooks/memory-pressure.yaml")
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"{path}:2:10: dry_run: true contradicts mode: enforce (dry_run: true is the older "
        "spelling of mode: shadow); keep mode and remove dry_run"
    )
