"""Cloud tags, launch tokens, expiry stamps and user-data templates: what gpuwarden writes on
an instance and reads back from it."""

from __future__ import annotations

import string
from datetime import UTC, datetime

import pytest

from gpuwarden.cloud import tags
from gpuwarden.config import CloudProfile

EXPIRY = datetime(2026, 11, 30, 8, 0, 0, tzinfo=UTC).timestamp()


def profile(**fields: object) -> CloudProfile:
    base: dict[str, object] = {
        "region": "us-east-1",
        "instance_types": ["p4d.24xlarge"],
        "ami": "ami-0123456789abcdef0",
    }
    base.update(fields)
    return CloudProfile.model_validate(base)


def tags_for(p: CloudProfile, incident: str = "20261130T075900-gpu-hot-gpu0") -> dict[str, str]:
    return tags.instance_tags(
        profile_name="burst",
        profile_tags=p.tags,
        incident=incident,
        rule="gpu-hot",
        host="node7",
        step=2,
        expires_at=EXPIRY,
    )


# --- instance tags -------------------------------------------------------------------------


def test_an_instance_carries_every_gpuwarden_tag_and_a_name() -> None:
    assert tags_for(profile()) == {
        "gpuwarden:managed": "true",
        "gpuwarden:incident": "20261130T075900-gpu-hot-gpu0",
        "gpuwarden:host": "node7",
        "gpuwarden:rule": "gpu-hot",
        "gpuwarden:profile": "burst",
        "gpuwarden:step": "2",
        "gpuwarden:expires": "2026-11-30T08:00:00Z",
        "Name": "gpuwarden-20261130T075900-gpu-hot-gpu0",
    }


def test_the_tag_constants_are_the_keys_written() -> None:
    written = tags_for(profile())
    for key in (
        tags.MANAGED,
        tags.INCIDENT,
        tags.HOST,
        tags.RULE,
        tags.PROFILE,
        tags.STEP,
        tags.EXPIRES,
    ):
        assert key in written
        assert key.startswith(tags.PREFIX)
    assert set(tags.OWN_KEYS) == set(written)


def test_profile_tags_are_added() -> None:
    written = tags_for(profile(tags={"team": "ml-infra", "cost-center": "4711"}))
    assert written["team"] == "ml-infra"
    assert written["cost-center"] == "4711"
    assert written[tags.MANAGED] == "true"
    assert len(written) == len(tags.OWN_KEYS) + 2


def test_a_profile_may_name_its_instances() -> None:
    assert tags_for(profile(tags={"Name": "burst-node"}))["Name"] == "burst-node"


def test_reserved_keys_win_over_profile_tags_even_past_validation() -> None:
    # The config refuses gpuwarden:* keys in a profile; a profile built without validation
    # (or by a future code path) still cannot replace them.
    sneaky = profile().model_copy(
        update={"tags": {tags.MANAGED: "false", tags.INCIDENT: "other", tags.EXPIRES: "never"}}
    )
    written = tags_for(sneaky)
    assert written[tags.MANAGED] == "true"
    assert written[tags.INCIDENT] == "20261130T075900-gpu-hot-gpu0"
    assert written[tags.EXPIRES] == "2026-11-30T08:00:00Z"


def test_tags_of_different_incidents_differ_only_where_they_should() -> None:
    a = tags_for(profile(), incident="a")
    b = tags_for(profile(), incident="b")
    assert {k for k in a if a[k] != b[k]} == {tags.INCIDENT, "Name"}


# --- tag lists from EC2 --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, {}),
        ([], {}),
        ([{"Key": "a", "Value": "1"}, {"Key": "b", "Value": "2"}], {"a": "1", "b": "2"}),
        ([{"Key": "a"}], {"a": ""}),
        ([{"Value": "lost"}, {"Key": "k", "Value": "v"}], {"k": "v"}),
        ([{"Key": "a", "Value": "1"}, {"Key": "a", "Value": "2"}], {"a": "2"}),
    ],
    ids=["none", "empty", "two", "no-value", "no-key-skipped", "last-wins"],
)
def test_tag_dict(raw: list[dict[str, str]] | None, expected: dict[str, str]) -> None:
    assert tags.tag_dict(raw) == expected


def test_tag_dict_reads_what_instance_tags_wrote() -> None:
    written = tags_for(profile(tags={"team": "x"}))
    as_ec2 = [{"Key": k, "Value": v} for k, v in written.items()]
    assert tags.tag_dict(as_ec2) == written


# --- expiry --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("t", "text"),
    [
        (EXPIRY, "2026-11-30T08:00:00Z"),
        (0.0, "1970-01-01T00:00:00Z"),
        (EXPIRY + 0.999, "2026-11-30T08:00:00Z"),
        (1_700_000_001.0, "2023-11-14T22:13:21Z"),
        (-5.0, "1970-01-01T00:00:00Z"),
        (1e20, "9999-12-31T23:59:59Z"),
        (float("inf"), "9999-12-31T23:59:59Z"),
        (float("nan"), "1970-01-01T00:00:00Z"),
    ],
    ids=["example", "epoch", "fraction-dropped", "odd", "before-1970", "far", "inf", "nan"],
)
def test_format_expires(t: float, text: str) -> None:
    assert tags.format_expires(t) == text


