"""Notifications end to end: a drill and a real run deliver to a real local receiver."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.notify_receivers import JsonReceiver

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def receiver() -> Iterator[JsonReceiver]:
    r = JsonReceiver().start()
    yield r
    r.stop()


def config_for(tmp_path: Path, url_env: str = "TEST_ONCALL_URL") -> Path:
    text = (
        (ROOT / "config" / "demo.yaml")
        .read_text()
        .replace("{env: GPUWARDEN_ONCALL_URL}", f"{{env: {url_env}}}")
    )
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(text)
    return path


def gpuwarden(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TEST_ONCALL_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", *args, "--config", str(config_for(tmp_path))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_drill_with_notify_delivers_marked_messages(tmp_path: Path, receiver: JsonReceiver) -> None:
    result = gpuwarden(
        tmp_path,
        receiver.url("drill"),
        "drill",
        "scenarios/memory-pressure-low-priority.yaml",
        "--playbooks",
        "playbooks/memory-pressure.yaml",
        "--notify",
    )
    assert result.returncode == 0, result.stderr
    titles = receiver.titles()
    assert titles, "nothing was delivered"
    assert all(t.startswith("[DRILL]") for t in titles)
    assert any("GPU memory pressure" in t or "gpu-memory-pressure" in t for t in titles)
    delivered = re.search(
        r"notifications: (\d+) of (\d+) \[DRILL\] message\(s\) delivered", result.stdout
    )
    assert delivered is not None, result.stdout
    assert int(delivered[1]) == int(delivered[2]) == len(titles)


def test_a_drill_to_a_dead_target_says_nothing_was_delivered(
    tmp_path: Path, receiver: JsonReceiver
) -> None:
    dead_port = receiver.port
    receiver.stop()
    result = gpuwarden(
        tmp_path,
        f"json://127.0.0.1:{dead_port}/drill",
        "drill",
        "scenarios/memory-pressure-low-priority.yaml",
        "--playbooks",
        "playbooks/memory-pressure.yaml",
        "--notify",
    )
    assert result.returncode == 0, result.stderr
    delivered = re.search(
        r"notifications: (\d+) of (\d+) \[DRILL\] message\(s\) delivered", result.stdout
    )
    assert delivered is not None, result.stdout
    assert delivered[1] == "0"  # tried, not delivered: they wait in the drill's outbox
    assert int(delivered[2]) > 0


def test_a_real_run_tells_the_oncall_and_the_token_stays_secret(
    tmp_path: Path, receiver: JsonReceiver
) -> None:
    secret = "s3cr3t-t0ken"
    url = f"json://user:{secret}@127.0.0.1:{receiver.port}/run"
    state = tmp_path / "state"
    result = gpuwarden(
        tmp_path,
        url,
        "run",
        "--source",
        "scenario:scenarios/memory-pressure-low-priority.yaml",
        "--playbooks",
        "playbooks/memory-pressure.yaml",
        "--state-dir",
        str(state),
        "--speed",
        "40",
    )
    assert result.returncode == 0, result.stderr
    documents = receiver.received
    assert documents, "nothing was delivered"
    bodies = " ".join(str(d["message"]) for d in documents)
    assert "sweep.py" in bodies  # the kill and its outcome are in a message
    assert not any(t.startswith("[DRY-RUN]") for t in receiver.titles())
    assert secret not in result.stderr
    assert secret.encode() not in (state / "journal.db").read_bytes()
    outbox = gpuwarden(tmp_path, url, "outbox", "--state-dir", str(state))
    assert outbox.returncode == 0
    assert "sent" in outbox.stdout


def test_notify_test_against_a_live_and_a_dead_receiver(
    tmp_path: Path, receiver: JsonReceiver
) -> None:
    live = gpuwarden(tmp_path, receiver.url("test"), "notify-test", "oncall")
    assert live.returncode == 0, live.stdout + live.stderr
    assert live.stdout.startswith("ok")
    assert len(receiver.received) == 1
    dead_port = receiver.port
    receiver.stop()
    dead = gpuwarden(tmp_path, f"json://127.0.0.1:{dead_port}/test", "notify-test", "oncall")
    assert dead.returncode == 1
    assert dead.stdout.startswith("FAIL")
    assert "Traceback" not in dead.stderr
    unknown = gpuwarden(tmp_path, receiver.url("x"), "notify-test", "nobody")
    assert unknown.returncode == 1
    assert "no notify target 'nobody'" in unknown.stdout


def test_a_target_from_an_apprise_config_file_with_tags(
    tmp_path: Path, receiver: JsonReceiver
) -> None:
    conf = tmp_path / "apprise.yml"
    conf.write_text(
        f"version: 1\nurls:\n  - {receiver.url('gpu')}:\n      - tag: gpu\n"
        f"  - {receiver.url('other')}:\n      - tag: other\n"
    )
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"notify:\n  targets:\n    team:\n      config: {conf}\n      tags: [gpu]\n")
    result = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "notify-test", "team", "--config", str(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert [d["path"] for d in receiver.received] == ["/gpu"]


def test_a_restart_mid_incident_still_sends_the_resolve_once(
    tmp_path: Path, receiver: JsonReceiver
) -> None:
    from gpuwarden import config as config_mod
    from gpuwarden.notify.service import Notifications
    from gpuwarden.runtime import Runtime
    from tests.test_runtime import RELIEF, Run, scenario_copy, wait_until

    cfg = config_mod.load(config_for(tmp_path))
    os.environ["TEST_ONCALL_URL"] = receiver.url("restart")
    try:
        playbook = tmp_path / "tell.yaml"
        playbook.write_text(
            "rules:\n  - name: squeeze\n    for_each: gpu\n"
            "    when: gpu.memory.used_pct >= 95\n    for: 10s\n"
            "    until: gpu.memory.used_pct < 85\n    severity: critical\n"
            "    steps:\n      - notify: oncall\n"
        )
        run = Run(
            tmp_path, cfg, scenario_copy(tmp_path, end="3m30s", extra=RELIEF), playbook, at=90.0
        )

        def runtime() -> Runtime:
            runtime = run.runtime()
            runtime.notifications = Notifications(
                cfg, run.journal_path, host="test-node", clock=run.clock
            )
            return runtime

        first = runtime()
        first.recover()
        wait_until(lambda: (first.tick(), bool(receiver.received))[1])  # the open message
        assert first.notifications is not None
        first.notifications.sender.stop()  # then it dies: no shutdown
        second = runtime()
        second.run()
    finally:
        del os.environ["TEST_ONCALL_URL"]
    titles = receiver.titles()
    assert [t.split("]")[0] for t in titles] == ["[CRITICAL", "[RESOLVED"], titles
