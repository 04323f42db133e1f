"""The ``gpuwarden`` command: the parser and the dispatch. Exit codes are ``errors.ExitCode``
(README, "Exit codes"); each command family lives in its own module of this package."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from gpuwarden import __version__
from gpuwarden.errors import ExitCode, GpuwardenError, InputError

if TYPE_CHECKING:
    from types import ModuleType

# The command families in the order ``--help`` lists them, each a module of this package with
# ``add_commands`` (and ``add_schema`` for ``check``). Only the family of the command given is
# imported: ``gpuwarden run`` does not load the report, status or cloud commands (their imports
# would stay in the daemon's memory), and ``gpuwarden --version`` loads none.
FAMILIES = ("status", "check", "run", "incidents", "oncall", "report", "notify", "doctor", "cloud")

# command -> (family, function, whether it takes the loaded config)
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "status": ("status", "cmd_status", False),
    "record": ("status", "cmd_record", False),
    "check": ("check", "cmd_check", False),
    "drill": ("check", "cmd_drill", False),
    "schema": ("check", "cmd_schema", False),
    "run": ("run", "cmd_run", False),
    "incidents": ("incidents", "cmd_incidents", True),
    "incident": ("incidents", "cmd_incident", True),
    "reset-breaker": ("incidents", "cmd_reset_breaker", True),
    "ack": ("oncall", "cmd_ack", True),
    "hold": ("oncall", "cmd_hold", True),
    "release": ("oncall", "cmd_release", True),
    "abort": ("oncall", "cmd_abort", True),
    "silence": ("oncall", "cmd_silence", True),
    "report": ("report", "cmd_report", True),
    "notify-test": ("notify", "cmd_notify_test", True),
    "outbox": ("notify", "cmd_outbox", True),
    "doctor": ("doctor", "cmd_doctor", False),
    "cloud": ("cloud", "cmd_cloud", True),
}


def _family(name: str) -> ModuleType:
    return importlib.import_module(f"gpuwarden.cli.{name}")


def _parser(families: Sequence[str] = FAMILIES) -> argparse.ArgumentParser:
    """The parser with the commands of ``families`` (all of them by default)."""
    parser = argparse.ArgumentParser(
        prog="gpuwarden",
        description="Incident response for GPU servers: telemetry, playbooks, safe actions.",
    )
    parser.add_argument("--version", action="version", version=f"gpuwarden {__version__}")
    config_help = "configuration file"
    if families:  # the config module loads pydantic: not for ``--version``
        from gpuwarden.config import DEFAULT_PATH

        config_help += f" (default: {DEFAULT_PATH} if it exists)"
    # Common options work before or after the command (``gpuwarden status --config F``).
    common = argparse.ArgumentParser(add_help=False)
    for target, default in ((parser, None), (common, argparse.SUPPRESS)):
        target.add_argument(
            "--config",
            metavar="FILE",
            default=default,
            help=config_help,
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
    for name in families:
        _family(name).add_commands(sub, common)
    if "check" in families:
        _family("check").add_schema(sub, common)
    return parser


def _families_for(argv: Sequence[str]) -> Sequence[str]:
    """The families the parser needs for ``argv``: the given command's alone, none for
    ``--version`` or a missing command, all of them for ``--help`` or an unknown command (to
    list every command). The command is the first word that is not an option or the value of
    ``--config`` (argparse takes ``--c``, ``--co``, ... for ``--config`` too)."""
    words = iter(argv)
    for word in words:
        if word == "--":
            break
        if word.startswith("-"):
            if word in ("-h", "--help"):
                return FAMILIES
            if word.startswith("--c") and "=" not in word:
                next(words, None)
            continue
        return (COMMANDS[word][0],) if word in COMMANDS else FAMILIES
    return ()


def _handler(command: str) -> Callable[[argparse.Namespace], int]:
    family, function, takes_config = COMMANDS[command]
    handler = getattr(_family(family), function)
    if not takes_config:
        return cast("Callable[[argparse.Namespace], int]", handler)
    from gpuwarden.cli.common import with_config

    return with_config(handler)


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
    words = _glued(sys.argv[1:] if argv is None else argv)
    args = _parser(_families_for(words)).parse_args(words)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(_handler(args.command)(args))
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
