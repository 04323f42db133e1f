"""Running the ``gpuwarden`` command as a user would, for the CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def gpuwarden(
    *args: str | Path,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``python -m gpuwarden ARGS`` in a fresh interpreter, without the caller's
    GPUWARDEN_CONFIG and without colour; ``env`` is added on top."""
    environment = {k: v for k, v in os.environ.items() if k != "GPUWARDEN_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**environment, "NO_COLOR": "1", **(env or {})},
        check=False,
    )
