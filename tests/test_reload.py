"""Hot reload through real edits of real files, seen by a real watchdog observer."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuwarden import config as config_module
from gpuwarden.clock import SimClock
from gpuwarden.config import Config
from gpuwarden.errors import InputError
from gpuwarden.playbook import loader
from gpuwarden.reload import Reloader, ReloadOutcome, Watcher, load_set

ROOT = Path(__file__).resolve().parent.parent
DEBOUNCE = 0.1
WAIT = 5.0
QUIET = 0.5  # how long "nothing happens" is watched for: five debounce periods
RULE = "gpu-memory-pressure"
OLD_WHEN = "when: gpu.memory.used_pct >= 95"
NEW_WHEN = "when: gpu.memory.used_pct >= 96"


def wait_for(condition: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@dataclass
class Rig:
    config: Path
    playbooks: Path
    reloader: Reloader
    watcher: Watcher
    calls: list[float]

    @property
    def pressure(self) -> Path:
        return self.playbooks / "memory-pressure.yaml"

    def wait_calls(self, count: int) -> None:
        assert wait_for(lambda: len(self.calls) >= count), f"{len(self.calls)} call(s), not {count}"

    def settle(self, count: int) -> ReloadOutcome:
        """Wait for ``count`` callbacks in all, make sure no more follow, and reload."""
        self.wait_calls(count)
        time.sleep(DEBOUNCE * 3)
        assert len(self.calls) == count
        outcome = self.reloader.check()
        assert outcome is not None
        return outcome


def copy_set(config_dir: Path, playbook_dir: Path) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    playbook_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "config" / "gpuwarden.yaml", config_dir / "gpuwarden.yaml")
    for path in (ROOT / "playbooks").glob("*.yaml"):
        shutil.copy(path, playbook_dir / path.name)


def start_rig(config: Path, playbooks: Path, *, poll: bool = False) -> Rig:
    current = load_set(
        config, [str(playbooks)], load_config=config_module.load, load_playbooks=loader.load
    )
    reloader = Reloader(config, [str(playbooks)], current)
    calls: list[float] = []

    def on_change() -> None:
        calls.append(time.monotonic())
        reloader.request()

    watcher = Watcher(config, [str(playbooks)], on_change, debounce=DEBOUNCE, poll=poll)
    watcher.start()
    return Rig(config, playbooks, reloader, watcher, calls)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    copy_set(tmp_path / "etc", tmp_path / "etc" / "playbooks")
    started = start_rig(tmp_path / "etc" / "gpuwarden.yaml", tmp_path / "etc" / "playbooks")
    yield started
    started.watcher.stop()


def edited(path: Path, old: str = OLD_WHEN, new: str = NEW_WHEN) -> str:
    text = path.read_text()
    assert old in text
    return text.replace(old, new)


def assert_rule_changed(rig: Rig, outcome: ReloadOutcome) -> None:
    assert outcome.ok, outcome.error and outcome.error.render()
    assert outcome.changes is not None
    assert outcome.changes.changed == (RULE,)
    assert outcome.changes.added == outcome.changes.removed == ()
    assert not outcome.changes.config_changed
    rule = rig.reloader.current[1].rule(RULE)
    assert rule is not None
    assert "96" in rule.spec.when


def test_watches_directories_not_files(rig: Rig) -> None:
    assert rig.watcher.directories == sorted([str(rig.config.parent), str(rig.playbooks)])


def test_in_place_write_reloads_and_the_reload_itself_does_not_retrigger(rig: Rig) -> None:
    with rig.pressure.open("r+") as handle:
        text = handle.read().replace(OLD_WHEN, NEW_WHEN)
        handle.seek(0)
        handle.write(text)
        handle.truncate()
    assert_rule_changed(rig, rig.settle(1))
    # Reading every file during the reload (opens, closes without writing) is not a change.
    time.sleep(QUIET)
    assert len(rig.calls) == 1
    assert rig.reloader.check() is None


def test_sed_in_place(rig: Rig) -> None:
    subprocess.run(["sed", "-i", "s/used_pct >= 95/used_pct >= 96/", str(rig.pressure)], check=True)
    assert_rule_changed(rig, rig.settle(1))


def test_rename_style_editor(rig: Rig) -> None:
    # vim's default: write a swap file, move the original to a backup, write anew, drop both.
    text = edited(rig.pressure)
    swap = rig.playbooks / ".memory-pressure.yaml.swp"
    swap.write_text("swap")
    backup = rig.playbooks / "memory-pressure.yaml~"
    os.rename(rig.pressure, backup)
    rig.pressure.write_text(text)
    backup.unlink()
    swap.unlink()
    assert_rule_changed(rig, rig.settle(1))


def test_atomic_replace_from_a_temp_file(rig: Rig) -> None:
    temp = rig.playbooks / ".memory-pressure.yaml.tmp1234"
    with temp.open("w") as handle:
        handle.write(edited(rig.pressure))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, rig.pressure)
    assert_rule_changed(rig, rig.settle(1))


def test_config_edit_reloads(rig: Rig) -> None:
    text = edited(rig.config, "tick: 2s", "tick: 5s")
    temp = rig.config.with_name("gpuwarden.yaml.new")
    temp.write_text(text)
    os.replace(temp, rig.config)
    outcome = rig.settle(1)
    assert outcome.ok
    assert outcome.changes is not None
    assert outcome.changes.config_changed
    assert outcome.changes.changed == ()
    assert outcome.config.tick == 5.0
    assert rig.reloader.current[0].tick == 5.0


def test_deleted_and_added_playbooks(rig: Rig) -> None:
    text = (rig.playbooks / "thermal-throttling.yaml").read_text()
    (rig.playbooks / "thermal-throttling.yaml").unlink()
    (rig.playbooks / "thermal.yml").write_text(text.replace("name: ", "name: renamed-", 1))
    outcome = rig.settle(1)
    assert outcome.ok
    assert outcome.changes is not None
    assert len(outcome.changes.removed) == 1
    assert outcome.changes.added == ("renamed-" + outcome.changes.removed[0],)


def test_broken_edit_is_refused_then_the_fix_is_picked_up(rig: Rig) -> None:
    before = rig.reloader.current
    rig.pressure.write_text(edited(rig.pressure, OLD_WHEN, "when: gpu.memory.used_pctt >= 95"))
    outcome = rig.settle(1)
    assert not outcome.ok
    assert outcome.error is not None
    assert re.search(rf"{re.escape(str(rig.pressure))}:\d+:\d+: ", outcome.error.render())
    assert rig.reloader.current is before
    assert (outcome.config, outcome.playbooks) == before
    assert (rig.reloader.successes, rig.reloader.failures) == (0, 1)
    assert rig.reloader.last_error is outcome.error

    rig.pressure.write_text(edited(rig.pressure, "used_pctt >= 95", "used_pct >= 96"))
    fixed = rig.settle(2)
    assert_rule_changed(rig, fixed)
    assert (rig.reloader.successes, rig.reloader.failures) == (1, 1)
    assert rig.reloader.last_error is None


def test_config_that_breaks_a_playbook_keeps_the_whole_old_set(rig: Rig) -> None:
    # The config alone is valid; a playbook that selects `priority <= low` no longer is.
    before = rig.reloader.current
    rig.config.write_text(edited(rig.config, "- name: low", "- name: lower"))
    outcome = rig.settle(1)
    assert not outcome.ok
    assert outcome.error is not None
    assert re.search(r"memory-pressure\.yaml:\d+:\d+: ", outcome.error.render())
    assert rig.reloader.current is before
    assert rig.reloader.current[0].priorities.names == before[0].priorities.names


def test_a_burst_of_writes_is_one_callback(rig: Rig) -> None:
    for count in range(10):
        rig.pressure.write_text(edited(rig.pressure, OLD_WHEN, OLD_WHEN + f"  # {count}"))
        time.sleep(0.01)
    outcome = rig.settle(1)
    assert outcome.ok
    assert outcome.changes is not None
    assert outcome.changes.summary() == "no changes"  # comments only


def test_unrelated_files_do_not_trigger(rig: Rig) -> None:
    (rig.playbooks / "notes.txt").write_text("remember the milk")
    (rig.playbooks / ".hidden.yaml").write_text("rules: []")
    (rig.playbooks / "memory-pressure.yaml.swp").write_text("swap")
    (rig.playbooks / "archive").mkdir()
    (rig.playbooks / "archive" / "old.yaml").write_text("rules: []")
    (rig.config.parent / "other.yaml").write_text("x: 1")
    (rig.config.parent / "gpuwarden.yaml.bak").write_text("x: 1")
    time.sleep(QUIET)
    assert rig.calls == []
    assert rig.reloader.check() is None


def test_request_goes_the_same_way(rig: Rig) -> None:
    rig.watcher.request()
    rig.watcher.request()
    outcome = rig.settle(1)
    assert outcome.ok
    assert outcome.changes is not None
    assert outcome.changes.summary() == "no changes"
    assert rig.reloader.successes == 1


def test_a_real_sighup(rig: Rig) -> None:
    previous = signal.signal(signal.SIGHUP, lambda _signum, _frame: rig.watcher.request())
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        rig.wait_calls(1)
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert rig.settle(1).ok


def make_configmap(folder: Path, files: dict[str, str], stamp: str) -> None:
    """The layout kubelet writes: a timestamped dir, ``..data`` linking to it, and one link per
    key through ``..data``."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"..{stamp}"
    data.mkdir()
    for name, text in files.items():
        (data / name).write_text(text)
    (folder / "..data").symlink_to(data.name)
    for name in files:
        (folder / name).symlink_to(f"..data/{name}")


