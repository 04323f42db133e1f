"""Message templates and escaping: substitution that cannot run code or reach attributes, and
fact values (process names and command lines are attacker-controlled) that cannot inject
Markdown, HTML, links, mentions or terminal escapes into a message."""

from __future__ import annotations

import datetime
import html
import re

import pytest

from gpuwarden.model import GpuState, Intent, Memory, Outcome, Reason, Target, TargetResult
from gpuwarden.notify.grouping import Member, Notice, StepNote
from gpuwarden.notify.messages import (
    BodyFormat,
    Message,
    clean,
    compose,
    escape,
    gpu_facts,
    message_id,
    rule_title,
    where_list,
)
from gpuwarden.playbook.templates import placeholders, render

UTC = datetime.UTC
T0 = datetime.datetime(2026, 3, 14, 3, 0, tzinfo=UTC).timestamp()

# -- substitution -----------------------------------------------------------------------------


def test_render_substitutes_known_names_only() -> None:
    facts = {"host": "gpu-node-07", "gpu": "0"}
    assert render("${host}: GPU ${gpu}", facts) == "gpu-node-07: GPU 0"
    assert render("${missing} stays", facts) == "${missing} stays"


@pytest.mark.parametrize(
    "template",
    [
        "${host.__class__}",
        "${host!r}",
        "${host:>30}",
        "{host}",
        "{0.__globals__}",
        "$host",
        "$$",
        "${ host }",
        "${__import__('os')}",
    ],
)
def test_render_has_no_features_beyond_names(template: str) -> None:
    assert render(template, {"host": "X"}) == template


def test_substituted_values_are_not_rendered_again() -> None:
    assert render("${a}", {"a": "${b}", "b": "boom"}) == "${b}"


def test_placeholders_lists_names_once() -> None:
    assert placeholders("${a} ${b} ${a} {c} ${d.e}") == ("a", "b")


# -- escaping ---------------------------------------------------------------------------------


def test_clean_strips_ansi_and_control_characters_and_flattens_lines() -> None:
    text = "\x1b[31mred\x1b[0m\nnext\tline\x07\x00\u202eevil"
    assert clean(text) == "red next lineevil"


def test_clean_truncates_long_values() -> None:
    value = clean("A" * 10_000)
    assert len(value) == 200
    assert value.endswith("…")


@pytest.mark.parametrize(
    ("raw", "markdown"),
    [
        ("[click](http://evil)", r"\[click\]\(http\[:\]//evil\)"),
        ("**bold**", r"\*\*bold\*\*"),
        ("_x_ `code` ~s~ # h > q", r"\_x\_ \`code\` \~s\~ \# h \> q"),
        ("a|b {c} 1.2! +-=", r"a\|b \{c\} 1\.2\! \+\-\="),
        ("back\\slash", r"back\\slash"),
    ],
)
def test_markdown_escaping(raw: str, markdown: str) -> None:
    assert escape(raw, "markdown") == markdown


MENTIONS = [
    "@here",
    "@channel",
    "@everyone",
    "<!here>",
    "<!channel>",
    "<!everyone>",
    "<@U024BE7LH>",  # Slack user
    "<#C024BE7LR>",  # Slack channel
    "<@80351110224678912>",  # Discord user
    "<@!80351110224678912>",  # Discord nickname form
    "<@&41771983423143936>",  # Discord role
    "!here",
]


@pytest.mark.parametrize("body_format", ["text", "markdown", "html"])
@pytest.mark.parametrize("mention", MENTIONS)
@pytest.mark.parametrize("around", ["python {} run", "a{}", "{}", "x{}y", "--tag={}"])
def test_mentions_are_neutralised_in_every_format_at_any_position(
    mention: str, around: str, body_format: BodyFormat
) -> None:
    out = escape(around.format(mention), body_format)
    seen = html.unescape(out).replace("\\", "")  # what a chat client parses
    assert not re.search(r"<[@!#]|@\w|(?<![\w.])!\w", seen), out
    assert seen.replace("\u2060", "") == around.format(mention)  # and what people read


def test_the_mention_guard_holds_in_titles_and_bodies_of_every_format() -> None:
    for body_format in ("text", "markdown", "html"):
        message = compose(
            kill_notice("python a@everyone <!channel> <@&41771983423143936>"),
            "oncall",
            host="gpu-node-07",
            tz=UTC,
            body_format=body_format,
        )
        for text in (message.title, message.body):
            seen = html.unescape(text).replace("\\", "")
            assert not re.search(r"<[@!#]|@\w", seen), text
        assert "python a@\u2060everyone" in html.unescape(message.body).replace("\\", "")


def test_html_escaping() -> None:
    out = escape('<script>alert("x")</script> <a href="http://evil">x</a>', "html")
    assert "<" not in out
    assert ">" not in out
    assert '"' not in out
    assert "&lt;script&gt;" in out
    assert "http://" not in out


