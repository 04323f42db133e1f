"""Cloud profiles in gpuwarden.yaml: a profile that could launch the wrong thing, overspend,
clash with gpuwarden's own tags or break its user data is refused at load, at its position."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuwarden import config
from gpuwarden.cloud import tags
from gpuwarden.config import Cloud, CloudProfile
from gpuwarden.errors import InputError

ROOT = Path(__file__).resolve().parent.parent

# A valid profile; each case below changes or adds lines after it.
HEAD = """\
cloud:
  profiles:
    burst:
      region: us-east-1
      instance_types: [p4d.24xlarge, p5.48xlarge]
"""
AMI = "      ami: ami-0123456789abcdef0\n"


def load(tmp_path: Path, text: str) -> config.Config:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(text, encoding="utf-8")
    return config.load(path)


def refused(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(InputError) as caught:
        load(tmp_path, text)
    prefix = f"{tmp_path / 'gpuwarden.yaml'}:"
    rendered = [p.render() for p in caught.value.problems]
    assert all(text.startswith(prefix) for text in rendered), rendered
    return [text.removeprefix(prefix) for text in rendered]


def test_the_shipped_config_has_a_valid_profile() -> None:
    cfg = config.load(ROOT / "config" / "gpuwarden.yaml")
    assert cfg.cloud.profiles
    for p in cfg.cloud.profiles.values():
        assert (p.launch_template is None) != (p.ami is None)
    assert cfg.cloud.reap_interval == 60.0


def test_a_full_profile_loads(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        HEAD
        + textwrap.indent(
            textwrap.dedent(
                """\
                launch_template: gpu-burst
                subnets: [subnet-0a1b2c3d, subnet-0123456789abcdef0]
                security_groups: [sg-0123abcd]
                key_name: ops
                market: spot
                count: 2
                max_instances: 4
                max_hourly_usd: 300
                prices: {p4d.24xlarge: 32.77, p5.48xlarge: 98.32, g5.xlarge: 1.0}
                ttl: 4h
                linger: 0
                tags: {team: ml, Name: burst}
                user_data: |
                  #!/bin/sh
                  echo "${incident} ${rule} ${host} ${profile} ${instance_type} ${expires}"
                  echo "$${HOME} costs $$5"
                """
            ),
            "      ",
        )
        + "  reap_interval: 2m\n",
    )
    p = cfg.cloud.profiles["burst"]
    assert p.launch_template == "gpu-burst"
    assert p.ami is None
    assert p.subnets == ("subnet-0a1b2c3d", "subnet-0123456789abcdef0")
    assert p.security_groups == ("sg-0123abcd",)
    assert (p.ttl, p.linger) == (4 * 3600.0, 0.0)
    assert p.prices["p5.48xlarge"] == 98.32
    assert p.user_data is not None
    assert tags.user_data_problems(p.user_data) == []
    assert cfg.cloud.reap_interval == 120.0


def test_defaults(tmp_path: Path) -> None:
    p = load(tmp_path, HEAD + AMI).cloud.profiles["burst"]
    assert (p.ttl, p.linger, p.max_instances, p.count, p.max_hourly_usd) == (
        8 * 3600.0,
        1800.0,
        1,
        1,
        None,
    )
    assert Cloud().reap_interval == 60.0


def test_without_a_budget_prices_are_optional(tmp_path: Path) -> None:
    p = load(tmp_path, HEAD + AMI + "      prices: {p4d.24xlarge: 32.77}\n").cloud.profiles
    assert p["burst"].prices == {"p4d.24xlarge": 32.77}


def test_prices_may_list_more_types_than_the_profile_uses(tmp_path: Path) -> None:
    text = HEAD + AMI + "      max_hourly_usd: 100\n"
    text += "      prices: {p4d.24xlarge: 1, p5.48xlarge: 2, g5.xlarge: 3}\n"
    assert load(tmp_path, text).cloud.profiles["burst"].max_hourly_usd == 100


NEITHER = (
    "3:5: cloud.profiles.burst: say what to boot: set launch_template (a template id lt-… or "
    "its name) or ami (an image id ami-…)"
)
BOTH = (
    "4:7: cloud.profiles.burst: set launch_template or ami, not both: the launch template "
    "names its own image; remove ami, or remove launch_template and keep ami"
)
KNOWN = "${expires}, ${host}, ${incident}, ${instance_type}, ${profile}, ${rule}"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("", [NEITHER.replace("3:5:", "4:7:")]),
        ("      launch_template: lt-0123\n" + AMI, [BOTH]),
        (
            AMI + "      max_hourly_usd: 50\n",
            [
                "4:7: cloud.profiles.burst: max_hourly_usd needs the hourly price of every "
                "instance type; prices has none for p4d.24xlarge, p5.48xlarge"
            ],
        ),
        (
            AMI + "      max_hourly_usd: 50\n      prices: {p5.48xlarge: 98.32, g5: 1}\n",
            [
                "8:15: cloud.profiles.burst.prices: max_hourly_usd needs the hourly price of "
                "every instance type; prices has none for p4d.24xlarge"
            ],
        ),
        (
            AMI + "      prices: {p4d.24xlarge: 0}\n",
            [
                "7:30: cloud.profiles.burst.prices.p4d.24xlarge: input should be greater "
                "than 0 (got 0)"
            ],
        ),
        (
            AMI + "      ttl: 0\n",
            ["7:12: cloud.profiles.burst.ttl: input should be greater than 0 (got 0.0)"],
        ),
        (
            AMI + "      ttl: 0s\n",
            ["7:12: cloud.profiles.burst.ttl: input should be greater than 0 (got 0.0)"],
        ),
        (
            AMI + "      linger: -1m\n",
            [
                "7:15: cloud.profiles.burst.linger: not a duration: '-1m' (write e.g. 30s, 2m, "
                "1h30m)"
            ],
        ),
        (
            AMI + "      linger: -5\n",
            ["7:15: cloud.profiles.burst.linger: a duration cannot be negative: -5"],
        ),
        (
            AMI + "      subnets: [subnet-0abc, us-east-1a]\n",
            [
                "7:30: cloud.profiles.burst.subnets.1: 'us-east-1a' is not a subnet id: write "
                "it as subnet-0123456789abcdef0"
            ],
        ),
        (
            AMI + "      subnets: [subnet-0abc, subnet-0abc]\n",
            ["7:16: cloud.profiles.burst.subnets: listed more than once: subnet-0abc"],
        ),
        (
            AMI + "      security_groups:\n        - sg-0abc\n        - default\n",
            [
                "9:11: cloud.profiles.burst.security_groups.1: 'default' is not a security "
                "group id: write it as sg-0123456789abcdef0 (group names are not accepted)"
            ],
        ),
        (
            AMI.replace("ami:", "instance_types: [g5, g5]\n      ami:"),
            [
                "6:7: duplicate key 'instance_types' (first at line 5) — "
                "expected each key once per mapping\n  hint: YAML would silently keep only "
                "the last one; remove or merge them"
            ],
        ),
        (
            AMI + "      user_data: |\n        #!/bin/sh\n        echo ${HOME} $PATH\n",
            [
                "7:18: cloud.profiles.burst.user_data: unknown name ${HOME} at line 2 col 6: "
                f"gpuwarden fills in only {KNOWN}; write $${{HOME}} to pass ${{HOME}} on to "
                "the script; $PATH at line 2 col 14: write $$PATH for the script to see $PATH"
            ],
        ),
        (
            AMI + "      user_data: 'echo $incident costs 5$'\n",
            [
                "7:18: cloud.profiles.burst.user_data: $incident at line 1 col 6: write "
                "${incident}; a lone $ at line 1 col 23: write $$ for a literal dollar"
            ],
        ),
        (
            AMI + "      user_data: '$a $b $c $d $e'\n",
            [
                "7:18: cloud.profiles.burst.user_data: $a at line 1 col 1: write $$a for the "
                "script to see $a; $b at line 1 col 4: write $$b for the script to see $b; "
                "$c at line 1 col 7: write $$c for the script to see $c; and 2 more"
            ],
        ),
        (
            AMI + "      tags:\n        team: ml\n        gpuwarden:managed: 'false'\n",
            [
                "9:28: cloud.profiles.burst.tags.gpuwarden:managed: tag 'gpuwarden:managed': "
                "keys starting with 'gpuwarden:' are reserved; gpuwarden writes them itself"
            ],
        ),
        (
            AMI + "      tags: {'aws:cloudformation:stack-name': x}\n",
            [
                "7:47: cloud.profiles.burst.tags.aws:cloudformation:stack-name: tag "
                "'aws:cloudformation:stack-name': keys starting with 'aws:' are reserved by AWS"
            ],
        ),
        (
            AMI + "      tags: {'': x}\n",
            ["7:18: cloud.profiles.burst.tags.: a tag key cannot be empty"],
        ),
        (
            AMI + f"      tags: {{{'k' * 129}: x}}\n",
            [
                f"7:{14 + 129 + 2}: cloud.profiles.burst.tags.{'k' * 129}: tag key "
                "'kkkkkkkkkkkkkkkkkkkk'... is 129 characters; EC2 allows at most 128"
            ],
        ),
        (
            AMI + f"      tags: {{team: {'v' * 257}}}\n",
            [
                "7:20: cloud.profiles.burst.tags.team: tag value 'vvvvvvvvvvvvvvvvvvvv'... is "
                "257 characters; EC2 allows at most 256"
            ],
        ),
        (
            AMI + "      tags: {" + ", ".join(f"t{n}: v" for n in range(43)) + "}\n",
            [
                "7:13: cloud.profiles.burst.tags: 43 tags; EC2 allows 50 per instance and "
                "gpuwarden writes 8 itself, so at most 42 here"
            ],
        ),
        (
            AMI + "  reap_interval: 0\n",
            ["7:18: cloud.reap_interval: input should be greater than 0 (got 0.0)"],
        ),
    ],
    ids=[
        "neither-ami-nor-template",
        "both-ami-and-template",
        "budget-without-prices",
        "budget-with-a-price-missing",
        "free-price",
        "ttl-zero",
        "ttl-zero-duration",
        "linger-negative-duration",
        "linger-negative-number",
        "not-a-subnet",
        "subnet-twice",
        "not-a-security-group-id",
        "yaml-duplicate-key",
        "user-data-shell-vars",
        "user-data-unbraced-and-lone",
        "user-data-many-problems-shortened",
        "reserved-gpuwarden-tag",
        "reserved-aws-tag",
        "empty-tag-key",
        "tag-key-too-long",
        "tag-value-too-long",
        "too-many-tags",
        "reap-interval-zero",
    ],
)
def test_a_bad_profile_is_refused_at_its_position(
    tmp_path: Path, extra: str, expected: list[str]
) -> None:
    assert refused(tmp_path, HEAD + extra) == expected


def test_a_profile_may_fill_every_tag_gpuwarden_leaves_free(tmp_path: Path) -> None:
    free = tags.MAX_TAGS - len(tags.OWN_KEYS)
    text = HEAD + AMI + "      tags: {" + ", ".join(f"t{n}: v" for n in range(free)) + "}\n"
    assert len(load(tmp_path, text).cloud.profiles["burst"].tags) == free
    # Setting Name replaces gpuwarden's own: one more tag fits.
    names = ", ".join(["Name: burst", *(f"t{n}: v" for n in range(free))])
    assert len(load(tmp_path, HEAD + AMI + "      tags: {" + names + "}\n").cloud.profiles) == 1


@pytest.mark.parametrize(
    ("key", "value"),
    [("k" * 128, "v"), ("team", "v" * 256), ("Gpuwarden-team", "x"), ("awsome", "x")],
    ids=["key-at-limit", "value-at-limit", "prefix-without-colon", "aws-without-colon"],
)
def test_tags_at_the_limits_load(tmp_path: Path, key: str, value: str) -> None:
    text = HEAD + AMI + f"      tags: {{'{key}': '{value}'}}\n"
    assert load(tmp_path, text).cloud.profiles["burst"].tags == {key: value}


def test_every_profile_is_checked(tmp_path: Path) -> None:
    text = (
        HEAD
        + AMI
        + textwrap.indent(
            textwrap.dedent(
                """\
            other:
              region: eu-west-1
              instance_types: [g5.xlarge]
            third:
              region: eu-west-1
              instance_types: [g5.xlarge]
              launch_template: lt-1
              security_groups: [web]
            """
            ),
            "    ",
        )
    )
    assert refused(tmp_path, text) == [
        "8:7: cloud.profiles.other: say what to boot: set launch_template (a template id lt-… "
        "or its name) or ami (an image id ami-…)",
        "14:25: cloud.profiles.third.security_groups.0: 'web' is not a security group id: "
        "write it as sg-0123456789abcdef0 (group names are not accepted)",
    ]


def test_profiles_built_in_code_are_checked_too() -> None:
    with pytest.raises(ValueError, match="say what to boot"):
        CloudProfile(region="us-east-1", instance_types=("g5",))
    with pytest.raises(ValueError, match="prices has none for g5"):
        CloudProfile(region="us-east-1", instance_types=("g5",), ami="ami-1", max_hourly_usd=1)
    assert CloudProfile(region="us-east-1", instance_types=("g5",), ami="ami-1").ami == "ami-1"


def test_caps_are_finite_and_bounded(tmp_path: Path) -> None:
    # NaN compares false with everything: a NaN cap would let any spend through.
    text = HEAD + AMI + "      max_hourly_usd: .nan\n      max_instances: 5000\n"
    text += "protected: {pids: [99999999999]}\n"
    assert refused(tmp_path, text) == [  # in file order
        "7:23: cloud.profiles.burst.max_hourly_usd: input should be a finite number (got nan)",
        "8:22: cloud.profiles.burst.max_instances: input should be less than or equal to 1000"
        " (got 5000)",
        "9:20: protected.pids.0: input should be less than or equal to 4194304 (got 99999999999)",
    ]


# -- the fleet budget ---------------------------------------------------------------------------


def test_a_fleet_budget_loads_with_its_defaults(tmp_path: Path) -> None:
    text = HEAD + AMI + "      budget: {table: gpuwarden-budget, max_instances: 8}\n"
    spec = load(tmp_path, text).cloud.profiles["burst"].budget
    assert spec is not None
    assert (spec.table, spec.key, spec.max_instances, spec.max_dollars_per_hour) == (
        "gpuwarden-budget",
        None,
        8,
        None,
    )
    assert (spec.lease, spec.region, spec.endpoint_url) == (600.0, None, None)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            "      budget: {table: gpuwarden-budget}\n",
            "7:15: cloud.profiles.burst.budget: a budget caps something: set max_instances, "
            "max_dollars_per_hour or both",
        ),
        (
            "      budget: {table: gpuwarden-budget, max_dollars_per_hour: 200}\n"
            "      prices: {p4d.24xlarge: 32.77}\n",
            "4:7: cloud.profiles.burst: budget.max_dollars_per_hour needs the hourly price of "
            "every instance type; prices has none for p5.48xlarge",
        ),
        (
            "      budget: {table: 'a b', max_instances: 2}\n",
            "7:23: cloud.profiles.burst.budget.table: 'a b' is not a DynamoDB table name: "
            "3 to 255 letters, digits, '_', '.' or '-'",
        ),
        (
            "      budget: {table: t12, max_instances: 2, lease: 90s}\n",
            "2:3: cloud: profile 'burst': budget.lease (90s) must be at least twice "
            "reap_interval (60s): leases are renewed at each reap round, and one late round "
            "must not free the slots of a live host",
        ),
    ],
    ids=["no-cap", "unpriced", "bad-table", "short-lease"],
)
def test_a_bad_budget_is_refused_at_its_position(tmp_path: Path, lines: str, expected: str) -> None:
    assert refused(tmp_path, HEAD + AMI + lines) == [expected]
