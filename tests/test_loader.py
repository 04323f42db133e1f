"""The playbook loader: every problem at its exact file:line:col, references checked against
the config, and a set that loads whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden import config
from gpuwarden.config import (
    Cloud,
    CloudProfile,
    Config,
    Notify,
    NotifyTarget,
    Priorities,
    PriorityClass,
)
from gpuwarden.errors import InputError
from gpuwarden.playbook import loader

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "playbooks"
CONFIG = config.load(ROOT / "config" / "gpuwarden.yaml")
KINDS = "notify, checkpoint, suspend, resume, renice, kill, requeue, power_cap, exec, provision"
KILL_SIGNALS = "SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2"
CHECKPOINT_SIGNALS = (
    "SIGALRM, SIGCONT, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH"
)


def write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def problems(tmp_path: Path, text: str, cfg: Config = CONFIG) -> list[str]:
    """What loading one file ``p.yaml`` holding ``text`` reports, file names relative."""
    return problems_of(tmp_path, {"p.yaml": text}, cfg)


def problems_of(tmp_path: Path, files: dict[str, str], cfg: Config = CONFIG) -> list[str]:
    directory = write(tmp_path / "playbooks", files)
    with pytest.raises(InputError) as info:
        loader.load([directory], cfg)
    rendered = [p.render() for p in info.value.problems]
    assert all(p.file.startswith(str(directory)) for p in info.value.problems)
    return [r.replace(f"{directory}/", "") for r in rendered]


RULE_KEYS = (
    "name, description, for_each, when, for, until, active, every, cooldown"
    ", severity, labels, mode, pause_on_ack, group_wait, group_interval, repeat, steps"
)


def rule(body: str, *, name: str = "r", when: str = "gpu.index == 0") -> str:
    """One rule; ``body`` is more of its keys, indented four spaces."""
    return f"rules:\n  - name: {name}\n    when: {when}\n{body}"


# -- the shipped set ---------------------------------------------------------------------------


def test_the_shipped_playbooks_load_against_the_shipped_config() -> None:
    playbooks = loader.load([SHIPPED], CONFIG)
    assert [Path(f).name for f in playbooks.files] == sorted(p.name for p in SHIPPED.glob("*.yaml"))
    assert [r.name for r in playbooks.rules] == [
        "burst-for-critical-work",
        "gpu-fatal-error",
        "idle-process-holding-memory",
        "gpu-memory-full-soon",
        "gpu-memory-pressure",
        "orphaned-gpu-memory",
        "gpu-thermal-throttling",
        "weekly-gpu-memory-health",
        "large-low-priority-job-in-working-hours",
    ]
    pressure = playbooks.rule("gpu-memory-pressure")
    assert pressure is not None
    assert (Path(pressure.file).name, pressure.line) == ("memory-pressure.yaml", 10)
    assert [s.kind for s in pressure.steps] == ["notify", "checkpoint", "kill"]
    assert [(k.field, k.descending) for k in pressure.steps[2].order] == [
        ("priority", False),
        ("gpu_memory_mib", True),
    ]
    assert playbooks.rule("weekly-gpu-memory-health") is not None
    assert playbooks.rule("no-such-rule") is None


def test_a_valid_file_loads_with_defaults(tmp_path: Path) -> None:
    directory = write(tmp_path, {"p.yaml": rule("    steps:\n      - kill:\n")})
    (compiled,) = loader.load([directory], CONFIG).rules
    assert (compiled.file, compiled.line) == (str(directory / "p.yaml"), 2)
    (step,) = compiled.steps
    assert step.kind == "kill"
    assert [(k.field, k.descending) for k in step.order] == [
        ("priority", False),
        ("gpu_memory_mib", True),
        ("age_s", False),
    ]


# -- YAML itself -------------------------------------------------------------------------------


def test_yaml_syntax_error(tmp_path: Path) -> None:
    text = "rules:\n  - name: a\n    when: gpu.index == 0\n    steps: [notify: oncall\n"
    assert problems(tmp_path, text) == [
        "p.yaml:5:1: YAML syntax error: expected ',' or ']', but got '<stream end>'"
    ]
    text = "rules:\n  - name: a\n   when: gpu.index == 0\n"
    assert problems(tmp_path, text) == [
        "p.yaml:3:4: YAML syntax error: expected <block end>, but found '<block mapping start>'"
    ]


def test_duplicate_key(tmp_path: Path) -> None:
    text = rule("    for: 30s\n    when: gpu.index == 1\n")
    assert problems(tmp_path, text) == [
        "p.yaml:5:5: duplicate key 'when' (first at line 3) — expected each key once per mapping"
        "\n  hint: YAML would silently keep only the last one; remove or merge them"
    ]


def test_a_character_yaml_does_not_allow(tmp_path: Path) -> None:
    text = rule("    description: bell \a here\n")
    assert problems(tmp_path, text) == [
        "p.yaml:4:23: YAML syntax error: character U+0007 is not allowed — expected printable text"
    ]


def test_an_alias_that_contains_itself(tmp_path: Path) -> None:
    text = rule("    labels: &l {a: *l}\n")
    assert problems(tmp_path, text) == [
        "p.yaml:4:13: this anchored value contains an alias of itself"
    ]


def test_aliases_that_multiply_aliases_are_refused(tmp_path: Path) -> None:
    # Each line repeats the one above ten times: x3 stands for 11110 values. (Ten more lines
    # would stand for more values than memory holds, which is what the limit is for.)
    lines = ["x0: &x0 [a, a, a, a, a, a, a, a, a, a]"]
    lines += [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 10)}]" for i in range(1, 4)]
    assert problems(tmp_path, "\n".join(lines) + "\n") == [
        "p.yaml:4:5: the aliases here repeat more than 10000 values"
        " — expected aliases that do not multiply other aliases"
    ]


def test_plain_aliases_are_fine(tmp_path: Path) -> None:
    text = (
        "rules:\n"
        "  - {name: a, when: &hot gpu.memory.used_pct >= 95, steps: [notify: &who oncall]}\n"
        "  - {name: b, when: *hot, for: 1m, steps: [notify: *who]}\n"
    )
    playbooks = loader.load([write(tmp_path, {"p.yaml": text})], CONFIG)
    assert [r.spec.when for r in playbooks.rules] == ["gpu.memory.used_pct >= 95"] * 2


def test_merge_keys_are_refused(tmp_path: Path) -> None:
    text = "base: &b {for: 1m}\nrules:\n  - <<: *b\n    name: a\n    when: gpu.lost\n"
    assert problems(tmp_path, text) == [
        "p.yaml:3:5: merge keys (<<) are not supported — expected plain keys"
    ]


def test_a_file_that_is_a_list_not_a_mapping(tmp_path: Path) -> None:
    text = "- name: a\n  when: gpu.lost\n"
    assert problems(tmp_path, text) == [
        "p.yaml:1:1: a playbook file must be a mapping — expected rules: [...]"
    ]


def test_an_empty_file(tmp_path: Path) -> None:
    assert problems(tmp_path, "# nothing yet\n") == [
        "p.yaml:1:1: the file is empty — expected a YAML mapping"
    ]


# -- the shape of a rule -----------------------------------------------------------------------


def test_unknown_top_level_key(tmp_path: Path) -> None:
    assert problems(tmp_path, "version: 1\nrulez: []\n") == [
        "p.yaml:2:1: rulez: unknown field 'rulez' — expected one of version, rules\n"
        "  hint: did you mean rules?"
    ]


def test_unknown_rule_field_points_at_its_key(tmp_path: Path) -> None:
    text = rule("    colour:   red\n")
    assert problems(tmp_path, text) == [
        f"p.yaml:4:5: rules.0.colour: unknown field 'colour' — expected one of {RULE_KEYS}"
    ]


def test_wrong_types_point_at_the_values(tmp_path: Path) -> None:
    text = rule("    severity: 3\n    labels: [team]\n    steps:\n      - kill: {limit: many}\n")
    assert problems(tmp_path, text) == [
        "p.yaml:4:15: rules.0.severity: input should be 'info', 'warning' or 'critical' (got 3)",
        "p.yaml:5:13: rules.0.labels: input should be a mapping (got ['team'])",
        "p.yaml:7:23: rules.0.steps.0.kill.limit: input should be a valid integer, unable to "
        "parse string as an integer (got 'many')",
    ]


def test_a_value_of_neither_allowed_type_is_one_problem(tmp_path: Path) -> None:
    text = rule(
        "    active: 5\n"
        "    every: [1]\n"
        "    steps:\n"
        "      - notify: 5\n"
        "      - exec: [/bin/true, 7]\n"
        "      - notify: [[a]]\n"
    )
    assert problems(tmp_path, text) == [
        "p.yaml:4:13: rules.0.active: input should be a valid string or a list (got 5)",
        "p.yaml:5:12: rules.0.every: input should be a valid string or a valid number (got [1])",
        "p.yaml:7:17: rules.0.steps.0.notify: input should be a mapping (got 5)",
        "p.yaml:8:27: rules.0.steps.1.exec.1: input should be a valid string (got 7)",
        "p.yaml:9:18: rules.0.steps.2.notify.0: input should be a valid string (got ['a'])",
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (".nan", "not a finite duration: nan"),
        ("inf", "not a finite duration: inf"),
        ("-.inf", "a duration cannot be negative: -inf"),
        ("1" + "0" * 400, "duration too long: 1" + "0" * 36 + "... (at most 3650d)"),
        ("1000000d", "duration too long: '1000000d' (at most 3650d)"),
        ("3651d", "duration too long: '3651d' (at most 3650d)"),
        ("-1s", "not a duration: '-1s' (write e.g. 30s, 2m, 1h30m)"),
    ],
    ids=["nan", "inf", "minus-inf", "huge", "days", "just-over", "negative"],
)
def test_durations_are_finite_and_not_negative(tmp_path: Path, value: str, message: str) -> None:
    assert problems(tmp_path, rule(f"    for: {value}\n")) == [
        f"p.yaml:4:10: rules.0.for: {message}"
    ]


def test_numbers_and_durations_of_steps_are_bounded_where_they_stand(tmp_path: Path) -> None:
    text = rule(
        "    steps:\n"
        "      - kill: {settle: 1000000d, limit: 99999999999}\n"
        "      - power_cap: {watts: 1.0e+30}\n"
        "      - exec: {argv: [/bin/true], timeout: 10000000000}\n"
        "      - after: 5000d\n        notify: oncall\n"
    )
    assert problems(tmp_path, text) == [
        "p.yaml:5:24: rules.0.steps.0.kill.settle: duration too long: '1000000d' (at most 3650d)",
        "p.yaml:5:41: rules.0.steps.0.kill.limit: input should be less than or equal to 10000"
        " (got 99999999999)",
        "p.yaml:6:28: rules.0.steps.1.power_cap.watts: input should be less than or equal to"
        " 10000 (got 1e+30)",
        "p.yaml:7:44: rules.0.steps.2.exec.timeout: duration too long: 10000000000 (at most 3650d)",
        "p.yaml:8:16: rules.0.steps.3.after: duration too long: '5000d' (at most 3650d)",
    ]


def test_a_schedule_interval_is_bounded_too(tmp_path: Path) -> None:
    assert problems(tmp_path, rule("    every: 1000000d\n")) == [
        "p.yaml:4:12: duration too long: '1000000d' (at most 3650d) — expected e.g. 30s, 5m, 6h"
    ]


def test_a_window_of_an_expression_is_bounded_too(tmp_path: Path) -> None:
    text = rule("", when="avg(gpu.power_w, 100000d) > 300")
    assert problems(tmp_path, text) == ["p.yaml:3:28: duration too long: '100000d' (at most 3650d)"]


def test_infinite_numbers_in_step_parameters(tmp_path: Path) -> None:
    text = rule("    steps:\n      - power_cap: {watts: .inf}\n      - kill: {grace: .NaN}\n")
    assert problems(tmp_path, text) == [
        "p.yaml:5:28: rules.0.steps.0.power_cap.watts: input should be a finite number (got inf)",
        "p.yaml:6:23: rules.0.steps.1.kill.grace: not a finite duration: nan",
    ]


def test_missing_when_points_at_the_rule(tmp_path: Path) -> None:
    text = "rules:\n  - name: a\n    for: 30s\n  - name: b\n    when: gpu.lost\n"
    assert problems(tmp_path, text) == ["p.yaml:2:5: rules.0.when: missing required field"]


def test_bad_rule_name(tmp_path: Path) -> None:
    text = "rules:\n  - name: Memory Pressure!\n    when: gpu.lost\n"
    assert problems(tmp_path, text) == [
        "p.yaml:2:11: rules.0.name: string should match pattern '^[a-z0-9][a-z0-9_.-]*$' "
        "(got 'Memory Pressure!')"
    ]


def test_bad_duration_in_for(tmp_path: Path) -> None:
    text = rule("    for: 30 parsecs\n")
    assert problems(tmp_path, text) == [
        "p.yaml:4:10: rules.0.for: not a duration: '30 parsecs' (write e.g. 30s, 2m, 1h30m)"
    ]


def test_bad_for_each(tmp_path: Path) -> None:
    text = "rules:\n  - name: a\n    for_each: cluster\n    when: gpu.lost\n"
    assert problems(tmp_path, text) == [
        "p.yaml:3:15: rules.0.for_each: input should be 'gpu', 'process', 'host' or 'event' "
        "(got 'cluster')"
    ]


def test_rules_whose_keys_contradict_each_other(tmp_path: Path) -> None:
    text = (
        "rules:\n"
        "  - {name: a, for_each: event, when: event.xid == 79, for: 1m}\n"
        "  - name: b\n"
        "    every: Mon 09:00\n"
        "    when: gpu.lost\n"
        "    for: 1m\n"
    )
    assert problems(tmp_path, text) == [
        "p.yaml:2:5: rules.0: an event rule fires on the event itself: it takes no `for`",
        "p.yaml:3:5: rules.1: a scheduled rule (`every`) is checked at its times:"
        " it takes no `for`",
    ]


# -- steps -------------------------------------------------------------------------------------


def test_a_step_with_two_kinds_and_a_step_with_none(tmp_path: Path) -> None:
    text = rule("    steps:\n      - notify: oncall\n        kill:\n      - after: 1m\n")
    assert problems(tmp_path, text) == [
        f"p.yaml:5:9: rules.0.steps.0: a step has exactly one kind (found: notify, kill); "
        f"kinds: {KINDS}",
        f"p.yaml:7:9: rules.0.steps.1: a step has exactly one kind (found: none); kinds: {KINDS}",
    ]


def test_unknown_step_field(tmp_path: Path) -> None:
    text = rule("    steps:\n      - notify: oncall\n        retry: 3\n      - kill: {grase: 5s}\n")
    assert problems(tmp_path, text) == [
        "p.yaml:6:9: rules.0.steps.0.retry: unknown step kind 'retry' — expected one of "
        "notify, checkpoint, suspend, resume, renice, kill, requeue, power_cap, exec, provision, "
        "after, name",
        "p.yaml:7:16: rules.0.steps.1.kill.grase: unknown field 'grase' — expected one of "
        "select, order, limit, free_until, grace, signal, process_group, settle, via\n"
        "  hint: did you mean grace?",
    ]


def test_step_parameters_are_checked(tmp_path: Path) -> None:
    text = rule(
        "    steps:\n"
        "      - power_cap: {}\n"
        "      - renice: {nice: 40}\n"
        "      - exec: []\n"
        "      - after: soon\n"
        "        notify: oncall\n"
    )
    assert problems(tmp_path, text) == [
        "p.yaml:5:20: rules.0.steps.0.power_cap: give exactly one of watts (a limit in W) or "
        "percent (of the device's default limit)",
        "p.yaml:6:24: rules.0.steps.1.renice.nice: input should be less than or equal to 19 "
        "(got 40)",
        "p.yaml:7:15: rules.0.steps.2.exec: input should have at least 1 item (got [])",
        "p.yaml:8:16: rules.0.steps.3.after: not a duration: 'soon' (write e.g. 30s, 2m, 1h30m)",
    ]


def test_unknown_notification_target_in_each_way_of_writing_one(tmp_path: Path) -> None:
    text = rule(
        "    steps:\n"
        "      - notify: pager\n"
        "      - notify: [oncall, pager]\n"
        "      - notify: {targets: [chat, pager], message: hi}\n"
        "      - notify: {targets: pager}\n"
    )
    expected = "unknown notification target 'pager' — expected one of: chat, oncall"
    assert problems(tmp_path, text) == [
        f"p.yaml:5:17: {expected}",
        f"p.yaml:6:26: {expected}",
        f"p.yaml:7:34: {expected}",
        f"p.yaml:8:27: {expected}",
    ]


def test_unknown_notification_target_when_the_config_has_none(tmp_path: Path) -> None:
    text = rule("    steps:\n      - notify: oncall\n")
    assert problems(tmp_path, text, Config()) == [
        "p.yaml:5:17: unknown notification target 'oncall'"
        "\n  hint: define it under notify.targets in the config"
    ]


def test_unknown_cloud_profile(tmp_path: Path) -> None:
    text = rule("    steps:\n      - provision: burst-h100\n      - provision: {profile: x}\n")
    assert problems(tmp_path, text) == [
        "p.yaml:5:20: unknown cloud profile 'burst-h100' — expected one of: burst-a100",
        "p.yaml:6:30: unknown cloud profile 'x' — expected one of: burst-a100",
    ]
    assert problems(tmp_path, text, Config()) == [
        "p.yaml:5:20: unknown cloud profile 'burst-h100'"
        "\n  hint: define it under cloud.profiles in the config",
        "p.yaml:6:30: unknown cloud profile 'x'"
        "\n  hint: define it under cloud.profiles in the config",
    ]


def test_references_resolve_against_the_config_given(tmp_path: Path) -> None:
    cfg = Config(
        notify=Notify(targets={"pager": NotifyTarget(urls=("json://127.0.0.1:9/x",))}),
        cloud=Cloud(
            profiles={
                "burst-h100": CloudProfile(
                    region="eu-west-1", instance_types=("g5",), ami="ami-0123456789abcdef0"
                )
            }
        ),
    )
    text = rule("    steps:\n      - notify: pager\n      - provision: burst-h100\n")
    (compiled,) = loader.load([write(tmp_path, {"p.yaml": text})], cfg).rules
    assert [s.kind for s in compiled.steps] == ["notify", "provision"]


def test_power_cap_in_a_host_rule(tmp_path: Path) -> None:
    text = (
        "rules:\n  - name: a\n    for_each: host\n    when: host.gpu_count > 0\n"
        "    steps:\n      - power_cap: {percent: 80}\n"
    )
    assert problems(tmp_path, text) == [
        "p.yaml:6:20: power_cap acts on one GPU; a host rule has none"
        " — expected for_each: gpu, process or event"
    ]


def test_bad_order_key(tmp_path: Path) -> None:
    text = rule(
        "    steps:\n      - kill: {order: [priority, -colour]}\n      - suspend: {order: name}\n"
    )
    sortable = (
        "age_s, cpu_pct, declared_priority, gpu, gpu_memory_mib, nice, pid, priority, rss_mib,"
        " sm_util_pct, uid"
    )
    assert problems(tmp_path, text) == [
        f"p.yaml:5:34: cannot order by '-colour' — expected a numeric process field, '-' first "
        f"for descending: {sortable}",
        f"p.yaml:6:26: cannot order by 'name' — expected a numeric process field, '-' first "
        f"for descending: {sortable}",
    ]


def test_bad_signal(tmp_path: Path) -> None:
    text = rule(
        "    steps:\n"
        "      - kill: {signal: SIGSTOP}\n"
        "      - checkpoint: {signal: KILL}\n"
        "      - kill: {signal: kill}\n"
        "      - checkpoint: {signal: usr2}\n"
    )
    assert problems(tmp_path, text) == [
        f"p.yaml:5:24: not a signal this step can send: 'SIGSTOP' — expected one of {KILL_SIGNALS}",
        f"p.yaml:6:30: not a signal this step can send: 'KILL' — expected one of "
        f"{CHECKPOINT_SIGNALS}",
    ]


# -- expressions -------------------------------------------------------------------------------

HINT_USED_PCT = "\n  hint: did you mean gpu.memory.used_pct?"


@pytest.mark.parametrize(
    ("when", "col"),
    [
        ("gpu.memory.usedpct > 5", 11),
        ("'gpu.memory.usedpct > 5'", 12),
        ('"gpu.memory.usedpct > 5"', 12),
        ("gpu.index >= 0 and gpu.memory.usedpct > 5", 30),
        ("'gpu.name == ''a''  and gpu.memory.usedpct > 5'", 35),
        ('"gpu.name == \\"a\\" and gpu.memory.usedpct > 5"', 34),
        ('"gpu.name == \\u0022a\\x22 and gpu.memory.usedpct > 5"', 40),
    ],
    ids=["plain", "single", "double", "plain-later", "single-escaped", "double-escaped", "codes"],
)
def test_expression_error_at_its_column_on_one_line(tmp_path: Path, when: str, col: int) -> None:
    text = rule("", when=when)
    line = text.splitlines()[2]
    assert line[col - 1 :].startswith("gpu.memory.usedpct")
    assert problems(tmp_path, text) == [
        f"p.yaml:3:{col}: unknown field gpu.memory.usedpct{HINT_USED_PCT}"
    ]


@pytest.mark.parametrize(
    ("when", "line", "col"),
    [
        ("gpu.index >= 0\n      and gpu.memory.usedpct > 5", 4, 11),
        ("'gpu.index >= 0\n\n      and gpu.memory.usedpct > 5'", 5, 11),
        ('"gpu.index >= 0 \\\n      and  gpu.memory.usedpct > 5"', 4, 12),
        (">-\n      gpu.index >= 0\n      and gpu.memory.usedpct > 5", 5, 11),
        ("|  # a comment\n      gpu.index >= 0 and\n        gpu.memory.usedpct > 5", 5, 9),
    ],
    ids=["plain", "single", "double", "folded", "literal"],
)
def test_expression_error_at_its_line_and_column_over_several_lines(
    tmp_path: Path, when: str, line: int, col: int
) -> None:
    text = rule("", when=when)
    assert text.splitlines()[line - 1][col - 1 :].startswith("gpu.memory.usedpct")
    assert problems(tmp_path, text) == [
        f"p.yaml:{line}:{col}: unknown field gpu.memory.usedpct{HINT_USED_PCT}"
    ]


def test_incomplete_expression_points_at_its_end(tmp_path: Path) -> None:
    text = rule("", when=">\n      gpu.index >=\n\n")
    assert problems(tmp_path, text) == [
        "p.yaml:4:19: not a valid expression: invalid syntax\n  hint: the expression is incomplete"
    ]


def test_unknown_priority_class(tmp_path: Path) -> None:
    text = (
        "rules:\n  - name: a\n    for_each: process\n"
        "    when: process.priority <= 'lowest'\n"
        "    steps:\n      - kill: {select: process.priority == scavnger}\n"
    )
    assert problems(tmp_path, text) == [
        "p.yaml:4:31: unknown priority class 'lowest'"
        "\n  hint: did you mean 'low'? (classes: critical, high, normal, low, scavenger)",
        "p.yaml:6:44: unknown name scavnger\n  hint: did you mean scavenger?",
    ]


def test_priority_classes_come_from_the_config(tmp_path: Path) -> None:
    classes = tuple(PriorityClass(name=n) for n in ("gold", "silver", "bronze"))
    cfg = Config(priorities=Priorities(classes=classes, default="silver", declared_max="silver"))
    text = rule("    steps:\n      - kill: {select: process.priority <= low}\n")
    assert problems(tmp_path, text, cfg) == [
        "p.yaml:5:44: unknown name low",
    ]
    good = rule("    steps:\n      - kill: {select: process.priority <= bronze}\n")
    assert loader.load([write(tmp_path / "good", {"p.yaml": good})], cfg).rules


def test_process_fields_in_a_gpu_rule(tmp_path: Path) -> None:
    hint = "\n  hint: this expression can read gpu.*, host.*, time.*"
    text = rule(
        "    until: gpu.memory.used_pct < 80 or process.idle\n"
        "    steps:\n"
        "      - kill:\n"
        "          select: process.idle\n"
        "          free_until: process.gpu_memory_mib == 0\n",
        when="gpu.index == 0 and process.priority <= low",
    )
    assert problems(tmp_path, text) == [
        f"p.yaml:3:30: process.* is not available here{hint}",
        f"p.yaml:4:40: process.* is not available here{hint}",
        f"p.yaml:8:23: process.* is not available here{hint}",
    ]


def test_event_fields_only_in_event_rules(tmp_path: Path) -> None:
    text = rule("", when="event.xid == 79")
    assert problems(tmp_path, text) == [
        "p.yaml:3:11: event.* is not available here"
        "\n  hint: this expression can read gpu.*, host.*, time.*"
    ]


def test_a_condition_must_be_true_or_false(tmp_path: Path) -> None:
    text = rule("", when="gpu.memory.used_pct")
    (problem,) = problems(tmp_path, text)
    assert problem.startswith("p.yaml:3:11: a condition must be true or false")


# -- time windows and schedules ----------------------------------------------------------------


def test_bad_active_window_points_at_the_bad_token(tmp_path: Path) -> None:
    text = rule('    active: "Mon-Fry 08:00-20:00"\n')
    assert problems(tmp_path, text) == [
        "p.yaml:4:18: unknown day 'Fry' — expected Mon, Tue, Wed, Thu, Fri, Sat, Sun"
    ]


def test_bad_active_window_inside_a_list(tmp_path: Path) -> None:
    text = rule(
        "    active:\n      - Mon-Fri 08:00-20:00\n      - 'Sat 09:00-25:00'\n"
        "    steps: [notify: oncall]\n"
    )
    assert problems(tmp_path, text) == [
        "p.yaml:6:20: hour 25 out of range — expected 00-23, or 24:00 to end a range"
    ]


def test_bad_every(tmp_path: Path) -> None:
    text = rule("    every: Funday 09:00\n")
    assert problems(tmp_path, text) == [
        "p.yaml:4:12: unknown day or schedule 'Funday' — expected hourly, hourly :MM, daily"
        " HH:MM, a day and a time (Mon 09:00), or an interval (6h)"
    ]


# -- the set: several files --------------------------------------------------------------------


def test_the_same_rule_name_in_two_files(tmp_path: Path) -> None:
    files = {
        "a.yaml": rule("", name="hot"),
        "b.yaml": "rules:\n  - name: cold\n    when: gpu.lost\n" + rule("", name="hot")[7:],
    }
    assert problems_of(tmp_path, files) == [
        "b.yaml:4:11: rule 'hot' is defined twice (first at a.yaml:2)"
        " — expected each rule name once across all playbook files"
    ]


def test_the_same_rule_name_twice_in_one_file(tmp_path: Path) -> None:
    text = "rules:\n  - {name: a, when: gpu.lost}\n  - {name: a, when: gpu.lost}\n"
    assert problems(tmp_path, text) == [
        "p.yaml:3:12: rule 'a' is defined twice (first at p.yaml:2)"
        " — expected each rule name once across all playbook files"
    ]


def test_an_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        loader.load([tmp_path], CONFIG)
    assert (
        info.value.render()
        == f"{tmp_path}: no playbook files found — expected *.yaml or *.yml files"
    )


def test_nothing_given(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        loader.load([], CONFIG)
    assert info.value.render() == (
        "(nothing given): no playbook files found — expected *.yaml or *.yml files"
    )


def test_a_file_named_directly_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        loader.load([tmp_path / "absent.yaml"], CONFIG)
    assert info.value.render() == f"{tmp_path}/absent.yaml: no such file"


def test_only_yaml_files_of_a_directory_are_read(tmp_path: Path) -> None:
    directory = write(
        tmp_path,
        {
            "a.yml": rule("", name="a"),
            "b.yaml": rule("", name="b"),
            "README.md": "rules: [not yaml at all",
            "b.yaml.bak": "rules: [",
            ".c.yaml.swp": "rules: [",
            ".hidden.yaml": "rules: [",
        },
    )
    (directory / "sub.yaml").mkdir()
    (directory / "sub.yaml" / "d.yaml").write_text(rule("", name="d"))
    playbooks = loader.load([directory], CONFIG)
    assert [r.name for r in playbooks.rules] == ["a", "b"]
    assert playbooks.files == (str(directory / "a.yml"), str(directory / "b.yaml"))


def test_files_and_directories_given_together(tmp_path: Path) -> None:
    directory = write(tmp_path / "d", {"a.yaml": rule("", name="a")})
    single = write(tmp_path, {"z.yaml": rule("", name="z")}) / "z.yaml"
    playbooks = loader.load([single, directory], CONFIG)
    assert [r.name for r in playbooks.rules] == ["z", "a"]


def test_every_problem_of_one_file_is_reported_at_once(tmp_path: Path) -> None:
    text = rule(
        "    active: Mon-Fri 8-20\n    steps:\n      - notify: pager\n",
        when="gpu.tempreature_c > 80",
    )
    assert problems(tmp_path, text) == [
        "p.yaml:3:11: unknown field gpu.tempreature_c\n  hint: did you mean gpu.temperature_c?",
        "p.yaml:4:21: not a time '8' — expected a time HH:MM (24-hour, e.g. 08:00)",
        "p.yaml:6:17: unknown notification target 'pager' — expected one of: chat, oncall",
    ]


def test_two_files_each_with_one_error_are_both_reported(tmp_path: Path) -> None:
    files = {
        "a.yaml": rule("", name="a", when="gpu.index =="),
        "b.yaml": rule("    for: 1 fortnight\n", name="b"),
    }
    reported = problems_of(tmp_path, files)
    assert [r.split(": ", 1)[0] for r in reported] == ["a.yaml:3:23", "b.yaml:4:10"]


def test_one_good_file_and_one_bad_file_load_nothing(tmp_path: Path) -> None:
    files = {"a.yaml": rule("", name="good"), "b.yaml": rule("", name="bad", when="gpu.nope")}
    reported = problems_of(tmp_path, files)
    assert reported == ["b.yaml:3:11: unknown field gpu.nope\n  hint: did you mean gpu.name?"]


def test_a_notify_message_may_only_use_known_placeholders(tmp_path: Path) -> None:
    cfg = Config.model_validate({"notify": {"targets": {"oncall": {"urls": ["json://x"]}}}})
    path = tmp_path / "p.yaml"
    path.write_text(
        "rules:\n  - name: r\n    when: gpu.memory.used_pct > 90\n    steps:\n"
        '      - notify: {targets: [oncall], message: "${title} on ${hostname}: ${memory}"}\n'
    )
    with pytest.raises(InputError) as caught:
        loader.load([path], cfg)
    (problem,) = caught.value.problems
    assert problem.message == "unknown placeholder ${hostname} in the message of a gpu rule"
    assert problem.hint == "did you mean ${host}?"
    assert problem.line == 5
    path.write_text(path.read_text().replace("${hostname}", "${host}"))
    assert [r.name for r in loader.load([path], cfg).rules] == ["r"]


# -- authoring: suggestions, file order, every problem in one run ------------------------------


def test_a_misspelled_step_kind_gets_a_suggestion_and_the_list(tmp_path: Path) -> None:
    text = rule("    steps:\n      - kil: {select: process.priority <= low}\n")
    assert problems(tmp_path, text) == [
        "p.yaml:5:9: rules.0.steps.0.kil: unknown step kind 'kil' — expected one of notify, "
        "checkpoint, suspend, resume, renice, kill, requeue, power_cap, exec, provision, after, "
        "name\n"
        "  hint: did you mean kill?"
    ]


def test_structure_and_expression_problems_come_together_in_file_order(tmp_path: Path) -> None:
    text = (
        "rules:\n"
        "  - name: a\n"
        "    when: gpu.memory.used_pct >= 95 and\n"  # an expression problem, line 3
        "  - name: b\n"
        "    whn: gpu.memory.used_pct >= 95\n"  # structure problems, lines 4 and 5
        "  - name: c\n"
        "    when: gpu.temprature_c > 80\n"  # an expression problem, line 7
        "    severty: critical\n"  # a structure problem, line 8
    )
    reported = problems(tmp_path, text)
    assert [line.split(" ")[0] for line in reported] == [
        "p.yaml:3:40:",
        "p.yaml:4:5:",
        "p.yaml:5:5:",
        "p.yaml:7:11:",  # rule c's expression, although its structure is wrong too
        "p.yaml:8:5:",
    ]
    assert reported[3].endswith("\n  hint: did you mean gpu.temperature_c?")


@pytest.mark.parametrize(
    ("when", "column", "value"),
    [
        ("process.user == bob", 27, "bob"),
        ("bob == process.user", 11, "bob"),
        ("process.user in [alice, bob]", 28, "alice"),
    ],
)
def test_a_bare_name_compared_with_a_string_field_hints_at_quotes(
    tmp_path: Path, when: str, column: int, value: str
) -> None:
    text = f"rules:\n  - name: r\n    for_each: process\n    when: {when}\n"
    assert problems(tmp_path, text) == [
        f"p.yaml:4:{column}: unknown name {value}\n"
        f'  hint: process.user is a string: write "{value}" in quotes'
    ]


def test_a_bare_name_next_to_a_number_gets_no_quote_hint(tmp_path: Path) -> None:
    text = "rules:\n  - name: r\n    for_each: process\n    when: process.gpu_memory_mib > big\n"
    assert problems(tmp_path, text) == ["p.yaml:4:36: unknown name big"]


def test_a_host_rule_killing_without_select_loads_with_a_warning(tmp_path: Path) -> None:
    text = (
        "rules:\n  - name: r\n    for_each: host\n    when: host.gpus_lost > 0\n"
        "    steps:\n      - kill: {}\n      - suspend: {select: process.priority <= low}\n"
    )
    directory = write(tmp_path / "playbooks", {"p.yaml": text})
    loaded = loader.load([directory], CONFIG)
    assert [w.render().replace(f"{directory}/", "") for w in loaded.warnings] == [
        "p.yaml:6:15: kill without select in a host rule chooses among every process on every "
        "GPU of the machine\n"
        "  hint: say which: kill: {select: process.priority <= low} (and free_until or limit "
        "to stop early)"
    ]
    gpu_rule = text.replace("for_each: host", "for_each: gpu").replace(
        "host.gpus_lost > 0", "gpu.lost"
    )
    assert loader.load([write(tmp_path / "g", {"p.yaml": gpu_rule})], CONFIG).warnings == ()
