"""The ``exec`` executor running real commands; and the ``notify`` and ``provision`` placeholders.

Hostile telemetry strings travel as facts into the command's environment: the tests check that
they arrive byte for byte and that nothing in them is ever run.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuwarden.actions import exec_ as exec_action
from gpuwarden.actions import notify, provision, registry
from gpuwarden.actions.base import Context
from gpuwarden.clock import SystemClock
from gpuwarden.model import Intent, Reason, Target
from gpuwarden.playbook.schema import ExecParams, NotifyParams, ProvisionParams

PRINT_ENV = "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))"


def make_intent(params: object, kind: str = "exec", **fields: Any) -> Intent:
    values: dict[str, Any] = {
        "id": "inc-7/2",
        "incident": "inc-7",
        "rule": "gpu-memory-pressure",
        "scope": "gpu:1",
        "step": 2,
        "kind": kind,
        "label": kind,
        "time": 1_767_225_600.0,
        "reason": Reason.STEP_DUE,
        "severity": "critical",
        "gpu": 1,
        "params": params,
        "where": "GPU 1",
    }
    values.update(fields)
    return Intent(**values)


def make_ctx(*, dry_run: bool = False, facts: dict[str, str] | None = None) -> Context:
    return Context(dry_run=dry_run, clock=SystemClock(), host="gpu-node-7", facts=facts or {})


def run(argv: list[str], ctx: Context | None = None, **params: Any) -> Any:
    intent = make_intent(ExecParams(argv=tuple(argv), **params))
    return exec_action.execute(intent, ctx or make_ctx())


def child_env(tmp_path: Path, ctx: Context, **params: Any) -> dict[str, str]:
    out = tmp_path / "env.json"
    outcome = run([sys.executable, "-c", PRINT_ENV, str(out)], ctx, **params)
    assert outcome.ok, outcome.detail
    env: dict[str, str] = json.loads(out.read_text())
    return env


def gone(pid: int, within: float = 5.0) -> bool:
    """The process has exited (a zombie waiting for a reaper counts as exited)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


# -- running commands ----------------------------------------------------------------------------


def test_a_command_runs_and_its_output_is_kept() -> None:
    outcome = run(["/bin/echo", "hello", "from", "a hook"])
    assert outcome.ok
    assert not outcome.dry_run
    assert outcome.detail == "/bin/echo exited 0; output:\nhello from a hook\n"


def test_stderr_is_captured_and_a_failing_exit_is_not_ok() -> None:
    code = (
        "import sys; print('to stdout', flush=True); sys.stderr.write('to stderr\\n'); sys.exit(3)"
    )
    outcome = run([sys.executable, "-c", code])
    assert not outcome.ok
    assert outcome.recoverable
    assert "exited 3" in outcome.detail
    assert "to stdout\nto stderr\n" in outcome.detail


def test_a_command_killed_by_a_signal_says_which() -> None:
    outcome = run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert not outcome.ok
    assert "was killed by SIGSEGV" in outcome.detail


def test_a_silent_command_says_so() -> None:
    outcome = run(["/bin/true"])
    assert outcome.ok
    assert outcome.detail == "/bin/true exited 0; no output"


def test_a_command_on_path_is_found_by_name() -> None:
    outcome = run(["echo", "found"])
    assert outcome.ok, outcome.detail
    assert outcome.detail.endswith("found\n")


def test_long_output_is_truncated_and_marked() -> None:
    outcome = run([sys.executable, "-c", "import sys; sys.stdout.write('x' * 100_000)"])
    assert outcome.ok
    output = outcome.detail.split("output:\n", 1)[1]
    assert output == "x" * exec_action.MAX_OUTPUT_BYTES + "…[truncated] (100000 bytes in all)"


def test_control_characters_in_output_are_escaped() -> None:
    code = "import sys; sys.stdout.write('\\x1b[31mred\\x1b[0m\\rover\\tand\\nnext\\x07')"
    outcome = run([sys.executable, "-c", code])
    assert outcome.ok
    assert outcome.detail.endswith("\\x1b[31mred\\x1b[0m\\x0dover\tand\nnext\\x07")
    assert "\x1b" not in outcome.detail


