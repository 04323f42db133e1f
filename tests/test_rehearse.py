"""Every shipped playbook says how to rehearse it in a ``# Rehearse:`` comment; that command
runs as written, in a fresh checkout (the tracked files only), with the installed
``gpuwarden`` command and nothing configured on the machine."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yaml"))


def rehearse_line(playbook: Path) -> str:
    lines = [line for line in playbook.read_text().splitlines() if "Rehearse:" in line]
    assert len(lines) == 1, f"{playbook.name}: one '# Rehearse:' comment"
    return lines[0].split("Rehearse:", 1)[1].strip()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked files of this checkout, as a fresh clone would have them (no .venv, no
    state, no build output)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    target = tmp_path_factory.mktemp("checkout")
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=[p.stem for p in PLAYBOOKS])
def test_the_rehearse_command_runs_as_written(playbook: Path, checkout: Path) -> None:
    command = rehearse_line(playbook)
    argv = shlex.split(command)
    assert argv[:2] == ["gpuwarden", "drill"], command
    assert f"playbooks/{playbook.name}" in argv, command
    bin_dir = Path(sys.executable).parent  # where `pip install` put the gpuwarden command
    assert (bin_dir / "gpuwarden").exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "AWS_", "NO_"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{command}\n{done.stderr}"
    assert "Traceback" not in done.stderr
    assert "FIRING" in done.stdout, done.stdout
    assert done.stdout.splitlines()[-4].startswith("summary: scenarios/")
