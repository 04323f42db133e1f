"""Messages for people: templates with safe substitution, facts escaped for the target's format.

A template is text with ``${name}`` placeholders over a flat mapping of strings. Nothing else is
special: there is no attribute access, no format spec, no expression, no escape sequence. A
placeholder whose name is unknown, ``${x.y}``, ``{x}`` and a lone ``$`` stay as literal text.

Template text is trusted (on-call staff write it); fact values are not (a process name or a
command line is chosen by whoever started the process). Every fact value is cleaned (control
characters and ANSI sequences removed, newlines flattened, length capped) and then escaped for
the body format of the target it goes to, before it is substituted:

- ``text``: cleaned, mentions neutralised;
- ``markdown``: Markdown punctuation backslash-escaped, links and mentions neutralised;
- ``html``: ``html.escape``, links and mentions neutralised.

Mentions are neutralised in every format and at any position, since chat services act on them
wherever they stand (``a@everyone`` pings a Discord server): a word joiner (U+2060) goes after
every ``@`` that a name follows (``@everyone``, ``@here``, ``@channel``, ``@user``), after a
``!`` that starts a word (``!here``), and between ``<`` and ``@``/``!``/``#`` (Slack's
``<!channel>``, ``<@U024BE7LH>``, ``<#C024BE7LR>``; Discord's ``<@123>``, ``<@&role>``). The
text still reads the same.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from gpuwarden.model import GpuProcess, GpuState, Intent, Outcome, Target
from gpuwarden.notify.grouping import Notice
from gpuwarden.playbook.templates import SCOPE_FACT_NAMES, render
from gpuwarden.units import format_duration

BodyFormat = Literal["text", "markdown", "html"]
Kind = Literal["open", "step", "resolve", "reminder", "test", "admin", "owner"]
MARKERS = ("", "[DRILL]", "[DRY-RUN]")
# Our severity -> apprise's NotifyType; a resolve message is always "success".
APPRISE_TYPES = {"info": "info", "warning": "warning", "critical": "failure"}
VALUE_LIMIT = 200  # characters of one fact value
LIST_LIMIT = 12  # items of one list (GPUs, actions) before "and N more"

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_SPACES = re.compile(r"\s+")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]()~>#+\-=|{}.!<])")
_MENTION = re.compile(r"(@)(?=\w)|(?<![\w.])(!)(?=\w)|(<)(?=[@!#])")
_SCHEME = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{1,15}):(?=//)")
_GPU_WHERE = re.compile(r"^GPU (\d+)$")


@dataclass(frozen=True, slots=True)
class Message:
    """One message for one named target, ready for the outbox.

    ``id`` is a digest of the group key, kind, sequence and target: the same decision made
    again (a restart replaying a tick) yields the same id, which the outbox deduplicates.
    """

    id: str
    target: str
    title: str
    body: str
    severity: str  # info | warning | critical
    kind: str  # open | step | resolve | reminder | test | admin | owner
    incidents: tuple[str, ...]
    group: str
    created: float
    marker: str = ""  # "" | "[DRILL]" | "[DRY-RUN]"
    body_format: BodyFormat = "text"

    @property
    def notify_type(self) -> str:
        """apprise's NotifyType value: info, warning, failure; success for a resolve."""
        if self.kind == "resolve":
            return "success"
        return APPRISE_TYPES.get(self.severity, "info")


def message_id(group: str, kind: str, sequence: int, target: str) -> str:
    raw = "\x1f".join((group, kind, str(sequence), target))
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


# -- escaping ---------------------------------------------------------------------------------


def clean(value: object, limit: int = VALUE_LIMIT) -> str:
    """One line of printable text: ANSI sequences and control characters removed, every run
    of whitespace (newlines included) made one space, at most ``limit`` characters."""
    text = _ANSI.sub("", str(value))
    text = "".join(
        " " if ch.isspace() else ch
        for ch in text
        if ch.isspace() or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn")
    )
    text = _SPACES.sub(" ", text).strip()
    if len(text) > limit:
        text = text[: max(0, limit - 1)].rstrip() + "…"
    return text


