"""Hot reload of the config file and the playbooks.

Three parts, each testable alone:

- ``Watcher`` watches the *directories* that hold the config file and the playbooks (a watch on a
  file's inode dies when an editor or ``sed -i`` renames a new file over it), keeps only events
  about the files that matter, waits until they settle (debounce) and then calls ``on_change()``
  once, from its own thread. ``request()`` (SIGHUP) goes the same way.
- ``load_set`` loads and validates a whole new set: the config, then the playbooks against it.
- ``Reloader`` holds the running set. The run loop calls ``check()`` between ticks; a flagged
  change is loaded whole or not at all, and a broken set never replaces the running one.
  Before anything is read, the owner and mode of every file of the set and of every
  directory above it are checked again, as at start (``unsafe_problems``): a playbook made
  writable by others after start, or a parent directory, refuses the reload with the reason
  (which the run loop sends to the admin target).

Wiring, in the run loop::

    reloader = Reloader(config_path, paths, (cfg, playbooks))
    watcher = Watcher(config_path, paths, reloader.request,
                      debounce=cfg.reload.debounce, poll=cfg.reload.poll)
    watcher.start()                                   # if cfg.reload.watch
    signal.signal(signal.SIGHUP, lambda *_: watcher.request())
    ...
    outcome = reloader.check()                        # between ticks; never raises
    if outcome is not None and outcome.ok: swap in outcome.config / outcome.playbooks
    ...
    watcher.stop()
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirModifiedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from gpuwarden import config as config_module
from gpuwarden import pathsafety
from gpuwarden.clock import Clock, SystemClock
from gpuwarden.config import Config
from gpuwarden.errors import InputError, Problem
from gpuwarden.playbook import loader
from gpuwarden.playbook.loader import PLAYBOOK_SUFFIXES, PlaybookSet

log = logging.getLogger(__name__)

# Kubernetes mounts a ConfigMap as files that link through ``..data``; an update swaps that link.
K8S_DATA_LINK = "..data"
DEFAULT_DEBOUNCE = 0.3
# Events that can change what a file holds. Opens and reads are left out: the reload itself
# reads every file, and must not set off another reload.
_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileDeletedEvent,
    FileClosedEvent,
    DirCreatedEvent,
    DirModifiedEvent,
    DirMovedEvent,
    DirDeletedEvent,
]

LoadConfig = Callable[[Path], Config]
LoadPlaybooks = Callable[[Sequence[str], Config], PlaybookSet]


def _text(path: bytes | str) -> str:
    return os.fsdecode(path)


class _Targets:
    """Which paths matter: the config file, playbook files named directly, the playbook files
    of the playbook directories, and ``..data`` in any of the watched directories."""

    def __init__(self, config_path: Path | None, playbook_paths: Sequence[str]) -> None:
        self.files: set[str] = set()
        self.playbook_dirs: set[str] = set()
        self.dirs: set[str] = set()
        if config_path is not None:
            path = os.path.abspath(config_path)
            self.files.add(path)
            self.dirs.add(os.path.dirname(path))
        for raw in playbook_paths:
            path = os.path.abspath(raw)
            if os.path.isdir(path):
                self.playbook_dirs.add(path)
                self.dirs.add(path)
            else:
                self.files.add(path)
                self.dirs.add(os.path.dirname(path))

    def relevant(self, path: str) -> bool:
        if not path:
            return False
        path = os.path.abspath(path)
        folder, name = os.path.split(path)
        if path in self.files:
            return True
        if name == K8S_DATA_LINK and folder in self.dirs:
            return True
        return (
            folder in self.playbook_dirs
            and not name.startswith(".")
            and name.endswith(PLAYBOOK_SUFFIXES)
        )


class _Handler(FileSystemEventHandler):
    def __init__(self, targets: _Targets, notice: Callable[[str], None]) -> None:
        self._targets = targets
        self._notice = notice

    def on_any_event(self, event: FileSystemEvent) -> None:
        for raw in (event.src_path, event.dest_path):
            path = _text(raw)
            if self._targets.relevant(path):
                self._notice(f"{event.event_type} {path}")
                return


class Watcher:
    """Calls ``on_change()`` once after changes to the config or the playbooks settle.

    ``on_change`` runs on the watcher's own thread: it must only set a flag or enqueue (e.g.
    ``Reloader.request``); the run loop does the reload between ticks. ``request()`` is safe to
    call from a signal handler (SIGHUP): it takes a re-entrant lock and never blocks on I/O.
    """

    def __init__(
        self,
        config_path: Path | None,
        playbook_paths: Sequence[str],
        on_change: Callable[[], None],
        *,
        debounce: float = DEFAULT_DEBOUNCE,
        poll: bool = False,
    ) -> None:
        self._targets = _Targets(config_path, playbook_paths)
        self._on_change = on_change
        self._debounce = debounce
        self._poll = poll
        self._cond = threading.Condition(threading.RLock())
        self._due: float | None = None  # monotonic time the pending change fires at
        self._stopping = False
        self._observer: BaseObserver | None = None
        self._thread: threading.Thread | None = None

    @property
    def directories(self) -> list[str]:
        """The directories watched (not the files: see the module's docstring)."""
        return sorted(self._targets.dirs)

    def start(self) -> None:
        observer: BaseObserver = PollingObserver(timeout=0.1) if self._poll else Observer()
        handler = _Handler(self._targets, self._noticed)
        for folder in self.directories:
            if not os.path.isdir(folder):
                log.warning("reload: cannot watch %s: not a directory", folder)
                continue
            observer.schedule(handler, folder, recursive=False, event_filter=_EVENTS)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="gpuwarden-reload", daemon=True)
        self._thread.start()
        observer.start()
        self._observer = observer

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def request(self) -> None:
        """Reload as if the files had changed (SIGHUP)."""
        self._noticed("reload requested")

    def _noticed(self, what: str) -> None:
        log.debug("reload: %s", what)
        with self._cond:
            self._due = time.monotonic() + self._debounce
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (self._due is None or self._due > time.monotonic()):
                    timeout = None if self._due is None else self._due - time.monotonic()
                    self._cond.wait(timeout)
                if self._stopping:
                    return
                self._due = None
            try:
                self._on_change()
            except Exception:
                log.exception("reload: the change callback failed")


