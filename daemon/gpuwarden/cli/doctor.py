"""``gpuwarden doctor``: every self-check of ``selfcheck`` for this machine, with its fix.

The same findings are what ``gpuwarden run`` logs at start (``cli/run.py``); an error among them
keeps the daemon from starting.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpuwarden import config as config_file
from gpuwarden.cli import common as cli_common
from gpuwarden.cli.findings import ok
from gpuwarden.cli.selfcheck import Finding, blocking, run_checks
from gpuwarden.config import Config
from gpuwarden.journal.lock import LOCK_NAME, holder
from gpuwarden.text import safe_text

_LABEL = {"ok": "ok  ", "warning": "WARN", "error": "FAIL"}


def render(findings: Sequence[Finding]) -> str:
    lines = []
    for f in findings:
        detail = f.detail.replace("\n", "\n     ")
        lines.append(f"{_LABEL[f.severity]} {f.check}: {detail}")
        if f.fix is not None and not f.ok:
            lines.append(f"  fix: {f.fix}")
    return "\n".join(lines)


def as_json(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    return [asdict(f) for f in findings]


def exit_code(findings: Sequence[Finding]) -> int:
    """0: everything ok or only warnings; 1: at least one error."""
    return 1 if blocking(findings) else 0


# -- gpuwarden doctor -----------------------------------------------------------------------


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    doctor = sub.add_parser(
        "doctor",
        parents=[common],
        help="check this machine's setup",
        description="Check NVML, permissions, the state directory, file modes, the config and "
        "playbooks, notification targets and cloud credentials; each finding says what to fix. "
        "Exit 1 if any is an error.",
    )
    doctor.add_argument(
        "--insecure-permissions",
        action="store_true",
        help="report writable config or playbooks as warnings, not errors",
    )
    doctor.add_argument("--state-dir", type=Path, metavar="DIR")
    doctor.add_argument("--json", action="store_true")


def setup_findings(
    args: argparse.Namespace,
    cfg: Config,
    playbook_paths: list[str],
    config_path: Path | None,
    *,
    parse_urls: bool,
) -> list[Finding]:
    """Every finding for this command's config, playbooks and state directory."""
    return run_checks(
        cfg,
        config_path,
        playbook_paths,
        state_dir=cli_common.state_dir(args, cfg),
        insecure_permissions=args.insecure_permissions,
        parse_urls=parse_urls,
    )


def daemon_finding(state_dir: Path) -> Finding:
    """Whether a daemon runs on ``state_dir``, and which: the holder of its lock."""
    pid = holder(state_dir)
    lock = state_dir / LOCK_NAME
    if pid is None:
        return ok("daemon", f"no gpuwarden daemon holds {lock}: nothing acts on this state_dir")
    try:
        name = Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        name = "?"
    return ok("daemon", f"pid {pid} ({safe_text(name)}) holds {lock}: a daemon runs here")


def cmd_doctor(args: argparse.Namespace) -> int:
    found = cli_common.config_path(args.config)
    cfg = config_file.Config() if found is None else config_file.load(found)
    checked = setup_findings(
        args, cfg, cli_common.playbook_paths(None, cfg), found, parse_urls=True
    )
    checked.append(daemon_finding(cli_common.state_dir(args, cfg)))
    if args.json:
        print(json.dumps(as_json(checked), indent=2))
    else:
        print(render(checked))
    return exit_code(checked)
