"""``gpuwarden drill`` for people: each timeline record as the lines a terminal shows, and the
summary. ``--json`` prints the records themselves (``drill.py`` makes them)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuwarden.drill import Summary


def _money(usd: float | None) -> str:
    return "unpriced" if usd is None else f"${usd:,.2f}/h"


def _cloud_line(cloud: dict[str, Any] | None, profile: object) -> str:
    if cloud is None:
        return f"→ cloud profile {profile}"
    head = f"→ cloud profile {cloud['profile']}: would launch "
    if cloud["count"] <= 0:
        return head + f"nothing ({cloud.get('capped', 'capped')})"
    capped = f" (capped: {cloud['capped']})" if cloud.get("capped") else ""
    return (
        f"{head}{cloud['count']} x {cloud['instance_type']} ({cloud['market']}) in "
        f"{cloud['region']}, {_money(cloud['hourly_usd'])}{capped}"
    )


def _clock(t: float) -> str:
    whole = int(t)
    return f"+{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _who(target: dict[str, Any]) -> str:
    job = f" ({target['job']})" if target.get("job") else ""
    mib = target.get("gpu_memory_mib")
    memory = f", {mib} MiB" if mib is not None else ""
    via = f" via slurm job {target.get('slurm_job')}" if target.get("via") == "slurm" else ""
    who = f"{target.get('user') or '?'}/{target['priority']}"
    return f"pid {target['pid']}{job} {who}{memory}{via}"


def _when(record: dict[str, Any]) -> str:
    """``+0:02:04  Sat 03:00:04``: from the scenario's start, and on its wall clock."""
    head = _clock(record["t"])
    at = record.get("at")
    if at:
        head += "  " + dt.datetime.fromisoformat(at).strftime("%a %H:%M:%S")
    return head


def render_record(record: dict[str, Any]) -> str:
    """One timeline entry for people (``--json`` prints the record itself)."""
    kind = record["kind"]
    when = _when(record)
    indent = " " * len(when)
    if kind == "message":
        body = "\n".join(f"{indent}    │ {line}".rstrip() for line in record["body"].splitlines())
        return f"{when}  MESSAGE → {record['target']}: {record['title']}\n{body}"
    head = f"{when}  {record['rule']}  {record.get('where') or record['scope']}"
    reason = record["reason"].replace("_", " ")
    if kind == "step":
        targets = record.get("targets") or []
        if "notify" in record:
            what = "→ " + ", ".join(record["notify"])
        elif "power_cap" in record:
            cap = record["power_cap"]
            limit = f"{cap['watts']:g} W" if cap["watts"] else f"{cap['percent']:g}% of default"
            what = f"→ GPU {cap['gpu']} limited to {limit}"
        elif "argv" in record:
            what = "→ " + " ".join(record["argv"])
        elif "profile" in record:
            what = _cloud_line(record.get("cloud"), record["profile"])
        elif targets:
            what = "→ " + "; ".join(_who(t) for t in targets)
        else:
            what = f"→ nobody ({reason})"
        shadow = " [shadow: not acted on]" if record.get("shadow") else ""
        line = f"{head}  STEP {record['step']} {what}{shadow}"
        ec2 = (record.get("cloud") or {}).get("ec2")
        if ec2 is not None:
            verdict = "ok" if ec2["ok"] else "NOT OK"
            line += f"\n{indent}    EC2 DryRun {verdict}: {ec2['detail']}"
        return line
    if kind == "skip":
        return f"{indent}    skip {_who(record['targets'][0])}: {reason}"
    detail = f" ({record['detail']})" if record.get("detail") else ""
    return f"{head}  {kind.upper()}: {reason}{detail}"


def render_summary(summary: Summary, scenario: str, rules: int) -> str:
    steps = ", ".join(f"{k} {v}" for k, v in sorted(summary.steps.items())) or "none"
    speed = summary.simulated_s / summary.wall_s if summary.wall_s > 0 else float("inf")
    lines = [
        f"summary: {scenario}: {rules} rule(s), {summary.ticks} ticks over "
        f"{summary.simulated_s:g}s simulated in {summary.wall_s:.2f}s ({speed:,.0f}x)",
        f"  incidents fired {summary.fired}, resolved {summary.resolved}, open at the end "
        f"{len(summary.open_at_end)}",
        f"  steps: {steps}; processes targeted: {len(summary.targets)}",
    ]
    start = dt.datetime.fromtimestamp(summary.start, summary.zone)
    lines.append(
        f"  messages: {summary.messages} [DRILL] message(s) composed; times are +H:MM:SS from "
        f"the scenario's start, {start:%a %Y-%m-%d %H:%M:%S} {start.tzname()}"
    )
    if summary.notify_queued:
        lines.append(
            f"  notifications: {summary.notified} of {summary.notify_queued} "
            "[DRILL] message(s) delivered (the rest: `gpuwarden outbox`)"
        )
    return "\n".join(lines)
