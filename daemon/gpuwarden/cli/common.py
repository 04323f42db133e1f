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
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden import config
from gpuwarden.journal.schema import JOURNAL_NAME, Access
from gpuwarden.units import parse_duration

if TYPE_CHECKING:
    from gpuwarden.cloud.store import InstanceStore
    from gpuwarden.journal.journal import Journal
    from gpuwarden.notify.outbox import Outbox


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
