"""Which targets receive a message, when, and at which URLs. Pure: I/O comes in as functions.

- ``min_severity``: a target takes messages of that severity and above. It is applied when a
  group is opened (``accepts``): a target that did not get the ``open`` message of a group gets
  none of its later messages either, and every target that did gets its ``resolve``, whatever
  the severity filter says.
- ``quiet_hours`` (an ``active``-style window, read in the config's time zone): ``critical``
  messages always go at once; any other message created during quiet hours is *deferred* to the
  end of the quiet window, not dropped — people read it when they are back, in order. A
  reminder deferred while an older deferred reminder of the same group waits replaces it.
- ``fallback``: where a message goes when a target's retry budget is spent (``fallback_chain``
  follows it, stopping at a loop).

``redact_url`` shows a URL in logs, errors and the journal without anything secret in it.
"""

from __future__ import annotations

import datetime as dt
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.config_notify import Notify, NotifyTarget, Secret
from gpuwarden.timewindow import parse_active

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}

# Schemes whose "host" is a real host name (shown redacted of user and password). For every
# other scheme (slack://, tgram://, discord://, pagerduty://, ...) the host part is a token.
HOST_SCHEMES = frozenset(
    {
        "json", "jsons", "xml", "xmls", "form", "forms", "http", "https", "ntfy", "ntfys",
        "mailto", "mailtos", "gotify", "gotifys", "mmost", "mmosts", "rocket", "rockets",
        "matrix", "matrixs", "mqtt", "mqtts", "apprise", "apprises", "signal", "signals",
        "nctalk", "nctalks", "ncloud", "nclouds", "gchat", "syslog", "rsyslog",
    }
)  # fmt: skip
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]{0,31}$")
_HOST = re.compile(r"^(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$")


class SecretError(ValueError):
    """A target's URL could not be read. The message names the target and where the secret
    should have come from, never the secret."""


def accepts(notify: Notify, target: str, severity: str) -> bool:
    """Does ``target`` take messages of ``severity`` (its ``min_severity``)? Unknown: no."""
    spec = notify.targets.get(target)
    if spec is None:
        return False
    return SEVERITY_RANK.get(severity, 0) >= SEVERITY_RANK[spec.min_severity]


def release_time(target: NotifyTarget, severity: str, now: float, tz: dt.tzinfo) -> float:
    """When a message of ``severity`` created at ``now`` may go to ``target``: ``now``, or the
    end of the target's quiet hours for a non-critical message created inside them."""
    if target.quiet_hours is None or severity == "critical":
        return now
    quiet = parse_active(target.quiet_hours)
    if not quiet.contains(now, tz):
        return now
    end = quiet.next_change(now, tz)
    return now if end is None else end  # quiet all week long: a window that never ends


@dataclass(frozen=True, slots=True)
class Route:
    target: str
    at: float  # when the message may be sent (later than now: deferred by quiet hours)


def route(
    notify: Notify,
    targets: tuple[str, ...],
    *,
    severity: str,
    now: float,
    tz: dt.tzinfo,
) -> list[Route]:
    """The targets (already chosen by the grouper) with when each may receive a message.
    Names not in the config are left out."""
    out = []
    for name in dict.fromkeys(targets):
        spec = notify.targets.get(name)
        if spec is not None:
            out.append(Route(name, release_time(spec, severity, now, tz)))
    return out


def fallback_chain(notify: Notify, target: str) -> list[str]:
    """The fallbacks of ``target`` in order (its fallback, that one's fallback, ...)."""
    chain: list[str] = []
    name = target
    while True:
        spec = notify.targets.get(name)
        following = spec.fallback if spec is not None else None
        if following is None or following == target or following in chain:
            return chain
        chain.append(following)
        name = following


def fallback(notify: Notify, target: str) -> str | None:
    """The target to try when ``target`` has spent its retry budget; None when there is none."""
    chain = fallback_chain(notify, target)
    return chain[0] if chain else None


# -- URLs -------------------------------------------------------------------------------------


def _urls_in(text: str) -> list[str]:
    """URLs in a secret: one per line (blank lines and ``#`` comments skipped)."""
    out = []
    for line in text.splitlines():
        item = line.strip()
        if item and not item.startswith("#"):
            out.append(item)
    return out


def recipient(target: str, user: str) -> str:
    """The outbox's name for one owner of an owner target: ``owner:alice``."""
    return f"{target}:{user}"


def split_recipient(notify: Notify, name: str) -> tuple[str, str] | None:
    """``owner:alice`` → ("owner", "alice") when ``owner`` is an owner target; None for a
    plain target name (a configured name always means that target)."""
    if name in notify.targets:
        return None
    target, sep, user = name.rpartition(":")
    spec = notify.targets.get(target)
    if not sep or spec is None or not spec.for_owners:
        return None
    return target, user