def guard_mentions(text: str) -> str:
    """Mentions a chat service would act on, anywhere in ``text``, made inert but readable:
    ``a@everyone`` → ``a@\u2060everyone``, ``<!channel>`` → ``<\u2060!\u2060channel>``."""
    return _MENTION.sub(lambda m: f"{m.group(0)}\u2060", text)


def _defang(text: str) -> str:
    """Links that a chat client would act on, made inert but readable: ``http://x`` →
    ``http[:]//x``."""
    return _SCHEME.sub(r"\1[:]", text)


def escape(value: object, body_format: BodyFormat, limit: int = VALUE_LIMIT) -> str:
    """A fact value made safe to stand in a body of ``body_format``."""
    text = guard_mentions(clean(value, limit))
    if body_format == "text":
        return text
    text = _defang(text)
    if body_format == "html":
        return html.escape(text, quote=True)
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


# -- facts ------------------------------------------------------------------------------------


def rule_title(rule: str) -> str:
    """``gpu-memory-pressure`` → ``GPU memory pressure``."""
    acronyms = {"gpu", "gpus", "cpu", "xid", "ecc", "oom", "nvml", "mig", "pcie", "nvlink"}
    words = [w for w in re.split(r"[-_.\s]+", rule) if w]
    out = [w.upper() if w.lower() in acronyms else w for w in words]
    if out and out[0] == words[0]:
        out[0] = out[0][:1].upper() + out[0][1:]
    return " ".join(out) or rule


def where_list(wheres: Iterable[str]) -> str:
    """``GPU 0``, ``GPU 3`` → ``GPUs 0, 3``; other scopes joined with commas."""
    items = list(dict.fromkeys(wheres))
    numbers = [m.group(1) for w in items if (m := _GPU_WHERE.match(w))]
    if items and len(numbers) == len(items):
        ordered = sorted(numbers, key=int)
        if len(ordered) == 1:
            return f"GPU {ordered[0]}"
        return "GPUs " + _capped(ordered)
    return _capped(items)


def _capped(items: list[str]) -> str:
    if len(items) <= LIST_LIMIT:
        return ", ".join(items)
    return ", ".join(items[:LIST_LIMIT]) + f" and {len(items) - LIST_LIMIT} more"


def _number(value: float) -> str:
    return f"{value:,.0f}".replace(",", "\u2009")


def gpu_facts(gpu: GpuState) -> dict[str, str]:
    """The current values of one GPU worth showing, by name; a value the device cannot tell
    is left out (never shown as 0)."""
    facts: dict[str, str] = {}
    mem = gpu.memory
    pct = mem.used_pct
    if pct is not None and mem.used_mib is not None and mem.total_mib is not None:
        facts["memory"] = (
            f"{pct:.1f} % used ({_number(mem.used_mib)} of {_number(mem.total_mib)} MiB)"
        )
    if gpu.temperature_c is not None:
        facts["temperature"] = f"{gpu.temperature_c} °C"
    if gpu.utilization_pct is not None:
        facts["utilization"] = f"{gpu.utilization_pct} %"
    if gpu.power_w is not None:
        limit = f" of {gpu.power_limit_w:.0f} W" if gpu.power_limit_w is not None else ""
        facts["power"] = f"{gpu.power_w:.0f} W{limit}"
    if gpu.lost:
        facts["state"] = "lost" + (f": {gpu.error}" if gpu.error else "")
    return facts


# Who and what an incident is about (the ``${gpu}``, ``${user}``, ``${pid}``, ``${job}``,
# ``${command}`` of a message): names, not measurements, so never in the values line.
IDENTITY_FACT_NAMES: tuple[str, ...] = SCOPE_FACT_NAMES["process"]


def process_facts(proc: GpuProcess) -> dict[str, str]:
    """The identity of the process a process rule's incident is about (raw; escaped when
    substituted)."""
    info = proc.info
    facts = {"gpu": str(proc.gpu), "pid": str(proc.pid)}
    if info.user:
        facts["user"] = info.user
    job = info.job
    if job:
        facts["job"] = job
    if info.command:
        facts["command"] = info.command
    return facts


