"""The ``gpuwarden`` command line. Exit codes are ``errors.ExitCode`` (README, "Exit codes")."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuwarden import __version__, cli_cloud, cli_run, config
from gpuwarden.clock import Clock, SimClock, SystemClock
from gpuwarden.errors import ExitCode, GpuwardenError, InputError, UsageError
from gpuwarden.model import Snapshot
from gpuwarden.sources import Source
from gpuwarden.sources.select import SourceSpec, open_source, parse_spec
from gpuwarden.units import parse_duration

log = logging.getLogger("gpuwarden")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuwarden",
        description="Incident response for GPU servers: telemetry, playbooks, safe actions.",
    )
    parser.add_argument("--version", action="version", version=f"gpuwarden {__version__}")
    # Common options work before or after the command (``gpuwarden status --config F``).
    common = argparse.ArgumentParser(add_help=False)
    for target, default in ((parser, None), (common, argparse.SUPPRESS)):
        target.add_argument(
            "--config",
            metavar="FILE",
            default=default,
            help=f"configuration file (default: {config.DEFAULT_PATH} if it exists)",
        )
        target.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=default or False,
            help="log more to stderr",
        )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

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
        help="nvml (default), scenario:FILE[@TIME] or smi-csv:FILE[@TIME]",
    )
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument(
        "--watch",
        type=_duration,
        metavar="SECONDS",
        help="refresh every SECONDS until Ctrl-C (replays run in real time)",
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
    record.add_argument(
        "--duration",
        type=_duration,
        default=60.0,
        metavar="D",
        help="how long to record (default 60s)",
    )
    record.add_argument(
        "--interval",
        type=_duration,
        default=1.0,
        metavar="I",
        help="time between samples (default 1s)",
    )
    record.add_argument("--name", help="the scenario's name (default: the output file's stem)")

    check = sub.add_parser(
        "check",
        parents=[common],
        help="validate the config and playbooks and print an inventory",
        description="Validate the config and the playbooks against it. Exit 0 when valid, "
        "1 when not (every problem as file:line:col), 2 on a usage error.",
    )
    check.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="playbook files or directories (default: the config's playbooks)",
    )
    check.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1) on warnings too, such as missing cloud credentials",
    )

    drill = sub.add_parser(
        "drill",
        parents=[common],
        help="rehearse the playbooks against a scenario on a simulated clock",
        description="Run a scenario through the real engine, as fast as the CPU allows, and "
        "print what would happen second by second. Nothing outside this process is touched.",
    )
    drill.add_argument("scenario", type=Path, metavar="SCENARIO")
    drill.add_argument(
        "--playbooks",
        action="append",
        metavar="PATH",
        help="playbook file or directory (repeatable; default: the config's)",
    )
    drill.add_argument("--json", action="store_true", help="one JSON object per line")
    drill.add_argument(
        "--notify",
        action="store_true",
        help="really deliver the messages, marked [DRILL], to the config's targets",
    )
    drill.add_argument(
        "--cloud",
        action="store_true",
        help="ask EC2 (DryRun: nothing is launched) whether each provision step would be "
        "allowed: credentials, permissions, parameters",
    )
    drill.add_argument(
        "--tick",
        type=_duration,
        metavar="D",
        help="simulated time between snapshots (default: the config's tick)",
    )

    cli_run.add_commands(sub, common, _duration)
    cli_run.add_doctor(sub, common)
    cli_cloud.add_commands(sub, common)

    sub.add_parser(
        "schema",
        parents=[common],
        help="print the JSON Schema of playbook files (for editors)",
        description="Print the JSON Schema of playbook files, for editor completion.",
    )
    return parser


def _config_path(path: str | None) -> Path | None:
    """--config, else $GPUWARDEN_CONFIG, else the default path if it exists."""
    chosen = path or os.environ.get("GPUWARDEN_CONFIG")
    if chosen:
        return Path(chosen)
    return config.DEFAULT_PATH if config.DEFAULT_PATH.is_file() else None


def _load_config(path: str | None) -> config.Config:
    found = _config_path(path)
    return config.Config() if found is None else config.load(found)


def _playbook_paths(given: Sequence[str] | None, cfg: config.Config) -> list[str]:
    """The playbooks named, else the config's directory; in a checkout with neither, the
    project's own ``playbooks/`` (said on stderr)."""
    if given:
        return list(given)
    if cfg.playbooks.exists() or not Path("playbooks").is_dir():
        return [str(cfg.playbooks)]
    print(f"gpuwarden: {cfg.playbooks} does not exist; using ./playbooks", file=sys.stderr)
    return ["playbooks"]


