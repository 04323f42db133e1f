"""The run loop: source → engine → executors → journal, one tick at a time.

Only the main thread touches the engine and the journal. Executors run in worker threads (a
slow checkpoint wait never delays the next tick) and hand their outcomes back through a queue
that each tick drains; that hand-off, and the undos, are the ``Dispatcher`` (``dispatch.py``).
Every intent is journaled before it is handed to an executor and its outcome after, so a daemon
killed mid-ladder and restarted repeats no step (``recover``), and whatever a step changed that
must be put back (a suspended job, a nice value, a power limit) is an undo row that survives the
restart. This module holds the loop around it: start-up recovery, the tick, cloud rounds,
metrics, reload between ticks, systemd notifications, and a clean stop. Between ticks it
reads the GPUs' cheap fields every ``fast_sample`` and ticks at once when a reading crosses a
watched rule's condition (``engine/fast.py``), and ticks when a pending rule's ``for`` or a
step's ``after`` is reached, so that neither waits for the next regular tick.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gpuwarden.actions.base import PowerControl
from gpuwarden.actions.slurm import Slurm
from gpuwarden.clock import Clock, ScaledClock, SystemClock
from gpuwarden.config import Config
from gpuwarden.dispatch import Dispatcher, RunStats
from gpuwarden.engine.engine import Engine
from gpuwarden.engine.fast import FastWatch
from gpuwarden.engine.incident import Tick
from gpuwarden.journal.control import hold_note
from gpuwarden.journal.samples import RuleFacts, SampleRecorder
from gpuwarden.journal.schema import JournalError
from gpuwarden.model import Intent, Reason, RuleChange, Transition, Undo
from gpuwarden.notify.service import Notifications
from gpuwarden.playbook.loader import PlaybookSet
from gpuwarden.safety import Rails
from gpuwarden.sources import Source

if TYPE_CHECKING:  # prometheus_client is imported only when metrics are on
    from gpuwarden.cloud.reaper import Reaped
    from gpuwarden.cloud.rounds import Rounds
    from gpuwarden.cloud.service import CloudService
    from gpuwarden.metrics import Metrics
    from gpuwarden.sdnotify import SystemdNotifier

log = logging.getLogger("gpuwarden.run")

NEXT_REFRESH_S = 10.0  # an unchanged next step is planned and written again this often
DUE_MARGIN_S = 0.001  # a tick for a due time runs this much after it (`now - since >= for`)
MERGE_S = 0.05  # a due time this close after the regular tick moves that tick, not adds one


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
        self.power = power
        self.host = host
        self.metrics = metrics
        self.systemd = systemd
        self.reloader = reloader  # a gpuwarden.reload.Reloader, when reloads are on
        self.cloud = cloud  # launches for provision steps; reconciled and reaped in rounds
        self.engine = Engine(playbooks, config, self_pid=self_pid)
        self.pool = ThreadPoolExecutor(config.safety.workers, thread_name_prefix="gpuwarden-step")
        self.rounds: Rounds | None = None
        if cloud is not None:  # the cloud modules are loaded only with a cloud profile
            from gpuwarden.cloud.rounds import Rounds

            self.rounds = Rounds(cloud, self.pool, self.clock)
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self.stats = RunStats()
        # Readings around incidents, kept in the journal for reports (journal/samples.py).
        self.samples = SampleRecorder(self._rule_facts, preroll=preroll_for(playbooks))
        # incident -> (what its next step was, when written): the journal's next_steps rows
        self._next: dict[str, tuple[object, float]] = {}
        self._source_lock = threading.Lock()
        # Between ticks (docs/operations.md, "Between ticks"): the fast readings' watch, and
        # when the open incidents' next `after` is reached (wall-clock; a pending rule's `for`
        # the engine tells), so that the loop ticks then rather than up to a tick later.
        self.fast = FastWatch(playbooks, config.tz)
        self._step_due: float | None = None
        self._last_now = -math.inf  # the last tick's `now`: dues at or before it are spent
        self._fast_failed = False
        self.steps = Dispatcher(
            journal,
            self.engine,
            self.pool,
            self.stats,
            rails=Rails(config.safety, journal),
            dry_run=dry_run or config.shadow,
            clock=self.clock,
            source=source,
            source_lock=self._source_lock,
            host=host,
            power=power,
            cloud=cloud,
            notifications=notifications,
            metrics=metrics,
            config=config,
            self_pid=self_pid,
            slurm=Slurm.from_config(config.slurm),
        )
        self._observe_setup()

    def _observe_setup(self) -> None:
        """What the metrics say about the loaded set: its rules, and whether anything acts."""
        if self.metrics is not None:
            self.metrics.observe_rules(
                (r.name, r.spec.severity) for r in self.engine.playbooks.rules
            )
            self.metrics.observe_mode(self.dry_run)

    @property
    def dry_run(self) -> bool:
        """Whether steps only say what they would do (``--dry-run``, or the config's)."""
        return self.steps.dry_run

    @property
    def notifications(self) -> Notifications | None:
        return self.steps.notifications

    @notifications.setter
    def notifications(self, notifications: Notifications | None) -> None:
        self.steps.notifications = notifications  # the loop and the dispatcher share them

    # -- start ------------------------------------------------------------------------------

    def recover(self) -> None:
        """Pick up where a previous run stopped: never repeat a step, never forget an undo."""
        now = self.clock.now()
        for row in self.journal.interrupted():
            log.warning("step %s was in flight when gpuwarden stopped; it is not repeated", row.id)
            self.journal.mark_interrupted(row.id, now)
            if not row.shadow:
                self.steps.rails.interrupted(row.rule, row.kind, row.targets, now)
            if row.kind == "suspend":  # it may have stopped jobs before writing their undo
                for target in row.targets:
                    self.steps.run_undo(
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
                _log_resolved(change)
        for undo in self.journal.pending_undos():
            if undo.incident not in open_ids:
                self.steps.undo(undo)

    # -- one tick ---------------------------------------------------------------------------

    def tick(self) -> Tick:
        began = time.perf_counter()
        now = self.clock.now()
        self.steps.drain()
        with self._source_lock:
            snapshot = self.source.snapshot(now)
        if self.notifications is not None:  # a silence in Alertmanager (ack_on_silence)
            self._ack_silenced(self.notifications.silenced(), now)
        # `gpuwarden ack`/hold/release/abort/silence, written by another process
        aborted = self._take_controls(now)
        result = self.engine.step(snapshot, now)
        self.stats.ticks += 1
        # Written before anything is acted on; an intent the journal already holds (a step a
        # previous run planned) comes back refused and is never run twice.
        records = [*aborted, *result.records]
        written = self.journal.record_all(records, now, self.engine.incidents)
        if self.notifications is not None:
            self.notifications.observe(written, snapshot, self.engine.incidents, now)
        for record in written:
            if isinstance(record, Intent):
                self.steps.dispatch(record, now)
            elif record.kind == Transition.RESOLVED and record.incident:
                _log_resolved(record)
                self.steps.undo_incident(record.incident)
            elif record.kind == Transition.FIRING and record.incident:
                self.stats.incidents.add(record.incident)
                log.warning(
                    "incident %s: rule %s fired for %s", record.incident, record.rule, record.where
                )
                rule = self.engine.playbooks.rule(record.rule)
                if self.metrics is not None and rule is not None:
                    self.metrics.observe_incident(record.rule, rule.spec.severity)
        self._last_now = now
        self.fast.seen(snapshot, now)
        self.samples.observe(snapshot, now, self.engine.incidents)
        if self.samples.due(now):
            self.journal.record_samples(self.samples.take(now))
        self._write_next(now)
        if self.cloud is not None:
            self._cloud_tick(now)  # before the flush: what the reaper ended goes out now
        if self.notifications is not None:
            self.notifications.flush(now)
        if self.metrics is not None:
            self._observe(snapshot, time.perf_counter() - began)
        return result

    def next_due(self) -> float | None:
        """The earliest time after the last tick at which a pending rule's `for` or an open
        incident's next step's `after` is reached (wall-clock); None: nothing due."""
        after = self._last_now
        times = [t for t in (self.engine.pending_due(), self._step_due) if t is not None]
        return min((t for t in times if t > after), default=None)

    def _rule_facts(self, incident: str, rule: str) -> RuleFacts | None:
        """The rule of an incident that just opened, for the journal (reports draw it)."""
        compiled = self.engine.playbooks.rule(rule)
        if compiled is None:
            return None
        until = None if compiled.until is None else compiled.until.text
        spec = compiled.spec
        return RuleFacts(incident, rule, compiled.when.text, until, spec.for_, spec.description)

    def _ack_silenced(self, silenced: dict[str, str], now: float) -> None:
        """Acknowledge the open incidents a silence covers, once each, in the journal (the
        loop then treats them as `gpuwarden ack` would)."""
        open_ids = {i.id for i in self.engine.incidents}
        for incident, who in silenced.items():
            if incident in open_ids and self.journal.ack(incident, now, by=who):
                log.warning("incident %s acknowledged by %s", incident, who)

    # -- on call ----------------------------------------------------------------------------

    def _take_controls(self, now: float) -> list[RuleChange]:
        """What the on-call commands wrote to the journal since the last tick (``ack``,
        ``hold``, ``release``, ``abort``, ``silence``), handed to the engine as data; returns
        the resolutions of the incidents aborted, to be journaled with this tick."""
        controls = self.journal.controls(now)
        for incident in controls.acked:
            self.engine.ack(incident)
            if self.notifications is not None:
                self.notifications.ack(incident, now)
        expired = {h.id for h in self.journal.expire_holds(controls.holds.values(), now)}
        holds = {i: h for i, h in controls.holds.items() if h.id not in expired}
        for incident in set(self.engine.holds) - set(holds):
            self.engine.release(incident)
            log.info("incident %s: released; its ladder goes on", incident)
        for incident, hold in holds.items():
            if incident not in self.engine.holds:
                log.info("incident %s: on hold %s", incident, hold_note(hold))
            self.engine.hold(incident, hold.until, hold_note(hold))
        self.engine.silence(s.silence() for s in controls.silences)
        if self.notifications is not None:
            self.notifications.mute(self.engine.silenced(now))
        ended: list[RuleChange] = []
        for incident, detail in controls.aborts.items():
            change = self.engine.abort(incident, now, detail)
            if change is None:  # open in the journal only (its rule is gone): close it there
                row = self.journal.incident(incident)
                if row is None or not row.open:
                    continue
                change = RuleChange(
                    Transition.RESOLVED,
                    row.rule,
                    row.scope,
                    now,
                    Reason.ABORTED,
                    incident,
                    detail,
                    where=row.label,
                )
            cancelled = self.steps.cancel_incident(incident)
            log.warning(
                "incident %s: aborted %s%s",
                incident,
                detail,
                f"; {cancelled} running step(s) told to stop" if cancelled else "",
            )
            ended.append(change)
        return ended

    def _write_next(self, now: float) -> None:
        """Each open incident's next step into the journal, for ``incident``, ``incidents
        --open`` and ``status`` (which never plan against live processes themselves).
        Written when the step or what keeps it waiting changes, and every
        ``NEXT_REFRESH_S`` with freshly planned targets; in between the planner is not
        asked (planning a step costs about what running it does)."""
        changed: list[str] = []
        kept: dict[str, tuple[object, float]] = {}
        self._step_due = None
        for step in self.engine.next_steps(now, plan=()):
            if step.state == "scheduled" and step.due is not None and step.due > now:
                self._step_due = min(step.due, self._step_due or step.due)
            key = (step.step, step.state, step.detail, step.due)
            seen = self._next.get(step.incident)
            if seen is not None and seen[0] == key and now - seen[1] < NEXT_REFRESH_S:
                kept[step.incident] = seen
            else:
                changed.append(step.incident)
                kept[step.incident] = (key, now)
        if changed or set(self._next) != set(kept):
            wanted = set(changed)
            steps = [s for s in self.engine.next_steps(now, plan=wanted) if s.incident in wanted]
            self.journal.write_next(steps, now, keep=[i for i in kept if i not in wanted])
        self._next = kept

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
        from gpuwarden.cloud.rounds import reaped_notes

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

    # -- the loop ---------------------------------------------------------------------------

    def run(self, *, once: bool = False) -> RunStats:
        """Tick until stopped, or until a replayed scenario ends; then shut down cleanly."""
        self.recover()
        end = None
        duration = getattr(self.source, "duration", None)
        start = getattr(self.source, "start_time", None)
        if duration is not None and start is not None:
            end = start + duration
        ready = warmed = False
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
                if not warmed and self.notifications is not None:
                    # After the first tick, in the sender's thread: the first message of an
                    # incident then pays no apprise import (notify/plugins.py).
                    self.notifications.warm()
                warmed = True
                self._between_ticks(began + self.config.tick)
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
            self.fast = FastWatch(result.playbooks, result.config.tz)
            self.samples.preroll = preroll_for(result.playbooks)
            self.config = result.config
            self.steps.rails.update(result.config.safety)  # keeps the room reserved
            self.steps.dry_run = self._forced_dry_run or result.config.shadow
            self.steps.configure(result.config)
            self.steps.slurm = Slurm.from_config(result.config.slurm)
            if self.notifications is not None:  # armed or disarmed: messages say which
                self.notifications.set_shadow(self.steps.dry_run)
            if self.cloud is not None:
                self.cloud.update(result.config.cloud)
            if closed:
                for change in self.journal.record_all(closed, now):
                    if isinstance(change, RuleChange) and change.kind == Transition.RESOLVED:
                        _log_resolved(change)
            self._observe_setup()
        elif self.notifications is not None and result.error is not None:
            self.notifications.admin(
                f"gpuwarden on {self.host}: reload refused", result.error.render(), now
            )
        if self.metrics is not None:
            self.metrics.observe_reload(result.ok, now)
        if self.systemd is not None:
            self.systemd.ready(("reloaded: " if result.ok else "reload refused: ") + self.summary())

    def _between_ticks(self, next_tick: float) -> None:
        """Wait for the next tick (``next_tick``, on the monotonic clock). Return earlier for
        a stop or a reload request, when a pending rule's `for` or a step's `after` is reached
        (``next_due``), and when a fast reading crosses a watched rule's condition
        (``engine/fast.py``): the tick that follows then runs at that moment."""
        clock = self.clock
        interval = self.config.fast_sample
        reader = getattr(self.source, "fast_gpus", None)
        sampling = reader is not None and bool(self.fast) and 0 < interval < self.config.tick
        next_fast = clock.monotonic() + interval if sampling else math.inf
        while not self.stopping.is_set():
            mono = clock.monotonic()
            due = self.next_due()
            due_at = math.inf if due is None else due - clock.now() + mono + DUE_MARGIN_S
            tick_at = next_tick
            if next_tick <= due_at <= next_tick + MERGE_S:
                tick_at = due_at  # one tick for both
            wake = min(tick_at, due_at, next_fast)
            if wake > mono:
                self._sleep(wake - mono)
                if self.stopping.is_set() or (self.reloader is not None and self.reloader.pending):
                    return
                mono = clock.monotonic()
            if mono >= min(tick_at, due_at) - 1e-9:
                return
            if mono >= next_fast - 1e-9:
                next_fast = max(next_fast + interval, mono + interval / 2)
                if self._fast_crossed():
                    return

    def _fast_crossed(self) -> bool:
        """One fast reading of the GPUs; True when it crossed a watched rule's condition."""
        now = self.clock.now()
        try:
            with self._source_lock:
                gpus = self.source.fast_gpus(now, self.fast.fields)  # type: ignore[attr-defined]
        except Exception as exc:  # the next tick reads (and reports) the GPUs in full
            if not self._fast_failed:
                log.warning("fast reading failed: %s: %s", type(exc).__name__, exc)
                self._fast_failed = True
            return False
        crossed = self.fast.crossed(gpus, now, self.host)
        if crossed:
            log.debug("fast reading crossed %s: ticking now", ", ".join(crossed))
        return bool(crossed)

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
        self.steps.settle(self.config.safety.shutdown_grace)

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    def shutdown(self) -> None:
        self.stopping.set()
        self.steps.stop(self.config.safety.shutdown_grace)
        if self.rounds is not None:  # a reap in flight records what it terminated
            self.rounds.wait(self.config.safety.shutdown_grace)
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.config.safety.restore_on_exit:
            for row in self.journal.pending_undos():
                self.steps.undo(row)
        with self._source_lock:
            self.source.close()
        if self.notifications is not None:
            self.notifications.close(self.clock.now())
        if self.metrics is not None:
            self.metrics.close()
        try:  # last: readings for reports never stand in the way of putting things back
            self.journal.record_samples(self.samples.take(self.clock.now()))
        except JournalError as exc:
            log.warning("readings around incidents not written: %s", exc.render())


def _log_resolved(change: RuleChange) -> None:
    """One line when an incident closes, the counterpart of the "fired" line."""
    if change.incident:
        log.info(
            "incident %s: rule %s resolved for %s (%s)",
            change.incident,
            change.rule,
            change.where,
            change.reason,
        )


def preroll_for(playbooks: PlaybookSet) -> float:
    """How much of the time before an incident its report shows: the longest ``for`` of the
    set (the pending stretch) and five minutes more, at most an hour."""
    longest = max((r.spec.for_ for r in playbooks.rules), default=0.0)
    return min(3600.0, longest + 300.0)