def loaded_paths(config_path: Path | None, playbook_paths: Sequence[str | Path]) -> list[Path]:
    """Every file and directory a set is loaded from: the config, the playbook directories
    and the playbook files in them (what ``pathsafety.unsafe`` checks, with their parents)."""
    found = [config_path] if config_path is not None else []
    found += [Path(p) for p in playbook_paths if os.path.isdir(p)]
    found += loader.playbook_files([Path(p) for p in playbook_paths])
    return list(dict.fromkeys(found))


def unsafe_problems(
    config_path: Path | None, playbook_paths: Sequence[str | Path]
) -> InputError | None:
    """The components of the set's paths others could change, as an error naming each (and
    its fix); None when there are none. The same rule as at start: owned by root or the
    daemon's user, writable by nobody else, every parent directory up to ``/`` included."""
    found = pathsafety.unsafe(loaded_paths(config_path, playbook_paths))
    if not found:
        return None
    return InputError(
        [
            Problem(
                u.path,
                None,
                None,
                f"{u.problem}: whoever can change it controls what gpuwarden does",
                hint=f"{u.fix} (or start with --insecure-permissions)",
            )
            for u in found
        ]
    )


def load_set(
    config_path: Path | None,
    playbook_paths: Sequence[str],
    *,
    load_config: LoadConfig,
    load_playbooks: LoadPlaybooks,
) -> tuple[Config, PlaybookSet]:
    """Load and validate a whole set: the config, then the playbooks against it.

    Raises ``InputError`` (with ``file:line:col``) on any problem; returns nothing partial.
    With no config file the defaults are used, as at start.
    """
    config = Config() if config_path is None else load_config(config_path)
    return config, load_playbooks(playbook_paths, config)


