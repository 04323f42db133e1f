"""The ``gpuwarden`` command: the parser and the dispatch. Exit codes are ``errors.ExitCode``
(README, "Exit codes"); each command family lives in its own module of this package."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from gpuwarden import __version__, config
from gpuwarden.cli import check, cloud, doctor, incidents, notify, oncall, report, run, status
from gpuwarden.cli.common import with_config
from gpuwarden.errors import ExitCode, GpuwardenError, InputError


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
    status.add_commands(sub, common)
    check.add_commands(sub, common)
    run.add_commands(sub, common)
    incidents.add_commands(sub, common)
    oncall.add_commands(sub, common)
    report.add_commands(sub, common)
    notify.add_commands(sub, common)
    doctor.add_commands(sub, common)
    cloud.add_commands(sub, common)
    check.add_schema(sub, common)
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "status": status.cmd_status,
    "record": status.cmd_record,
    "check": check.cmd_check,
    "drill": check.cmd_drill,
    "schema": check.cmd_schema,
    "run": run.cmd_run,
    "incidents": with_config(incidents.cmd_incidents),
    "incident": with_config(incidents.cmd_incident),
    "reset-breaker": with_config(incidents.cmd_reset_breaker),
    "ack": with_config(oncall.cmd_ack),
    "hold": with_config(oncall.cmd_hold),
    "release": with_config(oncall.cmd_release),
    "abort": with_config(oncall.cmd_abort),
    "silence": with_config(oncall.cmd_silence),
    "report": with_config(report.cmd_report),
    "notify-test": with_config(notify.cmd_notify_test),
    "outbox": with_config(notify.cmd_outbox),
    "doctor": doctor.cmd_doctor,
    "cloud": with_config(cloud.cmd_cloud),
}


def _glued(argv: Sequence[str]) -> list[str]:
    """``--columns --query-gpu=...``: the pasted value begins with a dash, which argparse would
    take for an option; glue it to its flag (``--columns=--query-gpu=...``)."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--columns" and arg.startswith("-"):
            out[-1] = f"--columns={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(_glued(sys.argv[1:] if argv is None else argv))
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
