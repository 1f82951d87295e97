"""The preemptor: foreground always wins, through memory only.

Design choice (issue 8). A cancel must never wait on anything that can be down or slow: the
database, a lock, a status write, a lease renewal. Two shapes were possible: a separate guard
with its own model/node -> Job index, or the projector itself run on an in-memory projection.
This is the second, because it keeps every cancel rule in one place (``backfill.core``): the
guard would have been a second, drifting copy of the cancel conditions, and ``backfill replay``
could not have explained its decisions.

How: the reconcile loop keeps the *durable* projection (the log as read back from the store).
The preemptor keeps an *optimistic* one: the durable projection plus every event this process
observed that the durable projection does not contain yet (the :class:`~.spool.Spool`'s
unfolded entries, folded in arrival order at provisional positions above the durable one). On
every new observation it folds it, asks the pure ``decide`` about the backfills it affects and
executes only the ``Cancel`` commands: the decision is spooled (in memory) and the Job DELETE
goes out at once (for a preemption of a ``spec.preemption: Suspend`` declaration, issue 11, the
PATCH ``spec.suspend: true`` instead: the same command, path and call discipline). The decision is appended *behind* the events that caused it (``cause``/``basis`` point at their spool entries and are
resolved to real positions when the writer commits them), so replay checks it against exactly
the state it was made on, even when PostgreSQL was away while it was made.

Every cancel, including those derived from the durable projection (events other replicas or a
resync brought), is made here: the reconcile loop pokes the keys its catch-up affected and never
cancels itself. Everything else (admissions, blocks, statuses, finalizers, re-issued deletes) is
the loop's, on the durable projection: admissions are fail-closed and need the durable log.

Threads: one, "preempt". It touches no database and waits for nothing: the Job DELETEs (with a
client-side timeout) go out on the actor's "job-deletes" pool, which also logs each answer and
emits its Kubernetes Event (side thread), so a second demand is decided while the first cancel's
DELETE is still in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any, Callable, Iterable

from backfill.core.commands import Cancel, DeleteJob, SuspendJob, WakeAt, WriteStatus
from backfill.core.conditions import cause_is_state
from backfill.core.decisions import decision_record
from backfill.core.projector import affected, decide, fold, only_position_moved
from backfill.core.state import IDLE, SUSPENDED, Key, World
from backfill.core.verdict import HOLD_FOR_THE_LOG
from backfill.errorlines import error_line

from .crash import crash_point
from .spool import Entry, Spool

log = logging.getLogger("backfill.controller.preempt")

_BASIS = object()  # a cause that is the decision's own basis

#: Seconds after which a cancel that the durable projection still does not show is decided again.
INFLIGHT_SECONDS = 60.0
#: Backfills re-checked per pass by a sweep (a resync's ``poke(None)``): a pass decides the keys
#: new observations affect *first*, then at most this many of the sweep, so a resync of 10,000
#: backfills never holds a foreground cancel behind it (about 1 ms of deciding per chunk).
SWEEP_CHUNK = 64
#: Seconds before a cancel call that failed is re-decided and re-sent from memory (the actor's
#: pacing, 1 s doubling to its maximum, applies on top).
RETRY_SECONDS = 1.0
#: Seconds between the preemptor's decisions of a Suspending attempt (its suspend re-asserted
#: from memory, the calls paced by the actor) until the Job is observed suspended.
REASSERT_SECONDS = 1.0


class Preemptor:
    """Decides and executes cancels on the optimistic projection (see the module docstring).

    Args:
        durable: ``() -> World``, the reconcile loop's latest durable projection (an immutable
            value, read without a lock).
        spool: where observations wait for the store, and where cancel decisions go.
        execute: ``(cancels: [Cancel], world) -> None`` deletes the Jobs (the actor), raising
            nothing.
        execute_again: ``(commands: [DeleteJob | SuspendJob], world, failed=True) -> None``
            re-sends the calls of cancels whose first call failed (see :meth:`retry`), and with
            ``failed`` False the suspends of Suspending attempts the pass decided (a Job someone
            else resumed), raising nothing; None: the reconcile loop's re-issue (needs the
            store) is the only one.
        can_act: the leader check (in memory; never a round trip).
        clock: aware UTC now.
        scope: decide only for backfills in this namespace (a namespaced controller); None: all.
        statuses: ``(commands: [WriteStatus]) -> None`` queues statuses (the actor's status
            writer: returns at once, never raises); None: statuses are the loop's only. With
            it, a backfill whose cancel was made here has its status written from the
            optimistic projection until the durable one shows that cancel done (:attr:`from_memory`):
            while PostgreSQL is away the status says ``Cancelling``, then the wait for a fresh
            idle window, instead of ``Running`` over a Job that is gone.
    """

    def __init__(
        self,
        durable: Callable[[], World],
        spool: Spool,
        execute: Callable[[list[Cancel], World], None],
        can_act: Callable[[], bool],
        clock: Callable[[], datetime],
        scope: str | None = None,
        execute_again: Callable[..., None] | None = None,
        statuses: Callable[[list[WriteStatus]], None] | None = None,
    ) -> None:
        self._scope = scope
        self._statuses = statuses
        self._execute_again = execute_again
        self._retry: dict[Key, float] = {}  # key -> monotonic time its failed cancel call is re-sent
        self._reassert: dict[Key, float] = {}  # key -> monotonic time its Suspending attempt is decided again
        #: key -> when (UTC, :attr:`_clock`) the verdict of a backfill whose status is written here
        #: changes by time alone (its admission falls due): decided and its status written again
        #: then (a fault trial: "admission at 06:37:34 if the model stays idle" still read at
        #: 06:37:45, the store away and nothing admitted)
        self._status_due: dict[Key, datetime] = {}
        self._acting = False  # could act at the last pass (leadership)
        #: (position, event) of decisions this process appended itself (admissions, resumes)
        #: that the durable projection has not read back yet: folded first, at their positions.
        self._recorded: list[tuple[int, Any]] = []
        self._recorded_new = False
        self._durable = durable
        self._spool = spool
        self._execute = execute
        self._can_act = can_act
        self._clock = clock
        self.signal = threading.Event()
        self._lock = threading.Lock()
        self._poked: set[Key] = set()
        self._poke_all = True
        self._sweep: list[Key] = []  # a resync's keys still to re-check, in chunks (last first)
        self._base: World | None = None
        self._opt: World = World()
        self._floor = 0  # the durable position plus our own appends folded on it
        self._folded_seq = 0
        self._entry_at: dict[int, Entry] = {}
        self._folded: list[Entry] = []  # entries folded onto the base, in order
        # (key, attempt, segment, suspend) -> monotonic time decided (a suspend ends a segment; a
        # delete may follow it for the same attempt, issue 11)
        self.inflight: dict[tuple[Key, int, int, bool], float] = {}
        #: (key, attempt, segment, suspend) of cancels executed here that the durable projection
        #: does not show done yet (:func:`_over`; no time limit, unlike :attr:`inflight`: a
        #: decision is never dropped, it reaches the log when the store answers): their
        #: backfills' statuses are this projection's, and the loop does not write its older ones
        #: (:meth:`writes_status`).
        self.from_memory: set[tuple[Key, int, int, bool]] = set()
        self.cancels = 0
        self.last_pass = time.monotonic()
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="preempt", daemon=True)

    def start(self) -> None:
        """Start the "preempt" thread."""
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (a cancel in progress finishes)."""
        self._stop.set()
        self.signal.set()
        self._thread.join(timeout)

    def poke(self, keys: Iterable[Key] | None = None) -> None:
        """Re-check ``keys`` on the next pass, and wake the thread. None: every backfill, as a
        sweep of :data:`SWEEP_CHUNK` keys per pass behind the keys new observations affect."""
        with self._lock:
            if keys is None:
                self._poke_all = True
            else:
                self._poked.update(keys)
        self.signal.set()

    def recorded(self, pairs: list[tuple[int, Any]]) -> None:
        """Admissions (and resumes) just appended by this process, with their log positions:
        the optimistic projection holds them at once, so a demand right after an admission
        cancels its Job even while the store cannot be read back (issue 8)."""
        if not pairs:
            return
        with self._lock:
            self._recorded.extend(pairs)
            self._recorded_new = True
        self.signal.set()

    def cancelling(self, key: Key, attempt: int) -> bool:
        """True while a cancel of ``key``'s ``attempt`` decided here is in flight (not yet shown
        by the durable projection): its Job must not be created (again)."""
        with self._lock:
            return any(k == key and a == attempt for k, a, _, _ in self.inflight)

    def retry(self, key: Key, after: float = RETRY_SECONDS) -> None:
        """The cancel call (DELETE or suspend) of ``key`` failed: re-decide it in memory and
        re-send it in ``after`` seconds (paced further by the actor), without waiting for the
        store (a refused DELETE while PostgreSQL is away would otherwise wait for it)."""
        with self._lock:
            self._retry[key] = time.monotonic() + after
        self.signal.set()

    def unanswered(self) -> bool:
        """True while a cancel call decided here failed and waits for its re-send (the API
        server did not answer it: a partition, an outage)."""
        with self._lock:
            return bool(self._retry)

    def retry_now(self) -> None:
        """Re-send every failed cancel call waiting for its retry on the next pass (the API
        server answers again: :meth:`backfill.controller.actor.Actor.hurry_cancels`)."""
        with self._lock:
            for key in self._retry:
                self._retry[key] = 0.0
        self.signal.set()

    @property
    def world(self) -> World:
        """The optimistic projection as of the last pass: the durable one plus the observations
        not yet stored (an immutable value, read without a lock)."""
        return self._opt

    def settle(self, durable: World) -> None:
        """Forget in-flight cancels the durable projection now shows (or that are too old)."""
        now = time.monotonic()
        with self._lock:
            for entry, t0 in list(self.inflight.items()):
                if _shown(durable, *entry) or now - t0 > INFLIGHT_SECONDS:
                    del self.inflight[entry]
            self.from_memory = {entry for entry in self.from_memory if not _over(durable, *entry)}

    def writes_status(self, key: Key) -> bool:
        """True while ``key``'s status is written from memory (a cancel made here that the
        durable projection does not show done yet): the loop's status of it would be older."""
        with self._lock:
            return any(entry[0] == key for entry in self.from_memory)

    # -- the pass -----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            # Not leading: look again soon (a leadership gained is a sweep, see run_once).
            wait = 1.0 if self._acting else 0.2
            with self._lock:
                if self._retry and self._acting:  # not leading: due re-sends wait for the lease
                    wait = max(0.0, min(wait, min(self._retry.values()) - time.monotonic()))
                if self._reassert and self._acting:
                    wait = max(0.0, min(wait, min(self._reassert.values()) - time.monotonic()))
                if self._status_due:
                    wait = max(0.0, min(wait, (min(self._status_due.values()) - self._clock()).total_seconds()))
            self.signal.wait(wait)
            self.signal.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
                self.error = None
            except Exception as exc:  # noqa: BLE001 - the cancel path must not die
                self.error = error_line(exc)  # one line, an API refusal with its message
                log.exception(f"preemption pass failed: {self.error}")
                self._base = None  # rebuild the optimistic projection next time
                self._stop.wait(0.05)
            self.last_pass = time.monotonic()

    def run_once(self) -> list[Cancel]:
        """One pass: fold new observations, decide cancels for what they affect, execute them.

        Returns the cancels executed (for tests)."""
        durable = self._durable()
        mono = time.monotonic()
        with self._lock:
            keys, self._poked = self._poked, set()
            everything, self._poke_all = self._poke_all, False
            # Due re-sends stay registered until this replica may act (below): a retry that fell
            # due while the lease had lapsed was dropped, and once the lease was regained nothing
            # re-sent the DELETE (its cancel in flight, filtered out) until the store returned (a
            # fault trial: the Job ran on for 80 s with the leader back).
            again = {k for k, at in self._retry.items() if at <= mono}
            reassert = {k for k, at in self._reassert.items() if at <= mono}
            if self._status_due:
                wall = self._clock()
                for k in [k for k, at in self._status_due.items() if at <= wall]:
                    del self._status_due[k]
                    keys.add(k)
            rebuild = self._recorded_new
            self._recorded_new = False
            self._recorded = [(p, e) for p, e in self._recorded if p > durable.position]
            recorded = sorted(self._recorded, key=lambda pe: pe[0])
        keys |= again
        if durable is not self._base or rebuild:
            opt = durable
            for p, e in recorded:  # our own appends the durable projection lacks, at their positions
                opt = fold(opt, e, p)
                keys.update(affected(opt, e))
            self._base, self._opt, self._folded_seq, self._entry_at, self._folded = durable, opt, 0, {}, []
            self._floor = opt.position
        opt = self._opt
        for entry in self._spool.unfolded(durable.position, self._folded_seq):
            pos = opt.position + 1 if opt.position >= self._floor else self._floor + 1
            before = opt
            opt = fold(opt, entry.event, pos)
            self._entry_at[pos] = entry
            self._folded.append(entry)
            self._folded_seq = entry.seq
            if not only_position_moved(before, opt):
                keys.update(affected(opt, entry.event))
        self._opt = opt
        if not self._can_act():
            # Not the leader: nothing is sent. What it observed meanwhile is not lost: the
            # optimistic projection keeps it, leadership gained re-checks every backfill, and a
            # failed cancel call's re-send stays due (:attr:`_retry`).
            self._acting = False
            self._sweep = []
            return []
        if again:
            with self._lock:
                for k in again:
                    if self._retry.get(k, mono + 1) <= mono:  # not re-registered meanwhile
                        del self._retry[k]
        if everything or not self._acting:
            self._sweep = sorted(opt.backfills, reverse=True)
        self._acting = True
        if reassert and self._spool.healthy and self._spool.stalled_for() <= REASSERT_SECONDS:
            with self._lock:  # the store answers: the reconcile loop re-issues the suspends
                for k in reassert:
                    self._reassert.pop(k, None)
            reassert = set()
        if reassert:
            # Re-assertions wait while anything urgent is decided (a foreground cancel is never
            # held behind them), then go at most a chunk a pass (a latency bench holds 200
            # Suspending attempts whose Jobs are never reported suspended).
            if keys:
                self.signal.set()
            else:
                keys.update(sorted(reassert)[:SWEEP_CHUNK])
                if len(reassert) > SWEEP_CHUNK:
                    self.signal.set()
        if not keys and not self._sweep:
            return []
        now = self._clock()
        if self._sweep:  # the urgent keys first, then one chunk of the sweep; the rest next pass
            chunk, self._sweep = self._sweep[-SWEEP_CHUNK:], self._sweep[:-SWEEP_CHUNK]
            keys.update(chunk)
            if self._sweep:
                self.signal.set()
        wanted = [k for k in keys if k[0] == self._scope] if self._scope else keys
        decided = decide(opt, now, wanted)
        cancels = [c for c in decided if isinstance(c, Cancel) and (c.key, c.attempt, c.segment, c.suspend) not in self.inflight]
        if self._execute_again is not None:
            redo = [r for r in (self._resend(c, again, opt) for c in decided) if r is not None]
            if redo:
                self._execute_again(redo, opt)
            # A suspending attempt's suspend, re-asserted from memory (paced by the actor): a Job
            # someone else resumes is suspended again while the store is away (an adversarial
            # trial: it ran 82 s, until PostgreSQL came back and the loop re-issued it). While
            # the store is away (the loop, which re-issues it otherwise, waits for it) the
            # attempt is also decided again every REASSERT_SECONDS until its Job is observed
            # suspended: a spec.suspend cleared before any Suspended status (no event says so;
            # re-trials: 65 s and 33 s, the second with the cancel itself still spooled).
            # A resume that *is* observed is re-asserted here whether or not the store answers:
            # the loop re-issues it too, but only after a store round trip, and stopping work
            # waits on no store (the actor's shared pace keeps the two to one call).
            assert_ = [s for s in (_suspend_of(c, opt, self.inflight) for c in decided) if s is not None and s.key not in again]
            if assert_:
                self._execute_again(assert_, opt, False)
            with self._lock:
                for k in wanted:
                    self._reassert.pop(k, None)
                for c in assert_:
                    self._reassert[c.key] = mono + REASSERT_SECONDS
                for c in cancels:
                    if c.suspend:
                        self._reassert[c.key] = mono + REASSERT_SECONDS
        if not cancels:
            self._write_statuses(opt, now, wanted)
            return []
        t0 = time.monotonic()
        with self._lock:
            for c in cancels:
                self.inflight[(c.key, c.attempt, c.segment, c.suspend)] = t0
        # Spool the decisions first (memory only: nothing waits for the store), so the log has
        # each cancel before the Job's deletion that the watch will report.
        for c in cancels:
            self._record(c, opt, durable, now)
        self._execute(cancels, opt)
        self.cancels += len(cancels)
        if self._statuses is not None:
            with self._lock:
                self.from_memory.update((c.key, c.attempt, c.segment, c.suspend) for c in cancels)
        self._write_statuses(opt, now, wanted)
        return cancels

    def _write_statuses(self, opt: World, now: datetime, keys: Iterable[Key]) -> None:
        """Queue the statuses of those of ``keys`` whose status is written from memory, derived
        from ``opt`` (after the cancels' calls went out: nothing here delays one)."""
        if self._statuses is None:
            return
        with self._lock:
            mine = {entry[0] for entry in self.from_memory}
            for k in [k for k in self._status_due if k not in mine]:
                del self._status_due[k]  # the loop writes its status again
        wanted = [k for k in keys if k in mine]
        if wanted:
            # An admission or resume due in memory is not made here (only the loop admits, once
            # the log explains it): its status says it waits for the log (decide's ``hold``).
            cmds = decide(opt, now, wanted, status=True, hold=HOLD_FOR_THE_LOG)
            self._statuses([c for c in cmds if isinstance(c, WriteStatus)])
            # (an attempt still live, Cancelling, is re-checked every second: its status is
            # written again when its Job is seen gone, as now)
            wakes = {c.key: c.at for c in cmds if isinstance(c, WakeAt)}
            with self._lock:
                for k in wanted:
                    b = opt.backfills.get(k)
                    if k in wakes and b is not None and b.live_attempt is None:
                        self._status_due[k] = wakes[k]  # written again when it changes by time alone
                    else:
                        self._status_due.pop(k, None)

    def _resend(self, c: Any, again: set[Key], opt: World) -> DeleteJob | SuspendJob | None:
        """The call to send again for decided command ``c``, or None:

        - for a backfill whose cancel call failed (``again``): its Cancelling (Suspending)
          attempt's ``DeleteJob`` (``SuspendJob``); a cancel whose decision still waits in the
          spool for its causes' commit shows as the same, in-flight ``Cancel``: its call;
        - a Job created again under the name of an attempt that ended (a create that landed
          after its cancel's delete): deleted at once. Other unexplained Jobs are the durable
          log's to judge (this projection may lack an admission another replica made).
        """
        if isinstance(c, DeleteJob) and c.unexplained:
            return c if _ended_attempts_name(opt, c) else None
        if c.key not in again:
            return None
        if isinstance(c, (DeleteJob, SuspendJob)):
            return c
        if isinstance(c, Cancel) and (c.key, c.attempt, c.segment, c.suspend) in self.inflight:
            return SuspendJob(c.key, c.job_name) if c.suspend else DeleteJob(c.key, c.job_name)
        return None

    def _ref(self, position: int | None, durable: World) -> Any:
        """A position of the optimistic projection as a reference the spool resolves."""
        if position is None or position <= self._floor:
            return position or 0  # durable, or one of our own appends (a real position)
        return self._entry_at[position]

    def _record(self, c: Cancel, opt: World, durable: World, now: datetime) -> None:
        """Spool ``c``'s decision. Its basis is the highest log position among everything the
        optimistic projection holds: an entry that turns out to be a duplicate (a re-observed
        ``JobCreated``, an event another replica stored first) resolves to its *earlier* stored
        position, so the last entry alone could name a state older than the attempt itself."""
        # A condition without an event of its own (suspend, spec change, model not Ready, node
        # change, deletion) names the state itself, so its cause is the basis, resolved the same.
        # Any other names its event, though it be the last one folded (a duplicate resolves to
        # the copy stored first, which the replay derives).
        cause = _BASIS if c.cause == opt.position and cause_is_state(c.reason) else self._ref(c.cause, durable)
        folded = list(self._folded)
        floor = self._floor
        deps = folded + ([cause] if isinstance(cause, Entry) else [])

        def make(resolve: Callable[[Any], int]) -> tuple[Any, str]:
            basis = max([floor] + [resolve(e) for e in folded])
            return decision_record(c, at=now, basis=basis, cause=basis if cause is _BASIS else resolve(cause))

        self._spool.put_decision(make, deps)
        crash_point("cancel/decision-appended")