def values_line(where: str, facts: Mapping[str, str]) -> str:
    """``GPU 0: memory 97.6 % used (…), temperature 76 °C`` (raw; escape before use)."""
    shown = [
        f"{k} {v}" for k, v in facts.items() if k != "description" and k not in IDENTITY_FACT_NAMES
    ]
    return f"{where}: " + ", ".join(shown) if shown else ""


def target_phrase(target: Target) -> str:
    """``pid 4242 (bob, low, 28900 MiB, python sweep.py)`` (raw; escape before use)."""
    parts = [target.user or "unknown user", target.priority]
    if target.gpu_memory_mib is not None:
        parts.append(f"{target.gpu_memory_mib} MiB")
    if target.command:
        parts.append(target.command)
    return f"pid {target.pid} ({', '.join(parts)})"


def action_lines(intent: Intent, outcome: Outcome | None) -> list[str]:
    """One line per target of a step with what happened to it (raw; escape before use)."""
    verb = intent.label if intent.label != intent.kind else intent.kind
    if outcome is None:
        state = "in progress"
    elif outcome.dry_run:
        state = "would run (dry run)"
    else:
        state = "done" if outcome.ok else "failed"
    if outcome is not None and outcome.detail and not intent.targets:
        state += f" ({outcome.detail})"
    if not intent.targets:
        why = "" if intent.reason.value == "step_due" else f", {intent.reason.value}"
        return [f"{verb}{why}: {state}"]
    results = {(r.pid, r.create_time): r for r in (outcome.targets if outcome else ())}
    lines = []
    for target in intent.targets:
        result = results.get((target.pid, target.create_time))
        said = result.state if result is not None else state
        if result is not None and result.detail and not result.ok:
            said += f" ({result.detail})"
        lines.append(f"{verb} {target_phrase(target)}: {said}")
    return lines


def local_time(epoch: float, tz: dt.tzinfo) -> str:
    return dt.datetime.fromtimestamp(epoch, tz).strftime("%Y-%m-%d %H:%M %Z")


# -- composing --------------------------------------------------------------------------------

TITLES: dict[str, str] = {
    "open": "${prefix}[${SEVERITY}] ${title} on ${host}: ${where}",
    "step": "${prefix}[${SEVERITY}] ${title} on ${host}: ${where} (update)",
    "resolve": "${prefix}[RESOLVED] ${title} on ${host}: ${where}",
    "reminder": "${prefix}[REMINDER] ${title} on ${host}: ${where}, open ${duration}",
}
BODIES: dict[str, str] = {
    "open": "${description}\n\n${values}\n\n${actions}\n\n"
    "Incident ${incidents}, opened ${opened}.\nTimeline: ${timeline}\nAcknowledge: ${ack}",
    "step": "${changes}\n\n${actions}\n\n${values}\n\nIncident ${incidents}.\n"
    "Timeline: ${timeline}",
    "resolve": "Resolved after ${duration}.\n\n${changes}\n\n${actions}\n\n"
    "Incident ${incidents}, opened ${opened}.\nTimeline: ${timeline}",
    "reminder": "Still open after ${duration} and not acknowledged.\n\n${values}\n\n"
    "Incident ${incidents}, opened ${opened}.\nAcknowledge: ${ack}",
}
FOOTER = "\n\nTimeline: ${timeline}"
_BLANK_LINES = re.compile(r"\n{3,}")


def _lines(items: list[str], body_format: BodyFormat) -> str:
    if not items:
        return ""
    shown = items[:LIST_LIMIT]
    if len(items) > LIST_LIMIT:
        shown.append(f"… and {len(items) - LIST_LIMIT} more")
    if body_format == "html":
        return "<br>".join(f"• {line}" for line in shown)
    return "\n".join(f"- {line}" for line in shown)


