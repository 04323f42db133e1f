"""Exit codes: the tables in README.md and docs/operations.md, the systemd unit's
``RestartPreventExitStatus=`` and the code (``errors.ExitCode``) say the same thing, and a
daemon started with a broken playbook or config exits with a code the unit does not restart.

Generic over the enum: a new exit code fails here until both tables list it and the unit
(through ``errors.CONFIGURATION_WRONG``) says whether systemd restarts on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuwarden.errors import CONFIGURATION_WRONG, ExitCode, restarted_by_systemd
from tests.cli_runner import gpuwarden

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "gpuwarden.service"


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def restart_prevented() -> set[int]:
    values = unit_settings()["RestartPreventExitStatus"]
    return {int(word) for value in values for word in value.split()}


def table(doc: Path) -> dict[int, list[list[str]]]:
    """The rows of the table under "## Exit codes", by code: each row's other cells."""
    text = doc.read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows: dict[int, list[list[str]]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].isdigit():
            rows.setdefault(int(cells[0]), []).append(cells[1:])
    return rows


def test_the_unit_prevents_restarts_on_exactly_the_configuration_codes() -> None:
    settings = unit_settings()
    assert settings["Restart"] == ["on-failure"]
    assert restart_prevented() == {int(c) for c in CONFIGURATION_WRONG}
    assert restart_prevented() <= {int(c) for c in ExitCode}


@pytest.mark.parametrize("doc", ["README.md", "docs/operations.md"])
def test_each_exit_code_table_lists_exactly_the_codes_of_the_enum(doc: str) -> None:
    assert set(table(ROOT / doc)) == {int(c) for c in ExitCode}


def test_the_operations_table_says_when_systemd_restarts() -> None:
    rows = table(ROOT / "docs" / "operations.md")
    for code in ExitCode:
        (row,) = rows[int(code)]
        said = row[-1].lower()
        assert said.startswith("yes" if restarted_by_systemd(code) else "no"), (code, row)


def bad_playbook(tmp_path: Path) -> Path:
    path = tmp_path / "playbooks" / "memory-pressure.yaml"
    path.parent.mkdir()
    text = (ROOT / "playbooks" / "memory-pressure.yaml").read_text()
    assert "    for: 30s  " in text
    path.write_text(text.replace("    for: 30s  ", "    unknown_field: 1\n    for: 30s  "))
    return path


def run_once(tmp_path: Path, *args: str | Path) -> tuple[int, str]:
    result = gpuwarden(
        "run",
        "--source",
        "scenario:scenarios/memory-pressure-low-priority.yaml",
        "--state-dir",
        tmp_path / "state",
        "--once",
        *args,
    )
    assert "Traceback" not in result.stderr
    return result.returncode, result.stderr


def test_a_bad_playbook_stops_the_daemon_for_good(tmp_path: Path) -> None:
    code, stderr = run_once(
        tmp_path, "--config", "config/demo.yaml", "--playbooks", bad_playbook(tmp_path)
    )
    assert code in restart_prevented()
    assert code == ExitCode.BAD_INPUT
    assert "unknown_field: unknown field" in stderr


def test_a_bad_config_and_an_unsafe_setup_stop_it_for_good(tmp_path: Path) -> None:
    broken = tmp_path / "gpuwarden.yaml"
    broken.write_text((ROOT / "config" / "demo.yaml").read_text().replace("tick: 2s", "tick: soon"))
    code, stderr = run_once(
        tmp_path, "--config", broken, "--playbooks", "playbooks/memory-pressure.yaml"
    )
    assert code in restart_prevented()
    assert f"{broken}:" in stderr
    shared = tmp_path / "shared"
    shared.mkdir()
    playbook = shared / "memory-pressure.yaml"
    shutil.copy(ROOT / "playbooks" / "memory-pressure.yaml", playbook)
    playbook.chmod(0o666)
    code, stderr = run_once(tmp_path, "--config", "config/demo.yaml", "--playbooks", shared)
    assert code == ExitCode.UNSAFE_SETUP
    assert code in restart_prevented()
    assert f"chmod go-w {playbook}" in stderr
