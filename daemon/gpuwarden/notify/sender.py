"""The sender: a daemon thread that delivers the outbox with apprise, per target, with retries.

The run loop only ``put``s messages into the outbox and calls ``wake``; it never waits for a
delivery. Each target is delivered by at most one worker at a time, in its own pool thread, so
a target that is down or slow holds back its own messages and no one else's. A failed attempt
puts the message back with an exponential, jittered delay (``RetryPolicy``: 5 s, 10 s, 20 s …
capped at 10 min) and holds the target until then; once the budget (attempts or age) is spent
the message is marked ``failed``, counted, and queued once for the target's fallback.

A target's URLs are resolved when a message is sent (``Resolver``: target name → URLs, read
from the config's secrets), so a rotated token is picked up without a restart, and they are
never stored or logged. One attempt itself (apprise, and the redaction of everything it says)
is ``delivery.py``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuwarden.clock import Clock, SystemClock
from gpuwarden.journal.schema import JournalError
from gpuwarden.notify.delivery import (
    SCRUBBER,
    Resolver,
    clean_detail,
    deliver,
    notify_type,
    quiet_apprise,
)
from gpuwarden.notify.outbox import Outbox, OutboxRow, clean_error
from gpuwarden.notify.plugins import warm as warm_plugins

logger = logging.getLogger(__name__)

Fallback = Callable[[str], str | None]
"""Target name → the target to try when its budget is spent (None: no fallback)."""

Deliver = Callable[[OutboxRow, list[str], float], tuple[bool, str]]
"""One attempt for a target not delivered with apprise (an Alertmanager target,
``alertmanager.Delivery``): (the row, the target's URLs, the timeout) → (ok, detail)."""


# -- the thread -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """When to try again, and when to give up (``max_attempts`` or ``max_age`` seconds since
    the message was queued, whichever comes first)."""

    base: float = 5.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: float = 0.2  # a delay is shortened by up to this share, at random
    max_attempts: int = 10
    max_age: float = 3600.0

    def delay(self, attempts: int, rng: random.Random) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt (1, 2, ...)."""
        plain = min(self.base * self.factor ** max(attempts - 1, 0), self.cap)
        return plain * (1.0 - self.jitter * rng.random())

    def spent(self, row: OutboxRow, now: float) -> bool:
        return row.attempts >= self.max_attempts or now - row.queued_at >= self.max_age


