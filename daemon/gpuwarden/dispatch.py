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
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuwarden.actions import registry
from gpuwarden.actions.base import Context, PowerControl
from gpuwarden.actions.slurm import Slurm
from gpuwarden.clock import Clock
from gpuwarden.engine.engine import Engine
from gpuwarden.model import Intent, Outcome, Undo
from gpuwarden.notify.service import Notifications
from gpuwarden.safety import Rails
from gpuwarden.sources import Source

if TYPE_CHECKING:  # prometheus_client is imported only when metrics are on
    from gpuwarden.cloud.service import CloudService
    from gpuwarden.metrics import Metrics

log = logging.getLogger("gpuwarden.run")


# Undo results worth trying again later (anything else — done, gone, reused — is final).
RETRY_UNDO = frozenset({"denied", "error"})


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
    """Runs the steps the engine asked for, and their undos. ``rails`` and ``dry_run`` are
    replaced when a reload is applied; ``cancel`` tells running steps to stop waiting."""

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
        self.slurm = slurm  # Slurm's commands, for steps on Slurm jobs (replaced on reload)
        self.cancel = threading.Event()  # running steps stop waiting: we are shutting down
        self._done: queue.Queue[tuple[Intent, Outcome]] = queue.Queue()
        self._running: dict[str, Future[None]] = {}

    # -- steps ------------------------------------------------------------------------------

    def dispatch(self, intent: Intent, now: float) -> None:
        """Hand a journaled intent to its executor, unless the rails refuse it."""
        self.stats.intents += 1
        refused = self.rails.refuse(intent, now)
        if refused is not None:
            self.stats.refused += 1
            log.warning(
                "action=%s rule=%s incident=%s refused: %s",
                intent.kind,
                intent.rule,
                intent.incident,
                refused,
            )
            if self.metrics is not None:
                self.metrics.observe_step(intent.kind, "refused")
            self._finish(intent, Outcome(ok=False, detail=f"refused: {refused}"), counted=True)
            return
        tripped = self.rails.record(intent, now)
        if tripped is not None:
            log.error(
                "circuit breaker tripped: %s; destructive steps halt until "
                "`gpuwarden reset-breaker`",
                tripped,
            )
            if self.notifications is not None:
                self.notifications.admin(
                    f"gpuwarden on {self.host}: circuit breaker tripped",
                    f"{tripped}. Destructive steps are halted until someone runs "
                    "`gpuwarden reset-breaker` on this host.",
                    now,
                )
        ctx = Context(
            dry_run=self.dry_run or intent.shadow,
            clock=self.clock,
            host=self.host,
            cancel=self.cancel,
            power=self.power,
            cloud=self.cloud,
            slurm=self.slurm,
            facts=self._facts(intent),
            still_needed=self._still_needed(intent) if intent.kind == "kill" else None,
        )
        self._running[intent.id] = self.pool.submit(self._execute, intent, ctx)

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
            with self._source_lock:
                snapshot = self.source.snapshot(now)
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
            self._finish(intent, outcome)

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

    def settle(self, grace: float) -> None:
        """Let steps that are still running finish, within ``grace`` seconds."""
        if self._running:
            wait(list(self._running.values()), timeout=grace)
        self.drain()

    def stop(self, grace: float) -> None:
        """Tell running steps to stop waiting, give them ``grace`` seconds, record what they
        did; a step still running after that is left unrecorded."""
        self.cancel.set()
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
