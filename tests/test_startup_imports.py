"""What a command loads at start: the daemon keeps every module it imports for its whole life
(its RSS budget, docs/performance.md), so ``gpuwarden run`` must not load other commands or
features its config does not use, and ``gpuwarden --version`` loads no command at all.

Each check runs a fresh interpreter and reads its ``sys.modules``; nothing here is timed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Prints the modules loaded after ``main(argv)`` returns (or exits, as --version does).
PROBE = textwrap.dedent(
    """
    import json, sys
    from gpuwarden.cli.main import main
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
    print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
    """
)


def loaded(*argv: str) -> tuple[object, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.strip(), done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return answer["code"], set(answer["modules"])


def test_version_loads_no_command_and_no_pydantic() -> None:
    code, modules = loaded("--version")
    assert code == 0
    assert "pydantic" not in modules
    assert not {m for m in modules if m.startswith("gpuwarden.cli.") and m != "gpuwarden.cli.main"}


def test_run_loads_only_what_its_config_uses(tmp_path: Path) -> None:
    """No regexes, no cloud profile, no kernel-log events, no Alertmanager target: none of
    their modules, and none of the other commands'."""
    config = tmp_path / "gpuwarden.yaml"
    config.write_text(
        "host: probe-node\ntick: 1s\nprotected: {root: false, users: []}\n"
        "notify:\n  targets:\n    oncall: {urls: ['json://127.0.0.1:9/']}\n",
        encoding="utf-8",
    )
    code, modules = loaded(
        "run",
        "--config",
        str(config),
        "--source",
        "scenario:scenarios/memory-pressure-low-priority.yaml",
        "--playbooks",
        "playbooks/memory-pressure.yaml",
        "--state-dir",
        str(tmp_path / "state"),
        "--once",
        "--dry-run",
    )
    assert code == 0
    assert "gpuwarden.runtime" in modules  # it did run
    unwanted = {
        "re2",  # google-re2: only with a config regex
        "gpuwarden.cloud.rounds",
        "gpuwarden.cloud.service",
        "gpuwarden.cloud.ec2",
        "boto3",
        "gpuwarden.sources.kernel_events",
        "gpuwarden.sources.kmsg",
        "urllib.request",  # the Alertmanager client's, at its first call
        *(f"gpuwarden.cli.{name}" for name in ("status", "check", "report", "cloud", "oncall")),
        "gpuwarden.cli.incidents",
        "gpuwarden.cli.notify",
    }
    assert not unwanted & modules, sorted(unwanted & modules)


def test_a_config_regex_still_runs_on_re2_when_installed(tmp_path: Path) -> None:
    """The lazy import keeps the engine choice: with the extra installed a pattern runs on
    RE2 (the first pattern imports it)."""
    script = textwrap.dedent(
        """
        import sys
        from gpuwarden.patterns import compile_pattern, re2_available
        assert "re2" not in sys.modules
        engine = compile_pattern("triton").engine
        print(engine, re2_available(), "re2" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    try:
        import re2  # noqa: F401
    except ImportError:
        assert done.stdout.split() == ["re", "False", "False"]
    else:
        assert done.stdout.split() == ["re2", "True", "True"]


def test_each_command_is_in_its_family_and_has_a_handler() -> None:
    """``COMMANDS`` says which family defines a command: the parser built from that family
    alone knows it, the full parser knows exactly these commands, and each handler exists."""
    import argparse

    from gpuwarden.cli import main

    def commands(parser: argparse.ArgumentParser) -> set[str]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return set(sub.choices)

    assert commands(main._parser()) == set(main.COMMANDS)
    for family in main.FAMILIES:
        declared = {c for c, (f, _, _) in main.COMMANDS.items() if f == family}
        assert commands(main._parser((family,))) == declared, family
    for command in main.COMMANDS:
        assert callable(main._handler(command)), command
    assert main._families_for(["--config", "run", "status"]) == ("status",)
    assert main._families_for(["--conf=x", "-v", "run"]) == ("run",)
    assert main._families_for(["--version"]) == ()
    assert main._families_for(["run", "--help"]) == ("run",)
    assert main._families_for(["--help"]) == main.FAMILIES
    assert main._families_for(["nonsense"]) == main.FAMILIES
