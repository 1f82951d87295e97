"""The controller: the pieces and the one place that starts them.

Pieces and threads (each named here, and only here, :meth:`Controller.start`):

- **watch-<kind>** (one per :data:`~backfill.controller.kinds.KINDS` entry): list + watch; their
  events go to :meth:`Controller.observe`, which hands them to the spool and the preemptor and
  returns at once.
- **log-writer** (:class:`~backfill.controller.spool.Spool`): appends what this process observes
  and the cancels it decides, in order, in the background; holds them in memory while the store
  is away.
- **preempt** (:class:`~backfill.controller.preempt.Preemptor`): folds observations in memory on
  top of the durable projection and sends a Job's DELETE (on the actor's job-deletes pool) the
  moment a cancel condition holds. The only thread that cancels; it touches no database.
- **reconcile** (:meth:`Controller.run`): reads the log back (the *durable* projection), keeps
  run rows and metrics, decides everything but cancels (admissions, blocks, statuses, finalizers,
  re-issued creates and deletes) and hands the commands to the actor. Admissions are fail-closed:
  only while the store answers and the spool has settled (everything observed is durable and
  folded), on the durable projection, recorded before the Job create.
- **log-notifier**: wakes the loop when another writer (another replica) appends to the log.
- The actor's **status-writer**, **k8s-events** and **job-deletes** pool (see
  :mod:`backfill.controller.actor`).

On start the loop loads the newest snapshot of the projection written by this code version
(:mod:`backfill.store.projection`) and folds only the log's tail; without one it refolds from
position 0 (the log is the source of truth). The leader snapshots the projection every
``snapshot_every_events`` events or ``snapshot_every_seconds``, on the reconcile thread.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

from backfill.core import events as ev
from backfill.core.commands import Admit, Resume, WriteStatus
from backfill.core.events import decode_many, decode_rows
from backfill.core.perf import long_fold
from backfill.core.projector import affected, decide, fold, fold_all, only_position_moved
from backfill.core.runs import previous_row, run_rows
from backfill.core.state import RUNNING, STARTING, World
from backfill.core.verdict import hold_for_refused, hold_for_signals
from backfill.errorlines import error_line
from backfill.settings import Settings
from backfill.store import EventStore, RunStore
from backfill.store import projection as snapshots

from .actor import FINALIZER, Actor
from .crash import crash_point
from .kinds import KINDS
from .metrics import Metrics
from .fence import fence
from .cancelwindow import CancelWindow
from .preempt import Preemptor
from .ratelimit import TokenBucket
from .spool import Spool
from .translate import Translator
from .watchers import Watcher

log = logging.getLogger("backfill.controller.loop")

RUNS_CHECKPOINT = "runs"
#: Up to where the acting replica counted the run rows in its metrics (:meth:`Controller.catch_up`).
#: A replica that takes over counts the rows it folded while it did not act and that lie after
#: it: a new user's trial found a Job that ended while no replica led counted by none of them.
COUNTED_CHECKPOINT = "runs-counted"
#: Run-row changes a replica keeps, while it does not act, to count when it takes over: past
#: UNCOUNTED_PRUNE it drops those the acting replica counted (one read of the checkpoint), and
#: past UNCOUNTED_MAX the oldest (no replica acted for that long). About 1 kB each.
UNCOUNTED_PRUNE = 10_000
UNCOUNTED_MAX = 100_000
#: Seconds an observation may wait for the log before statuses are held (``Reconciler._log_lags``):
#: an append answers in milliseconds; a backlog this old means the store is paused, hung or down.
STATUS_LAG_SECONDS = 1.0
#: The part of the spool (``spool_max_records``) ingest reports may fill while the store is
#: away: the rest stays for the watchers' observations (a ``lastActiveTime`` bump, a GamingSession).
INGEST_SPOOL_SHARE = 0.5
#: Seconds after a relist for dropped observations within which another drop means the relists
#: themselves overflow the spool: the next one is paced (``Controller._relist_all``). A relist and
#: the append of its observations take well under this with a healthy store.
OVERFLOW_RELIST_WINDOW = 60.0

Key = tuple[str, str]

#: Decisions that start a run segment, and foreground requests, each with its compiled form
#: (catch-up folds those).
_ADMITTING = ev.with_compiled(ev.AttemptAdmitted, ev.AttemptResumed)
_FOREGROUND = ev.with_compiled(ev.ForegroundRequest)


def utcnow() -> datetime:
    """The wall clock as an aware UTC datetime (the default, injectable clock)."""
    return datetime.now(timezone.utc)


def _rv(obj: Any) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def _fold_requests(world: World, requests: list[tuple[int, Any]], keys: set[Key]) -> World:
    """Fold a run of ``ForegroundRequest`` ``(position, event)`` pairs with the batch fold
    (:func:`backfill.core.projector.fold_all`: a cost per event that does not grow with the
    number of objects, issue 10) and add the backfills they wake to ``keys``; returns the world.

    Exact, not an approximation of the per-event loop of :meth:`Controller.catch_up`: a foreground
    request changes only its model's busy time, so it writes no run row (:func:`run_rows` looks
    only at the event's own backfill, and a request names none), and the backfills it wakes
    (:func:`affected`: those of its model) are read from indexes it does not change, the same
    at the run's end as after each request (``tests/controller/test_catch_up.py``).
    """
    world = fold_all(world, requests)
    for _, e in requests:
        keys.update(affected(world, e))
    return world


def _preempting(world: World, reports: list) -> set[int]:
    """The indexes in ``reports`` (decoded ``ForegroundRequest`` events) of the first report on
    each Model that has an attempt starting or running in ``world`` (the preemptor's
    projection): the report that cancels it (:meth:`Controller.ingest_append`)."""
    out: set[int] = set()
    seen: set[tuple[str, str]] = set()
    live, backfills = world.live_models, world.backfills
    for i, e in enumerate(reports):
        model = (e.namespace, e.model)
        if model in seen:
            continue
        seen.add(model)
        for key in live.get(model, ()):
            b = backfills.get(key)
            a = b.live_attempt if b is not None else None
            if a is not None and a.lifecycle in (STARTING, RUNNING):
                out.add(i)
                break
    return out


class Controller:
    """The controller on one event store and one API server.

    Args:
        settings: tunables (namespace scope, resync, back-off, watch and API timeouts).
        api: a kubernetes ApiClient.
        events / runs: the stores.
        metrics: where the counters go (counted only while this replica acts, so the replicas'
            sum is the true figure).
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
        self.window = CancelWindow()
        self.spool = Spool(
            events.append,
            events.positions_of,
            self.signal.set,
            backoff_initial=settings.backoff_initial_seconds,
            backoff_max=min(settings.backoff_max_seconds, 5.0),
            max_records=settings.spool_max_records,
            max_bytes=settings.spool_max_bytes,
            on_overflow_recovered=self._relist_all,
            before_append=self.window.wait,
        )
        self._objects: dict[Key, dict] = {}
        self._objects_lock = threading.Lock()
        self.actor = Actor(
            api,
            self._on_store(events.append),
            clock,
            can_act=self.is_leader,
            identity=identity,
            observe=self.observe,
            timeout=settings.api_timeout_seconds,
            delete_timeout=settings.delete_timeout_seconds,
            cached=self._cached_object,
            remember=self._remember_object,
            limiter=TokenBucket(settings.api_qps, settings.api_burst),
            status_limiter=TokenBucket(settings.api_qps, settings.api_burst),
            window=self.window,
        )
        self.preemptor = Preemptor(
            lambda: self.world, self.spool, self.actor.preempt, self.is_leader, clock, scope=settings.namespace,
            execute_again=self.actor.preempt_again, statuses=self.actor.submit_statuses,
        )
        self.actor.status_in_memory = self.preemptor.writes_status
        self.actor.on_preempt_failed = self.preemptor.retry
        self.actor.on_recorded = self.preemptor.recorded
        self.actor.cancelled_in_memory = self.preemptor.cancelling
        if leader is not None:
            fence(api, self.is_leader)  # the last check before any mutation leaves the process
        self.translator = Translator(self._known_last_active, signal_granularity=settings.foreground_signal_granularity_seconds)
        self.watchers: list[Watcher] = []
        self._wakes: list[tuple[datetime, Key]] = []
        self._wake_of: dict[Key, datetime] = {}
        self._pending_finalizers: dict[Key, str] = {}
        self._fin_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._preemptor_started = False  # stop() joins only what start() started
        self._overflow_relist_at = -OVERFLOW_RELIST_WINDOW  # monotonic time of the last relist after a drop
        self._overflow_pause = 0.0  # seconds the next one waits when it comes that soon (_relist_all)
        self._live = False
        self._carry: set[Key] = set()  # keys whose commands were left undone
        self._statuses_held = False  # statuses were not written while the log lagged (see step)
        self._unreadable: list[str] = []  # watched kinds that cannot be read (admissions held)
        self._runs_checkpoint = 0  # during the start-up refold: run rows up to here are stored
        self._counted_checkpoint = 0  # and their changes up to here counted (0: as the rows)
        # run-row changes folded and not counted yet: (position, row, previous, admitted)
        self._uncounted: deque[tuple[int, Any, Any, bool]] = deque(maxlen=UNCOUNTED_MAX)
        self._counting = 0  # the position up to which this replica counted while acting (0: not acting)
        self.store_error: str | None = None
        self._reading_since: float | None = None  # monotonic start of the log read in flight
        self._store_lock = threading.Lock()
        self._store_calls = 0  # store calls of the loop (reads, decision appends, checkpoints) in flight
        self._store_since: float | None = None  # monotonic start of the oldest of them
        self.snapshot_position = 0  # position of the newest snapshot loaded or saved
        self._snapshot_at = time.monotonic()
        self.last_pass = time.monotonic()
        self.error: BaseException | None = None

    # -- state --------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True when this instance may act (it holds the Lease, or leader election is off)."""
        return self.leader is None or self.leader.is_leader()

    def model_known(self, namespace: str, model: str) -> bool:
        """Whether Model ``namespace/model`` exists as far as this replica knows: in the durable
        projection or in the preemptor's (observations the store has not taken yet count). The
        ingest endpoint's check of a report's Model.

        Raises:
            ModelsNotLoadedError: it cannot tell yet: the log is not folded, or the Models have
                not been listed (start-up), or their watch fails before its first list.
        """
        from .ingest import ModelsNotLoadedError  # ingest imports nothing of the controller's

        if not self._live:
            raise ModelsNotLoadedError("this replica is starting (folding the event log) and cannot tell which Models exist yet; retry")
        watcher = next((w for w in self.watchers if w.kind.name == "model"), None)
        if watcher is None or not watcher.synced.is_set():
            failing = f" (the Model watch fails: {watcher.failing})" if watcher is not None and watcher.failing else ""
            raise ModelsNotLoadedError(f"this replica has not listed the Models yet{failing} and cannot tell which exist; retry")
        for world in (self.world, self.preemptor.world):
            m = world.models.get((namespace, model))
            if m is not None and m.exists:
                return True
        return False

    @property
    def synced(self) -> bool:
        """Every watcher finished its initial list."""
        return bool(self.watchers) and all(w.synced.is_set() for w in self.watchers)

    def readiness(self) -> tuple[bool, list[str]]:
        """``(ready, problems)`` for /readyz: not ready while a watcher has not listed or is stale,
        or while the event log does not answer (reads or appends)."""
        problems = [f"watcher {w.kind.name}: not synced" for w in self.watchers if not w.synced.is_set()]
        # a watcher that never listed is "not synced" (a new user's trial: it was also "stale")
        problems += [f"watcher {w.kind.name}: stale (nothing heard for too long)" for w in self.watchers if w.stale and w.synced.is_set()]
        problems += [f"watcher {w.kind.name}: failing: {w.failing}" for w in self.watchers if w.failing is not None]
        if not self.watchers:
            problems.append("watchers not started")
        if self.store_error is not None:
            problems.append(f"store: reading the event log fails: {self.store_error}")
        if not self.spool.healthy:
            problems.append(f"store: appends fail, {self.spool.backlog} events spooled in memory: {self.spool.last_error}")
        problems += self.store_stalls().values()
        return (not problems, problems)

    def store_stalls(self) -> dict[str, str]:
        """A read of the event log, or an append, waiting on the store for longer than
        ``settings.store_stall_seconds`` (a paused or hung server answers nothing and fails
        nothing): ``{"read" | "append": line}``, {} when neither. Said by /readyz and logged by
        :meth:`_watch_store` (a new user's trial: a 19 s hang was logged by no replica)."""
        out = {}
        stall = self.settings.store_stall_seconds
        since = self._reading_since
        if since is not None and time.monotonic() - since > stall:
            out["read"] = f"store: a read of the event log has not answered for {time.monotonic() - since:.0f}s"
        if self.spool.healthy and self.spool.stalled_for() > stall:
            out["append"] = f"store: an append has not answered for {self.spool.stalled_for():.0f}s, {self.spool.backlog} events spooled in memory"
        return out

    def _watch_store(self) -> None:
        """Log a stall of the store (:meth:`store_stalls`) once as a warning when it begins and
        once when the store answers again, checking every second (never touching the store)."""
        began: float | None = None
        said: set[str] = set()  # the kinds of stall logged ("read", "append")
        while not self.stop_event.wait(1.0):
            stalls = self.store_stalls()
            if stalls.keys() - said:  # a stall begins, or one of another kind joins it (a trial: a read's was not said)
                began = began if began is not None else time.monotonic() - self.settings.store_stall_seconds
                log.warning("; ".join(stalls.values()) + " (cancels go on from memory; nothing is admitted until it answers)")
                said |= stalls.keys()
            elif not stalls and began is not None:
                log.info(f"the event log answers again after about {time.monotonic() - began:.0f}s")
                began, said = None, set()

    def _on_store(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` (a store call of the loop) counted as waiting on the store while it runs
        (:meth:`liveness`)."""

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._store_lock:
                self._store_calls += 1
                if self._store_calls == 1:
                    self._store_since = time.monotonic()
            try:
                return call(*args, **kwargs)
            finally:
                with self._store_lock:
                    self._store_calls -= 1
                    if self._store_calls == 0:
                        self._store_since = None

        return counted

    def liveness(self) -> tuple[bool, list[str]]:
        """``(alive, problems)`` for /healthz: fails when the reconcile loop or the preemptor has
        not completed a pass for ``settings.health_stale_seconds`` (a wedged process), the loop
        excepted while it waits on the store (a read, a decision's append, a checkpoint: a hung
        PostgreSQL, which /readyz reports): a restart would not bring the store back, and the
        restarted process cancels nothing until it answers (a fault trial: the liveness probe
        would have killed a replica that still cancelled in 0.4 s, 150 s into a hang, and the
        new one could not start)."""
        limit = self.settings.health_stale_seconds
        now = time.monotonic()
        problems = []
        if self._threads and now - self.last_pass > limit and self._store_since is None:
            problems.append(f"reconcile loop: no pass for {now - self.last_pass:.0f}s")
        if self._threads and now - self.preemptor.last_pass > limit:
            problems.append(f"preemptor: no pass for {now - self.preemptor.last_pass:.0f}s")
        return (not problems, problems)

    # -- intake -------------------------------------------------------------------------------

    def observe(self, pairs: list, headroom: int = 0, refusable: bool = False) -> list:
        """Take observed ``(event, idempotency_key)`` pairs: spool them for the log and wake the
        preemptor, which folds them in memory at once. Never waits on the store. ``headroom``,
        ``refusable``: as :meth:`Spool.put` (the pairs it drops or refuses are not in the
        returned entries)."""
        entries = self.spool.put(pairs, headroom=headroom, refusable=refusable)
        self.preemptor.signal.set()
        return entries

    def ingest_append(self, records: list, wait: float = 1.0) -> list[int | None]:
        """The ingest endpoint's append: the reports go through :meth:`observe` (so they cancel
        even while the store is away), then up to ``wait`` seconds for the log to store them.

        Returns per record its position, None for a duplicate, or 0 when it is accepted but
        still spooled (the store did not answer within ``wait``; only on the leader, which cancels
        from memory, and only when its cancel calls were answered).

        Raises:
            NotLeaderError: this replica is not the leader (checked after the wait) and the log
                did not take every record within ``wait``: the leader, which alone cancels,
                learns of them only through the log. They stay spooled and reach it later.
            CancelUnansweredError: the leader, the log did not take them either, and a cancel
                call of this replica is in flight or failed (any backfill's: the API server does
                not answer this replica, so it may act on nothing; a chaos soak). The client
                retries; another replica may act.
            SpoolFullError: the spool has no room for some of them (the store has been away
                long, or slow under a flood); those are neither acted on nor stored, and the
                client retries. Reports fill at most half the spool (:data:`INGEST_SPOOL_SHARE`),
                so a flood of them never crowds out the watchers' observations (a fault trial:
                130 calls of 1,000 reports filled it, the next report was answered as a
                duplicate, and neither it nor a ``lastActiveTime`` bump cancelled the running
                Job) -- except a call's first report on each Model with an attempt starting or
                running (:func:`_preempting`), which may fill half of the watchers' part too:
                it is the one that cancels (a new user's trial: 100 calls of 1,000 reports on one
                Model, PostgreSQL slow, refused a report on another Model whose Job ran on)."""
        from .ingest import CancelUnansweredError, NotLeaderError, SpoolFullError  # ingest imports nothing of the controller's

        decoded = decode_many([(r.type, r.version, r.data) for r in records])
        pairs = [(e, r.idempotency_key) for e, r in zip(decoded, records)]
        headroom = self.spool.max_records - int(self.spool.max_records * INGEST_SPOOL_SHARE)
        first = _preempting(self.preemptor.world, decoded)
        entries = self.observe([pairs[i] for i in first], headroom=headroom // 2, refusable=True) if first else []
        rest = [p for i, p in enumerate(pairs) if i not in first] if first else pairs
        if rest:
            entries += self.observe(rest, headroom=headroom, refusable=True)
        if len(entries) < len(records):
            raise SpoolFullError(len(entries), len(records) - len(entries))
        committed = self.spool.wait_committed(entries, wait)
        if not committed:
            spooled = sum(1 for e in entries if e.position is None)
            if not self.is_leader():
                raise NotLeaderError(spooled)
            if self.window.inflight or self.preemptor.unanswered():
                raise CancelUnansweredError(spooled)
        return [None if e.duplicate else (e.position or 0) for e in entries]

    def _api_answers(self) -> None:
        """A watcher listed after failing: the API server answers again. Cancels whose calls
        failed meanwhile are re-sent now, not at the end of their back-off (up to 30 s; the
        store may still be away: neither waits on it)."""
        self.actor.hurry_cancels()
        self.preemptor.retry_now()

    def _on_object(self, kind: str, obj: dict) -> None:
        """ModelBackfill objects: keep the newest copy (status PUTs need no GET) and queue the
        finalizer for a live object that lacks it."""
        m = obj.get("metadata") or {}
        key = (m.get("namespace", ""), m.get("name", ""))
        if kind == "DELETED":
            with self._objects_lock:
                self._objects.pop(key, None)
            return
        self._remember_object(key, obj)
        if m.get("deletionTimestamp"):
            return
        if FINALIZER not in (m.get("finalizers") or []):
            with self._fin_lock:
                self._pending_finalizers[key] = m.get("uid", "")
            self.signal.set()

    def _remember_object(self, key: Key, obj: dict) -> None:
        with self._objects_lock:
            old = self._objects.get(key)
            if old is None or _rv(obj) >= _rv(old) or (obj.get("metadata") or {}).get("uid") != (old.get("metadata") or {}).get("uid"):
                self._objects[key] = obj

    def _cached_object(self, key: Key) -> dict | None:
        with self._objects_lock:
            return self._objects.get(key)

    def _known_last_active(self, namespace: str, model: str) -> datetime | None:
        m = self.world.models.get((namespace, model))
        return m.last_active if m is not None else None

    def _relist_all(self) -> None:
        """After observations were dropped (the spool was full): every watcher lists again, and
        the translator judges each Model's ``lastActiveTime`` against the log's, so a demand that
        was dropped is observed (and cancels) now.

        When the spool overflows again within :data:`OVERFLOW_RELIST_WINDOW` seconds of the
        previous such relist (the relists themselves do not fit in ``spool_max_records``), the
        next one waits like a failed watch: ``backoff_initial_seconds``, doubling up to
        ``backoff_max_seconds`` (it relisted every watcher about every 40 ms, for ever). The
        watches stay open during that pause (:meth:`Watcher.halt_watch` ``after``), so what they
        deliver still cancels at once."""
        now, s = time.monotonic(), self.settings
        if now - self._overflow_relist_at < OVERFLOW_RELIST_WINDOW:
            self._overflow_pause = min(max(2 * self._overflow_pause, s.backoff_initial_seconds), s.backoff_max_seconds)
            log.error(
                f"observations were dropped again after the last relist (the spool holds {s.spool_max_records}): "
                f"relisting every watcher in {self._overflow_pause:.1f}s"
            )
        else:
            self._overflow_pause = 0.0
            log.warning("observations were dropped while the store was away: relisting every watcher")
        self._overflow_relist_at = now + self._overflow_pause
        self.translator.forget_seen()
        for w in self.watchers:
            w.halt_watch(relist=True, after=self._overflow_pause)

    # -- folding ------------------------------------------------------------------------------

    def catch_up(self) -> set[Key]:
        """Fold every event after :attr:`position`; returns the affected backfill keys.

        Run rows go to the ``runs`` table with the ``runs`` checkpoint in the same transaction,
        only when a batch changed some. Rows at or below the stored checkpoint are already
        there: the start-up refold does not store them again, but keeps their changes after
        :data:`COUNTED_CHECKPOINT` for counting (a replica died between storing and counting
        them, or a standby stored them and restarted: a trial found both counted by none).

        The metrics count the rows only while this replica acts, after they are stored (so the
        replicas' sum is the true figure, and a batch retried after a failed write is not
        counted twice); the changes folded meanwhile are kept and counted when it acts, those
        after :data:`COUNTED_CHECKPOINT`.

        A gap a prune left past :attr:`position` (this replica fell behind while ``backfill db
        prune`` ran) is folded over from the newest snapshot, and every backfill is affected.

        Raises:
            Any error of the store (a read, a write of run rows): :attr:`position` is then
            still before the batch that failed.
            ControllerConfigError: the log was pruned past :attr:`position` and no snapshot
                of this release continues it.
        """
        keys: set[Key] = set()
        stored = self._runs_checkpoint
        # changes up to here need no counting either; a row stored and not counted (its replica
        # died in between, or a standby stored it and restarted) is kept for counting
        counted = min(stored, self._counted_checkpoint) if self._counted_checkpoint else stored
        first = self.position + 1  # the first position this call may fold
        while (pruned := self._fold_batches(keys, stored, counted)) is not None:
            self._continue_from_snapshot(pruned)
            keys.update(self.world.backfills)
        if not (self._live and self.is_leader()):
            self._counting = 0  # when it acts again, another replica may have counted meanwhile
        elif self._uncounted:  # also with no new batch: what start-up or a standby spell kept
            self._count_uncounted(first)
        return keys

    def _fold_batches(self, keys: set[Key], stored: int, counted: int) -> int | None:
        """:meth:`catch_up`'s reads and folds, batch by batch, adding the affected keys to
        ``keys``. Returns None once the log is read, or the position a prune dropped events up
        to, past :attr:`position` (nothing of that batch folded): the events after
        :attr:`position` up to there are gone (a standby paused or slow while ``backfill db
        prune`` ran; a trial: it skipped them, and once it took over deleted a running Job as
        unexplained and left a run open for ever)."""
        for batch in self.events.read_payloads(self.position, batch_size=5000):
            if pruned := snapshots.pruned_past(self.events, self.position, batch[0][0]):
                return pruned
            world = self.world
            rows = []
            tallies: list[tuple[int, Any, Any, bool]] = []  # what the metrics follow (_count_uncounted)
            requests: list[tuple[int, Any]] = []  # a run of foreground requests, folded together
            for position, e in decode_rows(batch, lean=True):  # folded only: in their compiled forms
                if type(e) in _FOREGROUND:
                    requests.append((position, e))
                    continue
                if requests:
                    world = _fold_requests(world, requests, keys)
                    requests = []
                before = world
                world = fold(world, e, position)
                if not only_position_moved(before, world):
                    keys.update(affected(world, e))
                if position <= counted:
                    continue
                admitted = type(e) in _ADMITTING
                for row in run_rows(before, world, e):
                    if position > stored:
                        rows.append(row)
                    tallies.append((position, row, None if row.result is None else previous_row(before, row), admitted))
            if requests:
                world = _fold_requests(world, requests, keys)
            if rows:
                self.runs.apply(rows, RUNS_CHECKPOINT, batch[-1][0])
                if any(r.result is None for r in rows):
                    crash_point("admit/runrow-written")
                if any(r.result is not None for r in rows):
                    crash_point("cancel/runrow-written")
            self.world = world
            self.position = batch[-1][0]
            self._uncounted.extend(tallies)
            if len(self._uncounted) >= UNCOUNTED_PRUNE and not (self._live and self.is_leader()):
                self._drop_counted()
        return None

    def _continue_from_snapshot(self, pruned: int) -> None:
        """Load the newest snapshot of this release (at or after ``pruned``, the position the
        log was pruned up to past :attr:`position`) to fold on from. Its run rows and counts are
        the acting replica's: a prune keeps every event after the ``runs`` checkpoints.

        Raises:
            ControllerConfigError: no readable snapshot of this release continues the pruned
                log (fail-closed: the live loop then reads and decides nothing, and says so).
        """
        from . import ControllerConfigError

        unreadable: list[str] = []
        snap = snapshots.latest(self.events, unreadable=unreadable)
        for problem in unreadable:
            log.warning(f"passed over an unreadable snapshot: {problem}")
        if snap is None or snap.position < pruned:
            why = snapshots.unrebuildable(self.events, unreadable) or "no snapshot of this release continues it"
            raise ControllerConfigError(
                f"the event log was pruned up to position {pruned}, past this replica's position {self.position}: {why}"
            )
        log.warning(
            f"the event log was pruned up to position {pruned}, past this replica's position {self.position} "
            f"(it fell behind): folding on from the snapshot at position {snap.position}",
            extra={"position": snap.position},
        )
        self.world, self.position, self.snapshot_position = snap, snap.position, snap.position

    def _drop_counted(self) -> None:
        """Drop the kept run-row changes the acting replica counted (at or before
        :data:`COUNTED_CHECKPOINT`); best effort (on a store error they stay, bounded)."""
        try:
            counted = self.runs.get_checkpoint(COUNTED_CHECKPOINT)
        except Exception:  # noqa: BLE001 - kept; the deque's bound holds meanwhile
            return
        while self._uncounted and self._uncounted[0][0] <= counted:
            self._uncounted.popleft()

    def _count_uncounted(self, first: int) -> None:
        """The metrics follow the run rows (a start per row begun by an admission or a resume;
        an end, with its running seconds, when a row's ``result`` is first set): count the
        changes folded and not counted yet that lie after what was counted before, by this
        replica while it acted throughout, else after :data:`COUNTED_CHECKPOINT` (what the
        replica that acted before counted), then move that checkpoint. A failed write of the
        checkpoint is logged: a replica that takes over later may then count those again (the
        counters are per process). Never raises: when the checkpoint cannot be read nothing is
        counted and the changes are kept for the next batch (the fold of this one stands).
        """
        counted = self._counting
        if not counted:
            try:
                counted = self.runs.get_checkpoint(COUNTED_CHECKPOINT)
            except Exception as exc:  # noqa: BLE001 - kept for the next batch
                log.warning(f"reading the {COUNTED_CHECKPOINT} checkpoint failed: {error_line(exc)}", extra={"position": self.position})
                return
        todo = [t for t in self._uncounted if t[0] > counted]
        self._uncounted.clear()
        if not todo:
            return
        if todo[0][0] < first:  # not only this call's: a takeover, or the first count after start-up
            log.info(
                f"counting {len(todo)} run row change(s) folded after position {counted} while another replica acted, or none did",
                extra={"position": todo[-1][0]},
            )
        for _, row, previous, admitted in todo:
            self.metrics.follow(row, previous, admitted=admitted)
            if row.result is not None and (previous is None or previous.result is None):
                self.actor.run_ended(row)  # once per ended row, as the counters
        self._counting = todo[-1][0]
        try:
            self.runs.apply([], COUNTED_CHECKPOINT, self._counting)
        except Exception as exc:  # noqa: BLE001 - counted here; only a later takeover could count them again
            log.warning(f"moving the {COUNTED_CHECKPOINT} checkpoint failed: {error_line(exc)}", extra={"position": self._counting})

    # -- threads ------------------------------------------------------------------------------

    def start(self) -> None:
        """Refold the log, then start the preemptor, the watchers, the log notifier and the loop."""
        t0 = time.monotonic()
        self._runs_checkpoint = self.runs.get_checkpoint(RUNS_CHECKPOINT)
        self._counted_checkpoint = self.runs.get_checkpoint(COUNTED_CHECKPOINT)
        unreadable: list[str] = []
        snap = snapshots.latest(self.events, unreadable=unreadable)
        for problem in unreadable:
            log.warning(f"passed over an unreadable snapshot: {problem}")
        if snap is not None:
            self.world, self.position, self.snapshot_position = snap, snap.position, snap.position
            log.info(f"loaded the snapshot at position {snap.position}", extra={"position": snap.position})
        else:
            why = snapshots.unrebuildable(self.events, unreadable)
            if why is not None:
                from . import ControllerConfigError

                raise ControllerConfigError(why)
        with long_fold():
            self.catch_up()  # a prune under way meanwhile: on from a newer snapshot
        self._runs_checkpoint = self._counted_checkpoint = 0
        self._live = True
        log.info(
            f"folded the log up to position {self.position} in {time.monotonic() - t0:.2f}s "
            f"({'from the snapshot at ' + str(self.snapshot_position) if self.snapshot_position else 'from the start'})",
            extra={"position": self.position},
        )
        self.preemptor.start()
        self._preemptor_started = True
        for kind in KINDS:
            w = Watcher(
                kind,
                self.api,
                namespace=kind.watch_namespace(self.settings.namespace),  # node-level signals: every namespace
                translate=kind.translate(self.translator),
                known=lambda kind=kind: kind.known(self.world),
                observe=self.observe,
                committed=self.spool.wait_committed,
                clock=self.clock,
                settings=self.settings,
                stop=self.stop_event,
                on_object=self._on_object if kind.name == "backfill" else None,
                after=[x.listed for x in self.watchers if x.kind.name in kind.lists_after],
                on_answered=self._api_answers,
            )
            self.watchers.append(w)
            w.start()
        for target, name in ((self._notify, "log-notifier"), (self.run, "reconcile"), (self._watch_store, "store-watch")):
            t = threading.Thread(target=target, name=name, daemon=True)
            self._threads.append(t)
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every thread (each joined within ``timeout`` seconds in all); the spool commits
        what it holds when the store answers. After a :meth:`start` that failed part way (the
        store refused its first read, say) only the threads it started are joined, so the
        start's own error reaches the caller (joining a thread never started raised
        ``RuntimeError: cannot join thread before it is started`` over it)."""
        self.stop_event.set()
        self.signal.set()
        for w in self.watchers:
            w.halt()
        deadline = time.monotonic() + timeout
        if self._preemptor_started:
            self.preemptor.stop(max(0.1, deadline - time.monotonic()))
        for t in self._threads + self.watchers:
            if t.ident is not None:  # started
                t.join(timeout=max(0.0, deadline - time.monotonic()))
        self.spool.stop(max(0.5, deadline - time.monotonic()))
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
                        self.stop_event.wait(0.01)
            except Exception as exc:  # noqa: BLE001
                log.debug(f"event log wait failed: {exc}")
                self.stop_event.wait(self.settings.backoff_initial_seconds)

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        """The reconcile loop (until :attr:`stop_event`); errors are logged and retried."""
        full = True
        next_resync = time.monotonic() + self.settings.resync_seconds
        backoff = self.settings.backoff_initial_seconds
        while not self.stop_event.is_set():
            self.signal.clear()
            acted = False
            try:
                try:
                    self._reading_since = time.monotonic()
                    keys = self._on_store(self.catch_up)()
                    self._reading_since = None
                except Exception as exc:  # noqa: BLE001 - the store is away: cancels go on regardless
                    self._reading_since = None
                    if self.store_error is None:
                        log.error(f"reading the event log failed: {error_line(exc)}")
                    self.store_error = f"{type(exc).__name__}"
                    self.last_pass = time.monotonic()
                    self.stop_event.wait(backoff)
                    backoff = min(backoff * 2, min(self.settings.backoff_max_seconds, 5.0))
                    continue
                if self.store_error is not None:
                    log.info("the event log answers again")
                self.store_error = None
                backoff = self.settings.backoff_initial_seconds
                self.spool.trim(self.position)
                self.preemptor.settle(self.world)
                self._maybe_snapshot()
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
                if self._statuses_held and not self._log_lags():
                    full, self._statuses_held = True, False  # the statuses held while the log lagged
                if full:
                    self.preemptor.poke(None)
                elif keys:
                    self.preemptor.poke(keys)
                if self.synced and self.is_leader():
                    self._finalizers()
                    if full or keys:
                        if full:
                            self.actor.forget()
                        before = self.actor.appended
                        self.step(None if full else keys, now)
                        full = False
                        acted = self.actor.appended > before
                else:
                    full = True  # decide everything (statuses included) once synced / leading
            except Exception as exc:  # noqa: BLE001 - the loop must not die
                log.exception(f"reconcile failed: {error_line(exc)}")
                full = True
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, self.settings.backoff_max_seconds)
                continue
            finally:
                self.last_pass = time.monotonic()
            if acted:
                continue  # fold our own decisions before deciding again
            timeout = min(next_resync - time.monotonic(), 5.0)  # a pass at least every 5 s (liveness)
            if self._wakes:
                timeout = min(timeout, (self._wakes[0][0] - self.clock()).total_seconds())
            if self._carry or not self.synced or (self.leader is not None and not self.is_leader()):
                timeout = min(timeout, 0.5)
            self.signal.wait(max(0.0, timeout))

    def _maybe_snapshot(self) -> None:
        """Snapshot the projection (leader only) when enough events or time passed since the last."""
        new = self.position - self.snapshot_position
        due = new >= self.settings.snapshot_every_events or (
            new > 0 and time.monotonic() - self._snapshot_at >= self.settings.snapshot_every_seconds
        )
        if not due or not self.is_leader():
            return
        t0 = time.monotonic()
        try:
            self._on_store(snapshots.save)(self.events, self.world, keep=self.settings.snapshot_keep)
        except Exception as exc:  # noqa: BLE001 - a snapshot is an optimisation: try again later
            log.warning(f"saving the snapshot failed: {error_line(exc)}", extra={"position": self.position})
        else:
            log.info(f"snapshot at position {self.world.position} in {time.monotonic() - t0:.2f}s", extra={"position": self.world.position})
            self.snapshot_position = self.world.position
            self._runs_complete_up_to(self.world.position)
        self._snapshot_at = time.monotonic()

    def _runs_complete_up_to(self, position: int) -> None:
        """Move the ``runs`` checkpoint to ``position``: :meth:`catch_up` stores the run rows of
        every batch before it moves :attr:`position`, so the runs table holds every row up to
        here. Without this the checkpoint moved only with a batch that changed a row, and in a
        quiet cluster (every declaration done, suspended or Blocked) it stayed behind for ever,
        and with it every ``backfill db prune`` (a trial: "after checkpoint 'runs' at 3715"
        while the log and its snapshot were at 6215). Best effort, as the snapshot.

        :data:`COUNTED_CHECKPOINT` too, when this replica acts and counted every change up to
        ``position`` (nothing kept): like every checkpoint it holds back ``backfill db prune``.
        """
        apply = self._on_store(self.runs.apply)
        try:
            apply([], RUNS_CHECKPOINT, position)
            if self._live and self.is_leader() and not self._uncounted and position <= self.position:
                apply([], COUNTED_CHECKPOINT, position)
        except Exception as exc:  # noqa: BLE001 - the next snapshot tries again
            log.warning(f"moving the runs checkpoints failed: {error_line(exc)}", extra={"position": position})

    def scope(self, keys: Any) -> Any:
        """``keys`` (None: every backfill in the projection) limited to this controller's
        namespace (``settings.namespace``): the log may hold other namespaces' declarations (the
        schema is shared), and a namespaced controller must decide and act only for its own."""
        ns = self.settings.namespace
        if not ns:
            return keys
        return [k for k in (self.world.backfills if keys is None else keys) if k[0] == ns]

    def step(self, keys: Any, now: datetime) -> list:
        """Decide for ``keys`` (None: all) on the durable projection at ``now`` and execute
        everything but cancels (the preemptor's); returns the commands decided.

        Admissions go out only while the spool has settled (nothing observed is missing from
        the durable projection) and every watched kind can be read (listed once, not stale, its
        last call not failed: a signal that cannot be read holds starts, fail-closed); otherwise
        their keys are decided again on a later pass. Statuses go out only while the spool's
        appends succeed (the log then holds what this process observed); otherwise every status
        is decided again by a full pass once they do."""
        keys = self.scope(keys)
        try:
            commands = decide(self.world, now, keys, status=True)
        except Exception as exc:  # noqa: BLE001 - one bad backfill must not starve the others
            log.error(f"decide failed ({error_line(exc)}); deciding backfill by backfill", extra={"position": self.world.position})
            commands = []
            for key in sorted(self.world.backfills if keys is None else keys):
                try:
                    commands.extend(decide(self.world, now, [key], status=True))
                except Exception as exc1:  # noqa: BLE001
                    log.error(
                        f"decide failed: {type(exc1).__name__}: {exc1}",
                        extra={"backfill": f"{key[0]}/{key[1]}", "position": self.world.position},
                    )
        for c in commands:
            if type(c).__name__ == "WakeAt" and self._wake_of.get(c.key) != c.at:
                self._wake_of[c.key] = c.at
                heapq.heappush(self._wakes, (c.at, c.key))
        todo = commands
        due = {c.key for c in commands if isinstance(c, (Admit, Resume))}  # a resume is an admission (issue 11)
        held: set = set()  # due admissions that wait, and why (their status says so when ``hold`` is set)
        hold = None
        if due and not (self._signals_readable() and self.spool.settled(self.position)):
            held = due
            if self._unreadable:
                # Say so in the status (a new user's trial: it kept "admission at T if the model
                # stays idle" long past T, the reason only in the log). A spool not yet settled
                # holds for milliseconds: no status for that.
                hold = hold_for_signals(self._unreadable)
        elif due and (doubts := self.spool.doubts()):
            # An observation the log refused (set aside by the spool) is missing from the durable
            # projection for good: the admissions it may affect wait, with their status saying so.
            held = due & self._doubted(doubts)
            hold = hold_for_refused([f"{e.record.type} of {e.record.stream}" for e in doubts])
        if held:
            self._carry |= held
            todo = [c for c in commands if c.key not in held]
            if hold is not None:
                todo += [c for c in decide(self.world, now, sorted(held), status=True, hold=hold) if type(c) is WriteStatus]
        if any(type(c) is WriteStatus for c in todo) and self._log_lags():
            # The log lacks what this process observed (a Job gone, a demand): appends fail, or
            # the store is paused and they hang. A status of this projection is then older than
            # the cluster (a replica that just gained leadership wrote Running over a Job its
            # predecessor had deleted, also the moment a paused store answered again). Statuses
            # wait for the log (a full pass once it caught up, :meth:`run`); a cancel made here
            # meanwhile has its status written from memory.
            self._statuses_held = True
            todo = [c for c in todo if type(c) is not WriteStatus]
        self._carry.update(self.actor.execute(todo, self.world, now, interrupted=self.signal.is_set))
        return commands

    def _doubted(self, doubts: list) -> set:
        """Keys of the backfills whose decision the observations in ``doubts`` (spool entries the
        log refused) may change: :func:`~backfill.core.conditions.affected` of each, folded into
        the projection in memory; every backfill when one cannot be folded (fail-closed)."""
        keys: set = set()
        for e in doubts:
            try:
                keys.update(affected(fold(self.world, e.event, self.world.position), e.event))
            except Exception:  # noqa: BLE001 - an event the fold cannot take: everything waits
                return set(self.world.backfills)
        return keys

    def _log_lags(self) -> bool:
        """True while appends fail, or the projection lacks an observation spooled over
        :data:`STATUS_LAG_SECONDS` ago (a paused or hung store; appends answer in milliseconds,
        so a younger backlog is ordinary traffic and holds nothing)."""
        return not self.spool.healthy or self.spool.lag(self.position) > STATUS_LAG_SECONDS

    def _signals_readable(self) -> bool:
        """True while every watcher has listed, is not stale and its last call did not fail;
        logs (once per change) which kind holds admissions otherwise."""
        unreadable = sorted(w.kind.name for w in self.watchers if not w.synced.is_set() or w.stale or w.failing is not None)
        if unreadable != self._unreadable:
            self._unreadable = unreadable
            if unreadable:
                log.warning(f"admissions held: cannot read {', '.join(unreadable)} (a signal that cannot be read holds starts)")
            else:
                log.info("admissions resumed: every watched kind can be read again")
        return not unreadable

    def _finalizers(self) -> None:
        with self._fin_lock:
            pending = dict(self._pending_finalizers)
            self._pending_finalizers.clear()
        for (ns, name), uid in pending.items():
            try:
                self.actor.ensure_finalizer(ns, name, uid)
            except Exception as exc:  # noqa: BLE001
                log.warning(f"adding the finalizer to {ns}/{name} failed: {exc}", extra={"backfill": f"{ns}/{name}"})
                with self._fin_lock:
                    self._pending_finalizers.setdefault((ns, name), uid)
