"""The reconcile loop: fold the log, keep run history and metrics, decide, act.

One thread (:meth:`Controller.run`): it reads the events appended after the last folded
position, folds them (``backfill.core.projector.fold``), upserts the run rows together with the
``runs`` checkpoint, counts ended/admitted attempts in the metrics, asks ``decide`` about the
affected backfills and hands the commands to the :class:`~backfill.controller.actor.Actor`.
It sleeps until a watcher or the event log signals, the earliest ``WakeAt`` comes due, or the
periodic full re-check (``settings.resync_seconds``) is due: there is no fixed poll.

On start it refolds the whole log from position 0: the log is the source of truth.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

from backfill.core import events as ev
from backfill.core.commands import Cancel, DeleteJob, WakeAt
from backfill.core.events import decode_many
from backfill.core.perf import paused_gc
from backfill.core.projector import affected, decide, fold
from backfill.core.runs import run_rows
from backfill.core.state import World
from backfill.settings import Settings
from backfill.store import EventStore, RunStore

from .actor import Actor
from .metrics import Metrics
from .translate import Translator
from .watchers import BatchAppender, Watcher, known_objects, resources, translator_for

log = logging.getLogger("backfill.controller.loop")

RUNS_CHECKPOINT = "runs"


def utcnow() -> datetime:
    """The wall clock as an aware UTC datetime (the default, injectable clock)."""
    return datetime.now(timezone.utc)


class Controller:
    """The controller on one event store and one API server.

    Args:
        settings: tunables (namespace scope, resync, back-off, watch timeout).
        api: a kubernetes ApiClient.
        events / runs: the stores.
        metrics: where the counters go.
        clock: aware UTC now (injectable for tests).
        leader: an object with ``is_leader()``; None = always act (no leader election).
        identity: reported in Events.
    """

    def __init__(
        self,
        settings: Settings,
        api: Any,
        events: EventStore,
        runs: RunStore,
        metrics: Metrics,
        *,
        clock: Callable[[], datetime] = utcnow,
        leader: Any = None,
        identity: str = "modelbackfill-controller",
    ) -> None:
        self.settings = settings
        self.api = api
        self.events = events
        self.runs = runs
        self.metrics = metrics
        self.clock = clock
        self.leader = leader
        self.world = World()
        self.position = 0
        self.signal = threading.Event()
        self.stop_event = threading.Event()
        self.actor = Actor(api, events.append, clock, can_act=self.is_leader, identity=identity)
        self.translator = Translator(settings.foreground_signal_granularity_seconds)
        self.watchers: list[Watcher] = []
        self._wakes: list[tuple[datetime, tuple[str, str]]] = []
        self._wake_of: dict[tuple[str, str], datetime] = {}
        self._pending_finalizers: dict[tuple[str, str], str] = {}
        self._fin_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._live = False
        self._carry: set[tuple[str, str]] = set()  # keys whose commands an interruption left undone
        self.appender: BatchAppender | None = None
        self._runs_checkpoint = 0  # during the start-up refold: run rows up to here are stored
        self.error: BaseException | None = None

    # -- state --------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True when this instance may act (it holds the Lease, or leader election is off)."""
        return self.leader is None or self.leader.is_leader()

    @property
    def synced(self) -> bool:
        """Every watcher finished its initial list."""
        return bool(self.watchers) and all(w.synced.is_set() for w in self.watchers)

    def _on_backfill_object(self, kind: str, obj: dict) -> None:
        m = obj.get("metadata") or {}
        if kind == "DELETED" or m.get("deletionTimestamp"):
            return
        if "modelbackfill.ai.flexinfer/finalizer" not in (m.get("finalizers") or []):
            with self._fin_lock:
                self._pending_finalizers[(m.get("namespace", ""), m.get("name", ""))] = m.get("uid", "")
            self.signal.set()

    # -- folding ------------------------------------------------------------------------------

    def catch_up(self) -> set[tuple[str, str]]:
        """Fold every event after :attr:`position`; returns the affected backfill keys.

        Run rows go to the ``runs`` table with the ``runs`` checkpoint in the same transaction,
        only when a batch changed some (no database write on the hot path otherwise). Rows at or
        below the stored checkpoint are already there: the start-up refold skips them.
        """
        keys: set[tuple[str, str]] = set()
        stored = self._runs_checkpoint
        for batch in self.events.read_payloads(self.position, batch_size=5000):
            decoded = decode_many([(t, v, d) for _, t, v, d in batch])
            world = self.world
            rows = []
            for (position, *_), e in zip(batch, decoded):
                before = world
                world = fold(world, e, position)
                keys.update(affected(world, e))
                if position <= stored:
                    continue
                for row in run_rows(before, world, e):
                    rows.append(row)
                    if self._live:
                        self._count(before, row, e)
            if rows:
                self.runs.apply(rows, RUNS_CHECKPOINT, batch[-1][0])
            self.world = world
            self.position = batch[-1][0]
        return keys

    def _count(self, before: World, row: Any, event: Any) -> None:
        if isinstance(event, ev.AttemptAdmitted) and row.result is None:
            self.metrics.started(row)
            return
        if row.result is None:
            return
        b0 = before.backfills.get((row.namespace, row.backfill))
        a0 = b0.attempt if b0 is not None else None
        if a0 is None or a0.number != row.attempt or a0.result is None:
            self.metrics.ended(row)

    # -- threads ------------------------------------------------------------------------------

    def start(self) -> None:
        """Refold the log, start the watchers, the log notifier and the loop thread."""
        t0 = time.monotonic()
        self._runs_checkpoint = self.runs.get_checkpoint(RUNS_CHECKPOINT)
        with paused_gc():
            self.catch_up()
        self._runs_checkpoint = 0
        self._live = True
        log.info(f"refolded the log up to position {self.position} in {time.monotonic() - t0:.2f}s", extra={"position": self.position})
        res = resources(self.api)
        self.appender = BatchAppender(self.events.append, self.signal, self.settings)
        for kind in ("cronjob", "model", "gaming", "lease", "job", "backfill"):
            w = Watcher(
                kind,
                res[kind],
                namespace=self.settings.namespace,
                translate=translator_for(self.translator, kind),
                known=lambda kind=kind: known_objects(self.world, kind),
                append=self.appender.append_sync,
                append_async=self.appender.append_async,
                signal=self.signal,
                clock=self.clock,
                settings=self.settings,
                stop=self.stop_event,
                on_object=self._on_backfill_object if kind == "backfill" else None,
            )
            self.watchers.append(w)
            w.start()
        for target, name in ((self._notify, "log-notifier"), (self.run, "reconcile")):
            t = threading.Thread(target=target, name=name, daemon=True)
            self._threads.append(t)
            t.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the watchers, the loop, the appender and the actor's threads (each joined within ``timeout``)."""
        self.stop_event.set()
        self.signal.set()
        for w in self.watchers:
            w.halt()
        deadline = time.monotonic() + timeout
        for t in self._threads + self.watchers:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.appender is not None:
            self.appender.stop()
        self.actor.close()

    def _notify(self) -> None:
        """Wake the loop when anyone (another replica, the ingest endpoint) appends to the log."""
        while not self.stop_event.is_set():
            after = self.position
            try:
                if self.events.wait(after, timeout=1.0):
                    self.signal.set()
                    # Let the loop fold it before waiting again.
                    end = time.monotonic() + 1.0
                    while self.position <= after and time.monotonic() < end and not self.stop_event.is_set():
                        time.sleep(0.01)
            except Exception as exc:  # noqa: BLE001
                log.warning(f"event log wait failed: {exc}")
                self.stop_event.wait(self.settings.backoff_initial_seconds)

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        """The reconcile loop (until :attr:`stop_event`); errors are logged and retried."""
        full = True
        next_resync = time.monotonic() + self.settings.resync_seconds
        backoff = self.settings.backoff_initial_seconds
        while not self.stop_event.is_set():
            self.signal.clear()
            try:
                keys = self.catch_up()
                keys |= self._carry
                self._carry = set()
                now = self.clock()
                while self._wakes and self._wakes[0][0] <= now:
                    at, key = heapq.heappop(self._wakes)
                    if self._wake_of.get(key) == at:  # else superseded by a newer wake-up
                        del self._wake_of[key]
                        keys.add(key)
                if time.monotonic() >= next_resync:
                    full = True
                    next_resync = time.monotonic() + self.settings.resync_seconds
                acted = False
                if self.synced and self.is_leader():
                    acted = self._finalizers()
                    if full or keys:
                        if full:
                            self.actor.forget()
                        before = self.actor.appended
                        self.step(None if full else keys, now)
                        full = False
                        acted = acted or self.actor.appended > before
                else:
                    full = True  # decide everything (statuses included) once synced / leading
                backoff = self.settings.backoff_initial_seconds
            except Exception as exc:  # noqa: BLE001 - the loop must not die
                log.exception(f"reconcile failed: {type(exc).__name__}: {exc}")
                full = True
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, self.settings.backoff_max_seconds)
                continue
            if acted:
                continue  # fold our own decisions before deciding again
            timeout = next_resync - time.monotonic()
            if self._wakes:
                timeout = min(timeout, (self._wakes[0][0] - self.clock()).total_seconds())
            if not self.synced or (self.leader is not None and not self.is_leader()):
                timeout = min(timeout, 0.5)
            self.signal.wait(max(0.0, timeout))

    def step(self, keys: Any, now: datetime) -> list:
        """Decide for ``keys`` (None: all) at ``now`` and execute; returns the commands."""
        try:
            commands = decide(self.world, now, keys, status=True)
        except Exception as exc:  # noqa: BLE001 - one bad backfill must not starve the others
            log.error(f"decide failed ({type(exc).__name__}: {exc}); deciding backfill by backfill")
            commands = []
            for key in sorted(self.world.backfills if keys is None else keys):
                try:
                    commands.extend(decide(self.world, now, [key], status=True))
                except Exception as exc1:  # noqa: BLE001
                    log.error(f"decide failed: {type(exc1).__name__}: {exc1}", extra={"backfill": f"{key[0]}/{key[1]}"})
        for c in commands:
            if isinstance(c, WakeAt) and self._wake_of.get(c.key) != c.at:
                self._wake_of[c.key] = c.at
                heapq.heappush(self._wakes, (c.at, c.key))
        # Foreground first: cancels and deletes before anything else of this step (a stable
        # sort, so each backfill's own commands keep their order). Commands left undone because
        # new events arrived are decided again on the next pass.
        ordered = sorted(commands, key=lambda c: 0 if isinstance(c, (Cancel, DeleteJob)) else 1)
        self._carry.update(self.actor.execute(ordered, self.world, now, interrupted=self.signal.is_set))
        return commands

    def _finalizers(self) -> bool:
        with self._fin_lock:
            pending = dict(self._pending_finalizers)
            self._pending_finalizers.clear()
        for (ns, name), uid in pending.items():
            try:
                self.actor.ensure_finalizer(ns, name, uid)
            except Exception as exc:  # noqa: BLE001
                log.warning(f"adding the finalizer to {ns}/{name} failed: {exc}")
                with self._fin_lock:
                    self._pending_finalizers.setdefault((ns, name), uid)
        return False
