"""``gpuwarden notify-test`` (one test message to each URL of a target) and ``gpuwarden
outbox`` (messages waiting or failed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gpuwarden import config
from gpuwarden.cli.common import outbox
from gpuwarden.config import host_name
from gpuwarden.errors import ExitCode


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    test = sub.add_parser(
        "notify-test",
        parents=[common],
        help="send a test message to a notification target",
        description="Send one test message to each URL of TARGET and report "
        "the result per URL (exit 1 if any failed).",
    )
    test.add_argument("target", metavar="TARGET")

    outbox = sub.add_parser(
        "outbox",
        parents=[common],
        help="messages waiting or failed",
        description="Show the notification outbox: pending and failed messages.",
    )
    outbox.add_argument("--state-dir", type=Path, metavar="DIR")
    outbox.add_argument("--json", action="store_true")


def cmd_notify_test(args: argparse.Namespace, cfg: config.Config) -> int:
    from gpuwarden.notify.service import test_target

    results = test_target(cfg, args.target, host=host_name(cfg))
    for result in results:
        status = "ok  " if result.ok else "FAIL"
        detail = f": {result.detail}" if result.detail and not result.ok else ""
        print(f"{status} {result.url}{detail}")
    return ExitCode.OK if results and all(r.ok for r in results) else ExitCode.FAILURE


def cmd_outbox(args: argparse.Namespace, cfg: config.Config) -> int:
    with outbox(args, cfg) as reading:  # read only: sending is the daemon's
        rows = reading.pending() + reading.failed()
        counts = reading.counts()
    if args.json:
        print(
            json.dumps(
                {
                    "version": 1,
                    "counts": counts,
                    "messages": [
                        {
                            "message_id": r.message_id,
                            "target": r.target,
                            "status": r.status,
                            "title": r.title,
                            "attempts": r.attempts,
                            "last_error": r.last_error,
                            "next_attempt_at": r.next_attempt_at,
                        }
                        for r in rows
                    ],
                },
                indent=2,
            )
        )
        return ExitCode.OK
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "empty"
    print(f"outbox: {summary}")
    for r in rows:
        error = f" — {r.last_error}" if r.last_error else ""
        print(f"  {r.status:<8} {r.target:<12} attempts {r.attempts}  {r.title}{error}")
    return ExitCode.OK