@pytest.mark.parametrize("t", [0.0, 1.0, EXPIRY, 1_700_000_001.0, 4_102_444_800.0])
def test_expiry_round_trips_to_the_second(t: float) -> None:
    assert tags.parse_expires(tags.format_expires(t)) == t
    assert tags.parse_expires(tags.format_expires(t + 0.5)) == t


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30T08:00:00Z", EXPIRY),
        ("2026-11-30T08:00:00+00:00", EXPIRY),
        ("2026-11-30T10:00:00+02:00", EXPIRY),
        ("2026-11-30T08:00:00", EXPIRY),
        (" 2026-11-30T08:00:00Z ", EXPIRY),
        ("2026-11-30T08:00:00.5Z", EXPIRY + 0.5),
        ("", None),
        ("   ", None),
        ("never", None),
        ("2026-13-01T00:00:00Z", None),
        ("1764489600", None),
    ],
    ids=[
        "ours",
        "offset-zero",
        "offset",
        "naive-is-utc",
        "spaces",
        "fraction",
        "empty",
        "blank",
        "word",
        "month-13",
        "epoch-number",
    ],
)
def test_parse_expires(text: str, expected: float | None) -> None:
    assert tags.parse_expires(text) == expected


# --- client tokens -------------------------------------------------------------------------


def test_a_client_token_is_deterministic() -> None:
    first = tags.client_token("inc-1", 0, "p4d.24xlarge@subnet-1")
    assert first == tags.client_token("inc-1", 0, "p4d.24xlarge@subnet-1")
    # Fixed across runs and versions of Python: a restart must ask for the same launch.
    assert first == tags.client_token("inc-1", 0, "p4d.24xlarge@subnet-1")
    assert first.startswith("gpuwarden-")


@pytest.mark.parametrize(
    ("other"),
    [
        ("inc-2", 0, "p4d.24xlarge@subnet-1"),
        ("inc-1", 1, "p4d.24xlarge@subnet-1"),
        ("inc-1", 0, "p4d.24xlarge@subnet-2"),
        ("inc-1", 0, "p5.48xlarge@subnet-1"),
        ("inc-10", 0, "p4d.24xlarge@subnet-1"),
    ],
    ids=["incident", "step", "subnet", "type", "prefix-incident"],
)
def test_a_client_token_differs_by_incident_step_and_attempt(other: tuple[str, int, str]) -> None:
    assert tags.client_token("inc-1", 0, "p4d.24xlarge@subnet-1") != tags.client_token(*other)


def test_a_client_token_cannot_be_forged_by_moving_text_between_parts() -> None:
    assert tags.client_token("a-1", 2, "x") != tags.client_token("a", 12, "x")
    assert tags.client_token("a", 1, "-x") != tags.client_token("a-", 1, "x")


@pytest.mark.parametrize(
    ("incident", "step", "attempt"),
    [
        ("", 0, ""),
        ("x" * 10_000, 999_999, "y" * 10_000),
        ("ünïcode-😀", -1, "type@subnet"),
        ("with\nnewline", 3, "tab\there"),
    ],
    ids=["empty", "long", "unicode", "control"],
)
def test_a_client_token_is_at_most_64_printable_ascii(
    incident: str, step: int, attempt: str
) -> None:
    token = tags.client_token(incident, step, attempt)
    assert 0 < len(token) <= 64
    assert all(ch in string.printable and not ch.isspace() for ch in token)


def test_tokens_of_many_launches_do_not_collide() -> None:
    tokens = {
        tags.client_token(f"inc-{i}", step, f"t{j}")
        for i in range(30)
        for step in range(5)
        for j in range(4)
    }
    assert len(tokens) == 30 * 5 * 4


# --- user data -----------------------------------------------------------------------------

VALUES = {
    "incident": "inc-1",
    "rule": "gpu-hot",
    "host": "node7",
    "profile": "burst",
    "instance_type": "p4d.24xlarge",
    "expires": "2026-11-30T08:00:00Z",
}


def test_user_data_names() -> None:
    assert frozenset(VALUES) == tags.USER_DATA_NAMES


@pytest.mark.parametrize(
    ("template", "rendered"),
    [
        ("", ""),
        ("#!/bin/sh\necho hi\n", "#!/bin/sh\necho hi\n"),
        ("${incident}", "inc-1"),
        (
            "join ${incident} ${rule} ${host} ${profile} ${instance_type} ${expires}",
            "join inc-1 gpu-hot node7 burst p4d.24xlarge 2026-11-30T08:00:00Z",
        ),
        ("cost: $$5", "cost: $5"),
        ("$$$$", "$$"),
        ("echo $${HOME} $$HOME", "echo ${HOME} $HOME"),
        ("$${incident}", "${incident}"),
        ("$$${incident}", "$inc-1"),
        ("${host}${host}", "node7node7"),
        ("a\n  b=${rule}\n", "a\n  b=gpu-hot\n"),
    ],
    ids=[
        "empty",
        "no-dollars",
        "one",
        "all",
        "escaped",
        "two-escaped",
        "shell-vars-escaped",
        "escaped-known-name",
        "escaped-then-name",
        "adjacent",
        "multiline",
    ],
)
def test_render_user_data(template: str, rendered: str) -> None:
    assert tags.user_data_problems(template) == []
    assert tags.render_user_data(template, VALUES) == rendered


