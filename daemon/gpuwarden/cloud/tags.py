"""What gpuwarden writes on the instances it launches, and how it reads it back.

Every instance carries ``gpuwarden:*`` tags that say it is managed, for which incident, rule,
host, profile and step it was launched, and when it expires; a profile's own ``tags`` come on
top but can never replace those. The launch's ClientToken is derived from the incident, the
step and the attempt, so that a retry or a restart asks EC2 for the same launch again.

The user-data template of a profile may name only gpuwarden's own identifiers (``${incident}``,
``${rule}``, ``${host}``, ``${profile}``, ``${instance_type}``, ``${expires}``); ``$$`` is a
literal dollar. Anything else with a ``$`` is refused when the config is loaded.

Pure: no I/O, no clock, no boto3, and no import of ``gpuwarden.config``, which imports
this module to validate profiles.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime

PREFIX = "gpuwarden:"
MANAGED = "gpuwarden:managed"  # value "true"
INCIDENT = "gpuwarden:incident"
HOST = "gpuwarden:host"
RULE = "gpuwarden:rule"
PROFILE = "gpuwarden:profile"
STEP = "gpuwarden:step"
EXPIRES = "gpuwarden:expires"  # ISO 8601 UTC, e.g. "2026-11-30T08:00:00Z"
NAME = "Name"

# EC2's limits on tags (user-defined; the "aws:" prefix belongs to AWS).
MAX_KEY = 128
MAX_VALUE = 256
MAX_TAGS = 50
AWS_PREFIX = "aws:"
# The tags gpuwarden itself writes on every instance.
OWN_KEYS: tuple[str, ...] = (MANAGED, INCIDENT, HOST, RULE, PROFILE, STEP, EXPIRES, NAME)

# EC2 takes at most 16 KiB of user data (before base64).
MAX_USER_DATA = 16 * 1024

USER_DATA_NAMES: frozenset[str] = frozenset(
    {"incident", "rule", "host", "profile", "instance_type", "expires"}
)

_EXPIRES_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
_LAUNCH_PREFIX = "gpuwarden-"


def format_expires(t: float) -> str:
    """``t`` (epoch seconds) as ISO 8601 UTC to the second: ``2026-11-30T08:00:00Z``.

    Fractions of a second are dropped; times before 1970 or after the year 9999 are written
    as the nearest of the two."""
    if math.isnan(t):  # no time at all: the earliest is the safe reading of an expiry
        t = 0.0
    clamped = min(max(t, 0.0), _LATEST)
    return datetime.fromtimestamp(int(clamped), UTC).strftime(_EXPIRES_FORMAT)


def parse_expires(text: str) -> float | None:
    """Epoch seconds from an expiry tag; None when it is not an ISO 8601 date and time.

    Written by gpuwarden as ``2026-11-30T08:00:00Z``; an offset (``+02:00``) is honoured and
    a time without one is read as UTC, since people edit tags too."""
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def tag_dict(tags: list[dict[str, str]] | None) -> dict[str, str]:
    """EC2's ``[{"Key": k, "Value": v}, ...]`` as ``{k: v}``; entries without a key are
    skipped, a missing value is ``""``."""
    out: dict[str, str] = {}
    for item in tags or ():
        key = item.get("Key")
        if not isinstance(key, str):
            continue
        value = item.get("Value")
        out[key] = value if isinstance(value, str) else ""
    return out


def key_problem(key: str) -> str | None:
    """What is wrong with ``key`` as a tag of a profile: reserved or too long for EC2."""
    if key.startswith(PREFIX):
        return (
            f"tag {key!r}: keys starting with {PREFIX!r} are reserved; gpuwarden writes them itself"
        )
    if key.lower().startswith(AWS_PREFIX):
        return f"tag {key!r}: keys starting with {AWS_PREFIX!r} are reserved by AWS"
    if not key:
        return "a tag key cannot be empty"
    if len(key) > MAX_KEY:
        return f"tag key {key[:20]!r}... is {len(key)} characters; EC2 allows at most {MAX_KEY}"
    return None


def value_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a tag value: too long for EC2."""
    if len(value) > MAX_VALUE:
        return (
            f"tag value {value[:20]!r}... is {len(value)} characters; "
            f"EC2 allows at most {MAX_VALUE}"
        )
    return None


def room_problem(profile_tags: Mapping[str, str]) -> str | None:
    """Whether a profile's tags and gpuwarden's own would exceed EC2's tags per instance
    (a profile's ``Name`` replaces gpuwarden's)."""
    own = len(OWN_KEYS) - (1 if NAME in profile_tags else 0)
    room = MAX_TAGS - own
    if len(profile_tags) <= room:
        return None
    return (
        f"{len(profile_tags)} tags; EC2 allows {MAX_TAGS} per instance and gpuwarden writes "
        f"{own} itself, so at most {room} here"
    )


