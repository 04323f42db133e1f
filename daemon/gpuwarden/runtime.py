"""The run loop: source → engine → executors → journal, one tick at a time.

Only the main thread touches the engine and the journal. Executors run in worker threads (a
slow checkpoint wait never delays the next tick) and hand their outcomes back through a queue
that each tick drains. Every intent is journaled before it is handed to an executor and its
outcome after, so a daemon killed mid-ladder and restarted repeats no step (``recover``), and
whatever a step changed that must be put back (a suspended job, a nice value, a power limit) is
an undo row that survives the restart.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuwarden.actions import registry
from gpuwarden.actions.base import Context, PowerControl
from gpuwarden.clock import Clock, ScaledClock, SystemClock
from gpuwarden.cloud.rounds import Rounds, reaped_notes
from gpuwarden.config import Config
from gpuwarden.engine.engine import Engine
from gpuwarden.engine.incident import Tick
from gpuwarden.model import Intent, Outcome, Reason, RuleChange, Transition, Undo
from gpuwarden.notify.service import Notifications
from gpuwarden.playbook.loader import PlaybookSet
from gpuwarden.safety import Rails
from gpuwarden.sources import Source

if TYPE_CHECKING:  # prometheus_client is imported only when metrics are on
    from gpuwarden.cloud.reaper import Reaped
    from gpuwarden.cloud.service import CloudService
    from gpuwarden.metrics import Metrics
    from gpuwarden.sdnotify import SystemdNotifier

log = logging.getLogger("gpuwarden.run")


# Undo results worth trying again later (anything else — done, gone, reused — is final).
RETRY_UNDO = frozenset({"denied", "error"})


@dataclass
class RunStats:
    ticks: int = 0
    intents: int = 0
    refused: int = 0
    failed: int = 0
    undone: int = 0
    incidents: set[str] = field(default_factory=set)


class Runtime:
    def __init__(
        self,
        config: Config,
        source: Source,
        playbooks: PlaybookSet,
        journal: Any,
        *,
        clock: Clock | None = None,
        dry_run: bool = False,
        power: PowerControl | None = None,
        self_pid: int | None = None,
        host: str = "",
        notifications: Notifications | None = None,
        metrics: Metrics | None = None,
        systemd: SystemdNotifier | None = None,
        reloader: Any = None,
        cloud: CloudService | None = None,
    ) -> None:
        self.config = config
        self.source = source
        self.journal = journal
        self.clock = clock or SystemClock()
        self._forced_dry_run = dry_run  # --dry-run holds across reloads
        self.dry_run = dry_run or config.dry_run
        self.power = power
        self.host = host
        self.notifications = notifications
        self.metrics = metrics
        self.systemd = systemd
        self.reloader = reloader  # a gpuwarden.reload.Reloader, when reloads are on
        self.cloud = cloud  # launches for provision steps; reconciled and reaped in rounds
        self.engine = Engine(playbooks, config, self_pid=self_pid)
        self.rails = Rails(config.safety, journal)
        self.pool = ThreadPoolExecutor(config.safety.workers, thread_name_prefix="gpuwarden-step")
        self.rounds = None if cloud is None else Rounds(cloud, self.pool, self.clock)
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self.cancel = threading.Event()  # running steps stop waiting: we are shutting down
        self.stats = RunStats()
        self._done: queue.Queue[tuple[Intent, Outcome]] = queue.Queue()
        self._running: dict[str, Future[None]] = {}
        self._source_lock = threading.Lock()

    # -- start ------------------------------------------------------------------------------

    def recover(self) -> None:
        """Pick up where a previous run stopped: never repeat a step, never forget an undo."""
        now = self.clock.now()
        for row in self.journal.interrupted():
            log.warning("step %s was in flight when gpuwarden stopped; it is not repeated", row.id)
            self.journal.mark_interrupted(row.id, now)
            if row.kind == "suspend":  # it may have stopped jobs before writing their undo
                for target in row.targets:
                    self._run_undo(
                        Undo(kind="resume", pid=target.pid, create_time=target.create_time)
                    )
        open_ids: set[str] = set()
        for found in self.journal.open_incidents():
            inc = found.incident
            restored = self.engine.restore(
                rule=inc.rule,
                scope=inc.scope,
                label=inc.label,
                incident=inc.id,
                opened=inc.opened_at,
                gpu=inc.gpu,
                planned_steps=found.steps.keys(),
                targeted=found.targeted,
            )
            if restored:
                open_ids.add(inc.id)
                if self.notifications is not None:
                    self.notifications.restore(inc, self.journal.timeline(inc.id), now)
                log.info(
                    "resumed incident %s (%s, %d step(s) already run)",
                    inc.id,
                    inc.rule,
                    len(found.steps),
                )
            else:
                change = RuleChange(
                    Transition.RESOLVED,
                    inc.rule,
                    inc.scope,
                    now,
                    Reason.RULE_REMOVED,
                    inc.id,
                    where=inc.label,
                )
                self.journal.record(change, now)
        for undo in self.journal.pending_undos():
            if undo.incident not in open_ids:
                self._undo(undo)

    # -- one tick ---------------------------------------------------------------------------

    def tick(self) -> Tick:
        began = time.perf_counter()
        now = self.clock.now()
        self._drain()
        with self._source_lock:
            snapshot = self.source.snapshot(now)
        for row in self.journal.incidents(open_only=True):
            if row.acked_at is not None:  # `gpuwarden ack`, from another process
                self.engine.ack(row.id)
                if self.notifications is not None:
                    self.notifications.ack(row.id, now)
        result = self.engine.step(snapshot, now)
        self.stats.ticks += 1
        # Written before anything is acted on; an intent the journal already holds (a step a
        # previous run planned) comes back refused and is never run twice.
        written = self.journal.record_all(result.records, now, self.engine.incidents)
        if self.notifications is not None:
            self.notifications.observe(
                written, snapshot.gpus, {i.id: i.gpu for i in self.engine.incidents}, now
            )
        for record in written:
            if isinstance(record, Intent):
                self._dispatch(record, now)
            elif record.kind == Transition.RESOLVED and record.incident:
                self._undo_incident(record.incident)
            elif record.kind == Transition.FIRING and record.incident:
                self.stats.incidents.add(record.incident)
                log.warning(
                    "incident %s: rule %s fired for %s", record.incident, record.rule, record.where
                )
        if self.cloud is not None:
            self._cloud_tick(now)  # before the flush: what the reaper ended goes out now
        if self.notifications is not None:
            self.notifications.flush(now)
        if self.metrics is not None:
            self._observe(snapshot, time.perf_counter() - began)
        return result

    # -- cloud ------------------------------------------------------------------------------

    def _cloud_tick(self, now: float) -> None:
        assert self.rounds is not None
        self._tell_reaped(self.rounds.reaped(), now)
        self.rounds.tick(
            now,
            interval=self.config.cloud.reap_interval,
            dry_run=self.dry_run,
            needed=self._cloud_needed,
        )

    def _cloud_needed(self) -> bool:
        """A rule that can launch, or an instance that runs: else no round calls EC2."""
        assert self.cloud is not None
        rules = self.engine.playbooks.rules
        return any(s.kind == "provision" for r in rules for s in r.steps) or bool(
            self.cloud.store.live()
        )

    def _tell_reaped(self, reaped: list[Reaped], now: float) -> None:
        """Tell the people a burst's rule notifies that its instances were terminated, and
        what they cost: the launch was announced, so is the end of the spend."""
        if not reaped or self.notifications is None or self.cloud is None:
            return
        notes = reaped_notes(self.cloud, self.engine.playbooks, reaped, now)
        for rule, lines, targets, severity in notes:
            self.notifications.tell(
                targets,
                f"{self.host}/reaped/{rule}/{now:.3f}",
                f"gpuwarden on {self.host}: {len(lines)} cloud instance(s) of {rule} terminated",
                "\n".join(lines),
                "info",
                now,
                route_as=severity,  # like a resolve message: whoever heard of the launch
            )

    def _observe(self, snapshot: Any, seconds: float) -> None:
        assert self.metrics is not None
        self.metrics.observe_tick(
            snapshot, seconds, self.engine.phase_counts(), len(self.engine.incidents)
        )
        self.metrics.observe_breaker(self.journal.breaker() is not None)
        if self.cloud is not None:
            self.metrics.observe_cloud(*self.cloud.totals(self.clock.now()))
        if self.notifications is not None:
            sender = self.notifications.sender
            self.metrics.observe_outbox(
                self.notifications.outbox.counts(), sender.retried + sender.failed
            )

    def _dispatch(self, intent: Intent, now: float) -> None:
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

    def _still_needed(self, intent: Intent) -> Any:
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

    def _drain(self) -> None:
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

    # -- putting things back ----------------------------------------------------------------

    def _undo_incident(self, incident: str) -> None:
        for undo in self.journal.pending_undos(incident):
            self._undo(undo)

    def _undo(self, row: Any) -> None:
        state = self._run_undo(row.undo())
        if state is None or state in RETRY_UNDO:
            return  # kept in the journal: tried again at the next resolve, stop or start
        self.journal.undo_done(row.id, self.clock.now(), state)

    def _run_undo(self, undo: Undo) -> str | None:
        ctx = Context(
            dry_run=self.dry_run,
            clock=self.clock,
            host=self.host,
            cancel=threading.Event(),
            power=self.power,
        )
        try:
            result = registry.undoer(undo.kind)(undo, ctx)
        except Exception:
            log.exception("undo %s failed", undo.kind)
            return None
        log.info("undo=%s pid=%s gpu=%s result=%s", undo.kind, undo.pid, undo.gpu, result.state)
        self.stats.undone += 1
        return result.state

    # -- the loop ---------------------------------------------------------------------------

    def run(self, *, once: bool = False) -> RunStats:
        """Tick until stopped, or until a replayed scenario ends; then shut down cleanly."""
        self.recover()
        end = None
        duration = getattr(self.source, "duration", None)
        start = getattr(self.source, "start_time", None)
        if duration is not None and start is not None:
            end = start + duration
        ready = False
        pinged = time.monotonic()
        watchdog = self.systemd.watchdog_interval() if self.systemd is not None else None
        try:
            while not self.stopping.is_set():
                began = self.clock.monotonic()
                self._reload_if_asked()
                self.tick()
                if self.systemd is not None:
                    if not ready:  # the first tick has run: systemd may consider us started
                        self.systemd.ready(self.summary())
                        ready = True
                    elif watchdog is not None and time.monotonic() - pinged >= watchdog:
                        self.systemd.watchdog()
                        self.systemd.status(self.summary())
                        pinged = time.monotonic()
                if once or (end is not None and self.clock.now() >= end):
                    break
                remaining = self.config.tick - (self.clock.monotonic() - began)
                self._sleep(remaining)
            self._settle()
        finally:
            if self.systemd is not None:
                self.systemd.stopping("stopping: finishing steps, putting suspended jobs back")
            self.shutdown()
        return self.stats

    def summary(self) -> str:
        """One line for systemd's STATUS: what is being watched and what is open."""
        open_now = len(self.engine.incidents)
        return (
            f"{len(self.engine.playbooks.rules)} rules, {open_now} open incident(s), "
            f"{self.stats.ticks} ticks" + (" (dry-run)" if self.dry_run else "")
        )

    def request_reload(self) -> None:
        """SIGHUP: reload between ticks (never inside one). The file watcher asks the
        reloader directly."""
        if self.reloader is not None:
            self.reloader.request()
            self._wake.set()  # do not wait for the rest of the tick interval

    def _reload_if_asked(self) -> None:
        if self.reloader is None or not self.reloader.pending:
            return
        now = self.clock.now()
        if self.systemd is not None:
            self.systemd.reloading("reloading config and playbooks")
        result = self.reloader.check()
        if result is None:
            return
        if result.ok:
            closed = self.engine.replace(result.playbooks, result.config, now)
            self.config = result.config
            self.rails = Rails(result.config.safety, self.journal)
            self.dry_run = self._forced_dry_run or result.config.dry_run
            if self.cloud is not None:
                self.cloud.update(result.config.cloud)
            if closed:
                self.journal.record_all(closed, now)
        elif self.notifications is not None and result.error is not None:
            self.notifications.admin(
                f"gpuwarden on {self.host}: reload refused", result.error.render(), now
            )
        if self.metrics is not None:
            self.metrics.observe_reload(result.ok, now)
        if self.systemd is not None:
            self.systemd.ready(("reloaded: " if result.ok else "reload refused: ") + self.summary())

    def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if isinstance(self.clock, SystemClock | ScaledClock):
            speed = self.clock.speed if isinstance(self.clock, ScaledClock) else 1.0
            self._wake.wait(seconds / speed)  # a stop or a reload request wakes us at once
            self._wake.clear()
        else:
            self.clock.sleep(seconds)

    def _settle(self) -> None:
        """Let steps that are still running finish, within the shutdown grace."""
        if self._running:
            wait(list(self._running.values()), timeout=self.config.safety.shutdown_grace)
        self._drain()

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    def shutdown(self) -> None:
        self.stopping.set()
        self.cancel.set()
        if self._running:
            _done, pending = wait(
                list(self._running.values()), timeout=self.config.safety.shutdown_grace
            )
            for future in pending:
                log.error("a step was still running at shutdown; its outcome is not recorded")
                future.cancel()
        self._drain()
        if self.rounds is not None:  # a reap in flight records what it terminated
            self.rounds.wait(self.config.safety.shutdown_grace)
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.config.safety.restore_on_exit:
            for row in self.journal.pending_undos():
                self._undo(row)
        with self._source_lock:
            self.source.close()
        if self.notifications is not None:
            self.notifications.close(self.clock.now())
        if self.metrics is not None:
            self.metrics.close()