class Sender:
    """Delivers the outbox in the background: ``start()``, ``wake()`` after a ``put``,
    ``stop(timeout)``. ``deliver_due()`` does one round in the caller's thread (tests, drills).
    Counters (``sent``, ``retried``, ``failed``, ``dropped``) are for metrics."""

    def __init__(
        self,
        outbox: Outbox,
        resolver: Resolver,
        *,
        fallback: Fallback | None = None,
        deliverers: Callable[[str], Deliver | None] | None = None,
        policy: RetryPolicy | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        timeout: float = 30.0,
        workers: int = 4,
        poll: float = 1.0,
        batch: int = 20,
        unresolved: Iterable[str] = (),
    ) -> None:
        self.outbox = outbox
        self.resolver = resolver
        self.fallback = fallback or (lambda _target: None)
        self.deliverers = deliverers or (lambda _target: None)  # None: apprise
        self.policy = policy or RetryPolicy()
        self.clock: Clock = clock or SystemClock()
        self.rng = rng or random.Random()  # noqa: S311 (jitter, not cryptography)
        self.timeout = timeout
        self.poll = poll
        self.batch = batch
        self.sent = self.retried = self.failed = self.dropped = 0
        # Targets whose URLs cannot be read (a missing secret) that were reported already: at
        # start (``unresolved``, the daemon's self-check said so) or by a first failed attempt.
        # Their retries are logged at debug level until the target works again.
        self._said_unresolved: set[str] = set(unresolved)
        self._workers = workers
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._busy: set[str] = set()
        self._held: dict[str, float] = {}  # target → not before (it failed until then)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warm: list[str] | None = None  # targets whose plugins to load, once asked
        self.warmed: tuple[str, ...] = ()  # the plugin modules that warming loaded
        quiet_apprise()

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Put messages left in flight by a stopped daemon back in the queue, then start."""
        if self._thread is not None:
            raise RuntimeError("the sender is already running")
        again = self.outbox.recover()
        if again:
            logger.warning("notify outbox recovered=%d (in flight when the daemon stopped)", again)
        self._stop.clear()
        self._pool = self._new_pool()
        self._thread = threading.Thread(target=self._run, name="gpuwarden-sender", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Something was queued: look at the outbox now rather than at the next poll."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop; wait up to ``timeout`` for deliveries in flight. False if some still run (their
        rows stay ``sending`` and go back to ``pending`` at the next start)."""
        self._stop.set()
        self._wake.set()
        thread, pool = self._thread, self._pool
        if thread is not None:
            thread.join(timeout)
        done = thread is None or not thread.is_alive()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
            with self._lock:
                running = list(self._futures)
            _finished, late = concurrent.futures.wait(running, timeout=timeout)
            done = done and not late
        self._thread = self._pool = None
        return done

    def warm(self, targets: Iterable[str]) -> None:
        """Load apprise and the plugins of ``targets`` (those it delivers) in the sender's
        thread, sending nothing: the first message then pays no import (``plugins.warm``).
        The daemon asks once it is ready, so that start-up and the first tick do not wait."""
        self._warm = [t for t in targets if self.deliverers(t) is None]
        self._wake.set()

    def _warm_up(self, targets: list[str]) -> None:
        began = time.perf_counter()
        urls: list[str] = []
        for target in targets:
            try:
                urls += self.resolver(target)
            except Exception:  # an unreadable secret: the self-check said so; its turn comes
                logger.debug("notify warm target=%s skipped: its URLs cannot be read", target)
        if not urls:
            return
        SCRUBBER.learn(urls)
        try:
            self.warmed = warm_plugins(urls)
        except Exception as exc:  # a plugin that fails to import fails its first message too
            logger.warning("notify warm failed: %s", clean_detail(f"{exc}", urls))
            return
        logger.info(
            "notify warm plugins=%s targets=%d seconds=%.3f",
            ",".join(self.warmed),
            len(targets),
            time.perf_counter() - began,
        )

    def _new_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        self._futures: set[concurrent.futures.Future[int]] = set()
        return concurrent.futures.ThreadPoolExecutor(self._workers, "gpuwarden-notify")

    def _run(self) -> None:
        while not self._stop.is_set():
            warm, self._warm = self._warm, None
            if warm is not None:
                self._warm_up(warm)
            try:
                self._dispatch()
            except JournalError as exc:
                logger.error("notify outbox error=%s", clean_error(exc.render()))
            except Exception:
                logger.exception("notify sender round failed")
            self._wake.wait(self._idle())
            self._wake.clear()

    def _idle(self) -> float:
        try:
            due = self.outbox.next_due()
        except JournalError:
            return self.poll
        if due is None:
            return self.poll
        return min(self.poll, max(due - self.clock.now(), 0.01))

    # -- rounds ------------------------------------------------------------------------------

    def _targets_due(self) -> dict[str, list[OutboxRow]]:
        now = self.clock.now()
        by_target: dict[str, list[OutboxRow]] = {}
        with self._lock:
            for row in self.outbox.due(now, limit=self.batch * 10):
                if row.target in self._busy or self._held.get(row.target, 0.0) > now:
                    continue
                rows = by_target.setdefault(row.target, [])
                if len(rows) < self.batch:
                    rows.append(row)
            self._busy.update(by_target)
        return by_target

    def _dispatch(self) -> None:
        pool = self._pool
        if pool is None:
            return
        for target, rows in self._targets_due().items():
            future = pool.submit(self._deliver_target, target, rows)
            with self._lock:
                self._futures.add(future)
            future.add_done_callback(self._forget)

    def _forget(self, future: concurrent.futures.Future[int]) -> None:
        with self._lock:
            self._futures.discard(future)
        self._wake.set()  # a target is free again: it may have more due

    def deliver_due(self) -> int:
        """One round in the caller's thread: every target with due messages, one after the
        other. Returns how many attempts were made."""
        made = 0
        for target, rows in self._targets_due().items():
            made += self._deliver_target(target, rows)
        return made

    def _deliver_target(self, target: str, rows: list[OutboxRow]) -> int:
        made = 0
        try:
            for row in rows:
                if self._stop.is_set() and self._thread is not None:
                    break
                made += 1
                if not self._attempt(row):
                    break  # the target is down: its other messages wait with it
        except JournalError as exc:
            logger.error("notify outbox error=%s", clean_error(exc.render()))
        except Exception:
            logger.exception("notify delivery to target=%s failed unexpectedly", target)
        finally:
            with self._lock:
                self._busy.discard(target)
        return made

    def _attempt(self, row: OutboxRow) -> bool:
        """Send one row; True when it was sent (or can never be: dropped)."""
        if not self.outbox.claim(row.key):
            return True  # someone else took it, or it is no longer pending
        try:
            urls = list(self.resolver(row.target))
        except KeyError:
            self.outbox.mark_dropped(row.key, f"no notify target {row.target!r} in the config")
            self.dropped += 1
            logger.warning(
                "notify dropped message=%s target=%s reason=unknown_target",
                row.message_id,
                row.target,
            )
            return True
        except Exception as exc:
            ok, detail = False, f"cannot read the target's URLs: {exc}"
            urls = []
            unresolved = True
        else:
            unresolved = False
            own = self.deliverers(row.target)
            if own is not None:
                ok, detail = own(row, urls, self.timeout)
            else:
                kind = notify_type(row.severity, row.kind)
                ok, detail = deliver(urls, row.title, row.body, kind, row.body_format, self.timeout)
        now = self.clock.now()
        if ok:
            self.outbox.mark_sent(row.key, now)
            self.sent += 1
            with self._lock:
                self._held.pop(row.target, None)
                self._said_unresolved.discard(row.target)
            logger.info(
                "notify sent message=%s target=%s attempts=%d",
                row.message_id,
                row.target,
                row.attempts + 1,
            )
            return True
        self._failed(row, now, clean_detail(detail, urls), unresolved=unresolved)
        return False

    def _failed(self, row: OutboxRow, now: float, detail: str, *, unresolved: bool) -> None:
        attempts = row.attempts + 1
        spent = self.policy.spent(dataclasses.replace(row, attempts=attempts), now)
        if not spent:
            next_at = now + self.policy.delay(attempts, self.rng)
            self.outbox.mark_retry(row.key, detail, next_at)
            self.retried += 1
            with self._lock:
                self._held[row.target] = next_at
                said = row.target in self._said_unresolved
                if unresolved:
                    self._said_unresolved.add(row.target)
            if unresolved and not said:
                logger.warning(
                    "notify target=%s is not configured: %s; its messages wait in the outbox "
                    "and are retried quietly until it is",
                    row.target,
                    detail,
                )
            logger.log(
                logging.DEBUG if unresolved else logging.WARNING,
                "notify retry message=%s target=%s attempts=%d next_in=%.1fs error=%s",
                row.message_id,
                row.target,
                attempts,
                next_at - now,
                detail,
            )
            return
        self.outbox.mark_failed(row.key, detail)
        self.failed += 1
        with self._lock:
            self._held.pop(row.target, None)  # its next message gets its own chance
        fallback = None if row.fallback_of is not None else self.fallback(row.target)
        queued = False
        if fallback is not None and fallback != row.target:
            queued = self.outbox.put(_Copy.of(row), now, target=fallback, fallback_of=row.target)
        logger.error(
            "notify failed message=%s target=%s attempts=%d fallback=%s error=%s",
            row.message_id,
            row.target,
            attempts,
            fallback if queued else "none",
            detail,
        )
        if queued:
            self.wake()


@dataclass(frozen=True)
class _Copy:
    """A stored row as a message again (to queue it for a fallback target)."""

    id: str
    target: str
    title: str
    body: str
    severity: str
    kind: str
    created: float
    body_format: str
    incidents: tuple[str, ...]

    @classmethod
    def of(cls, r: OutboxRow) -> _Copy:
        return cls(
            r.message_id,
            r.target,
            r.title,
            r.body,
            r.severity,
            r.kind,
            r.created,
            r.body_format,
            r.incidents,
        )
