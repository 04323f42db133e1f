"""`make install` and `make uninstall`, staged in a folder with DESTDIR."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_install_places_everything_and_uninstall_keeps_the_config(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    prefix = "/opt/gpuwarden-test"
    run = subprocess.run(
        ["make", "install", f"DESTDIR={stage}", f"PREFIX={prefix}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    etc = stage / "etc" / "gpuwarden"
    assert (etc / "gpuwarden.yaml").read_text() == (ROOT / "config" / "gpuwarden.yaml").read_text()
    shipped = sorted(p.name for p in (ROOT / "playbooks").glob("*.yaml"))
    assert sorted(p.name for p in (etc / "playbooks").glob("*.yaml")) == shipped
    assert (etc / "gpuwarden.yaml").stat().st_mode & 0o022 == 0  # not writable by group/other
    unit = stage / "etc" / "systemd" / "system" / "gpuwarden.service"
    assert unit.read_text() == (ROOT / "systemd" / "gpuwarden.service").read_text()
    link = stage / "usr" / "local" / "bin" / "gpuwarden"
    assert link.is_symlink()
    assert str(link.readlink()) == f"{prefix}/bin/gpuwarden"
    version = subprocess.run(
        [str(stage / prefix.lstrip("/") / "bin" / "python"), "-m", "gpuwarden", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert version.stdout.startswith("gpuwarden ")
    # an edited config survives a second install
    (etc / "gpuwarden.yaml").write_text("# edited\n")
    again = subprocess.run(
        ["make", "install", f"DESTDIR={stage}", f"PREFIX={prefix}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert (etc / "gpuwarden.yaml").read_text() == "# edited\n"
    gone = subprocess.run(
        ["make", "uninstall", f"DESTDIR={stage}", f"PREFIX={prefix}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert gone.returncode == 0, gone.stderr
    assert not unit.exists()
    assert not link.exists()
    assert not (stage / prefix.lstrip("/")).exists()
    assert (etc / "gpuwarden.yaml").exists()
