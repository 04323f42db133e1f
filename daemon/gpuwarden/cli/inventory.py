"""What ``gpuwarden check`` prints: an inventory of the config and the rules, for review."""

from __future__ import annotations

from gpuwarden.config import Config, Secret
from gpuwarden.playbook.loader import CompiledRule, CompiledStep, PlaybookSet
from gpuwarden.sources.priority import rule_conditions, rule_reach
from gpuwarden.units import format_duration


def _step(step: CompiledStep) -> str:
    params = step.spec.params
    after = f"+{format_duration(step.spec.after, exact=True)} " if step.spec.after else ""
    detail = ""
    if step.kind == "notify":
        detail = " " + ", ".join(getattr(params, "targets", ()))
    elif step.kind == "provision":
        detail = " " + str(getattr(params, "profile", ""))
    elif step.kind == "power_cap":
        watts = getattr(params, "watts", None)
        detail = f" {watts:g} W" if watts else f" {getattr(params, 'percent', 0):g}%"
    elif step.kind == "exec":
        detail = " " + " ".join(getattr(params, "argv", ()))[:40]
    select = getattr(params, "select", None)
    if select:
        detail += f" [{select}]"
    limit = getattr(params, "limit", None)
    if limit:
        detail += f" limit {limit}"
    free_until = getattr(params, "free_until", None)
    if free_until:
        detail += f" until {free_until}"
    return f"{after}{step.spec.label}{detail}"


def _rule(rule: CompiledRule) -> list[str]:
    spec = rule.spec
    timing = []
    if spec.for_:
        timing.append(f"for {format_duration(spec.for_, exact=True)}")
    if spec.every is not None:
        timing.append(f"every {spec.every}")
    if spec.active is not None:
        active = spec.active if isinstance(spec.active, str) else "; ".join(spec.active)
        timing.append(f"active {active}")
    timing.append(f"cooldown {format_duration(spec.cooldown, exact=True)}")
    mode = "  SHADOW" if spec.mode == "shadow" else ""
    lines = [
        f"  {spec.name}  ({spec.for_each}, {spec.severity}{mode})  {rule.file}:{rule.line}",
        f"    when  {spec.when}",
    ]
    if spec.until:
        lines.append(f"    until {spec.until}")
    lines.append("    " + ", ".join(timing))
    if rule.steps:
        lines.append("    steps " + " → ".join(_step(s) for s in rule.steps))
    else:
        lines.append("    steps (none: the incident is only recorded)")
    return lines


def _url_count(urls: tuple[str | Secret, ...]) -> str:
    secret = sum(1 for u in urls if isinstance(u, Secret) and u.value is None)
    text = f"{len(urls)} url{'s' if len(urls) != 1 else ''}"
    return text + (f" ({secret} from a file or the environment)" if secret else "")


def _classes(config: Config) -> list[str]:
    """Per class, each rule and how far it may move a process (docs/security.md)."""
    p = config.priorities
    width = max(len(name) for name in p.names) + 2
    lines = []
    for cls in p.classes:
        head = f"{'':11}{cls.name:<{width}}"
        if not cls.match:
            lines.append(f"{head}no rules" + (" (the default)" if cls.name == p.default else ""))
        for i, rule in enumerate(cls.match):
            lead = head if i == 0 else " " * len(head)
            lines.append(f"{lead}{rule_conditions(rule)}: {rule_reach(rule, p.declared_max)}")
    lines.append(
        f"{'':11}{'declared':<{width}}GPUWARDEN_PRIORITY: any class up to {p.declared_max}"
    )
    return lines


def render(config: Config, config_source: str, playbooks: PlaybookSet) -> str:
    p = config.priorities
    lines = [
        f"config     {config_source}",
        f"           tick {format_duration(config.tick, exact=True)}, timezone {config.timezone}, "
        f"mode {config.mode_name}"
        + (" (nothing is acted on)" if config.shadow else " (steps act)"),
        f"priorities {' > '.join(p.names)} (default {p.default}, declared max {p.declared_max})",
        *_classes(config),
    ]
    prot = config.protected
    parts = ["pid 1-2", "gpuwarden itself"]
    if prot.root:
        parts.append("root-owned")
    if prot.users:
        parts.append("users " + ", ".join(prot.users))
    if prot.groups:
        parts.append("groups " + ", ".join(prot.groups))
    if prot.exes:
        parts.append("executables " + ", ".join(prot.exes))
    if prot.units:
        parts.append("units (root-owned cgroups) " + ", ".join(prot.units))
    if prot.priorities:
        parts.append("classes " + ", ".join(prot.priorities))
    lines.append("protected  " + "; ".join(parts))
    targets = config.notify.targets
    if targets:
        for name, target in targets.items():
            extra = f", fallback {target.fallback}" if target.fallback else ""
            if target.type == "alertmanager":
                extra += ", alertmanager" + (", silence = ack" if target.ack_on_silence else "")
            where = _url_count(target.urls)
            if target.for_owners:
                reach = [f"{len(target.owners)} listed"] if target.owners else []
                if target.owner_mail is not None:
                    reach.append(f"mail to USER@{target.owner_mail.domain}")
                where = "the owner of each process acted on (" + ", ".join(reach) + ")"
            lines.append(f"notify     {name}: {where}, ≥{target.min_severity}{extra}")
    else:
        lines.append("notify     (no targets)")
    for name, profile in config.cloud.profiles.items():
        cap = f", ≤${profile.max_hourly_usd:g}/h" if profile.max_hourly_usd else ""
        fleet = profile.budget
        if fleet is not None:
            caps = [f"≤{fleet.max_instances} instances"] if fleet.max_instances else []
            if fleet.max_dollars_per_hour:
                caps.append(f"≤${fleet.max_dollars_per_hour:g}/h")
            cap += f"; fleet budget {fleet.key or name} ({fleet.table}): {', '.join(caps)}"
        lines.append(
            f"cloud      {name}: {profile.provider} {profile.region}, "
            f"{', '.join(profile.instance_types)}, ≤{profile.max_instances} "
            f"instances{cap}"
        )
    lines.append(f"playbooks  {len(playbooks.files)} file(s), {len(playbooks.rules)} rule(s)")
    for rule in playbooks.rules:
        lines.extend(_rule(rule))
    series = len(playbooks.series)
    if series:
        lines.append(
            f"history    {series} series kept per scope for avg/min/max/rate/predict/held_for"
        )
    return "\n".join(lines)