def cmd_check(args: argparse.Namespace) -> int:
    from gpuwarden import inventory
    from gpuwarden.playbook import loader

    found = _config_path(args.config)
    try:
        cfg = config.Config() if found is None else config.load(found)
        paths = _playbook_paths(args.paths, cfg)
        if not args.paths and not Path(paths[0]).exists():
            raise InputError.at(
                paths[0],
                None,
                None,
                "no such playbook directory",
                hint="name playbook files or directories (gpuwarden check PATH...), "
                "or set playbooks: in the config",
            )
        playbooks = loader.load(paths, cfg)
    except InputError as exc:
        print(exc.render(), file=sys.stderr)
        if found is None:
            print(
                f"note: no config file was read (no --config, no GPUWARDEN_CONFIG, no "
                f"{config.DEFAULT_PATH}): there are no notification targets or cloud "
                "profiles, and the priority classes are the built-in ones",
                file=sys.stderr,
            )
        count = len(exc.problems)
        print(f"check failed: {count} problem{'s' if count != 1 else ''}", file=sys.stderr)
        return ExitCode.FAILURE
    source = str(found) if found else "(none: built-in defaults)"
    print(inventory.render(cfg, source, playbooks))
    warnings = cli_cloud.credential_warnings(cfg)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if warnings and args.strict:
        count = len(warnings)
        print(
            f"check failed: {count} warning{'s' if count != 1 else ''} (--strict)", file=sys.stderr
        )
        return ExitCode.FAILURE
    print(f"ok: {len(playbooks.rules)} rule(s) in {len(playbooks.files)} file(s)")
    return ExitCode.OK


def cmd_drill(args: argparse.Namespace) -> int:
    from gpuwarden import drill
    from gpuwarden.playbook import loader

    cfg = _load_config(args.config)
    playbooks = loader.load(_playbook_paths(args.playbooks, cfg), cfg)
    if not args.scenario.is_file():
        raise UsageError(
            f"no such scenario file: {args.scenario}", "shipped scenarios are in scenarios/"
        )
    if args.tick is not None and args.tick <= 0:
        raise UsageError("--tick must be positive")
    if args.cloud and not cfg.cloud.profiles:
        raise UsageError(
            "--cloud: the config has no cloud profiles to ask EC2 about",
            "define them under cloud.profiles, or give the daemon's --config",
        )
    summary = drill.Summary()
    # The drill's own journal for --notify's outbox and --cloud's instances; never the daemon's.
    scratch = (
        tempfile.TemporaryDirectory(prefix="gpuwarden-drill-")
        if args.notify or args.cloud
        else None
    )
    journal = Path(scratch.name) / "journal.db" if scratch else None
    try:
        for record in drill.run(
            args.scenario,
            cfg,
            playbooks,
            tick=args.tick,
            summary=summary,
            notify=journal if args.notify else None,
            cloud=journal if args.cloud else None,
        ):
            if args.json:
                print(json.dumps(record), flush=False)
            else:
                print(drill.render_record(record))
        if not args.json:
            print(drill.render_summary(summary, str(args.scenario), len(playbooks.rules)))
    finally:
        if scratch is not None:
            scratch.cleanup()
    return ExitCode.OK


def cmd_schema(args: argparse.Namespace) -> int:
    from gpuwarden.playbook.jsonschema import playbook_schema

    del args
    print(json.dumps(playbook_schema(), indent=2))
    return ExitCode.OK


def _position(spec: SourceSpec, source: Source, *, real_time: bool) -> Clock:
    """The clock a command reads snapshots on. A replay runs on a simulated clock that
    starts at the requested point of the recording, or in real time for --watch."""
    if not spec.replay:
        return SystemClock()
    start = getattr(source, "start_time", 0.0)
    at = spec.at or 0.0
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


