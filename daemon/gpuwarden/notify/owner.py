"""Owner messages: what the owner of a process a step acted on is told — what happened, why,
and how to avoid it next time. Facts are escaped for the target's format as in every message
(``messages.escape``). Pure: no I/O, no clock.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping

from gpuwarden.model import Intent, Target
from gpuwarden.notify.messages import (
    IDENTITY_FACT_NAMES,
    BodyFormat,
    Message,
    clean,
    escape,
    guard_mentions,
    local_time,
    message_id,
    rule_title,
    values_line,
)
from gpuwarden.playbook.templates import render

_BLANK = re.compile(r"\n{3,}")

# What happened to a process, by step kind: (title words, what the body says gpuwarden did;
# ``${process}`` is "your process 4242 (its command line)").
OWNER_ACTS: dict[str, tuple[str, str]] = {
    "checkpoint": ("was asked to save a checkpoint", "asked ${process} to save a checkpoint"),
    "suspend": ("was paused", "paused ${process} (SIGSTOP)"),
    "renice": ("was given a lower priority", "lowered the CPU and I/O priority of ${process}"),
    "kill": ("was stopped", "stopped ${process}"),
    "requeue": ("was put back in the queue", "put the Slurm job of ${process} back in the queue"),
}
# How to avoid it next time, unless the owner target says it in its own words (``advice``).
OWNER_ADVICE: dict[str, str] = {
    "checkpoint": "save and acknowledge when asked (the gpuwarden.job helper does both); if "
    "the GPU stays under pressure, lower-priority work may be paused or stopped next.",
    "suspend": "nothing, unless it is urgent: it is resumed when the incident is over. Work "
    "that must not wait belongs in a higher priority class, or where there is room.",
    "renice": "nothing, unless it is urgent: its priority is put back when the incident is over.",
    "kill": "declare GPUWARDEN_CHECKPOINT_SIGNAL in the job's environment and save when asked "
    "(the gpuwarden.job helper), so that gpuwarden asks before anything is stopped; run work "
    "that matters in a higher priority class, or where there is room.",
    "requeue": "save checkpoints as you go and resume from the latest one when the job starts "
    "again (the gpuwarden.job helper saves when asked); run work that must not wait in a "
    "higher priority class, or where there is room.",
}
OWNER_TITLE = "${prefix}gpuwarden on ${host}: your process ${pid} ${act}"
OWNER_BODY = (
    "Hello ${user},\n\n"
    "What happened: at ${time} gpuwarden ${what} on GPU ${gpu} of ${host}${job}: ${result}.\n\n"
    "Why: ${title} on ${where}. ${description}\n${values}\n"
    "Your process is in priority class ${priority} and held ${memory} of GPU memory.\n\n"
    "How to avoid it: ${advice}\n\n"
    "Incident ${incident}; the on-call team can tell you more."
)


def owner_message(
    intent: Intent,
    target: Target,
    result: str,
    *,
    to: str,
    host: str,
    tz: dt.tzinfo,
    now: float,
    marker: str = "",
    description: str = "",
    facts: Mapping[str, str] | None = None,
    advice: str | None = None,
    body_format: BodyFormat = "text",
) -> Message:
    """What the owner of ``target`` is told about what ``intent`` did to it (``result``: the
    executor's words); ``to`` is the recipient (``owner:alice``)."""

    def esc(value: object) -> str:
        return escape(value, body_format)

    act, what = OWNER_ACTS.get(intent.kind, (f"was acted on ({intent.kind})", intent.kind))
    shown = {k: v for k, v in (facts or {}).items() if k not in IDENTITY_FACT_NAMES}
    values = values_line(intent.where, shown)
    memory = (
        "an unknown amount" if target.gpu_memory_mib is None else f"{target.gpu_memory_mib} MiB"
    )
    gpu = target.gpu if target.gpu is not None else intent.gpu
    process = f"your process {target.pid} ({clean(target.command or '?', 120)})"
    filled = {
        "prefix": f"{marker} " if marker else "",
        "host": esc(host),
        "pid": str(target.pid),
        "act": act,
        "what": render(what, {"process": esc(process)}),
        "user": esc(target.user or "there"),
        "gpu": "?" if gpu is None else str(gpu),
        "time": esc(local_time(now, tz)),
        "job": f" (job {esc(target.job)})" if target.job else "",
        "result": esc(result),
        "title": esc(rule_title(intent.rule)),
        "where": esc(intent.where),
        "description": esc(description),
        "values": esc(values),
        "priority": esc(target.priority),
        "memory": esc(memory),
        "advice": esc(advice or OWNER_ADVICE.get(intent.kind, "ask the on-call team.")),
        "incident": esc(intent.incident),
    }
    body = _BLANK.sub("\n\n", render(OWNER_BODY, filled).replace(" \n", "\n"))
    if body_format == "html":
        body = body.replace("\n", "<br>\n")
    key = f"{host}/owner/{intent.id}/{target.pid}"
    return Message(
        id=message_id(key, "owner", 0, to),
        target=to,
        title=guard_mentions(clean(render(OWNER_TITLE, filled), 250)),
        body=body,
        severity=intent.severity,
        kind="owner",
        incidents=(intent.incident,),
        group=key,
        created=now,
        marker=marker,
        body_format=body_format,
    )