def swap_configmap(folder: Path, files: dict[str, str], stamp: str) -> None:
    """What kubelet does on an update: a new dir, a new link, renamed over ``..data``."""
    old = os.readlink(folder / "..data")
    data = folder / f"..{stamp}"
    data.mkdir()
    for name, text in files.items():
        (data / name).write_text(text)
    (folder / "..data_tmp").symlink_to(data.name)
    os.replace(folder / "..data_tmp", folder / "..data")
    shutil.rmtree(folder / old)


def test_kubernetes_configmap_swap(tmp_path: Path) -> None:
    config_text = (ROOT / "config" / "gpuwarden.yaml").read_text()
    books = {p.name: p.read_text() for p in sorted((ROOT / "playbooks").glob("*.yaml"))}
    make_configmap(tmp_path / "cfg", {"gpuwarden.yaml": config_text}, "2026_01_01_00_00_00.000001")
    make_configmap(tmp_path / "books", books, "2026_01_01_00_00_00.000002")
    rig = start_rig(tmp_path / "cfg" / "gpuwarden.yaml", tmp_path / "books")
    try:
        changed = dict(books)
        changed["memory-pressure.yaml"] = books["memory-pressure.yaml"].replace(OLD_WHEN, NEW_WHEN)
        swap_configmap(tmp_path / "books", changed, "2026_01_01_00_05_00.000003")
        assert_rule_changed(rig, rig.settle(1))

        swap_configmap(
            tmp_path / "cfg",
            {"gpuwarden.yaml": config_text.replace("tick: 2s", "tick: 7s")},
            "2026_01_01_00_06_00.000004",
        )
        outcome = rig.settle(2)
        assert outcome.ok
        assert outcome.config.tick == 7.0
    finally:
        rig.watcher.stop()