def notice_facts(
    notice: Notice,
    *,
    host: str,
    marker: str,
    description: str,
    tz: dt.tzinfo,
    body_format: BodyFormat,
) -> dict[str, str]:
    """The facts of one notice, every value escaped for ``body_format``."""

    def esc(value: object) -> str:
        return escape(value, body_format)

    members = notice.members
    if notice.kind in ("open", "reminder"):
        shown = [m for m in members if m.resolved is None] or list(members)
        if notice.kind == "reminder":
            shown = [m for m in shown if not m.acked] or shown
    elif notice.kind == "step":
        shown = [m for m in members if m.resolved is None or m.incident in notice.resolved]
    else:
        shown = list(members)
    first = min((m.opened for m in members), default=notice.time)
    ids = [m.incident for m in shown] or list(notice.incidents)
    head = ids[0] if ids else ""
    by_id = {m.incident: m for m in members}
    changes = [f"{by_id[i].where} joined" for i in notice.joined if i in by_id]
    changes += [
        f"{by_id[i].where} {'handled: its ladder has run' if by_id[i].handled else 'resolved'}"
        for i in notice.resolved
        if i in by_id
    ]
    still = [m.where for m in members if m.resolved is None]
    if notice.resolved and still and notice.kind == "step":
        changes.append(f"still open: {where_list(still)}")
    actions = [
        line
        for step in notice.steps
        for line in action_lines(step.intent, step.outcome)
        if step.intent.incident in by_id
    ]
    values = [
        line
        for m in shown
        if (m.resolved is None or m.handled) and (line := values_line(m.where, dict(m.facts)))
    ]
    facts: dict[str, str] = {}
    if shown:
        for key, value in shown[0].facts:
            if key.isidentifier():
                facts[key] = esc(value)
    facts.update(
        prefix=f"{marker} " if marker else "",
        marker=marker,
        kind=notice.kind,
        host=esc(host),
        rule=esc(notice.rule),
        title=esc(rule_title(notice.rule)),
        description=esc(description),
        severity=esc(notice.severity),
        SEVERITY=esc(notice.severity.upper()),
        where=esc(where_list(m.where for m in shown)),
        incident=esc(head),
        incidents=esc(_capped(ids)),
        count=str(len(ids)),
        opened=esc(local_time(first, tz)),
        duration=esc(format_duration(_end(notice) - first)),
        values=_lines([esc(v) for v in values], body_format),
        actions=_lines([esc(a) for a in actions], body_format),
        changes=_lines([esc(c) for c in changes], body_format),
        timeline=esc(f"gpuwarden incident {head}"),
        ack=esc(f"gpuwarden ack {head}" + (" (one per incident)" if len(ids) > 1 else "")),
    )
    return facts


def _end(notice: Notice) -> float:
    """When what the message reports ended: the last resolve for a resolve message (it may go
    out later, batched by ``group_interval``), the notice's own time otherwise."""
    ends = [m.resolved for m in notice.members if m.resolved is not None]
    return max(ends) if notice.kind == "resolve" and ends else notice.time


def compose(
    notice: Notice,
    target: str,
    *,
    host: str,
    tz: dt.tzinfo,
    marker: str = "",
    description: str = "",
    body_format: BodyFormat = "text",
) -> Message:
    """One target's message for a notice."""
    facts = notice_facts(
        notice,
        host=host,
        marker=marker,
        description=description,
        tz=tz,
        body_format=body_format,
    )
    title = guard_mentions(clean(render(TITLES.get(notice.kind, TITLES["step"]), facts), 250))
    if notice.template is not None:
        body = render(notice.template, facts)
        if "${timeline}" not in notice.template:
            body += render(FOOTER, facts)
    else:
        body = render(BODIES.get(notice.kind, BODIES["step"]), facts)
    body = _BLANK_LINES.sub("\n\n", body).strip()
    if body_format == "html":
        body = body.replace("\n", "<br>\n")
    return Message(
        id=message_id(notice.group, notice.kind, notice.sequence, target),
        target=target,
        title=title,
        body=body,
        severity=notice.severity,
        kind=notice.kind,
        incidents=notice.incidents,
        group=notice.group,
        created=notice.time,
        marker=marker,
        body_format=body_format,
    )
