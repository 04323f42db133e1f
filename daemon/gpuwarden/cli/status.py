"""``gpuwarden status`` (the GPUs and their processes, once or ``--watch``) and ``gpuwarden
record`` (live telemetry written as a scenario to replay later)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from gpuwarden import config
from gpuwarden.cli.common import add_replay_options, duration, load_config, replay_options
from gpuwarden.clock import Clock, SimClock, SystemClock
from gpuwarden.errors import ExitCode, UsageError
from gpuwarden.model import Snapshot
from gpuwarden.sources import Source
from gpuwarden.sources.select import Options, SourceSpec, open_source, parse_spec, with_sample

log = logging.getLogger("gpuwarden")


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    status = sub.add_parser(
        "status",
        parents=[common],
        help="show the GPUs and the processes on them",
        description="Show each GPU and the processes on it.",
    )
    status.add_argument(
        "--source",
        default="nvml",
        metavar="SOURCE",
        help="nvml (default), scenario:FILE[@TIME] or smi-csv:FILE[@TIME]; @#N for the Nth sample",
    )
    add_replay_options(status)
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument(
        "--watch",
        type=duration,
        metavar="SECONDS",
        help="refresh every SECONDS until Ctrl-C (replays run in real time)",
    )
    status.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="the journal whose open incidents are shown under the GPUs (default: the config's)",
    )
    status.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the table (auto: only on a terminal, unless NO_COLOR)",
    )

    record = sub.add_parser(
        "record",
        parents=[common],
        help="write live telemetry as a scenario file",
        description="Sample a source and write what it saw as a scenario.",
    )
    record.add_argument("--out", required=True, type=Path, metavar="FILE")
    record.add_argument("--source", default="nvml", metavar="SOURCE")
    add_replay_options(record)
    record.add_argument(
        "--duration",
        type=duration,
        default=60.0,
        metavar="D",
        help="how long to record (default 60s)",
    )
    record.add_argument(
        "--interval",
        type=duration,
        default=1.0,
        metavar="I",
        help="time between samples (default 1s)",
    )
    record.add_argument("--name", help="the scenario's name (default: the output file's stem)")


def _position(spec: SourceSpec, source: Source, *, real_time: bool) -> Clock:
    """The clock a command reads snapshots on. A replay runs on a simulated clock that
    starts at the requested point of the recording, or in real time for --watch."""
    if not spec.replay:
        return SystemClock()
    start = getattr(source, "start_time", 0.0)
    at = spec.at or 0.0
    if spec.sample is not None:
        at = source.sample_offset(spec.sample)  # type: ignore[attr-defined]
    if real_time:
        clock = SystemClock()
        source.start_time = clock.now() - at  # type: ignore[attr-defined]
        return clock
    return SimClock(start=start + at)


def _colour(choice: str) -> bool:
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty()


def _show(
    snap: Snapshot, args: argparse.Namespace, cfg: config.Config, source: Source, *, clear: bool
) -> None:
    from gpuwarden.cli import status_incidents
    from gpuwarden.cli.status_view import render_table, snapshot_dict

    rows, upcoming, note = status_incidents.read(args, cfg)
    if args.json:
        doc = snapshot_dict(snap)
        if rows or upcoming:
            doc["incidents"] = status_incidents.as_json(rows, upcoming)
        print(json.dumps(doc, indent=None if args.watch else 2), flush=True)
        return
    width = shutil.get_terminal_size((80, 24)).columns if sys.stdout.isatty() else 80
    text = render_table(snap, width=width, colour=_colour(args.color))
    below = status_incidents.render(rows, upcoming, note, time.time(), width)
    if below:
        text = f"{text}\n\n{below}"
    position = getattr(source, "position", None)
    shown = position(snap.time) if position is not None else None
    if shown:  # which sample of a log this is: @TIME picks the last one taken by then
        head, _, rest = text.partition("\n")
        text = f"{head}\n  showing {shown}\n{rest}"
    if clear:
        sys.stdout.write("\x1b[H\x1b[2J")
    print(text, flush=True)


def cmd_status(args: argparse.Namespace) -> int:
    spec = with_sample(parse_spec(args.source), args.at_sample)
    options = replay_options(args)
    cfg = load_config(args.config)
    with _opened(spec, cfg, options) as source:
        clock = _position(spec, source, real_time=args.watch is not None)
        if args.watch is None:
            _show(source.snapshot(clock.now()), args, cfg, source, clear=False)
            return ExitCode.OK
        if args.watch <= 0:
            raise UsageError("--watch needs a positive number of seconds")
        tty = sys.stdout.isatty() and not args.json
        try:
            while True:
                began = clock.monotonic()
                _show(source.snapshot(clock.now()), args, cfg, source, clear=tty)
                clock.sleep(args.watch - (clock.monotonic() - began))
        except KeyboardInterrupt:
            return ExitCode.OK


def cmd_record(args: argparse.Namespace) -> int:
    from gpuwarden.sources import record

    spec = with_sample(parse_spec(args.source), args.at_sample)
    options = replay_options(args)
    if args.interval <= 0:
        raise UsageError("--interval must be positive")
    cfg = load_config(args.config)
    snapshots: list[Snapshot] = []
    with _opened(spec, cfg, options) as source:
        clock = _position(spec, source, real_time=False)
        began = clock.monotonic()
        try:
            while True:
                tick = clock.monotonic()
                snapshots.append(source.snapshot(clock.now()))
                if tick - began + args.interval > args.duration + 1e-9:
                    break
                clock.sleep(args.interval - (clock.monotonic() - tick))
        except KeyboardInterrupt:
            log.warning("recording stopped early after %d samples", len(snapshots))
    document = record.to_scenario(snapshots, args.name or args.out.stem)
    record.write(document, args.out)
    print(
        f"recorded {len(snapshots)} samples of {len(document['gpus'])} GPU(s) and "
        f"{len(document['jobs'])} process(es) to {args.out}",
        file=sys.stderr,
    )
    return ExitCode.OK


class _opened:
    """``with _opened(spec, cfg) as source``: the source is closed however the block ends."""

    def __init__(self, spec: SourceSpec, cfg: config.Config, options: Options) -> None:
        self.source = open_source(spec, cfg, options)

    def __enter__(self) -> Source:
        return self.source

    def __exit__(self, *exc: object) -> None:
        self.source.close()
