"""``gpuwarden incidents``, ``incident`` (one timeline) and ``reset-breaker``: what the on-call
person reads in the journal, with each open incident's next step as the daemon last wrote it.
The views open the journal read only; ``reset-breaker`` writes it beside the running daemon
(``common.journal(..., write=True)``), which picks the change up at its next tick. ``ack``,
``hold``, ``release``, ``abort`` and ``silence`` are in ``oncall.py``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden import config
from gpuwarden.cli.common import duration, instances, journal
from gpuwarden.errors import ExitCode, UsageError
from gpuwarden.text import safe_text

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

    reset = sub.add_parser(
        "reset-breaker",
        parents=[common],
        help="let destructive steps run again after the breaker tripped",
        description="Reset the circuit breaker recorded in the journal.",
    )
    reset.add_argument("--state-dir", type=Path, metavar="DIR")


def cmd_incidents(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.journal import next_view
    from gpuwarden.journal import view as journal_view

    with journal(args, cfg) as reading:
        since = None if args.since is None else time.time() - args.since
        rows = reading.incidents(since=since, open_only=args.open)
        upcoming = reading.next_steps()
    now = time.time()
    if args.json:
        docs = journal_view.incidents_json(rows)
        for row, doc in zip(rows, docs, strict=True):
            found = upcoming.get(row.id) if row.open else None
            doc["next"] = (
                None if found is None else next_view.next_json(found[1], row.opened_at, found[0])
            )
        print(json.dumps({"version": 1, "incidents": docs}, indent=2))
        return ExitCode.OK
    print(journal_view.render_incidents(rows, now))
    if args.open:
        for row in rows:
            found = upcoming.get(row.id)
            if found is not None:
                words = next_view.next_words(found[1], row.opened_at, now, found[0])
                print(f"\n{safe_text(row.id)}\n  next: {words}")
    return ExitCode.OK


def cmd_incident(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.cli import cloud as cli_cloud
    from gpuwarden.journal import next_view
    from gpuwarden.journal import view as journal_view

    with journal(args, cfg) as reading:
        incident = journal_target(reading, args.id)
        timeline = reading.timeline(incident.id)
        found = reading.next_steps().get(incident.id) if incident.open else None
    with instances(args, cfg) as store:  # the cloud instances it launched
        launched: list[Managed] = store.for_incident(incident.id)
    now = time.time()
    if args.json:
        doc = journal_view.timeline_json(incident, timeline)
        doc["next"] = (
            None if found is None else next_view.next_json(found[1], incident.opened_at, found[0])
        )
        doc["instances"] = [cli_cloud.instance_json(m, now) for m in launched]
        print(json.dumps(doc, indent=2))
    else:
        text = journal_view.render_timeline(incident, timeline, now)
        if found is not None or incident.open:
            words = (
                next_view.next_words(found[1], incident.opened_at, now, found[0])
                if found is not None
                else "not known: the daemon has not written it (is it running?)"
            )
            head, sep, rest = text.partition("\n\n")
            text = f"{head}\n  next      {words}{sep}{rest}"
        print(text)
        if launched:
            print("\ncloud instances\n" + cli_cloud.render_instances(launched, now))
    return ExitCode.OK


def cmd_reset_breaker(args: argparse.Namespace, cfg: config.Config) -> int:
    with journal(args, cfg, write=True) as writing:
        if writing.breaker() is None:
            print("the circuit breaker is not tripped")
            return ExitCode.OK
        writing.reset_breaker(time.time())
    print("circuit breaker reset: destructive steps may run again")
    return ExitCode.OK


def journal_target(journal: Any, text: str) -> Any:
    if text == "last":
        rows = journal.incidents()
        if not rows:
            raise UsageError("the journal has no incidents yet")
        return max(rows, key=lambda r: r.opened_at)
    return journal.find_incident(text)  # an id or a unique prefix of one