def instance_tags(
    *,
    profile_name: str,
    profile_tags: Mapping[str, str],
    incident: str,
    rule: str,
    host: str,
    step: int,
    expires_at: float,
) -> dict[str, str]:
    """The tags of an instance launched for ``incident``: the profile's ``tags``, then
    gpuwarden's own, which always win; ``Name`` is ``gpuwarden-<incident>`` unless the
    profile sets one."""
    tags = {NAME: f"gpuwarden-{incident}"}
    tags.update(profile_tags)
    tags.update(
        {
            MANAGED: "true",
            INCIDENT: incident,
            HOST: host,
            RULE: rule,
            PROFILE: profile_name,
            STEP: str(step),
            EXPIRES: format_expires(expires_at),
        }
    )
    return tags


def client_token(incident: str, step: int, attempt: str) -> str:
    """The ClientToken of one launch: the same for the same incident, step and attempt
    (so EC2 runs a repeated request once), different otherwise; 50 printable ASCII
    characters (EC2 allows 64)."""
    key = json.dumps([incident, step, attempt], ensure_ascii=True)
    digest = hashlib.sha256(key.encode("ascii")).hexdigest()[:40]
    return _LAUNCH_PREFIX + digest


# A "$" and what follows it. Only ${name} and $$ are valid: "$name" and a lone "$" are
# invalid, so that a shell variable written $HOME in a script is refused, not replaced.
_PLACEHOLDER = re.compile(
    r"""
    \$(?:
      (?P<escaped>\$)              # $$: a literal dollar
    | \{(?P<braced>[^{}$\n]*)\}    # ${name}; the name is checked against USER_DATA_NAMES
    | (?P<invalid>)                # anything else after a $
    )
    """,
    re.VERBOSE,
)


def _where(template: str, index: int) -> str:
    line = template.count("\n", 0, index) + 1
    col = index - template.rfind("\n", 0, index)
    return f"line {line} col {col}"


def _names() -> str:
    return ", ".join("${" + n + "}" for n in sorted(USER_DATA_NAMES))


def user_data_problems(template: str, *, shown: int | None = None) -> list[str]:
    """What is wrong with a user-data template, one message per ``$`` that is not ``$$`` or
    ``${name}`` with a known name, and its size if EC2 would refuse it; ``[]`` when it is
    fine. Positions are within the template (line and column, 1-based). With ``shown``, at
    most that many messages and then "and N more" (a script full of $VARs needs no 40)."""
    problems = _dollar_problems(template)
    size = len(template.encode("utf-8"))
    if size > MAX_USER_DATA:
        problems.append(f"the user data is {size} bytes; EC2 takes at most {MAX_USER_DATA}")
    if shown is not None and len(problems) > shown:
        problems = [*problems[:shown], f"and {len(problems) - shown} more"]
    return problems


def _dollar_problems(template: str) -> list[str]:
    problems: list[str] = []
    for match in _PLACEHOLDER.finditer(template):
        at = _where(template, match.start())
        braced = match.group("braced")
        if braced is not None:
            if not braced:
                problems.append(f"an empty ${{}} at {at}: write ${{name}} with one of {_names()}")
            elif braced not in USER_DATA_NAMES:
                problems.append(
                    f"unknown name ${{{braced}}} at {at}: gpuwarden fills in only {_names()}; "
                    f"write $${{{braced}}} to pass ${{{braced}}} on to the script"
                )
        elif match.group("invalid") is not None:
            rest = template[match.end() : match.end() + 1]
            word = re.match(r"[A-Za-z_][A-Za-z0-9_]*", template[match.end() :])
            if word:
                shown = "$" + word.group(0)
                fix = (
                    f"write ${{{word.group(0)}}}"
                    if word.group(0) in USER_DATA_NAMES
                    else f"write ${shown} for the script to see {shown}"
                )
                problems.append(f"{shown} at {at}: {fix}")
            elif rest == "{":
                problems.append(f"an unclosed ${{ at {at}: write ${{name}}, or $$ for a dollar")
            else:
                problems.append(f"a lone $ at {at}: write $$ for a literal dollar")
    return problems


def render_user_data(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each ``${name}`` replaced by ``values[name]`` and ``$$`` by ``$``.

    Only the names in USER_DATA_NAMES are looked up (other keys of ``values`` are never
    reachable). Raises ``ValueError`` for what ``user_data_problems`` reports, and for a
    name the template uses that ``values`` lacks."""
    problems = user_data_problems(template)
    if problems:
        raise ValueError("; ".join(problems))
    allowed = {k: v for k, v in values.items() if k in USER_DATA_NAMES}
    missing = sorted({n for n in _braced(template) if n not in allowed})
    if missing:
        names = ", ".join("${" + n + "}" for n in missing)
        raise ValueError(f"no value for {names} in the user data")

    def fill(match: re.Match[str]) -> str:
        braced = match.group("braced")
        return "$" if braced is None else str(allowed[braced])

    return _PLACEHOLDER.sub(fill, template)


def _braced(template: str) -> list[str]:
    return [n for m in _PLACEHOLDER.finditer(template) if (n := m.group("braced")) is not None]