@dataclass(frozen=True)
class RuleChanges:
    """What a reload changed, by rule name (each tuple sorted)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    config_changed: bool

    @staticmethod
    def between(old: tuple[Config, PlaybookSet], new: tuple[Config, PlaybookSet]) -> RuleChanges:
        before = {rule.name: rule.spec for rule in old[1].rules}
        after = {rule.name: rule.spec for rule in new[1].rules}
        return RuleChanges(
            added=tuple(sorted(after.keys() - before.keys())),
            removed=tuple(sorted(before.keys() - after.keys())),
            changed=tuple(
                sorted(name for name in before.keys() & after.keys() if before[name] != after[name])
            ),
            config_changed=old[0] != new[0],
        )

    def summary(self) -> str:
        parts = [
            f"{label}: {', '.join(names)}"
            for label, names in (
                ("added", self.added),
                ("removed", self.removed),
                ("changed", self.changed),
            )
            if names
        ]
        if self.config_changed:
            parts.append("config changed")
        return "; ".join(parts) or "no changes"


@dataclass(frozen=True)
class ReloadOutcome:
    """The result of one reload attempt: the new set and what changed, or the error."""

    ok: bool
    at: float  # wall-clock seconds since the epoch
    config: Config  # the set running after this attempt (the old one when it failed)
    playbooks: PlaybookSet
    changes: RuleChanges | None = None
    error: InputError | None = None


class Reloader:
    """Holds the running (config, playbooks) and replaces it, whole, when a new set is valid."""

    def __init__(
        self,
        config_path: Path | None,
        playbook_paths: Sequence[str],
        current: tuple[Config, PlaybookSet],
        *,
        load_config: LoadConfig | None = None,
        load_playbooks: LoadPlaybooks | None = None,
        clock: Clock | None = None,
        insecure_permissions: bool = False,
    ) -> None:
        self._config_path = config_path
        self._insecure = insecure_permissions  # as at start: --insecure-permissions
        self._paths = list(playbook_paths)
        self._current = current
        self._load_config: LoadConfig = load_config or config_module.load
        self._load_playbooks: LoadPlaybooks = load_playbooks or loader.load
        self._clock: Clock = clock or SystemClock()
        self._flag = threading.Event()
        self.successes = 0
        self.failures = 0
        self.last_attempt: float | None = None  # wall-clock seconds since the epoch
        self.last_success: float | None = None
        self.last_error: InputError | None = None

    @property
    def current(self) -> tuple[Config, PlaybookSet]:
        return self._current

    def request(self) -> None:
        """Flag a reload for the next ``check()``; safe from any thread."""
        self._flag.set()

    @property
    def pending(self) -> bool:
        return self._flag.is_set()

    def check(self) -> ReloadOutcome | None:
        """Reload if flagged; ``None`` when nothing was. Never raises."""
        if not self._flag.is_set():
            return None
        self._flag.clear()
        now = self._clock.now()
        self.last_attempt = now
        unsafe = unsafe_problems(self._config_path, self._paths)
        if unsafe is not None and not self._insecure:
            return self._failed(now, unsafe)
        if unsafe is not None:
            log.warning("reload: allowed by --insecure-permissions:\n%s", unsafe.render())
        try:
            new = load_set(
                self._config_path,
                self._paths,
                load_config=self._load_config,
                load_playbooks=self._load_playbooks,
            )
        except InputError as exc:
            return self._failed(now, exc)
        except Exception as exc:
            log.exception("reload: unexpected failure")
            where = str(self._config_path or ", ".join(self._paths))
            return self._failed(now, InputError.at(where, None, None, f"cannot reload: {exc}"))
        changes = RuleChanges.between(self._current, new)
        self._current = new
        self.successes += 1
        self.last_success = now
        self.last_error = None
        log.info("reload: ok (%s)", changes.summary())
        return ReloadOutcome(True, now, new[0], new[1], changes=changes)

    def _failed(self, now: float, error: InputError) -> ReloadOutcome:
        self.failures += 1
        self.last_error = error
        log.error("reload: refused, keeping the running set:\n%s", error.render())
        config, playbooks = self._current
        return ReloadOutcome(False, now, config, playbooks, error=error)