def _suspend_of(c: Any, opt: World, inflight: dict[tuple, float]) -> SuspendJob | None:
    """The suspend to re-assert for decided command ``c``: a ``SuspendJob``, or for a suspending
    ``Cancel`` in flight (its decision still spooled, not folded here) the suspend of the round
    that decision opens; else None."""
    if isinstance(c, SuspendJob):
        return c
    if isinstance(c, Cancel) and c.suspend and (c.key, c.attempt, c.segment, c.suspend) in inflight:
        b = opt.backfills.get(c.key)
        a = b.attempt if b is not None else None
        return SuspendJob(c.key, c.job_name, (a.suspend_round if a is not None else 0) + 1)
    return None


def _current(durable: World, key: Key, attempt: int, segment: int) -> Any:
    """``key``'s attempt in the durable projection while it is still ``attempt`` at segment
    ``segment`` or earlier; None once another attempt or a later segment is current (or none)."""
    b = durable.backfills.get(key)
    a = b.attempt if b is not None else None
    return None if a is None or a.number != attempt or a.segment > segment else a


def _shown(durable: World, key: Key, attempt: int, segment: int, suspend: bool) -> bool:
    """True when the durable projection shows the cancel ``(key, attempt, segment, suspend)``:
    the attempt is no longer Starting/Running (a suspending cancel), or no longer live nor
    suspended (a deleting one), or another attempt or a later segment is current."""
    a = _current(durable, key, attempt, segment)
    if a is None:
        return True
    if suspend:
        return a.lifecycle not in ("Starting", "Running")
    return a.lifecycle not in ("Starting", "Running", "Suspending", "Suspended")


def _over(durable: World, key: Key, attempt: int, segment: int, suspend: bool) -> bool:
    """True when the durable projection shows the cancel ``(key, attempt, segment, suspend)``
    done: the Job observed suspended (a suspending cancel) or the attempt ended, or another
    attempt or a later segment current. Until then its status is written from memory: a status
    of the durable projection's (``Cancelling`` while the optimistic one already saw the Job
    gone) would be older."""
    a = _current(durable, key, attempt, segment)
    return a is None or (a.lifecycle in (SUSPENDED, IDLE) if suspend else a.lifecycle == IDLE)


def _ended_attempts_name(world: World, c: DeleteJob) -> bool:
    """True when ``c`` deletes an unexplained Job that carries the name of its backfill's
    current, ended attempt (created again after that attempt's Job was deleted)."""
    b = world.backfills.get(c.key)
    a = b.attempt if b is not None else None
    return a is not None and a.job_name == c.job_name and not a.live and not a.suspended
