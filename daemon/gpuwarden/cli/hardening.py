"""What ``gpuwarden check`` and ``gpuwarden doctor`` warn about in the trust a config places
(docs/security.md): regexes that backtrack exponentially on a crafted command line, protected
classes a job can declare itself into, and secrets that other users can read.

Each warning names the config's file:line:col where it can, and says what to do.
"""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from gpuwarden import yamlfile
from gpuwarden.cli.findings import Finding, warn
from gpuwarden.config import Config, Secret
from gpuwarden.errors import InputError
from gpuwarden.notify.delivery import secret_parts
from gpuwarden.patterns import compile_pattern, nested_quantifier, re2_available

KeyPath = tuple[str | int, ...]
_MATCHERS = ("exe", "cmdline", "cgroup", "unit")


def review(config: Config, config_path: Path | None) -> list[Finding]:
    """Every warning about ``config`` (read from ``config_path``, if any), in a fixed order."""
    located = _located(config_path)
    return [
        *regex_findings(config, located),
        *protected_class_findings(config, located),
        *secret_findings(config, config_path, located),
    ]


def _located(config_path: Path | None) -> yamlfile.Located | None:
    if config_path is None:
        return None
    try:
        return yamlfile.load(config_path)
    except (InputError, OSError):
        return None


def _where(located: yamlfile.Located | None, path: KeyPath) -> str:
    if located is None:
        return ""
    line, col = located.where(path)
    return f"{located.file}:{line}:{col}: " if line is not None else f"{located.file}: "


def _dotted(path: KeyPath) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


# -- regexes -------------------------------------------------------------------------------------


def config_patterns(config: Config) -> Iterator[tuple[KeyPath, str]]:
    """Every regex of the config with its key path."""
    for i, cls in enumerate(config.priorities.classes):
        for j, rule in enumerate(cls.match):
            for key in _MATCHERS:
                value = getattr(rule, key)
                if value is not None:
                    yield ("priorities", "classes", i, "match", j, key), value
    for key in ("exes", "units"):
        for k, value in enumerate(getattr(config.protected, key)):
            yield ("protected", key, k), value


def regex_findings(config: Config, located: yamlfile.Located | None) -> list[Finding]:
    findings = []
    for path, pattern in config_patterns(config):
        if not nested_quantifier(pattern):
            continue
        engine = compile_pattern(pattern).engine
        if engine == "re2":
            now = "it runs on RE2 here, in time linear in the text, but not where the re2 extra "
            now += "is missing"
        elif re2_available():
            now = "RE2 cannot express it (back-references, look-around), so it runs on re here"
        else:
            now = "it runs on Python's re here (the re2 extra is not installed)"
        findings.append(
            warn(
                "regex",
                f"{_where(located, path)}{_dotted(path)} '{pattern}' repeats a group that holds a "
                "quantifier: on a backtracking engine a crafted command line of a few dozen "
                f"characters can stall attribution for minutes; {now}",
                "rewrite it without a quantifier inside a repeated group (for example "
                "'^[\\w\\s]+--prod$' for '^(\\w+\\s?)+--prod$'), and install the re2 extra: "
                "pip install 'gpuwarden[re2]'",
            )
        )
    return findings


# -- protected classes ---------------------------------------------------------------------------


def protected_class_findings(config: Config, located: yamlfile.Located | None) -> list[Finding]:
    p = config.priorities
    findings = []
    for k, name in enumerate(config.protected.priorities):
        if name in p.names and p.rank(name) <= p.rank(p.declared_max):
            findings.append(
                warn(
                    "protected class",
                    f"{_where(located, ('protected', 'priorities', k))}protected class {name} is "
                    f"not above declared_max ({p.declared_max}): any job can declare itself into "
                    "it (GPUWARDEN_PRIORITY, env rules) and be protected",
                    f"protect only classes above declared_max, or lower declared_max below {name}",
                )
            )
    return findings


# -- secrets -------------------------------------------------------------------------------------


def readable_by_others(info: os.stat_result) -> str | None:
    """Who besides the owner may read a file: "everyone", "group NAME", or None. Group root
    and the daemon's own group do not count."""
    if info.st_mode & stat.S_IROTH:
        return "everyone"
    if info.st_mode & stat.S_IRGRP and info.st_gid not in (0, os.getegid()):
        try:
            return f"group {grp.getgrgid(info.st_gid).gr_name}"
        except KeyError:
            return f"group {info.st_gid}"
    return None


def _inline_secrets(config: Config) -> list[KeyPath]:
    found: list[KeyPath] = []
    for name, target in config.notify.targets.items():
        for i, url in enumerate(target.urls):
            if isinstance(url, Secret):
                if url.value is not None:
                    found.append(("notify", "targets", name, "urls", i, "value"))
            elif secret_parts(url):
                found.append(("notify", "targets", name, "urls", i))
    return found


def secret_findings(
    config: Config, config_path: Path | None, located: yamlfile.Located | None
) -> list[Finding]:
    findings = []
    inline = _inline_secrets(config)
    if config_path is not None and inline:
        try:
            who = readable_by_others(config_path.stat())
        except OSError:
            who = None
        if who is not None:
            shown = ", ".join(_where(located, p) + _dotted(p) for p in inline[:3])
            more = f" and {len(inline) - 3} more" if len(inline) > 3 else ""
            findings.append(
                warn(
                    "secrets",
                    f"{config_path} is readable by {who} and holds {len(inline)} secret(s) "
                    f"inline: {shown}{more}",
                    f"move them to {{file: PATH}} (mode 0600) or {{env: NAME}}, or make the "
                    f"config private: chmod 0600 {config_path}",
                )
            )
    for name, target in config.notify.targets.items():
        files: list[tuple[KeyPath, Path]] = [
            (("notify", "targets", name, "urls", i, "file"), url.file)
            for i, url in enumerate(target.urls)
            if isinstance(url, Secret) and url.file is not None
        ]
        if target.config is not None:
            files.append((("notify", "targets", name, "config"), target.config))
        for path, file in files:
            try:
                who = readable_by_others(file.stat())
            except OSError:
                continue  # a missing secret is the notify check's finding
            if who is not None:
                findings.append(
                    warn(
                        "secrets",
                        f"{_where(located, path)}{_dotted(path)}: {file} holds a secret and is "
                        f"readable by {who}",
                        f"chmod 0600 {file} (owned by the daemon's user)",
                    )
                )
    return findings
