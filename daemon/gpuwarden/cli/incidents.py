"""``gpuwarden incidents``, ``incident`` (one timeline), ``ack`` and ``reset-breaker``: what
the on-call person reads and says to the journal."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden import config
from gpuwarden.cli.common import duration, state_dir
from gpuwarden.errors import ExitCode, UsageError
from gpuwarden.journal.schema import JOURNAL_NAME

if TYPE_CHECKING:
    from gpuwarden.cloud.instance import Managed


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    incidents = sub.add_parser(
        "incidents",
        parents=[common],
        help="list incidents",
        description="List incidents from the journal, newest first.",
    )
    incidents.add_argument("--state-dir", type=Path, metavar="DIR")
    incidents.add_argument("--json", action="store_true")
    incidents.add_argument(
        "--since", type=duration, metavar="D", help="only incidents opened in the last D (e.g. 24h)"
    )
    incidents.add_argument("--open", action="store_true", help="only open incidents")

    incident = sub.add_parser(
        "incident",
        parents=[common],
        help="one incident's timeline",
        description="Everything recorded for one incident: what ran, on "
        "whom, why, what was skipped and why. ID may be `last`.",
    )
    incident.add_argument("id", metavar="ID")
    incident.add_argument("--state-dir", type=Path, metavar="DIR")
    incident.add_argument("--json", action="store_true")

    ack = sub.add_parser(
        "ack",
        parents=[common],
        help="record that a person has taken over",
        description="Acknowledge an incident: reminders about it stop.",
    )
    ack.add_argument("id", metavar="ID", help="an incident id, a unique prefix of one, or last")
    ack.add_argument("--state-dir", type=Path, metavar="DIR")

    reset = sub.add_parser(
        "reset-breaker",
        parents=[common],
        help="let destructive steps run again after the breaker tripped",
        description="Reset the circuit breaker recorded in the journal.",
    )
    reset.add_argument("--state-dir", type=Path, metavar="DIR")


def _readonly(args: argparse.Namespace, cfg: config.Config) -> Any:
    from gpuwarden.journal.journal import Journal

    return Journal.open_readonly(state_dir(args, cfg) / JOURNAL_NAME)


def cmd_incidents(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.journal import view as journal_view

    journal = _readonly(args, cfg)
    try:
        since = None if args.since is None else time.time() - args.since
        rows = journal.incidents(since=since, open_only=args.open)
    finally:
        journal.close()
    if args.json:
        print(json.dumps({"version": 1, "incidents": journal_view.incidents_json(rows)}, indent=2))
    else:
        print(journal_view.render_incidents(rows, time.time()))
    return ExitCode.OK


def cmd_incident(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.cli import cloud as cli_cloud
    from gpuwarden.journal import view as journal_view

    journal = _readonly(args, cfg)
    try:
        incident = journal_target(journal, args.id)
        timeline = journal.timeline(incident.id)
        instances = _cloud_instances(journal.path, incident.id)
    finally:
        journal.close()
    now = time.time()
    if args.json:
        doc = journal_view.timeline_json(incident, timeline)
        doc["instances"] = [cli_cloud.instance_json(m, now) for m in instances]
        print(json.dumps(doc, indent=2))
    else:
        print(journal_view.render_timeline(incident, timeline, now))
        if instances:
            print("\ncloud instances\n" + cli_cloud.render_instances(instances, now))
    return ExitCode.OK


def _cloud_instances(path: Path, incident: str) -> list[Managed]:
    """The cloud instances an incident launched, from the same journal file."""
    from gpuwarden.cloud.store import InstanceStore

    with InstanceStore.open_readonly(path) as store:
        return store.for_incident(incident)


def cmd_reset_breaker(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.journal.journal import Journal

    journal = Journal(state_dir(args, cfg) / JOURNAL_NAME)
    try:
        state = journal.breaker()
        if state is None:
            print("the circuit breaker is not tripped")
            return ExitCode.OK
        journal.reset_breaker(time.time())
    finally:
        journal.close()
    print("circuit breaker reset: destructive steps may run again")
    return ExitCode.OK


def journal_target(journal: Any, text: str) -> Any:
    if text == "last":
        rows = journal.incidents()
        if not rows:
            raise UsageError("the journal has no incidents yet")
        return max(rows, key=lambda r: r.opened_at)
    return journal.find_incident(text)  # an id or a unique prefix of one


def cmd_ack(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.journal.journal import Journal

    journal = Journal(state_dir(args, cfg) / JOURNAL_NAME)
    try:
        incident = journal_target(journal, args.id)
        journal.ack(incident.id, time.time())
    finally:
        journal.close()
    print(f"acknowledged {incident.id}: no more reminders about it")
    return ExitCode.OK
