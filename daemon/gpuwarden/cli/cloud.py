"""``gpuwarden cloud`` (what gpuwarden owns in the cloud), ``gpuwarden cloud reap`` (the reaper,
now), and the credential warnings of ``gpuwarden check``.

``cloud`` reads the journal and asks EC2 for the current state of every instance (and for any
live one that carries this host's tags but is missing from the journal); it writes nothing.
``cloud reap`` brings the journal in line with EC2, then terminates what is past its ttl or has
lingered long enough after its incident. boto3 is imported only when EC2 is asked.

``cloud --json`` prints a list with one object per instance: every field of
``gpuwarden.cloud.instance.Managed`` (times in epoch seconds) plus ``age_s`` (seconds from
launch to its end, or to now), ``cost_usd`` (estimated spend so far, null when the type has
no price) and ``expires_in_s`` (seconds until the ttl reaps it, negative when overdue, null
once ended).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden import config
from gpuwarden.cli.common import instances, journal_path
from gpuwarden.config import host_name
from gpuwarden.errors import ExitCode
from gpuwarden.text import safe_text
from gpuwarden.units import format_duration

if TYPE_CHECKING:
    from gpuwarden.cloud.instance import Managed
    from gpuwarden.cloud.service import CloudService
    from gpuwarden.cloud.store import InstanceStore

NO_PROFILES = "no cloud profiles configured"
UNPRICED = "—"


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    cloud = sub.add_parser(
        "cloud",
        parents=[common],
        help="cloud instances gpuwarden launched, and the reaper",
        description="List the cloud instances gpuwarden launched or adopted, with EC2's "
        "current state, their age, expiry and estimated cost; `cloud reap` runs the "
        "reaper now.",
    )
    cloud.add_argument("--state-dir", type=Path, metavar="DIR")
    cloud.add_argument("--json", action="store_true", help="print a JSON list")
    cloud.add_argument(
        "--offline", action="store_true", help="do not ask EC2: states as the journal has them"
    )
    actions = cloud.add_subparsers(dest="cloud_action", metavar="ACTION")
    reap = actions.add_parser(
        "reap",
        parents=[common],
        help="terminate what is past its ttl or linger, now",
        description="Compare the journal with EC2 (adopt what carries this host's tags, note "
        "what ended), then terminate every instance past its ttl or whose incident resolved "
        "longer than linger ago. Exit 1 when EC2 could not be asked.",
    )
    # SUPPRESS: `cloud --state-dir D reap` keeps D (a subcommand's default would replace it).
    reap.add_argument("--state-dir", type=Path, metavar="DIR", default=argparse.SUPPRESS)
    reap.add_argument(
        "--dry-run",
        action="store_true",
        help="terminate nothing, say what would be (the journal still learns EC2's states)",
    )


def _age(m: Managed, now: float) -> float:
    """Seconds from launch to its end, or to now while it runs."""
    end = m.terminated_at if m.terminated_at is not None else now
    return max(0.0, end - m.launched_at)


def cmd_cloud(args: argparse.Namespace, cfg: config.Config) -> int:
    if getattr(args, "cloud_action", None) == "reap":
        return _reap(args, cfg)
    return _list(args, cfg)


def _service(cfg: config.Config, store: InstanceStore) -> CloudService:
    from gpuwarden.cloud.service import CloudService

    return CloudService(cfg.cloud, store, host=host_name(cfg))


def _failed_profiles(cfg: config.Config, problems: Sequence[str]) -> list[str]:
    """The profiles a problem line (``"<profile>: <what>"``) is about."""
    return [n for n in sorted(cfg.cloud.profiles) if any(p.startswith(f"{n}: ") for p in problems)]


# -- the list ---------------------------------------------------------------------------------


def _list(args: argparse.Namespace, cfg: config.Config) -> int:
    path = journal_path(args, cfg)
    if not cfg.cloud.profiles and not path.is_file():
        print("[]" if args.json else NO_PROFILES)
        return ExitCode.OK
    now = time.time()
    with instances(args, cfg) as store:
        rows, problems = _service(cfg, store).instances(now, live=not args.offline)
    for problem in problems:
        print(f"gpuwarden: cloud profile {safe_text(problem)}", file=sys.stderr)
    if args.json:
        print(json.dumps(instances_json(rows, now), indent=2))
        return ExitCode.OK
    if not rows and not cfg.cloud.profiles:
        print(NO_PROFILES)
        return ExitCode.OK
    print(render_instances(rows, now))
    if args.offline:
        print("states: as last recorded in the journal (--offline: EC2 was not asked)")
    else:
        failed = _failed_profiles(cfg, problems)
        if failed:
            print(
                f"states of profile {', '.join(failed)}: as last recorded in the journal "
                "(EC2 could not be asked, see above)"
            )
    return ExitCode.OK


def _money(usd: float | None) -> str:
    return UNPRICED if usd is None else f"${usd:,.2f}"


def _expires_in(m: Managed, now: float) -> float | None:
    return m.expires_at - now if m.live else None


def instance_json(m: Managed, now: float) -> dict[str, Any]:
    cost = m.cost_so_far(now)
    expires_in = _expires_in(m, now)
    return dataclasses.asdict(m) | {
        "age_s": round(_age(m, now), 3),
        "cost_usd": None if cost is None else round(cost, 6),
        "expires_in_s": None if expires_in is None else round(expires_in, 3),
    }


def instances_json(rows: Sequence[Managed], now: float) -> list[dict[str, Any]]:
    return [instance_json(m, now) for m in rows]


def _text(value: object, limit: int = 60) -> str:
    text = safe_text("" if value is None else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_instances(rows: Sequence[Managed], now: float) -> str:
    """A table, newest launch first, and a line of totals: live instances, what they cost per
    hour, and the estimated spend of every instance listed."""
    if not rows:
        return "no cloud instances"
    header = ("ID", "PROFILE", "TYPE", "STATE", "INCIDENT", "AGE", "EXPIRES IN", "COST")
    table = [header]
    for m in rows:
        expires_in = _expires_in(m, now)
        if expires_in is None:
            expiry = "ended"
        elif expires_in <= 0:
            expiry = "expired"
        else:
            expiry = format_duration(expires_in)
        table.append(
            (
                _text(m.instance_id),
                _text(m.profile),
                _text(m.instance_type),
                _text(m.state),
                _text(m.incident or "-"),
                format_duration(_age(m, now)),
                expiry,
                _money(m.cost_so_far(now)),
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]
    return "\n".join([*lines, _totals(rows, now)])


def _totals(rows: Sequence[Managed], now: float) -> str:
    live = [m for m in rows if m.live]
    rate = sum(m.hourly_usd for m in live if m.hourly_usd is not None)
    unpriced = sum(1 for m in live if m.hourly_usd is None)
    spent = sum(c for m in rows if (c := m.cost_so_far(now)) is not None)
    hourly = f"${rate:,.2f}/h" + (f" + {unpriced} unpriced" if unpriced else "")
    return (
        f"total: {len(live)} live, {hourly}; spent so far {_money(spent)} "
        "(estimated from the profiles' prices)"
    )


# -- the reaper -------------------------------------------------------------------------------


class _Errors(logging.Handler):
    """Collects what the cloud service logs as errors while the reaper runs: an instance it
    could not check or terminate."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _reap(args: argparse.Namespace, cfg: config.Config) -> int:
    if not journal_path(args, cfg).is_file() and not cfg.cloud.profiles:
        print(NO_PROFILES)
        return ExitCode.OK
    from gpuwarden.cloud import reaper

    now = time.time()
    errors = _Errors()
    logger = logging.getLogger("gpuwarden.cloud")
    with instances(args, cfg, write=True) as store:  # beside the daemon, never creating one
        service = _service(cfg, store)
        report = reaper.reconcile(service, now)
        logger.addHandler(errors)
        try:
            reaped = reaper.reap(service, now, dry_run=args.dry_run, seen=report)
            if not args.dry_run:
                service.renew_budgets(now)  # what it cannot reach is logged as an error
        finally:
            logger.removeHandler(errors)
    for line in report.lines():
        if not line.startswith("error "):
            print(f"reconcile: {_text(line, 300)}")
    for r in reaped:
        if args.dry_run:
            print(f"would terminate {r.instance_id} ({r.profile}, {r.reason}): {r.detail}")
        else:
            print(f"terminated {r.instance_id} ({r.profile}, {r.reason}): {r.detail} -> {r.state}")
    if not reaped:
        print("nothing to reap")
    problems = [f"cloud profile {e}" for e in report.errors] + errors.messages
    for problem in report.errors:
        print(f"gpuwarden: cloud profile {safe_text(problem)}", file=sys.stderr)
    if problems:
        count = len(problems)
        print(
            f"gpuwarden: cloud reap incomplete: {count} problem{'s' if count != 1 else ''} "
            "(above); what could not be checked was not terminated",
            file=sys.stderr,
        )
        return ExitCode.FAILURE
    return ExitCode.OK


# -- gpuwarden check --------------------------------------------------------------------------


def credential_warnings(cfg: config.Config) -> list[str]:
    """One line per cloud profile whose credentials are missing (or whose boto3 is): what is
    wrong and what to do. Nothing is asked of AWS; boto3 is imported only with a profile."""
    if not cfg.cloud.profiles:
        return []
    from gpuwarden.cli import selfcheck

    warnings = []
    for finding in selfcheck.check_cloud(cfg):
        if finding.ok:
            continue
        name = finding.check.removeprefix("cloud ")
        fix = f" — {finding.fix}" if finding.fix else ""
        warnings.append(f"cloud profile {name}: {finding.detail}{fix}")
    return warnings
