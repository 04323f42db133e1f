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
from gpuwarden.cli.status_watch import Watch
from gpuwarden.clock import Clock, ScaledClock, SimClock, SystemClock
from gpuwarden.errors import ExitCode, UsageError
from gpuwarden.model import Snapshot
from gpuwarden.sources import Source
from gpuwarden.sources.select import Options, SourceSpec, open_source, parse_spec, with_sample
from gpuwarden.text import fit

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
        help="refresh every SECONDS until Ctrl-C (exit 0); replays run in real time, on "
        "their own clock",
    )
    status.add_argument(
        "--compact",
        action="store_true",
        help="one line per GPU (with --watch this is automatic when the table does not fit)",
    )
    status.add_argument(
        "--events-for",
        type=duration,
        default=600.0,
        metavar="D",
        help="with --watch: keep each event on screen this long (default 10m)",
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
    """The clock a command reads snapshots on. A replay runs on its own clock, from the
    requested point of the recording: simulated, or in real time for --watch (so that the
    screen shows the recording's time, not today's)."""
    if not spec.replay:
        return SystemClock()
    start = getattr(source, "start_time", 0.0)
    at = spec.at or 0.0
    if spec.sample is not None:
        at = source.sample_offset(spec.sample)  # type: ignore[attr-defined]
    if real_time:
        return ScaledClock(1.0, start=start + at)
    return SimClock(start=start + at)


def _colour(choice: str) -> bool:
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty()


def _show(
    snap: Snapshot,
    args: argparse.Namespace,
    cfg: config.Config,
    source: Source,
    watch: Watch | None,
) -> None:
    from gpuwarden.cli import status_incidents
    from gpuwarden.cli.status_view import render_table, snapshot_dict
    from gpuwarden.cli.status_watch import compact_lines

    rows, upcoming, inc_note = status_incidents.read(args, cfg)
    if args.json:
        doc = snapshot_dict(snap)
        if rows or upcoming:
            doc["incidents"] = status_incidents.as_json(rows, upcoming)
        print(json.dumps(doc, indent=None if args.watch else 2), flush=True)
        return
    position = getattr(source, "position", None)
    shown = position(snap.time) if position is not None else None
    # Which sample of a log this is: @TIME picks the last one taken by then.
    note = f"  showing {shown}" if shown else None
    tty = sys.stdout.isatty()
    size = shutil.get_terminal_size((80, 24)) if tty else os.terminal_size((80, 24))
    colour = _colour(args.color)
    # The open incidents in the journal, each with its next step, under the GPUs.
    below = status_incidents.render(rows, upcoming, inc_note, time.time(), size.columns)
    if watch is not None and tty:  # one screen, redrawn in place
        text = watch.frame(
            snap,
            width=size.columns,
            height=size.lines,
            colour=colour,
            note=note,
            below=below.splitlines(),
        )
        sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
        sys.stdout.flush()
        return
    if args.compact:
        lines = compact_lines(snap, width=size.columns, height=10_000, colour=colour)
    else:
        lines = render_table(snap, width=size.columns, colour=colour).splitlines()
    if note:
        lines[1:1] = [note]
    if below:
        lines += ["", *below.splitlines()]
    print("\n".join(fit(line, size.columns) for line in lines), flush=True)


def cmd_status(args: argparse.Namespace) -> int:
    spec = with_sample(parse_spec(args.source), args.at_sample)
    options = replay_options(args)
    cfg = load_config(args.config)
    with _opened(spec, cfg, options) as source:
        clock = _position(spec, source, real_time=args.watch is not None)
        if args.watch is None:
            _show(source.snapshot(clock.now()), args, cfg, source, None)
            return ExitCode.OK
        if args.watch <= 0:
            raise UsageError("--watch needs a positive number of seconds")
        if args.events_for < 0:
            raise UsageError("--events-for cannot be negative")
        watch = Watch(events_for=args.events_for, compact=args.compact)
        try:
            while True:
                began = clock.monotonic()
                _show(source.snapshot(clock.now()), args, cfg, source, watch)
                clock.sleep(args.watch - (clock.monotonic() - began))
        except KeyboardInterrupt:  # how a watch is ended: not a failure (README, exit codes)
            if sys.stdout.isatty():
                print(flush=True)
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
