"""What every command needs: durations on the command line, the config, the playbook paths,
the state directory and the journal in it, each found and opened the same way by every command.

The journal file is opened here and nowhere else in ``cli/`` (``run`` excepted: the daemon owns
it): ``journal``, ``outbox`` and ``instances`` open it read only, or with ``write=True`` for a
command that changes it beside a running daemon (``journal.schema.Access``). A new command that
writes is ``with journal(args, cfg, write=True) as j: ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden import config
from gpuwarden.errors import UsageError
from gpuwarden.journal.schema import JOURNAL_NAME, Access
from gpuwarden.sources.select import EVENT_FORMS, Options, parse_events
from gpuwarden.units import parse_duration

if TYPE_CHECKING:
    from gpuwarden.cloud.store import InstanceStore
    from gpuwarden.journal.journal import Journal
    from gpuwarden.notify.outbox import Outbox, OutboxRow


def duration(text: str) -> float:
    """An argparse type: ``90s``, ``5m``, ``1h30m`` as seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def config_path(path: str | None) -> Path | None:
    """--config, else $GPUWARDEN_CONFIG, else the default path if it exists."""
    chosen = path or os.environ.get("GPUWARDEN_CONFIG")
    if chosen:
        return Path(chosen)
    return config.DEFAULT_PATH if config.DEFAULT_PATH.is_file() else None


def load_config(path: str | None) -> config.Config:
    found = config_path(path)
    return config.Config() if found is None else config.load(found)


def playbook_paths(given: Sequence[str] | None, cfg: config.Config) -> list[str]:
    """The playbooks named, else the config's directory; in a checkout with neither, the
    project's own ``playbooks/`` (said on stderr)."""
    if given:
        return list(given)
    if cfg.playbooks.exists() or not Path("playbooks").is_dir():
        return [str(cfg.playbooks)]
    print(f"gpuwarden: {cfg.playbooks} does not exist; using ./playbooks", file=sys.stderr)
    return ["playbooks"]


def state_dir(args: argparse.Namespace, cfg: config.Config) -> Path:
    """--state-dir, else the config's."""
    return Path(args.state_dir) if getattr(args, "state_dir", None) else cfg.state_dir


def journal_path(args: argparse.Namespace, cfg: config.Config) -> Path:
    """The journal in the state directory (``--state-dir``, else the config's)."""
    return state_dir(args, cfg) / JOURNAL_NAME


def _access(write: bool) -> Access:
    return Access.WRITE if write else Access.READ


@contextlib.contextmanager
def journal(
    args: argparse.Namespace, cfg: config.Config, *, write: bool = False
) -> Iterator[Journal]:
    """The journal, read only (``mode=ro``, ``query_only``); with ``write``, an existing
    journal written in short transactions that wait for the daemon's (never created,
    migrated or switched out of WAL)."""
    from gpuwarden.journal.journal import Journal

    with Journal(journal_path(args, cfg), access=_access(write)) as opened:
        yield opened


@contextlib.contextmanager
def outbox(
    args: argparse.Namespace, cfg: config.Config, *, write: bool = False
) -> Iterator[Outbox]:
    """The notification outbox in the journal, opened like ``journal``."""
    from gpuwarden.notify.outbox import Outbox

    with Outbox(journal_path(args, cfg), access=_access(write)) as opened:
        yield opened


def scratch_messages(path: Path) -> list[OutboxRow]:
    """Every message in the outbox of a drill's own scratch journal (never the daemon's), read
    only; none when the drill wrote no journal."""
    from gpuwarden.notify.outbox import Outbox

    if not path.exists():
        return []
    with Outbox.open_readonly(path) as opened:
        return opened.rows()


@contextlib.contextmanager
def instances(
    args: argparse.Namespace, cfg: config.Config, *, write: bool = False
) -> Iterator[InstanceStore]:
    """The cloud instances recorded in the journal, opened like ``journal``."""
    from gpuwarden.cloud.store import InstanceStore

    with InstanceStore(journal_path(args, cfg), access=_access(write)) as opened:
        yield opened


def with_config(
    command: Callable[[argparse.Namespace, config.Config], int],
) -> Callable[[argparse.Namespace], int]:
    """A command that needs only the arguments and the loaded config."""

    def run(args: argparse.Namespace) -> int:
        return command(args, load_config(args.config))

    return run


def add_replay_options(parser: argparse.ArgumentParser, *, sample: bool = True) -> None:
    """The options of commands that read a source: kernel-log events beside it, and how to
    read a replayed log (docs/scenarios.md lists every form)."""
    parser.add_argument(
        "--events",
        action="append",
        metavar="EVENTS",
        help=f"kernel-log events beside the source: {EVENT_FORMS} (repeatable)",
    )
    parser.add_argument(
        "--columns",
        metavar="LIST",
        help="the columns of an nvidia-smi log written with --format=csv,noheader: "
        "'timestamp,index,memory.used [MiB],...', or its --query-gpu=... argument as is",
    )
    parser.add_argument(
        "--tz",
        metavar="ZONE",
        help="the time zone of local times in replayed logs (nvidia-smi, dmesg -T, "
        "journalctl -k); default UTC",
    )
    parser.add_argument(
        "--boot-time",
        metavar="TIME",
        help="when the machine of a plain dmesg log booted (ISO 8601, in --tz); "
        "default: the start of the replay",
    )
    if sample:
        parser.add_argument(
            "--at-sample",
            type=int,
            metavar="N",
            help="show the Nth sample of a log, the Nth keyframe of a scenario (1 is the "
            "first); the same as @#N",
        )


def replay_options(args: argparse.Namespace, default_events: Sequence[str] = ()) -> Options:
    """The ``Options`` that ``add_replay_options`` read; ``default_events`` when no
    ``--events`` was given (the daemon's config)."""
    given = getattr(args, "events", None)
    events = tuple(parse_events(e) for e in (given if given is not None else default_events))
    columns = None
    if getattr(args, "columns", None):
        from gpuwarden.sources.smi_csv_records import split_columns

        columns = tuple(split_columns(args.columns))
    if columns is not None and not columns:
        raise UsageError("--columns is empty", "write e.g. --columns 'timestamp,index,name'")
    tz = getattr(args, "tz", None)
    boot_text = getattr(args, "boot_time", None)
    if tz is not None or boot_text:  # the kernel-log modules only when a log's times are read
        from gpuwarden.sources.kernel_events import zone_of

        zone = zone_of(tz)
    boot_time = None
    if boot_text:
        try:
            booted = dt.datetime.fromisoformat(boot_text.replace("Z", "+00:00"))
        except ValueError:
            raise UsageError(
                f"--boot-time {boot_text!r} is not a time",
                "write e.g. 2026-03-03T09:12:44 (uptime -s on that machine tells it)",
            ) from None
        if booted.tzinfo is None:
            booted = booted.replace(tzinfo=zone)
        boot_time = booted.timestamp()
    return Options(columns=columns, tz=tz, events=events, boot_time=boot_time)