def test_text_format_keeps_punctuation_but_not_controls() -> None:
    assert escape("**bold** [x](y)\x1b[2J", "text") == "**bold** [x](y)"


# -- facts and composing ----------------------------------------------------------------------


def test_rule_title_and_where_list() -> None:
    assert rule_title("gpu-memory-pressure") == "GPU memory pressure"
    assert rule_title("xid-79_fallen") == "XID 79 fallen"
    assert where_list(["GPU 5", "GPU 0", "GPU 3"]) == "GPUs 0, 3, 5"
    assert where_list(["GPU 2"]) == "GPU 2"
    assert where_list(["pid 4 on GPU 1", "host"]) == "pid 4 on GPU 1, host"
    assert where_list([f"GPU {i}" for i in range(20)]).endswith("11 and 8 more")


def test_gpu_facts_leave_out_what_the_device_cannot_tell() -> None:
    facts = gpu_facts(GpuState(index=0, memory=Memory(81920, 79950, 1970), temperature_c=76))
    assert facts == {
        "memory": "97.6 % used (79\u2009950 of 81\u2009920 MiB)",
        "temperature": "76 °C",
    }
    assert gpu_facts(GpuState(index=1)) == {}


EVIL = "python [click](http://evil) <script> **bold** @here \x1b[31m" + "x" * 10_000


def kill_notice(command: str = "python sweep.py --trial 17") -> Notice:
    target = Target(4242, 1.0, 0, "bob", "low", 28900, command=command)
    intent = Intent(
        id="inc-1/2",
        incident="inc-1",
        rule="gpu-memory-pressure",
        scope="gpu:0",
        step=2,
        kind="kill",
        label="kill",
        time=T0,
        reason=Reason.STEP_DUE,
        severity="critical",
        targets=(target,),
        gpu=0,
        where="GPU 0",
    )
    outcome = Outcome(ok=True, targets=(TargetResult(4242, 1.0, ok=True, state="terminated"),))
    member = Member("inc-1", "GPU 0", T0 - 150, (("memory", "99.4 % used"),))
    return Notice(
        kind="step",
        group="gpu-node-07/gpu-memory-pressure/inc-1",
        sequence=1,
        rule="gpu-memory-pressure",
        severity="critical",
        time=T0,
        targets=("oncall",),
        members=(member,),
        steps=(StepNote(intent, outcome),),
    )


def test_compose_a_kill_step_message() -> None:
    message = compose(kill_notice(), "oncall", host="gpu-node-07", tz=UTC)
    assert message.title == "[CRITICAL] GPU memory pressure on gpu-node-07: GPU 0 (update)"
    assert "- kill pid 4242 (bob, low, 28900 MiB, python sweep.py --trial 17): terminated" in (
        message.body
    )
    assert "Timeline: gpuwarden incident inc-1" in message.body
    assert message.kind == "step"
    assert message.incidents == ("inc-1",)


@pytest.mark.parametrize("body_format", ["text", "markdown", "html"])
def test_an_evil_command_line_cannot_inject(body_format: BodyFormat) -> None:
    message = compose(
        kill_notice(EVIL), "oncall", host="gpu-node-07", tz=UTC, body_format=body_format
    )
    body = message.body
    assert "\x1b" not in body
    assert len(body) < 1500  # 10 KB of command line was truncated
    assert "@here" not in body
    if body_format == "markdown":
        assert "[click](" not in body
        assert "**bold**" not in body
        assert "http://" not in body
    if body_format == "html":
        assert "<script>" not in body
        assert "http://" not in body
        assert "<br>" in body  # the only markup is ours


def test_a_step_template_sees_the_same_facts_escaped() -> None:
    templated = _with_template(kill_notice(EVIL), "*${host}* ${actions} ${nope} ${memory}")
    message = compose(templated, "chat", host="node_*1*", tz=UTC, body_format="markdown")
    assert message.body.startswith(r"*node\_\*1\** - kill pid 4242")
    assert "${nope}" in message.body
    assert r"99\.4 % used" in message.body
    assert "Timeline: gpuwarden incident inc\\-1" in message.body


def _fields(notice: Notice) -> dict[str, object]:
    return {name: getattr(notice, name) for name in Notice.__slots__}


def _with_template(notice: Notice, template: str) -> Notice:
    values = _fields(notice)
    values["template"] = template
    return Notice(**values)  # type: ignore[arg-type]


def test_message_ids_are_deterministic_and_distinct() -> None:
    a = message_id("g", "open", 0, "oncall")
    assert a == message_id("g", "open", 0, "oncall")
    assert len({a, message_id("g", "open", 0, "chat"), message_id("g", "step", 0, "oncall")}) == 3


def test_notify_type_follows_severity_and_resolve() -> None:
    base = Message("i", "t", "x", "y", "warning", "open", (), "g", T0)
    assert base.notify_type == "warning"
    resolved = Message("i", "t", "x", "y", "critical", "resolve", (), "g", T0)
    assert resolved.notify_type == "success"