def test_render_only_reaches_the_known_names() -> None:
    values = {**VALUES, "secret": "hunter2", "HOME": "/root"}
    with pytest.raises(ValueError, match=r"unknown name \$\{secret\}"):
        tags.render_user_data("${secret}", values)
    with pytest.raises(ValueError, match=r"unknown name \$\{HOME\}"):
        tags.render_user_data("${HOME}", values)


def test_render_refuses_a_template_using_a_name_without_a_value() -> None:
    with pytest.raises(
        ValueError, match=r"no value for \$\{expires\}, \$\{host\} in the user data"
    ):
        tags.render_user_data("${host} ${expires} ${incident}", {"incident": "i"})


def test_values_are_inserted_verbatim_and_never_reinterpreted() -> None:
    values = {**VALUES, "host": "${incident}$$"}
    assert tags.render_user_data("h=${host}", values) == "h=${incident}$$"


@pytest.mark.parametrize(
    ("template", "problems"),
    [
        (
            "echo $HOME",
            ["$HOME at line 1 col 6: write $$HOME for the script to see $HOME"],
        ),
        ("$incident", ["$incident at line 1 col 1: write ${incident}"]),
        (
            "a\nb ${HOME}",
            [
                "unknown name ${HOME} at line 2 col 3: gpuwarden fills in only ${expires}, "
                "${host}, ${incident}, ${instance_type}, ${profile}, ${rule}; "
                "write $${HOME} to pass ${HOME} on to the script"
            ],
        ),
        (
            "${Incident}",
            [
                "unknown name ${Incident} at line 1 col 1: gpuwarden fills in only ${expires}, "
                "${host}, ${incident}, ${instance_type}, ${profile}, ${rule}; "
                "write $${Incident} to pass ${Incident} on to the script"
            ],
        ),
        ("price: 5$", ["a lone $ at line 1 col 9: write $$ for a literal dollar"]),
        ("$ 5", ["a lone $ at line 1 col 1: write $$ for a literal dollar"]),
        ("$1", ["a lone $ at line 1 col 1: write $$ for a literal dollar"]),
        ("x ${incident", ["an unclosed ${ at line 1 col 3: write ${name}, or $$ for a dollar"]),
        ("${host\n}", ["an unclosed ${ at line 1 col 1: write ${name}, or $$ for a dollar"]),
        (
            "${}",
            [
                "an empty ${} at line 1 col 1: write ${name} with one of ${expires}, ${host}, "
                "${incident}, ${instance_type}, ${profile}, ${rule}"
            ],
        ),
        (
            "$$$",
            ["a lone $ at line 1 col 3: write $$ for a literal dollar"],
        ),
    ],
    ids=[
        "shell-var",
        "unbraced-known-name",
        "unknown-braced",
        "case-matters",
        "trailing",
        "space",
        "digit",
        "unclosed",
        "brace-over-newline",
        "empty-braces",
        "odd-dollars",
    ],
)
def test_user_data_problems(template: str, problems: list[str]) -> None:
    assert tags.user_data_problems(template) == problems
    with pytest.raises(ValueError, match=r"\$") as caught:
        tags.render_user_data(template, VALUES)
    assert str(caught.value) == "; ".join(problems)


def test_every_bad_dollar_is_reported_in_order() -> None:
    found = tags.user_data_problems("#!/bin/sh\necho $USER ${incident} ${PATH}\nexit $?\n")
    assert [p.split(" at ")[0] for p in found] == ["$USER", "unknown name ${PATH}", "a lone $"]
    assert [p.split(" at ")[1].split(":")[0] for p in found] == [
        "line 2 col 6",
        "line 2 col 24",
        "line 3 col 6",
    ]


def test_user_data_larger_than_ec2_takes_is_refused() -> None:
    fits = "#" * tags.MAX_USER_DATA
    assert tags.user_data_problems(fits) == []
    assert tags.user_data_problems(fits + "é") == [
        f"the user data is {tags.MAX_USER_DATA + 2} bytes; EC2 takes at most 16384"
    ]


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        (None, ["$a", "$b", "$c", "$d"]),
        (4, ["$a", "$b", "$c", "$d"]),
        (2, ["$a", "$b", "and 2 more"]),
        (0, ["and 4 more"]),
    ],
)
def test_problems_can_be_shortened(shown: int | None, expected: list[str]) -> None:
    found = tags.user_data_problems("$a $b $c $d", shown=shown)
    assert [p.split(" at ")[0] for p in found] == expected