def owner_urls(
    target: NotifyTarget,
    user: str | None,
    environ: Mapping[str, str],
    read_file: Callable[[Path], str],
    *,
    name: str = "target",
) -> list[str]:
    """The URL that reaches ``user`` through an owner target: the ``owners`` table's, else
    ``owner_mail``'s with ``to=USER@domain``. ``user`` None: every URL the target holds (what
    ``check`` and ``doctor`` verify). Raises ``SecretError``."""
    if user is None:
        found: list[str] = []
        for who, item in sorted(target.owners.items()):
            found += _one(item, environ, read_file, f"owner target {name!r} user {who}")
        if target.owner_mail is not None:
            found += _one(target.owner_mail.url, environ, read_file, f"owner target {name!r} mail")
        return found
    if not target.reaches(user):
        raise SecretError(f"owner target {name!r} has no address for user {user!r}")
    if user in target.owners:
        return _one(target.owners[user], environ, read_file, f"owner target {name!r} user {user}")
    assert target.owner_mail is not None
    mail = target.owner_mail
    base = _one(mail.url, environ, read_file, f"owner target {name!r} mail")[0]
    joiner = "&" if "?" in base else "?"
    return [f"{base}{joiner}to={urllib.parse.quote(f'{user}@{mail.domain}', safe='@')}"]


def _one(
    item: str | Secret,
    environ: Mapping[str, str],
    read_file: Callable[[Path], str],
    what: str,
) -> list[str]:
    if isinstance(item, str):
        return [item]
    found = _secret(item, environ, read_file, what)
    if not found:
        raise SecretError(f"{what}: {_where(item)} holds no URL — expected an apprise URL")
    return found[:1]


def resolve_urls(
    target: NotifyTarget,
    environ: Mapping[str, str],
    read_file: Callable[[Path], str],
    *,
    name: str = "target",
) -> list[str]:
    """Every apprise URL of a target, with secrets read (``read_file`` for ``{file: …}``,
    ``environ`` for ``{env: …}``). A secret file or variable may hold several URLs, one a
    line. Raises ``SecretError`` naming the target and the missing secret."""
    if target.for_owners:
        return owner_urls(target, None, environ, read_file, name=name)
    urls: list[str] = []
    for number, item in enumerate(target.urls, 1):
        if isinstance(item, str):
            urls.append(item)
            continue
        found = _secret(item, environ, read_file, f"notify target {name!r} URL {number}")
        if not found:
            raise SecretError(
                f"notify target {name!r} URL {number}: {_where(item)} holds no URL — "
                "expected an apprise URL such as json://host/path, one per line"
            )
        urls.extend(found)
    return urls


def _where(secret: Secret) -> str:
    if secret.file is not None:
        return f"file {str(secret.file)!r}"
    if secret.env is not None:
        return f"environment variable {secret.env}"
    return "the inline value"


def _secret(
    secret: Secret,
    environ: Mapping[str, str],
    read_file: Callable[[Path], str],
    what: str,
) -> list[str]:
    if secret.value is not None:
        return _urls_in(secret.value)
    if secret.env is not None:
        value = environ.get(secret.env)
        if value is None:
            raise SecretError(
                f"{what}: environment variable {secret.env} is not set — set it to the "
                "target's apprise URL (for systemd: Environment= or EnvironmentFile=)"
            )
        return _urls_in(value)
    assert secret.file is not None
    try:
        return _urls_in(read_file(secret.file))
    except FileNotFoundError:
        raise SecretError(f"{what}: file {str(secret.file)!r} does not exist") from None
    except PermissionError:
        raise SecretError(
            f"{what}: file {str(secret.file)!r} cannot be read (permission denied) — "
            "make it readable by the user gpuwarden runs as"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretError(
            f"{what}: file {str(secret.file)!r} cannot be read ({type(exc).__name__})"
        ) from None


def redact_url(url: str) -> str:
    """A URL fit for a log line: ``scheme://***@host/***?name=***``. Credentials, paths and
    query values are always hidden; the host is shown only for schemes where it is a host
    (``HOST_SCHEMES``), never for services whose URL starts with a token."""
    scheme, sep, rest = url.partition("://")
    if not sep or not _SCHEME.match(scheme):
        return "***"
    scheme = scheme.lower()
    netloc, _, tail = rest.partition("/")
    netloc, qmark, query = netloc.partition("?")
    if not qmark:
        tail, qmark, query = tail.partition("?")
    query = query.partition("#")[0]
    user, at, host = netloc.rpartition("@")
    shown = f"{scheme}://"
    if at or user:
        shown += "***@"
    if scheme in HOST_SCHEMES and _HOST.match(host):
        shown += host
    else:
        return f"{scheme}://***"
    if tail.strip("/"):
        shown += "/***"
    if qmark and query:
        keys = [k for k, _ in urllib.parse.parse_qsl(query, keep_blank_values=True)]
        safe = [k for k in keys if re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", k)]
        shown += "?" + "&".join(f"{k}=***" for k in safe) if safe else "?***"
    return shown
