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

from backfill.core.commands import Cancel
from backfill.core.decisions import decision_record
from backfill.core.projector import affected, decide, fold, only_position_moved
from backfill.core.state import Key, World

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


class Preemptor:
    """Decides and executes cancels on the optimistic projection (see the module docstring).

    Args:
        durable: ``() -> World``, the reconcile loop's latest durable projection (an immutable
            value, read without a lock).
        spool: where observations wait for the store, and where cancel decisions go.
        execute: ``(cancels: [Cancel], world) -> None`` deletes the Jobs (the actor), raising
            nothing.
        can_act: the leader check (in memory; never a round trip).
        clock: aware UTC now.
        scope: decide only for backfills in this namespace (a namespaced controller); None: all.
    """

    def __init__(
        self,
        durable: Callable[[], World],
        spool: Spool,
        execute: Callable[[list[Cancel], World], None],
        can_act: Callable[[], bool],
        clock: Callable[[], datetime],
        scope: str | None = None,
    ) -> None:
        self._scope = scope
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
        self._folded_seq = 0
        self._entry_at: dict[int, Entry] = {}
        self._folded: list[Entry] = []  # entries folded onto the base, in order
        # (key, attempt, segment, suspend) -> monotonic time decided (a suspend ends a segment; a
        # delete may follow it for the same attempt, issue 11)
        self.inflight: dict[tuple[Key, int, int, bool], float] = {}
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

    def settle(self, durable: World) -> None:
        """Forget in-flight cancels the durable projection now shows (or that are too old)."""
        now = time.monotonic()
        with self._lock:
            for entry, t0 in list(self.inflight.items()):
                key, attempt, segment, suspend = entry
                b = durable.backfills.get(key)
                a = b.attempt if b is not None else None
                if a is None or a.number != attempt or a.segment > segment:
                    shown = True
                elif suspend:
                    shown = a.lifecycle not in ("Starting", "Running")
                else:
                    shown = a.lifecycle not in ("Starting", "Running", "Suspending", "Suspended")
                if shown or now - t0 > INFLIGHT_SECONDS:
                    del self.inflight[entry]

    # -- the pass -----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self.signal.wait(1.0)
            self.signal.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
                self.error = None
            except Exception as exc:  # noqa: BLE001 - the cancel path must not die
                self.error = f"{type(exc).__name__}: {exc}"
                log.exception(f"preemption pass failed: {self.error}")
                self._base = None  # rebuild the optimistic projection next time
                self._stop.wait(0.05)
            self.last_pass = time.monotonic()

    def run_once(self) -> list[Cancel]:
        """One pass: fold new observations, decide cancels for what they affect, execute them.

        Returns the cancels executed (for tests)."""
        durable = self._durable()
        with self._lock:
            keys, self._poked = self._poked, set()
            everything, self._poke_all = self._poke_all, False
        if durable is not self._base:
            self._base, self._opt, self._folded_seq, self._entry_at, self._folded = durable, durable, 0, {}, []
        opt = self._opt
        for entry in self._spool.unfolded(durable.position, self._folded_seq):
            pos = opt.position + 1 if opt.position >= durable.position else durable.position + 1
            before = opt
            opt = fold(opt, entry.event, pos)
            self._entry_at[pos] = entry
            self._folded.append(entry)
            self._folded_seq = entry.seq
            if not only_position_moved(before, opt):
                keys.update(affected(opt, entry.event))
        self._opt = opt
        if everything:
            self._sweep = sorted(opt.backfills, reverse=True)
        if not keys and not self._sweep:
            return []
        if not self._can_act():
            self._sweep = []
            return []
        now = self._clock()
        if self._sweep:  # the urgent keys first, then one chunk of the sweep; the rest next pass
            chunk, self._sweep = self._sweep[-SWEEP_CHUNK:], self._sweep[:-SWEEP_CHUNK]
            keys.update(chunk)
            if self._sweep:
                self.signal.set()
        wanted = [k for k in keys if k[0] == self._scope] if self._scope else keys
        cancels = [
            c
            for c in decide(opt, now, wanted)
            if isinstance(c, Cancel) and (c.key, c.attempt, c.segment, c.suspend) not in self.inflight
        ]
        if not cancels:
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
        return cancels

    def _ref(self, position: int | None, durable: World) -> Any:
        """A position of the optimistic projection as a reference the spool resolves."""
        if position is None or position <= durable.position:
            return position or 0
        return self._entry_at[position]

    def _record(self, c: Cancel, opt: World, durable: World, now: datetime) -> None:
        """Spool ``c``'s decision. Its basis is the highest log position among everything the
        optimistic projection holds: an entry that turns out to be a duplicate (a re-observed
        ``JobCreated``, an event another replica stored first) resolves to its *earlier* stored
        position, so the last entry alone could name a state older than the attempt itself."""
        # A condition without an event of its own (suspend, spec change, model not Ready, node
        # change, deletion) names the state itself, so its cause is the basis, resolved the same.
        cause = _BASIS if c.cause == opt.position else self._ref(c.cause, durable)
        folded = list(self._folded)
        floor = durable.position
        deps = folded + ([cause] if isinstance(cause, Entry) else [])

        def make(resolve: Callable[[Any], int]) -> tuple[Any, str]:
            basis = max([floor] + [resolve(e) for e in folded])
            return decision_record(c, at=now, basis=basis, cause=basis if cause is _BASIS else resolve(cause))

        self._spool.put_decision(make, deps)
        crash_point("cancel/decision-appended")