def test_polling_observer(tmp_path: Path) -> None:
    copy_set(tmp_path / "etc", tmp_path / "etc" / "playbooks")
    rig = start_rig(tmp_path / "etc" / "gpuwarden.yaml", tmp_path / "etc" / "playbooks", poll=True)
    try:
        subprocess.run(
            ["sed", "-i", "s/used_pct >= 95/used_pct >= 96/", str(rig.pressure)], check=True
        )
        assert_rule_changed(rig, rig.settle(1))
    finally:
        rig.watcher.stop()


def test_stop_ends_the_threads(rig: Rig) -> None:
    rig.watcher.stop()
    assert not any(t.name == "gpuwarden-reload" for t in threading.enumerate())
    rig.pressure.write_text(edited(rig.pressure))
    time.sleep(QUIET)
    assert rig.calls == []


def test_check_without_a_request_does_nothing(tmp_path: Path) -> None:
    copy_set(tmp_path, tmp_path / "books")
    current = load_set(
        tmp_path / "gpuwarden.yaml",
        [str(tmp_path / "books")],
        load_config=config_module.load,
        load_playbooks=loader.load,
    )
    clock = SimClock()
    reloader = Reloader(
        tmp_path / "gpuwarden.yaml", [str(tmp_path / "books")], current, clock=clock
    )
    assert reloader.check() is None
    assert (reloader.successes, reloader.failures, reloader.last_attempt) == (0, 0, None)
    reloader.request()
    assert reloader.pending
    outcome = reloader.check()
    assert outcome is not None
    assert outcome.ok
    assert outcome.at == clock.now() == reloader.last_attempt == reloader.last_success
    assert reloader.check() is None  # the request was used up


def test_load_set_without_a_config_uses_the_defaults(tmp_path: Path) -> None:
    # The defaults have no notification targets: a rule that only renices loads against them.
    (tmp_path / "p.yaml").write_text(
        "rules:\n  - name: hot\n    when: gpu.memory.used_pct >= 95\n"
        "    steps: [renice: {select: process.priority <= low, nice: 19}]\n"
    )
    config, playbooks = load_set(
        None, [str(tmp_path)], load_config=config_module.load, load_playbooks=loader.load
    )
    assert config == Config()
    assert [r.name for r in playbooks.rules] == ["hot"]


def test_load_set_raises_with_positions(tmp_path: Path) -> None:
    copy_set(tmp_path, tmp_path / "books")
    (tmp_path / "gpuwarden.yaml").write_text("tick: 2s\nnot_a_key: 1\n")
    with pytest.raises(InputError) as caught:
        load_set(
            tmp_path / "gpuwarden.yaml",
            [str(tmp_path / "books")],
            load_config=config_module.load,
            load_playbooks=loader.load,
        )
    assert f"{tmp_path / 'gpuwarden.yaml'}:2:1" in caught.value.render()


def test_unexpected_loader_failure_is_an_outcome_not_an_exception(tmp_path: Path) -> None:
    copy_set(tmp_path, tmp_path / "books")
    current = load_set(
        tmp_path / "gpuwarden.yaml",
        [str(tmp_path / "books")],
        load_config=config_module.load,
        load_playbooks=loader.load,
    )

    def exploding(_path: Path) -> Config:
        raise RuntimeError("disk on fire")

    reloader = Reloader(
        tmp_path / "gpuwarden.yaml", [str(tmp_path / "books")], current, load_config=exploding
    )
    reloader.request()
    outcome = reloader.check()
    assert outcome is not None
    assert not outcome.ok
    assert outcome.error is not None
    assert "disk on fire" in outcome.error.render()
    assert reloader.current is current
    assert reloader.failures == 1
