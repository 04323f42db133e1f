"""Reload checks owner and mode again, as at start: a playbook made writable by others after the
daemon started, or a directory above it, is refused with the reason, the running set stays, and
the admin target is told (a real HTTP receiver). The edit is made by a real second user."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden import config as config_mod
from gpuwarden.journal.journal import Journal
from gpuwarden.notify.service import Notifications
from gpuwarden.playbook import loader
from gpuwarden.reload import Reloader, unsafe_problems
from gpuwarden.runtime import Runtime
from tests.local_users import LocalUsers, ProcessSource
from tests.notify_receivers import JsonReceiver
from tests.system_users import User

RULES = """rules:
  - name: full
    for_each: gpu
    when: gpu.memory.used_pct >= 95
    steps:
      - notify: admin
"""


@pytest.fixture
def etc() -> Iterator[Path]:
    """An /etc/gpuwarden of the test's own: root-owned, 0755, traversable by the test users."""
    top = Path(tempfile.mkdtemp(prefix="gpuwarden-etc-"))
    top.chmod(0o755)
    (top / "playbooks").mkdir(mode=0o755)
    (top / "playbooks" / "full.yaml").write_text(RULES)
    yield top
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def receiver() -> Iterator[JsonReceiver]:
    server = JsonReceiver().start()
    yield server
    server.stop()


def edit_as(user: User, playbook: Path, text: str, how: str) -> None:
    """``user`` changes the playbook: writes into it, or replaces it through its directory."""
    if how == "playbook":
        command = f"cat > {playbook}"
    else:
        command = f"cat > {playbook.parent}/.new && mv -f {playbook.parent}/.new {playbook}"
    done = user.run(["/bin/sh", "-c", command], input=text)
    assert done.returncode == 0, done.stderr


def reload_once(etc: Path, receiver: JsonReceiver, tmp_path: Path, change: str, user: User) -> str:
    """Start with a safe set, let ``change`` happen, reload once; the admin's message."""
    config_path = etc / "gpuwarden.yaml"
    config_path.write_text(
        "notify:\n  admin: admin\n  group_wait: 0s\n  targets:\n"
        f"    admin: {{urls: ['json://127.0.0.1:{receiver.port}/admin']}}\n"
    )
    cfg = config_mod.load(config_path)
    books = [str(etc / "playbooks")]
    assert unsafe_problems(config_path, books) is None  # safe at start
    playbooks = loader.load(books, cfg)
    journal = Journal(tmp_path / "journal.db")
    notifications = Notifications(cfg, journal.path, host="node")
    reloader = Reloader(config_path, books, (cfg, playbooks))
    runtime = Runtime(
        cfg,
        ProcessSource(),
        playbooks,
        journal,
        host="node",
        notifications=notifications,
        reloader=reloader,
    )
    playbook = etc / "playbooks" / "full.yaml"
    if change == "playbook":
        playbook.chmod(0o666)
    else:
        (etc / "playbooks").chmod(0o777)
    edit_as(user, playbook, RULES.replace(">= 95", ">= 5"), change)
    runtime.request_reload()
    runtime.run(once=True)  # the reload comes before the tick; the stop delivers the message
    assert reloader.failures == 1
    assert runtime.engine.playbooks.rules[0].spec.when == "gpu.memory.used_pct >= 95"
    deadline = time.monotonic() + 20
    while not receiver.received:
        assert time.monotonic() < deadline, "the admin was not told"
        time.sleep(0.05)
    (message,) = receiver.received
    assert message["path"] == "/admin"
    assert message["title"] == "gpuwarden on node: reload refused"
    return str(message["message"])


def test_reload_refuses_a_playbook_made_writable_after_start(
    local_users: LocalUsers, etc: Path, receiver: JsonReceiver, tmp_path: Path
) -> None:
    body = reload_once(etc, receiver, tmp_path, "playbook", local_users.mallory)
    playbook = etc / "playbooks" / "full.yaml"
    assert f"{playbook}: writable by group or others (mode -rw-rw-rw-)" in body
    assert f"chmod go-w {playbook}" in body


def test_reload_refuses_when_a_parent_directory_is_made_writable(
    local_users: LocalUsers, etc: Path, receiver: JsonReceiver, tmp_path: Path
) -> None:
    body = reload_once(etc, receiver, tmp_path, "directory", local_users.mallory)
    folder = etc / "playbooks"
    assert f"{folder}: writable by group or others (mode drwxrwxrwx)" in body
    assert "whoever can change it controls what gpuwarden does" in body
