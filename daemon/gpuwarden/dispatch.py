"""The dispatcher: the run loop's hands. It takes the intents the journal has just written,
puts them through the rails, runs each executor in a worker thread, and records what comes back;
and it runs the undos that put things back.

Only the main thread calls it (``dispatch``, ``drain``, the undos); the worker threads only run
an executor and put its outcome on a queue, which ``drain`` empties at the start of each tick,
so the journal and the engine are still touched by the main thread alone. The loop itself
(ticks, reload, stop) is ``runtime.py``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.actions import registry
from gpuwarden.actions.base import Context, PowerControl
from gpuwarden.actions.slurm import Slurm
from gpuwarden.clock import Clock
from gpuwarden.config import Config
from gpuwarden.engine.engine import Engine
from gpuwarden.engine.protect import ProtectedMatcher
from gpuwarden.model import Intent, Outcome, Undo
from gpuwarden.notify.service import Notifications
from gpuwarden.safety import Admission, Rails
from gpuwarden.sources import Source
from gpuwarden.sources.procs import Attributor

if TYPE_CHECKING:  # prometheus_client is imported only when metrics are on
    from gpuwarden.cloud.service import CloudService
    from gpuwarden.metrics import Metrics

log = logging.getLogger("gpuwarden.run")


# Undo results worth trying again later (anything else — done, gone, reused — is final).
RETRY_UNDO = frozenset({"denied", "error"})


def member_protection(config: Config, self_pid: int | None) -> Callable[[int], str | None]:
    """Why a process is protected by ``config`` (None: it is not), read from /proc when asked:
    for the members of a process group a kill takes, which the planner never saw. Safe to call
    from several worker threads."""
    matcher = ProtectedMatcher(config.protected, self_pid=self_pid)
    attributor = Attributor(config.priorities)
    lock = threading.Lock()  # the attributor keeps what it read between calls

    def why(pid: int) -> str | None:
        with lock:
            info = attributor.describe([pid], time.time())[pid]
        return None if info.orphaned else matcher.why(info)

    return why


@dataclass
class RunStats:
    """What a run did, for the line printed when it stops: the loop counts ticks and
    incidents, the dispatcher steps and undos."""

    ticks: int = 0
    intents: int = 0
    refused: int = 0
    failed: int = 0
    undone: int = 0
    incidents: set[str] = field(default_factory=set)


class Dispatcher:
    """Runs the steps the engine asked for, and their undos. ``dry_run`` is replaced and
    ``configure`` called when a reload is applied (``rails`` is updated in place); ``cancel``
    tells running steps to stop waiting."""

    def __init__(
        self,
        journal: Any,
        engine: Engine,
        pool: ThreadPoolExecutor,
        stats: RunStats,
        *,
        rails: Rails,
        dry_run: bool,
        clock: Clock,
        source: Source,
        source_lock: threading.Lock,
        host: str = "",
        power: PowerControl | None = None,
        cloud: CloudService | None = None,
        notifications: Notifications | None = None,
        metrics: Metrics | None = None,
        config: Config | None = None,
        self_pid: int | None = None,
        slurm: Slurm | None = None,
    ) -> None:
        self.journal = journal
        self.engine = engine
        self.pool = pool
        self.stats = stats
        self.rails = rails
        self.dry_run = dry_run
        self.clock = clock
        self.source = source
        self._source_lock = source_lock  # the loop's: one snapshot at a time
        self.host = host
        self.power = power
        self.cloud = cloud
        self.notifications = notifications
        self.metrics = metrics
        self.self_pid = self_pid
        self.ack_spool: Path | None = None
        self.protection: Callable[[int], str | None] | None = None
        self.exec_user: str | None = None
        self.exec_group: str | None = None
        if config is not None:
            self.configure(config)
        self.slurm = slurm  # Slurm's commands, for steps on Slurm jobs (replaced on reload)
        self.cancel = threading.Event()  # running steps stop waiting: we are shutting down
        # Each running step's own cancel event: set at shutdown, or when its incident is
        # aborted (``cancel_incident``).
        self._cancels: dict[str, tuple[str, threading.Event]] = {}
        self._done: queue.Queue[tuple[Intent, Outcome]] = queue.Queue()
        self._running: dict[str, Future[None]] = {}
        # intent id -> (the intent as journaled, what the rails let run), until it finishes
        self._admitted: dict[str, tuple[Intent, Admission]] = {}

    def configure(self, config: Config) -> None:
        """What executors take from the config: the ack spool, the protected list (for the
        members of a process group), the user exec steps run as."""
        self.ack_spool = config.ack_spool
        self.protection = member_protection(config, self.self_pid)
        self.exec_user = config.exec.user
        self.exec_group = config.exec.group

    # -- steps ------------------------------------------------------------------------------

    def dispatch(self, intent: Intent, now: float) -> None:
        """Hand a journaled intent to its executor, unless the rails refuse it; a step over
        the room the limits leave runs on its first targets only (``safety.Rails.admit``)."""
        self.stats.intents += 1
        admission = self.rails.admit(intent, now)
        if admission.refused is not None:
            self.stats.refused += 1
            log.warning(
                "action=%s rule=%s incident=%s refused: %s",
                intent.kind,
                intent.rule,
                intent.incident,
                admission.refused,
            )
            if self.metrics is not None:
                self.metrics.observe_step(intent.kind, "refused")
            outcome = Outcome(ok=False, detail=f"refused: {admission.refused}")
            self._finish(intent, outcome, counted=True)
            return
        if admission.dropped:
            log.warning(
                "action=%s rule=%s incident=%s trimmed: %s",
                intent.kind,
                intent.rule,
                intent.incident,
                admission.note,
            )
        runs = admission.intent
        cancel = threading.Event()
        if self.cancel.is_set():
            cancel.set()
        self._cancels[intent.id] = (intent.incident, cancel)
        ctx = Context(
            dry_run=self.dry_run or intent.shadow,
            clock=self.clock,
            host=self.host,
            cancel=cancel,
            power=self.power,
            cloud=self.cloud,
            slurm=self.slurm,
            facts=self._facts(runs),
            still_needed=self._still_needed(runs) if intent.kind == "kill" else None,
            ack_spool=self.ack_spool,
            protection=self.protection,
            exec_user=self.exec_user,
            exec_group=self.exec_group,
        )
        self._admitted[intent.id] = (intent, admission)
        self._running[intent.id] = self.pool.submit(self._execute, runs, ctx)

    def _execute(self, intent: Intent, ctx: Context) -> None:
        try:
            outcome = registry.executor(intent.kind)(intent, ctx)
        except Exception as exc:  # an executor bug must not take the daemon down
            log.exception("executor %s failed", intent.kind)
            outcome = Outcome(
                ok=False,
                detail=f"executor failed: {type(exc).__name__}: {exc}",
                dry_run=ctx.dry_run,
            )
        self._done.put((intent, outcome))

    def _still_needed(self, intent: Intent) -> Callable[[], bool]:
        def check() -> bool:
            now = self.clock.now()
            # A second look between ticks: it must not take the events the next tick reports.
            look = getattr(self.source, "peek", self.source.snapshot)
            with self._source_lock:
                snapshot = look(now)
            return self.engine.still_needed(intent, snapshot, now)

        return check

    def _facts(self, intent: Intent) -> dict[str, str]:
        facts = {
            "GPUWARDEN_INCIDENT": intent.incident,
            "GPUWARDEN_RULE": intent.rule,
            "GPUWARDEN_SEVERITY": intent.severity,
            "GPUWARDEN_HOST": self.host,
            "GPUWARDEN_SCOPE": intent.where,
            "GPUWARDEN_DRY_RUN": "1" if self.dry_run or intent.shadow else "0",
        }
        if intent.gpu is not None:
            facts["GPUWARDEN_GPU"] = str(intent.gpu)
        if intent.targets:
            facts["GPUWARDEN_TARGET_PIDS"] = " ".join(str(t.pid) for t in intent.targets)
        return facts

    def drain(self) -> None:
        """Record the outcomes of the steps that have finished since the last drain."""
        while True:
            try:
                intent, outcome = self._done.get_nowait()
            except queue.Empty:
                return
            self._running.pop(intent.id, None)
            self._cancels.pop(intent.id, None)
            journaled, admission = self._admitted.pop(intent.id, (intent, Admission(intent)))
            self._count(journaled, outcome)
            self._finish(journaled, admission.completed(outcome))

    def _count(self, intent: Intent, outcome: Outcome) -> None:
        """Count what a finished step did against the rails; tell the admin if it trips the
        circuit breaker."""
        now = self.clock.now()
        tripped = self.rails.finish(intent, outcome, now)
        if tripped is None:
            return
        log.error(
            "circuit breaker tripped: %s; destructive steps halt until `gpuwarden reset-breaker`",
            tripped,
        )
        if self.notifications is not None:
            self.notifications.admin(
                f"gpuwarden on {self.host}: circuit breaker tripped",
                f"{tripped}. Destructive steps are halted until someone runs "
                "`gpuwarden reset-breaker` on this host.",
                now,
            )

    def _finish(self, intent: Intent, outcome: Outcome, *, counted: bool = False) -> None:
        if self.metrics is not None and not counted:
            result = "dry_run" if outcome.dry_run else "ok" if outcome.ok else "failed"
            self.metrics.observe_step(intent.kind, result)
        if not outcome.ok:
            self.stats.failed += 1
        self.journal.finish(intent.id, outcome, self.clock.now())
        self.engine.complete(intent.id, outcome)
        if self.notifications is not None:
            self.notifications.observe_outcome(intent, outcome, self.clock.now())
        if outcome.undo and not outcome.dry_run and intent.incident not in self._open():
            # The incident ended (resolved, aborted) while the step ran: put back now what
            # the step has just done, rather than at the next stop.
            self.undo_incident(intent.incident)

    def _open(self) -> set[str]:
        return {i.id for i in self.engine.incidents}

    def cancel_incident(self, incident: str) -> int:
        """The incident was aborted: its running steps stop waiting (a kill sends no further
        signal, a checkpoint stops waiting for its acknowledgement). How many were told."""
        told = 0
        for owner, event in self._cancels.values():
            if owner == incident and not event.is_set():
                event.set()
                told += 1
        return told

    def settle(self, grace: float) -> None:
        """Let steps that are still running finish, within ``grace`` seconds."""
        if self._running:
            wait(list(self._running.values()), timeout=grace)
        self.drain()

    def stop(self, grace: float) -> None:
        """Tell running steps to stop waiting, give them ``grace`` seconds, record what they
        did; a step still running after that is left unrecorded."""
        self.cancel.set()
        for _incident, event in self._cancels.values():
            event.set()
        if self._running:
            _done, pending = wait(list(self._running.values()), timeout=grace)
            for future in pending:
                log.error("a step was still running at shutdown; its outcome is not recorded")
                future.cancel()
        self.drain()

    # -- putting things back ----------------------------------------------------------------

    def undo_incident(self, incident: str) -> None:
        for undo in self.journal.pending_undos(incident):
            self.undo(undo)

    def undo(self, row: Any) -> None:
        """Run a journaled undo; it stays pending if it failed or may succeed later."""
        state = self.run_undo(row.undo())
        if state is None or state in RETRY_UNDO:
            return  # kept in the journal: tried again at the next resolve, stop or start
        self.journal.undo_done(row.id, self.clock.now(), state)

    def run_undo(self, undo: Undo) -> str | None:
        """Run one undo in this thread; its result's state, or None if the undoer failed."""
        ctx = Context(
            dry_run=self.dry_run,
            clock=self.clock,
            host=self.host,
            cancel=threading.Event(),
            power=self.power,
            slurm=self.slurm,
        )
        try:
            result = registry.undoer(undo.kind)(undo, ctx)
        except Exception:
            log.exception("undo %s failed", undo.kind)
            return None
        log.info("undo=%s pid=%s gpu=%s result=%s", undo.kind, undo.pid, undo.gpu, result.state)
        self.stats.undone += 1
        return result.state