def _show(snap: Snapshot, args: argparse.Namespace, *, clear: bool) -> None:
    from gpuwarden.status import render_table, snapshot_dict

    if args.json:
        print(json.dumps(snapshot_dict(snap), indent=None if args.watch else 2), flush=True)
        return
    width = shutil.get_terminal_size((80, 24)).columns if sys.stdout.isatty() else 80
    text = render_table(snap, width=width, colour=_colour(args.color))
    if clear:
        sys.stdout.write("\x1b[H\x1b[2J")
    print(text, flush=True)


def cmd_status(args: argparse.Namespace) -> int:
    spec = parse_spec(args.source)
    cfg = _load_config(args.config)
    with _opened(spec, cfg) as source:
        clock = _position(spec, source, real_time=args.watch is not None)
        if args.watch is None:
            _show(source.snapshot(clock.now()), args, clear=False)
            return ExitCode.OK
        if args.watch <= 0:
            raise UsageError("--watch needs a positive number of seconds")
        tty = sys.stdout.isatty() and not args.json
        try:
            while True:
                began = clock.monotonic()
                _show(source.snapshot(clock.now()), args, clear=tty)
                clock.sleep(args.watch - (clock.monotonic() - began))
        except KeyboardInterrupt:
            return ExitCode.OK


def cmd_record(args: argparse.Namespace) -> int:
    from gpuwarden import record

    spec = parse_spec(args.source)
    if args.interval <= 0:
        raise UsageError("--interval must be positive")
    cfg = _load_config(args.config)
    snapshots: list[Snapshot] = []
    with _opened(spec, cfg) as source:
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

    def __init__(self, spec: SourceSpec, cfg: config.Config) -> None:
        self.source = open_source(spec, cfg)

    def __enter__(self) -> Source:
        return self.source

    def __exit__(self, *exc: object) -> None:
        self.source.close()


def cmd_run(args: argparse.Namespace) -> int:
    found = _config_path(args.config)
    cfg = config.Config() if found is None else config.load(found)
    return cli_run.cmd_run(args, cfg, _playbook_paths(args.playbooks, cfg), found)


def cmd_doctor(args: argparse.Namespace) -> int:
    found = _config_path(args.config)
    cfg = config.Config() if found is None else config.load(found)
    return cli_run.cmd_doctor(args, cfg, _playbook_paths(None, cfg), found)


def _with_config(
    command: Callable[[argparse.Namespace, config.Config], int],
) -> Callable[[argparse.Namespace], int]:
    """A command of ``cli_run`` that needs only the arguments and the loaded config."""

    def run(args: argparse.Namespace) -> int:
        return command(args, _load_config(args.config))

    return run


COMMANDS = {
    "status": cmd_status,
    "record": cmd_record,
    "check": cmd_check,
    "drill": cmd_drill,
    "schema": cmd_schema,
    "run": cmd_run,
    "incidents": _with_config(cli_run.cmd_incidents),
    "incident": _with_config(cli_run.cmd_incident),
    "reset-breaker": _with_config(cli_run.cmd_reset_breaker),
    "ack": _with_config(cli_run.cmd_ack),
    "notify-test": _with_config(cli_run.cmd_notify_test),
    "outbox": _with_config(cli_run.cmd_outbox),
    "doctor": cmd_doctor,
    "cloud": _with_config(cli_cloud.cmd_cloud),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(COMMANDS[args.command](args))
    except InputError as exc:  # file:line:col first, as compilers print it
        print(exc.render(), file=sys.stderr)
        return int(exc.exit_code)
    except GpuwardenError as exc:
        print(f"gpuwarden: {exc.render()}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("gpuwarden: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        sys.stderr.close()
        return int(ExitCode.OK)
    except Exception as exc:
        if os.environ.get("GPUWARDEN_DEBUG"):
            raise
        print(
            f"gpuwarden: internal error: {type(exc).__name__}: {exc}\n"
            "  hint: this is a bug; rerun with GPUWARDEN_DEBUG=1 for a traceback and report it",
            file=sys.stderr,
        )
        return int(ExitCode.FAILURE)
