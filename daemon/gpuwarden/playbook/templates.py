"""The message templates of playbooks: ``${name}`` placeholders and the names they may use.

A template is text with ``${name}`` placeholders over a flat mapping of strings. Nothing else is
special: there is no attribute access, no format spec, no expression, no escape sequence. A
placeholder whose name is unknown, ``${x.y}``, ``{x}`` and a lone ``$`` stay as literal text.
The loader checks a playbook's messages against these names; ``notify.messages`` fills them in
with facts escaped for the target's format.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

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


@dataclass(frozen=True)
class UnknownPlaceholder:
    """A name a message uses that its rule's messages do not have."""

    name: str
    for_each: str
    known: tuple[str, ...]
    hint: str | None

    def words(self) -> tuple[str, str, str | None]:
        """(what is wrong, what was expected, a hint) for a ``Problem``."""
        return (
            f"unknown placeholder ${{{self.name}}} in the message of a {self.for_each} rule",
            f"one of {', '.join('${' + n + '}' for n in self.known)}",
            self.hint,
        )


def unknown_placeholders(template: str, for_each: str) -> list[UnknownPlaceholder]:
    """The placeholders of a notify message that a ``for_each`` rule cannot fill, each with a
    hint: the close name meant, or why a name of another kind of rule does not apply."""
    known = (*FACT_NAMES, *GPU_FACT_NAMES, *SCOPE_FACT_NAMES[for_each])
    found = []
    for name in placeholders(template):
        if name in known:
            continue
        elsewhere = [k for k, v in SCOPE_FACT_NAMES.items() if name in v]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean ${{{close[0]}}}?" if close else None
        if elsewhere:
            hint = (
                f"${{{name}}} names what a for_each: {' or '.join(elsewhere)} rule's incident "
                f"is about; a {for_each} rule has none. To tell the owner of each process a "
                "step acts on, name an owner target in a notify step (docs/notifications.md, "
                '"Owner messages")'
            )
        found.append(UnknownPlaceholder(name, for_each, known, hint))
    return found
