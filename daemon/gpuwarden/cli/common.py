"""What every command needs: durations on the command line, the config, the playbook paths
and the state directory, each found the same way by every command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuwarden import config
from gpuwarden.units import parse_duration


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


def with_config(
    command: Callable[[argparse.Namespace, config.Config], int],
) -> Callable[[argparse.Namespace], int]:
    """A command that needs only the arguments and the loaded config."""

    def run(args: argparse.Namespace) -> int:
        return command(args, load_config(args.config))

    return run
