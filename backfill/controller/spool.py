"""The spool: every event this process observes or decides, appended to the log in order, in
the background.

Why a spool (issue 8, "foreground always wins"): a cancel must never wait on the database. The
watchers and the ingest endpoint hand their events to the spool and, at the same moment, to the
:class:`~backfill.controller.preempt.Preemptor`, which folds them in memory and deletes a Job on
demand at once. The spool makes the same events durable behind it: one writer thread appends
them in arrival order, as many per transaction as have queued up (group commit), and retries
with capped back-off while the store is down or hanging, keeping them in memory.

Decisions made on events that are not durable yet (a cancel decided while PostgreSQL is away)
are spooled as *deferred* entries: their ``cause`` and ``basis`` point at earlier entries, and
the writer fills in those entries' log positions once they are committed, then appends the
decision after them. So ``backfill replay`` sees every cancel after the events that caused it,
with the positions it was decided on, however long the store was away.

Bounds: at most ``max_records`` observations, of at most ``max_bytes`` of payload (JSON
characters) in all, wait in memory. Past either new observations are
dropped (decisions never are), counted in :attr:`Spool.dropped` and logged once per episode
(``spool full ...``; the controller exports only the seed's four metric families); a dropped
observation cancels nothing while the store is away. When the backlog has drained,
``on_overflow_recovered`` runs: the controller relists every watcher with the translator
judging each Model's ``lastActiveTime`` against the log, so a dropped demand is observed, and
cancels, then (``tests/faults/test_store_faults.py``). Admissions never rely on the spool: the reconcile loop admits
only when it is :meth:`Spool.settled` (everything observed is durable and folded).

A record the log refuses for what it holds (:class:`~backfill.store.interface.RecordRefusedError`:
appending it again can never succeed) is set aside, not retried for ever: a refused batch is
split in halves until the refused record is alone, the rest are appended in order, and that one
is logged at error with its content, counted in :attr:`Spool.refused` and given position 0.
Before this, one such record (a NUL PostgreSQL refused, a 9 kB key) stayed at the spool's head
and no ModelBackfill anywhere was admitted again until a restart; those two are now encoded so
that they store (:mod:`backfill.core.storable`), this is for the next one nobody has found. An
observation set aside is a *doubt* (fail-closed): :meth:`Spool.doubts` gives it until a later
observation of the same object and type (same stream and event type, arrived later and
happened no earlier) is appended, and the
reconcile loop holds the admissions it may affect meanwhile (``UnstorableEvent``). Past
:data:`MAX_REFUSED_IN_A_ROW` refusals with no append between, the store is taken to refuse
everything (a schema or server problem, not a record) and the batch is retried with back-off,
as while the store is away.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from itertools import islice
from typing import Any, Callable, Iterable, Sequence

from backfill.core.events import encode
from backfill.errorlines import error_line
from backfill.store.interface import RecordRefusedError

log = logging.getLogger("backfill.controller.spool")

#: Refused records set aside one after another, with no append accepted between, before the
#: store is taken to refuse everything (its schema or server, not a record): the batch is then
#: retried with back-off instead (nothing more set aside) until an append succeeds.
MAX_REFUSED_IN_A_ROW = 8
#: Characters of a refused record's ``data`` in its error line.
REFUSED_DATA_LOGGED = 4096


class Entry:
    """One spooled event.

    Attributes:
        seq: arrival number in this process (1, 2, ...).
        event: the typed event (None for a deferred decision until it is built).
        record: the :class:`~backfill.core.records.EventRecord` to append (None until built).
        position: the log position once committed (an earlier position when the key was
            already stored, e.g. by another replica); None while not committed.
        duplicate: the key was already stored (nothing new was appended).
        spooled_at: monotonic seconds when it was spooled.
        size: the record's payload (``data``) in characters, counted against the spool's
            ``max_bytes`` (0 for a decision: decisions are never dropped).
        refused: why the log refused the record (it was set aside: position 0), else None.
    """

    __slots__ = ("seq", "event", "record", "position", "duplicate", "decision", "spooled_at", "size", "refused", "_make", "_deps")

    def __init__(self, seq: int, event: Any = None, record: Any = None, make: Any = None, deps: Sequence["Entry"] = ()) -> None:
        self.seq = seq
        self.event = event
        self.record = record
        self.position: int | None = None
        self.duplicate = False
        self.decision = make is not None  # a decision of this process (logged when recorded)
        self.spooled_at = time.monotonic()
        self.size = len(record.data) if record is not None else 0
        self.refused: str | None = None
        self._make = make
        self._deps = tuple(deps)


Resolve = Callable[[Any], int]
"""Maps a reference (an :class:`Entry` or a position) to a committed log position."""


class Spool:
    """Ordered, bounded, in-memory queue of appends with one writer thread ("log-writer").

    Args:
        append: ``records -> [position | None]`` in one transaction (``EventStore.append``).
        positions_of: ``idempotency keys -> {key: position}`` for keys that were already stored.
        on_commit: called after every committed batch (wakes the reconcile loop).
        backoff_initial / backoff_max: retry back-off of a failed append, seconds.
        max_records: most observations held while the store does not accept them.
        on_overflow_recovered: called once the backlog drained after observations were dropped.
        before_append: called before each append (the controller passes
            :meth:`~backfill.controller.cancelwindow.CancelWindow.wait`: PostgreSQL's commit does
            not compete with a preemption DELETE in flight; bounded).
    """

    def __init__(
        self,
        append: Callable[[list], list],
        positions_of: Callable[[Sequence[str]], dict[str, int]],
        on_commit: Callable[[], None],
        *,
        backoff_initial: float = 0.2,
        backoff_max: float = 5.0,
        max_records: int = 100_000,
        max_bytes: int = 64 << 20,
        on_overflow_recovered: Callable[[], None] = lambda: None,
        before_append: Callable[[], Any] = lambda: None,
    ) -> None:
        self._append = append
        self._before_append = before_append
        self._positions_of = positions_of
        self._on_commit = on_commit
        self._backoff = (backoff_initial, backoff_max)
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._bytes = 0  # payload characters of the observations not yet committed
        self._waiting: dict[str, Entry] = {}  # idempotency key -> its observation entry not yet committed
        self._on_overflow_recovered = on_overflow_recovered
        self._cond = threading.Condition()
        self._entries: list[Entry] = []  # not yet trimmed, in order
        self._next = 0  # index in _entries of the first entry not yet committed
        self._seq = 0
        self._stopped = False
        self.dropped = 0
        self._overflowed = False
        self.last_error: str | None = None
        self.failing_since: float | None = None  # monotonic time of the first failure in a row
        self.committed = 0
        self.refused = 0  # records the log refused, set aside
        self._refused_in_a_row = 0
        self._doubts: dict[tuple[str, str], Entry] = {}  # (stream, type) -> observation set aside, not superseded yet
        self.writing_since: float | None = None  # monotonic start of the append in flight
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    # -- producers ----------------------------------------------------------------------------

    def put(self, pairs: Iterable[tuple[Any, str | None]], *, headroom: int = 0, refusable: bool = False) -> list[Entry]:
        """Spool observed ``(event, idempotency_key)`` pairs; returns their entries (in order).

        Never blocks on the store. Past :attr:`max_records` waiting observations, less
        ``headroom`` (kept free for others: the ingest endpoint leaves half to the watchers),
        the pairs are dropped (counted in :attr:`dropped`) and the returned list is shorter.

        ``refusable`` (the ingest endpoint's reports, which its client sends again): a pair whose
        key already waits here is answered with its waiting entry (a re-send takes no room), and
        those that do not fit are refused, not dropped: the caller answers for them, nothing is
        counted, logged or relisted (a second trial: refused reports were logged as dropped
        observations and every watcher relisted twice once the store was back)."""
        records = [(e, encode(e, k)) for e, k in pairs]
        out: list[Entry] = []
        with self._cond:
            if refusable:
                waiting = [self._waiting.get(r.idempotency_key) for _, r in records]
                if any(waiting):
                    out = [w for w in waiting if w is not None]
                    records = [x for x, w in zip(records, waiting) if w is None]
            room = self.max_records - headroom - (len(self._entries) - self._next)
            # the payloads are bounded too (a fault trial: 151 changes of a GamingSession with
            # a 900 kB field took a replica from 126 to 403 MB; 100,000 of them would not fit)
            budget = self.max_bytes - self._bytes - headroom * self.max_bytes // self.max_records
            fits = 0
            for _, r in records[: max(0, room)]:
                budget -= len(r.data)
                if budget < 0:
                    break
                fits += 1
            if fits < len(records) and refusable:
                records = records[:fits]
            elif fits < len(records):
                lost = len(records) - fits
                records = records[:fits]
                self.dropped += lost
                if not self._overflowed:
                    log.error(
                        f"spool full ({len(self._entries) - self._next} events, {self._bytes} bytes already waiting for the store; "
                        f"at most {self.max_records} events, {self.max_bytes} bytes): dropping observations; "
                        "the watchers relist once the store accepts the backlog"
                    )
                self._overflowed = True
            for e, r in records:
                self._seq += 1
                entry = Entry(self._seq, e, r)
                self._bytes += entry.size
                self._waiting[r.idempotency_key] = entry
                self._entries.append(entry)
                out.append(entry)
            if out:
                self._cond.notify_all()
        return out

    def put_decision(self, make: Callable[[Resolve], tuple[Any, str]], deps: Sequence[Entry] = ()) -> Entry:
        """Spool a decision built by ``make(resolve)`` once every entry in ``deps`` is committed.

        ``make`` receives ``resolve(ref) -> position`` (``ref``: an :class:`Entry` or an int) and
        returns ``(event, idempotency_key)``. Decisions are never dropped."""
        with self._cond:
            self._seq += 1
            entry = Entry(self._seq, make=make, deps=deps)
            self._entries.append(entry)
            self._cond.notify_all()
        return entry

    # -- consumers ----------------------------------------------------------------------------

    def unfolded(self, position: int, after_seq: int = 0) -> list[Entry]:
        """Observation entries the durable projection (folded up to ``position``) lacks, in order:
        not committed yet, or committed after ``position``. Deferred decisions are left out.

        ``after_seq``: only entries that arrived after that one (the preemptor asks for what it
        has not folded yet; while the store is away the spool holds thousands, and a pass must
        not walk them all)."""
        with self._cond:
            start = bisect.bisect_right(self._entries, after_seq, key=_seq_of) if after_seq else 0
            return [
                e
                for e in islice(self._entries, start, None)
                if e.event is not None and e._make is None and (e.position is None or e.position > position)
            ]

    def settled(self, position: int) -> bool:
        """True when every spooled entry is committed at or before ``position`` (nothing this
        process observed is missing from a projection folded up to there)."""
        with self._cond:
            if self._next < len(self._entries):
                return False
            return all(e.position is not None and e.position <= position for e in self._entries)

    def lag(self, position: int) -> float:
        """Seconds the oldest entry a projection folded up to ``position`` lacks has waited
        (not committed yet, or committed after ``position``); 0.0 when :meth:`settled`. Appends
        answer in milliseconds, so a lag of seconds means the store is paused, hung or down and
        the projection is older than what this process observed."""
        with self._cond:
            for e in self._entries:  # in arrival order: the first one missing is the oldest
                if e.position is None or e.position > position:
                    return time.monotonic() - e.spooled_at
            return 0.0

    def trim(self, position: int) -> None:
        """Forget committed entries at or before ``position`` (folded into the durable projection)."""
        with self._cond:
            i = 0
            while i < self._next and (self._entries[i].position or 0) <= position:
                i += 1
            if i:
                del self._entries[:i]
                self._next -= i

    def wait_committed(self, entries: Sequence[Entry], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every entry in ``entries`` is committed."""
        with self._cond:
            return self._cond.wait_for(lambda: all(e.position is not None for e in entries) or self._stopped, timeout) and all(
                e.position is not None for e in entries
            )

    def doubts(self) -> list[Entry]:
        """Observations the log refused (set aside) and no later observation of the same object
        and type (stream and event type; arrived later, its ``at`` no earlier) has replaced in the
        log, in arrival order: what the
        durable projection lacks for good. Their events are still here (``Entry.event``), for
        the reconcile loop to hold the admissions they may affect (fail-closed)."""
        with self._cond:
            return sorted(self._doubts.values(), key=_seq_of)

    @property
    def backlog(self) -> int:
        """Entries waiting for the store."""
        with self._cond:
            return len(self._entries) - self._next

    @property
    def healthy(self) -> bool:
        """False while appends are failing (the store is down or refusing)."""
        return self.failing_since is None

    def stalled_for(self) -> float:
        """Seconds the append in flight has been waiting for the store (0 when none): a paused
        or hung server never answers, and its statement timeout is enforced by the server."""
        since = self.writing_since
        return time.monotonic() - since if since is not None else 0.0

    def stop(self, timeout: float = 5.0) -> None:
        """Commit what is queued (best effort within ``timeout`` seconds), then stop the writer.
        What could not be committed is lost with the process: logged as a warning with its count
        (observations are found again by the next leader's relist; a cancel decision's Job is
        gone already, its run then ends for the condition that held)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._cond.wait_for(lambda: self._next >= len(self._entries) or self.failing_since is not None, timeout)
            self._stopped = True
            lost = len(self._entries) - self._next
            self._cond.notify_all()
        if lost:
            log.warning(f"stopping with {lost} spooled record(s) the event log did not accept; they are dropped ({self.last_error or 'the store did not answer'})")
        self._thread.join(max(0.0, deadline - time.monotonic()))

    # -- the writer ---------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = self._backoff[0]
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._next < len(self._entries) or self._stopped)
                if self._stopped:
                    return
                todo = self._entries[self._next :]
            self._before_append()
            try:
                self.writing_since = time.monotonic()
                self._write(todo)
            except Exception as exc:  # noqa: BLE001 - keep the entries and retry
                self.writing_since = None
                text = error_line(exc)
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                    log.error(f"the event log does not accept appends ({text}); spooling in memory")
                self.last_error = text
                with self._cond:
                    if self._cond.wait_for(lambda: self._stopped, backoff):
                        return
                backoff = min(backoff * 2, self._backoff[1])
                continue
            self.writing_since = None
            if self.failing_since is not None:
                log.info(f"the event log accepts appends again after {time.monotonic() - self.failing_since:.1f}s")
            self.failing_since, self.last_error, backoff = None, None, self._backoff[0]
            recovered = False
            with self._cond:
                if self._overflowed and self._next >= len(self._entries):
                    self._overflowed, recovered = False, True
            if recovered:
                self._on_overflow_recovered()

    def _write(self, todo: list[Entry]) -> None:
        """Append ``todo`` in order; a deferred decision waits until its dependencies are committed."""
        chunk: list[Entry] = []
        for entry in todo:
            if entry._make is not None:
                if any(d.position is None for d in entry._deps) and chunk:
                    self._commit(chunk)
                    chunk = []
                event, key = entry._make(_resolve)
                entry.event, entry.record, entry._make = event, encode(event, key), None
            chunk.append(entry)
        if chunk:
            self._commit(chunk)

    def _commit(self, chunk: list[Entry]) -> None:
        """Append ``chunk`` (the next entries not committed, in order) in one transaction; on a
        refusal, in halves until the refused record is alone, which is set aside."""
        try:
            positions = self._append([e.record for e in chunk])
        except RecordRefusedError as exc:
            if self._refused_in_a_row >= MAX_REFUSED_IN_A_ROW:
                raise  # the store refuses everything: retried with back-off (``_run``)
            if len(chunk) == 1:
                self._set_aside(chunk[0], exc)
                return
            half = len(chunk) // 2
            self._commit(chunk[:half])
            self._commit(chunk[half:])
            return
        self._refused_in_a_row = 0
        dups = [e.record.idempotency_key for e, p in zip(chunk, positions) if p is None]
        known = self._positions_of(dups) if dups else {}
        with self._cond:
            for e, p in zip(chunk, positions):
                e.position = p if p is not None else known.get(e.record.idempotency_key, 0)
                e.duplicate = p is None
            self._next += len(chunk)
            self._bytes -= sum(e.size for e in chunk)
            for e, p in zip(chunk, positions):
                if self._waiting.get(e.record.idempotency_key) is e:
                    del self._waiting[e.record.idempotency_key]
                if self._doubts and p is not None and not e.decision:
                    doubt = self._doubts.get((e.record.stream, e.record.type))
                    if doubt is not None and e.record.at >= doubt.record.at:  # a later observation replaces it
                        del self._doubts[(e.record.stream, e.record.type)]
            self.committed += len(chunk)
            self._cond.notify_all()
        for e in chunk:
            if e.decision:
                _log_recorded(e)
        self._on_commit()

    def _set_aside(self, entry: Entry, exc: RecordRefusedError) -> None:
        """``entry`` (the next not committed) was refused by the log on its own: commit it as
        position 0, keep an observation as a doubt, and log its content (the log cannot)."""
        r = entry.record
        text = f"{exc}"
        with self._cond:
            entry.position, entry.refused = 0, text
            self._next += 1
            self._bytes -= entry.size
            if self._waiting.get(r.idempotency_key) is entry:
                del self._waiting[r.idempotency_key]
            self.refused += 1
            self._refused_in_a_row += 1
            if not entry.decision:
                self._doubts[(r.stream, r.type)] = entry
            self._cond.notify_all()
        d = entry.event
        data = r.data if len(r.data) <= REFUSED_DATA_LOGGED else f"{r.data[:REFUSED_DATA_LOGGED]}... ({len(r.data)} characters)"
        what = "decision" if entry.decision else "observation"
        log.error(
            f"the event log refused the {what} {r.type} {r.idempotency_key!r} ({text}); set aside, not retried"
            + ("" if entry.decision else "; admissions it may affect wait until a later observation of the same object and type is stored (fail-closed)")
            + f"; its record: type={r.type} version={r.version} stream={r.stream!r} at={r.at.isoformat()} data={data}",
            extra={"backfill": f"{getattr(d, 'namespace', '')}/{getattr(d, 'backfill', getattr(d, 'name', ''))}", "decision": r.type if entry.decision else None},
        )
        self._on_commit()  # the loop decides again (a doubt holds what it may affect)
        if self._refused_in_a_row == MAX_REFUSED_IN_A_ROW:
            log.error(
                f"the event log refused {MAX_REFUSED_IN_A_ROW} records in a row and accepted none: it is taken to refuse "
                "everything (its schema or server), so nothing more is set aside; appends are retried with back-off"
            )


def _seq_of(e: Entry) -> int:
    return e.seq


def _log_recorded(e: Entry) -> None:
    """One line per decision of this process once it is in the log, naming its real position,
    cause and basis (the cancel's own line, written when its call went out, cannot)."""
    d = e.event
    what = type(d).__name__
    attempt = getattr(d, "attempt", None)
    extra = {"backfill": f"{getattr(d, 'namespace', '')}/{getattr(d, 'backfill', '')}", "position": e.position, "decision": what}
    state = "already recorded (another replica's copy)" if e.duplicate else "recorded"
    log.info(
        f"{state} {what}{f' of attempt {attempt}' if attempt is not None else ''} at position {e.position} "
        f"(cause {getattr(d, 'cause', None)}, basis {getattr(d, 'basis', None)})",
        extra=extra,
    )


def _resolve(ref: Any) -> int:
    if isinstance(ref, Entry):
        if ref.position is None:
            raise RuntimeError("a deferred decision's dependency is not committed")  # never: committed first
        return ref.position
    return int(ref)
