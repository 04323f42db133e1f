"""`make install` and `make uninstall`, staged in a folder with DESTDIR; and what a fresh
install does when started: it runs in shadow mode (records and notifies, acts on nothing)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli_runner import gpuwarden
from tests.notify_receivers import JsonReceiver

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "/opt/gpuwarden-test"


@dataclass(frozen=True)
class Staged:
    stage: Path
    fresh: Path  # a copy of etc/gpuwarden as the first install left it


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Staged:
    if shutil.which("make") is None:
        pytest.skip("needs make")
    stage = tmp_path_factory.mktemp("install") / "stage"
    run = subprocess.run(
        ["make", "install", f"DESTDIR={stage}", f"PREFIX={PREFIX}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "installed in SHADOW mode" in run.stdout
    fresh = tmp_path_factory.mktemp("fresh") / "gpuwarden"
    shutil.copytree(stage / "etc" / "gpuwarden", fresh)
    return Staged(stage, fresh)


def test_install_places_everything_and_uninstall_keeps_the_config(staged: Staged) -> None:
    stage = staged.stage
    etc = stage / "etc" / "gpuwarden"
    assert (etc / "gpuwarden.yaml").read_text() == (ROOT / "config" / "gpuwarden.yaml").read_text()
    shipped = sorted(p.name for p in (ROOT / "playbooks").glob("*.yaml"))
    assert sorted(p.name for p in (etc / "playbooks").glob("*.yaml")) == shipped
    assert (etc / "gpuwarden.yaml").stat().st_mode & 0o022 == 0  # not writable by group/other
    unit = stage / "etc" / "systemd" / "system" / "gpuwarden.service"
    assert unit.read_text() == (ROOT / "systemd" / "gpuwarden.service").read_text()
    link = stage / "usr" / "local" / "bin" / "gpuwarden"
    assert link.is_symlink()
    assert str(link.readlink()) == f"{PREFIX}/bin/gpuwarden"
    version = subprocess.run(
        [str(stage / PREFIX.lstrip("/") / "bin" / "python"), "-m", "gpuwarden", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert version.stdout.startswith("gpuwarden ")
    # an edited config survives a second install
    (etc / "gpuwarden.yaml").write_text("# edited\n")
    again = subprocess.run(
        ["make", "install", f"DESTDIR={stage}", f"PREFIX={PREFIX}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert (etc / "gpuwarden.yaml").read_text() == "# edited\n"
    gone = subprocess.run(
        ["make", "uninstall", f"DESTDIR={stage}", f"PREFIX={PREFIX}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert gone.returncode == 0, gone.stderr
    assert not unit.exists()
    assert not link.exists()
    assert not (stage / PREFIX.lstrip("/")).exists()
    assert (etc / "gpuwarden.yaml").exists()


@pytest.fixture
def receiver() -> Iterator[JsonReceiver]:
    r = JsonReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def owned_scenario(job_owner: str) -> Iterator[Path]:
    """The memory-pressure scenario with its two real jobs run by ``job_owner``, not root:
    the installed config protects root's processes, and these must be fair game."""
    text = (ROOT / "scenarios" / "memory-pressure-low-priority.yaml").read_text()
    assert text.count("    spawn: true\n") == 2
    folder = Path(tempfile.mkdtemp(prefix="gpuwarden-test-"))
    path = folder / "memory-pressure-owned.yaml"
    path.write_text(
        text.replace("    spawn: true\n", f"    spawn: true\n    run_as: {job_owner}\n")
    )
    yield path
    shutil.rmtree(folder)


def test_a_fresh_install_runs_in_shadow(
    staged: Staged, owned_scenario: Path, receiver: JsonReceiver, job_owner: str, tmp_path: Path
) -> None:
    cfg = staged.fresh / "gpuwarden.yaml"
    assert cfg.read_text() == (ROOT / "config" / "gpuwarden.yaml").read_text()
    state = tmp_path / "state"
    env = {"GPUWARDEN_ONCALL_URL": receiver.url("oncall")}
    result = gpuwarden(
        "run",
        "--config",
        cfg,
        "--playbooks",
        staged.fresh / "playbooks" / "memory-pressure.yaml",
        "--source",
        f"scenario:{owned_scenario}",
        "--state-dir",
        state,
        "--speed",
        "60",
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"(shadow mode ({cfg}): recording and notifying, acting on nothing;" in result.stderr
    # Recorded: the ladder ran to the kill and chose the owner's low-priority sweep ...
    (incident,) = json.loads(gpuwarden("incidents", "--state-dir", state, "--json").stdout)[
        "incidents"
    ]
    timeline = json.loads(
        gpuwarden("incident", incident["id"], "--state-dir", state, "--json").stdout
    )
    steps = {s["kind"]: s for s in timeline["steps"]}
    assert set(steps) == {"notify", "checkpoint", "kill"}
    (victim,) = steps["kill"]["targets"]
    assert victim["user"] == job_owner
    assert victim["priority"] == "low"
    (asked,) = steps["checkpoint"]["targets"]
    assert asked["user"] == job_owner
    for kind in ("checkpoint", "kill"):
        assert steps[kind]["outcome"]["dry_run"] is True, steps[kind]
        assert [r["state"] for r in steps[kind]["results"]] == ["would"], steps[kind]
    # ... acted on nothing: the sweep still held its memory, so the GPU never recovered and
    # the incident was still open when the replay ended ...
    assert incident["resolved_at"] is None
    assert "action=kill" in result.stderr
    assert "result=would" in result.stderr
    assert "result=terminated" not in result.stderr
    assert "result=acknowledged" not in result.stderr
    # ... and notified: the on-call got the incident, marked as a dry run.
    titles = receiver.titles()
    assert titles, "nothing was delivered"
    assert all(t.startswith("[DRY-RUN] ") for t in titles)
    assert any("GPU memory pressure" in t for t in titles)