def test_stdin_is_empty() -> None:
    outcome = run([sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"], timeout=10)
    assert outcome.ok
    assert outcome.detail.endswith("''\n")


@pytest.mark.parametrize(
    ("argv0", "expected"),
    [
        ("/nonexistent/gpuwarden-hook", "cannot run /nonexistent/gpuwarden-hook: no such file"),
        ("gpuwarden-no-such-hook", "cannot run gpuwarden-no-such-hook: not found on PATH="),
        ("{tmp}/notes.txt", "cannot run {tmp}/notes.txt: not an executable file"),
        ("{tmp}", "cannot run {tmp}: not an executable file"),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_missing_executable_is_an_outcome(
    tmp_path: Path, argv0: str, expected: str, dry_run: bool
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a program\n")
    notes.chmod(0o644)
    outcome = run([argv0.format(tmp=tmp_path), "--flag"], make_ctx(dry_run=dry_run))
    assert not outcome.ok
    assert not outcome.recoverable
    assert outcome.detail.startswith(expected.format(tmp=tmp_path))


def test_a_nul_byte_in_the_step_env_is_an_outcome() -> None:
    outcome = run(["/bin/true"], env={"BAD": "a\x00b"})
    assert not outcome.ok
    assert "null byte" in outcome.detail


# -- timeouts and stopping -----------------------------------------------------------------------

# A command that ignores SIGTERM and starts a grandchild that ignores it too (and sleeps).
STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(sys.argv[1], "w").write(f"{child.pid}\\n")
    print("started", child.pid, flush=True)
    time.sleep(120)
""")


def test_a_timeout_kills_the_command_and_its_grandchild(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    started = time.monotonic()
    outcome = run([sys.executable, "-c", STUBBORN, str(pid_file)], timeout=1.5)
    took = time.monotonic() - started
    assert not outcome.ok
    assert outcome.recoverable
    assert outcome.detail.startswith("timed out after 1.5s; process group killed; output:\nstarted")
    assert 1.4 <= took < 1.5 + exec_action.KILL_GRACE_S + 3
    assert gone(int(pid_file.read_text()))


def test_a_background_process_holding_the_output_is_killed_at_the_deadline(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "background.pid"
    code = textwrap.dedent("""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open(sys.argv[1], "w").write(f"{child.pid}\\n")
    """)
    outcome = run([sys.executable, "-c", code, str(pid_file)], timeout=1)
    assert not outcome.ok
    assert outcome.detail.startswith("timed out after 1s")
    assert gone(int(pid_file.read_text()))


def test_a_background_process_that_lets_go_of_the_output_survives(tmp_path: Path) -> None:
    pid_file = tmp_path / "background.pid"
    code = textwrap.dedent("""
        import subprocess, sys
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(30)"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        open(sys.argv[1], "w").write(f"{child.pid}\\n")
        print("detached")
    """)
    outcome = run([sys.executable, "-c", code, str(pid_file)], timeout=20)
    assert outcome.ok, outcome.detail
    pid = int(pid_file.read_text())
    try:
        assert psutil.Process(pid).is_running()
    finally:
        os.kill(pid, 9)


def test_a_stopping_daemon_kills_the_command(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    ctx = make_ctx()
    timer = threading.Timer(0.5, ctx.cancel.set)
    timer.start()
    started = time.monotonic()
    outcome = run([sys.executable, "-c", STUBBORN, str(pid_file)], ctx, timeout=60)
    timer.join()
    assert time.monotonic() - started < 10
    assert not outcome.ok
    assert outcome.detail.startswith("stopped: gpuwarden is shutting down")
    assert gone(int(pid_file.read_text()))


# -- the environment -----------------------------------------------------------------------------


def test_incident_facts_arrive_as_gpuwarden_variables(tmp_path: Path) -> None:
    ctx = make_ctx(facts={"gpu.memory.used_pct": "97.5", "process name": "python"})
    intent = make_intent(
        ExecParams(argv=(sys.executable, "-c", PRINT_ENV, str(tmp_path / "env.json"))),
        targets=(
            Target(pid=4242, create_time=1.0, gpu=1, user="bob", priority="low", gpu_memory_mib=1),
            Target(pid=4343, create_time=2.0, gpu=1, user="eve", priority="low", gpu_memory_mib=1),
        ),
    )
    assert exec_action.execute(intent, ctx).ok
    env = json.loads((tmp_path / "env.json").read_text())
    assert {k: v for k, v in env.items() if k.startswith("GPUWARDEN_")} == {
        "GPUWARDEN_INCIDENT": "inc-7",
        "GPUWARDEN_RULE": "gpu-memory-pressure",
        "GPUWARDEN_SEVERITY": "critical",
        "GPUWARDEN_HOST": "gpu-node-7",
        "GPUWARDEN_GPU": "1",
        "GPUWARDEN_SCOPE": "GPU 1",
        "GPUWARDEN_STEP": "2",
        "GPUWARDEN_TARGET_PIDS": "4242 4343",
        "GPUWARDEN_GPU_MEMORY_USED_PCT": "97.5",
        "GPUWARDEN_PROCESS_NAME": "python",
    }


def test_the_environment_is_minimal_and_keeps_the_daemons_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-hooks")
    monkeypatch.setenv("LANG", "C.utf8")  # not the default spelling, and installed
    ctx = make_ctx(facts={"LD_PRELOAD": "/tmp/evil.so", "PATH": "/evil"})
    env = child_env(tmp_path, ctx, env={"HOOK_MODE": "page"})
    assert {k for k in env if not k.startswith("GPUWARDEN_")} == {"PATH", "LANG", "HOOK_MODE"}
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert "LD_PRELOAD" not in env
    assert env["PATH"] == os.environ["PATH"]
    assert env["LANG"] == "C.utf8"
    assert env["HOOK_MODE"] == "page"
    assert env["GPUWARDEN_LD_PRELOAD"] == "/tmp/evil.so"
    assert env["GPUWARDEN_PATH"] == "/evil"


def test_without_a_lang_the_command_reads_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LANG", raising=False)
    assert child_env(tmp_path, make_ctx())["LANG"] == "C.UTF-8"


def test_the_intent_wins_over_facts_and_unknowns_are_left_out(tmp_path: Path) -> None:
    ctx = make_ctx(facts={"rule": "forged", "GPUWARDEN_SEVERITY": "info", "gpu": "3"})
    out = tmp_path / "env.json"
    intent = make_intent(ExecParams(argv=(sys.executable, "-c", PRINT_ENV, str(out))), gpu=None)
    assert exec_action.execute(intent, ctx).ok
    env = json.loads(out.read_text())
    assert env["GPUWARDEN_RULE"] == "gpu-memory-pressure"
    assert env["GPUWARDEN_SEVERITY"] == "critical"
    assert env["GPUWARDEN_GPU"] == "3"  # the intent has no GPU: the fact stands
    assert "GPUWARDEN_TARGET_PIDS" not in env


def hostile_values(tmp_path: Path) -> dict[str, str]:
    marker = tmp_path / "pwned"
    victim = tmp_path / "victim"
    return {
        "subshell": f"$(touch {marker})",
        "backticks": f"`touch {marker}`",
        "semicolon": f"x; rm -rf {victim}; touch {marker}",
        "pipe": f"| touch {marker}",
        "newlines": f"line one\nline two\n/usr/bin/touch {marker}\n",
        "ansi": "\x1b[2J\x1b[31mALERT\x1b[0m\x07",
        "quotes": 'it\'s "quoted" \\ and $HOME and ${PATH}',
        "unicode": "ジョブ-λ-\u202eevil",
        "long": "A" * 10_240,
    }


def test_hostile_facts_arrive_verbatim_and_are_never_run(tmp_path: Path) -> None:
    (tmp_path / "victim").mkdir()
    values = hostile_values(tmp_path)
    ctx = make_ctx(facts={f"process.{k}": v for k, v in values.items()})
    env = child_env(tmp_path, ctx, env={f"STEP_{k.upper()}": v for k, v in values.items()})
    for key, value in values.items():
        assert env[f"GPUWARDEN_PROCESS_{key.upper()}"] == value
        assert env[f"STEP_{key.upper()}"] == value
    assert not (tmp_path / "pwned").exists()
    assert (tmp_path / "victim").is_dir()


def test_argv_is_not_expanded(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    ctx = make_ctx(facts={"rule_name": f"$(touch {marker})"})
    outcome = run(["/bin/echo", "$GPUWARDEN_RULE_NAME", f"`touch {marker}`", "*"], ctx)
    assert outcome.ok
    assert outcome.detail.endswith(f"$GPUWARDEN_RULE_NAME `touch {marker}` *\n")
    assert not marker.exists()


def test_a_nul_byte_in_a_fact_is_dropped_and_huge_facts_are_cut(tmp_path: Path) -> None:
    ctx = make_ctx(facts={"cmdline": "python\x00train.py", "huge": "B" * 100_000})
    env = child_env(tmp_path, ctx)
    assert env["GPUWARDEN_CMDLINE"] == "pythontrain.py"
    assert env["GPUWARDEN_HUGE"] == "B" * exec_action.MAX_FACT_BYTES


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("gpu.memory.used_pct", "GPUWARDEN_GPU_MEMORY_USED_PCT"),
        ("GPUWARDEN_RULE", "GPUWARDEN_RULE"),
        ("a=b c", "GPUWARDEN_A_B_C"),
        ("...", None),
        ("", None),
    ],
)
def test_fact_variable_names(key: str, name: str | None) -> None:
    assert exec_action.fact_variable(key) == name


# -- dry-run -------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["dry_run", "shadow"])
def test_dry_run_reports_the_argv_and_runs_nothing(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "ran"
    argv = (sys.executable, "-c", "import sys; open(sys.argv[1], 'w')", str(marker))
    intent = make_intent(ExecParams(argv=argv), shadow=how == "shadow")
    with caplog.at_level(logging.INFO, logger="gpuwarden.action"):
        outcome = exec_action.execute(intent, make_ctx(dry_run=how == "dry_run"))
    assert outcome.ok
    assert outcome.dry_run
    assert outcome.detail.startswith(f"would run: {sys.executable} -c 'import sys;")
    assert outcome.detail.endswith(str(marker))
    assert not marker.exists()
    assert "action=exec" in caplog.text
    assert "dry_run=true" in caplog.text


def test_one_log_line_per_run_without_control_characters(
    caplog: pytest.LogCaptureFixture,
) -> None:
    intent = make_intent(ExecParams(argv=("/bin/echo", "\x1b[31mhi\nthere")), rule="r\nforged=1")
    with caplog.at_level(logging.INFO, logger="gpuwarden.action"):
        assert exec_action.execute(intent, make_ctx()).ok
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuwarden.action"]
    assert len(lines) == 1
    assert lines[0].startswith(
        'action=exec rule="r?forged=1" incident=inc-7 dry_run=false '
        "argv=\"/bin/echo '?[31mhi?there'\" pid="
    )
    assert lines[0].endswith(" outcome=exited exit=0")
    assert all(ch.isprintable() for ch in lines[0])


# -- notify (the notifier does the rest) and provision (a placeholder) ----------------------------


def test_notify_records_the_step_and_finishes_at_once(caplog: pytest.LogCaptureFixture) -> None:
    intent = make_intent(NotifyParams(targets=("oncall", "chat")), kind="notify")
    with caplog.at_level(logging.INFO):
        first = notify.execute(intent, make_ctx())
        second = notify.execute(intent, make_ctx())
    assert first == second
    assert first.ok
    assert first.detail == notify.QUEUED
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuwarden.action"]
    assert len(lines) == 2
    assert all("action=notify" in line and "targets=oncall,chat" in line for line in lines)


def test_provision_without_a_cloud_service_says_it_launched_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    intent = make_intent(ProvisionParams(profile="burst-a100"), kind="provision")
    with caplog.at_level(logging.INFO, logger="gpuwarden.action"):
        outcome = provision.execute(intent, make_ctx())
    assert not outcome.ok
    assert not outcome.recoverable
    assert outcome.detail.startswith(
        "profile burst-a100 was not launched: the daemon has no cloud service"
    )
    assert len(caplog.records) == 1
    assert "action=provision" in caplog.text
    assert "profile=burst-a100" in caplog.text


@pytest.mark.parametrize(
    ("kind", "module"), [("exec", exec_action), ("notify", notify), ("provision", provision)]
)
def test_the_registry_finds_these_executors(kind: str, module: Any) -> None:
    assert registry.executor(kind) is module.execute
