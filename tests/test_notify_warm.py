"""The notification path is warm before the first incident: once the daemon is ready, the
sender loads apprise and only the plugins of the configured targets, sending nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwarden.notify import plugins
from tests.notify_receivers import JsonReceiver

ROOT = Path(__file__).resolve().parent.parent


def test_the_daemon_loads_only_the_configured_plugin_after_ready(tmp_path: Path) -> None:
    receiver = JsonReceiver().start()
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwarden",
                "run",
                "--config",
                "config/demo.yaml",
                "--source",
                "scenario:scenarios/memory-pressure-low-priority.yaml",
                "--playbooks",
                "playbooks/memory-pressure.yaml",
                "--state-dir",
                str(tmp_path / "state"),
                "--dry-run",
            ],
            cwd=ROOT,
            env={**os.environ, "GPUWARDEN_ONCALL_URL": receiver.url()},
            text=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        assert process.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "notify warm" in line:
                break
        process.send_signal(signal.SIGTERM)
        _out, rest = process.communicate(timeout=30)
    finally:
        receiver.stop()
    text = "".join(lines)
    warm = [line for line in lines if "notify warm" in line]
    assert warm, text + rest
    # Before the first tick's results are acted on: the ready line comes first, no incident yet.
    assert "fired for" not in text
    assert "notify warm plugins=custom_json targets=1 " in warm[0]
    assert receiver.received == []  # warming sends nothing
    assert "Traceback" not in rest


@pytest.mark.parametrize(("scheme", "module"), sorted(plugins.PLUGIN_MODULES.items()), ids=str)
def test_each_scheme_maps_to_the_plugin_module_apprise_serves_it_with(
    scheme: str, module: str
) -> None:
    import importlib

    loaded = importlib.import_module(f"apprise.plugins.{module}")
    schemes: set[str] = set()
    for name in dir(loaded):
        plugin = getattr(loaded, name)
        if name.startswith("Notify") and hasattr(plugin, "app_id"):
            schemes |= set(plugin.schemas(plugin))
    assert scheme in schemes
