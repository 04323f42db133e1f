"""Shared test configuration: the ``gpu`` marker runs only where NVML really initializes;
real unprivileged users (``local_users``, ``system_users``) for the tests that play an
attacker; the report tests share one real incident (``run_report``)."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.local_users import LocalUsers
from tests.system_users import User, created_users, unavailable

# A suite started in the background by a script (``make test &``) inherits SIGINT ignored, and
# so would every command it starts: the tests that end a watch with Ctrl-C, as a person does,
# would wait forever. Python's own handler here means children start with the default again.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@functools.cache
def nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not nvml_works():
        skip = pytest.mark.skip(reason="needs a working NVML (NVIDIA driver and GPU)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def session_users() -> Iterator[dict[str, User]]:
    """The session's real unprivileged users, made with useradd on first use and removed at
    the end (with whatever processes the tests left running as them): ``victim`` owns a job
    gpuwarden acts on, ``mallory`` attacks, ``bob`` is another user, ``owner`` and ``mail``
    own spawned jobs. Skipped without root."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    with created_users("victim", "mallory", "bob", "owner", "mail") as users:
        yield users


@pytest.fixture(scope="session")
def local_users(session_users: dict[str, User]) -> LocalUsers:
    """A job owner and an attacker."""
    return LocalUsers(session_users["victim"], session_users["mallory"])


# -- reports: one real incident and one drill, shared by the report and browser tests -----------

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "tests" / "fixtures" / "report" / "hostile-memory-pressure.yaml"


@dataclasses.dataclass(frozen=True)
class RunReport:
    state: Path  # the daemon's state directory (its journal)
    path: Path  # the report of its incident
    page: str
    received: list[dict[str, object]]  # what the notification receiver got


@pytest.fixture(scope="session")
def run_report(tmp_path_factory: pytest.TempPathFactory) -> RunReport:
    """``gpuwarden run`` on a scenario of real processes, one of them with a command line that
    holds markup; its incident's report (``gpuwarden report last``)."""
    from tests.notify_receivers import JsonReceiver

    receiver = JsonReceiver().start()
    base = tmp_path_factory.mktemp("run-report")
    state = base / "state"
    env = {
        **{k: v for k, v in os.environ.items() if k != "GPUWARDEN_CONFIG"},
        "GPUWARDEN_ONCALL_URL": receiver.url("oncall"),
    }

    def gpuwarden(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuwarden", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    try:
        ran = gpuwarden(
            "run",
            "--config",
            "config/demo.yaml",
            "--source",
            f"scenario:{HOSTILE}",
            "--playbooks",
            "playbooks/memory-pressure.yaml",
            "--state-dir",
            str(state),
            "--speed",
            "40",
        )
        assert ran.returncode == 0, ran.stderr
        out = base / "report.html"
        made = gpuwarden(
            "report",
            "last",
            "--config",
            "config/demo.yaml",
            "--state-dir",
            str(state),
            "--out",
            str(out),
        )
        assert made.returncode == 0, made.stderr
        assert made.stdout.startswith(f"report: {out} ("), made.stdout
    finally:
        receiver.stop()
    return RunReport(state, out, out.read_text(encoding="utf-8"), list(receiver.received))


@dataclasses.dataclass(frozen=True)
class DrillReport:
    playbook: str
    path: Path
    page: str
    records: list[dict[str, Any]]  # the drill's timeline (drill --json)


def drill_report(playbook: str, scenario: Path, out: Path, *extra: str) -> DrillReport:
    """``gpuwarden drill SCENARIO --json --html OUT`` in this process, as a user runs it."""
    import contextlib
    import io
    import json

    from gpuwarden.cli.main import main

    printed, said = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(said):
        code = main(
            [
                "drill",
                str(scenario),
                "--config",
                str(ROOT / "config" / "gpuwarden.yaml"),
                "--playbooks",
                str(ROOT / "playbooks" / f"{playbook}.yaml"),
                "--json",
                "--html",
                str(out),
                *extra,
            ]
        )
    assert code == 0, said.getvalue()
    assert f"report: {out} (" in said.getvalue()
    records = [json.loads(line) for line in printed.getvalue().splitlines()]
    return DrillReport(playbook, out, out.read_text(encoding="utf-8"), records)


@pytest.fixture(scope="session")
def drill_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, DrillReport]:
    """The report of every shipped playbook's drill against its scenario (tests/golden_pairs)."""
    from tests.golden_pairs import PAIRS

    base = tmp_path_factory.mktemp("drill-reports")
    return {
        playbook: drill_report(
            playbook, ROOT / "scenarios" / f"{scenario}.yaml", base / f"{playbook}.html"
        )
        for playbook, scenario in PAIRS.items()
    }


@pytest.fixture(scope="session")
def system_users(session_users: dict[str, User]) -> dict[str, User]:
    """``mallory`` (who tries to promote her own jobs) and ``bob`` (another user)."""
    return session_users


@pytest.fixture(scope="session")
def job_owner(session_users: dict[str, User]) -> str:
    """A real user (not root) to own spawned jobs (``run_as:`` in a scenario)."""
    return session_users["owner"].name
