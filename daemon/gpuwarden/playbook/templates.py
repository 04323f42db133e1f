"""The message templates of playbooks: ``${name}`` placeholders and the names they may use.

A template is text with ``${name}`` placeholders over a flat mapping of strings. Nothing else is
special: there is no attribute access, no format spec, no expression, no escape sequence. A
placeholder whose name is unknown, ``${x.y}``, ``{x}`` and a lone ``$`` stay as literal text.
The loader checks a playbook's messages against these names; ``notify.messages`` fills them in
with facts escaped for the target's format.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

# The names every template may use (a member's own facts, such as ``memory``, come on top).
FACT_NAMES: tuple[str, ...] = tuple(
    re.findall(
        r"\S+",
        "prefix marker kind host rule title description severity SEVERITY where incident"
        " incidents count opened duration values actions changes timeline ack",
    )
)
# Facts a GPU adds to its incident's messages (``gpu_facts``), when the device reports them.
GPU_FACT_NAMES: tuple[str, ...] = ("memory", "temperature", "utilization", "power", "state")
# Who and what an incident is about, by the rule's for_each: the GPU's index, and for a
# process rule the process (its pid, owner, job and command line).
SCOPE_FACT_NAMES: dict[str, tuple[str, ...]] = {
    "gpu": ("gpu",),
    "process": ("gpu", "user", "pid", "job", "command"),
    "event": ("gpu",),
    "host": (),
}


def render(template: str, facts: Mapping[str, str]) -> str:
    """``${name}`` replaced by ``facts[name]``; everything else left exactly as written."""

    def one(match: re.Match[str]) -> str:
        value = facts.get(match.group(1))
        return match.group(0) if value is None else value

    return _PLACEHOLDER.sub(one, template)


def placeholders(template: str) -> tuple[str, ...]:
    """The names a template uses (for checking a playbook's message against FACT_NAMES)."""
    return tuple(dict.fromkeys(_PLACEHOLDER.findall(template)))
