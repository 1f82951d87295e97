"""The in-memory store: the same contract as PostgreSQL (``tests/store/contract.py``), in one
process, for fast tests of the loop, actor and watchers and for ``memory://`` URLs.

Same semantics, same guarantees:

- one write lock (a :class:`threading.Lock`) taken by an append transaction at its first
  append and held until it commits or rolls back, so positions become visible in order and a
  tailing reader never skips one; positions reserved by a rolled-back transaction stay unused;
- idempotency keys unique over the whole log (first occurrence wins), ``data`` must be JSON and
  ``at`` timezone-aware (else the whole append fails);
- what a transaction writes (events, keys, checkpoints, snapshots) becomes visible at once on
  commit; run rows and their checkpoint likewise;
- :meth:`MemoryEventStore.wait` wakes on a commit (a :class:`threading.Condition`) and
  re-checks the head every ``poll`` seconds regardless;
- run rows are checked like the table's constraints (``result`` one of
  :data:`backfill.core.runs.RESULTS` or None).

Not durable, not shared between processes. ``data`` comes back as it was given (PostgreSQL
returns its ``jsonb`` rendering); compare parsed JSON, never the text.
"""

from __future__ import annotations

import bisect
import itertools
import json
import threading
import uuid
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from backfill.core.records import EventRecord, StoredEvent
from backfill.core.runs import RESULTS, RunRow
from backfill.core.storable import JSON_NUL, NUL, nul_path
from backfill.store.interface import Payload, RecordRefusedError
from backfill.store.schema import RUN_COLUMNS

DEFAULT_SNAPSHOT_KEEP = 3


@dataclass
class _Snapshot:
    name: str
    version: str
    position: int
    created_at: datetime
    payload: bytes


@dataclass
class _Pending:
    events: list[StoredEvent] = field(default_factory=list)
    keys: dict[str, int] = field(default_factory=dict)
    checkpoints: dict[str, int] = field(default_factory=dict)
    snapshots: list[tuple[_Snapshot, int]] = field(default_factory=list)


class MemoryBackend:
    """The shared state of one in-memory store: log, keys, checkpoints, snapshots, runs.

    ``events`` and ``runs`` are its two faces (:class:`MemoryEventStore`, :class:`MemoryRunStore`).
    """

    def __init__(self, *, snapshot_keep: int = DEFAULT_SNAPSHOT_KEEP, poll: float = 1.0) -> None:
        self.write_lock = threading.Lock()
        self.state = threading.Condition(threading.Lock())
        self.log: list[StoredEvent] = []
        self.positions: list[int] = []
        self.keys: dict[str, int] = {}
        self.checkpoints: dict[str, int] = {}
        self.snapshots: dict[str, list[_Snapshot]] = {}
        self.runs_rows: dict[tuple[str, int, int], RunRow] = {}
        self.next_position = 1
        self.identity = uuid.uuid4().hex  # the log's id (PostgreSQL: the log_identity table)
        self.events = MemoryEventStore(self, poll=poll, snapshot_keep=snapshot_keep)
        self.runs = MemoryRunStore(self)

    # -- commit -------------------------------------------------------------------------------

    def commit(self, pending: _Pending, *, notify: bool = True) -> None:
        """Publish a transaction's writes at once (the caller holds the write lock if it
        wrote events)."""
        with self.state:
            for ev in pending.events:
                self.log.append(ev)
                self.positions.append(ev.position)
            self.keys.update(pending.keys)
            self.checkpoints.update(pending.checkpoints)
            for snap, keep in pending.snapshots:
                kept = [s for s in self.snapshots.get(snap.name, []) if (s.version, s.position) != (snap.version, snap.position)]
                kept.append(snap)
                kept.sort(key=lambda s: (s.position, s.created_at))
                # the newest ``keep`` of the writing version, and the newest of every other one
                others = {s.version: s for s in kept if s.version != snap.version}
                mine = [s for s in kept if s.version == snap.version][-keep:]
                self.snapshots[snap.name] = sorted(mine + list(others.values()), key=lambda s: (s.position, s.created_at))
            if notify and pending.events:
                self.state.notify_all()

    def wake(self) -> None:
        """Wake every :meth:`MemoryEventStore.wait` without an event (a spurious wake-up)."""
        with self.state:
            self.state.notify_all()


class MemoryAppendTransaction:
    """An open append transaction of the in-memory store (see :class:`AppendTransaction`)."""

    def __init__(self, backend: MemoryBackend, store: MemoryEventStore) -> None:
        self._backend = backend
        self._store = store
        self._pending = _Pending()
        self.locked = False

    def lock(self) -> None:
        """Take the log's write lock now (held until the transaction ends; idempotent)."""
        if not self.locked:
            self._backend.write_lock.acquire()
            self.locked = True

    def append(self, records: Sequence[EventRecord]) -> list[int | None]:
        """Like :meth:`MemoryEventStore.append`, inside this transaction."""
        if not records:
            return []
        self.lock()
        b, p = self._backend, self._pending
        fresh: list[int] = []
        seen: set[str] = set()
        for i, r in enumerate(records):
            key = r.idempotency_key
            if key in seen or key in b.keys or key in p.keys:
                continue
            seen.add(key)
            fresh.append(i)
        for i in fresh:  # validate everything before taking positions
            refusal = _refusal(records[i])
            if refusal:
                raise RecordRefusedError(f"event {records[i].idempotency_key!r}: {refusal}")
        result: list[int | None] = [None] * len(records)
        now = datetime.now(timezone.utc)
        for i in fresh:
            r = records[i]
            position = b.next_position
            b.next_position += 1
            p.events.append(StoredEvent(position, now, r.type, r.version, r.stream, r.idempotency_key, r.at.astimezone(timezone.utc), r.data))
            p.keys[r.idempotency_key] = position
            result[i] = position
        return result

    def set_checkpoint(self, name: str, position: int) -> None:
        """Set checkpoint ``name`` in this transaction."""
        self._pending.checkpoints[name] = int(position)

    def save_snapshot(self, name: str, position: int, version: str, payload: bytes, *, keep: int | None = None) -> None:
        """Like :meth:`MemoryEventStore.save_snapshot`, in this transaction."""
        keep = self._store.snapshot_keep if keep is None else keep
        if keep < 1:
            raise ValueError("keep must be >= 1")
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"snapshot payload must be bytes, not {type(payload).__name__}")
        snap = _Snapshot(name, str(version), int(position), datetime.now(timezone.utc), bytes(payload))
        self._pending.snapshots.append((snap, keep))
        self._pending.checkpoints[name] = int(position)

    def _finish(self, commit: bool, notify: bool = True) -> None:
        try:
            if commit:
                self._backend.commit(self._pending, notify=notify)
        finally:
            self._pending = _Pending()
            if self.locked:
                self.locked = False
                self._backend.write_lock.release()


class MemoryEventStore:
    """The event log and snapshots of a :class:`MemoryBackend` (the :class:`EventLog` and
    :class:`Snapshots` protocols of :mod:`backfill.store.interface`). Thread-safe."""

    def __init__(self, backend: MemoryBackend, *, poll: float = 1.0, snapshot_keep: int = DEFAULT_SNAPSHOT_KEEP) -> None:
        if snapshot_keep < 1:
            raise ValueError("snapshot_keep must be >= 1")
        self._b = backend
        self.poll = poll
        self.snapshot_keep = snapshot_keep

    @property
    def backend(self) -> MemoryBackend:
        return self._b

    # -- writing ------------------------------------------------------------------------------

    @contextmanager
    def begin(self, *, notify: bool = True) -> Iterator[MemoryAppendTransaction]:
        """An append transaction: commits when the block ends, rolls back if it raises.
        ``notify=False`` commits without waking waiters (tests of the polling fallback)."""
        tx = MemoryAppendTransaction(self._b, self)
        try:
            yield tx
        except BaseException:
            tx._finish(False)
            raise
        tx._finish(True, notify)

    def append(self, records: Sequence[EventRecord]) -> list[int | None]:
        """Append ``records`` in one transaction (see :meth:`EventLog.append`)."""
        if not records:
            return []
        with self.begin() as tx:
            return tx.append(records)

    # -- reading ------------------------------------------------------------------------------

    def _committed_after(self, after: int, upto: int | None) -> list[StoredEvent]:
        with self._b.state:
            lo = bisect.bisect_right(self._b.positions, after)
            hi = len(self._b.positions) if upto is None else bisect.bisect_right(self._b.positions, upto)
            return self._b.log[lo:hi]

    def read(
        self,
        after: int = 0,
        *,
        upto: int | None = None,
        batch_size: int = 10000,
        stream_prefix: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> Iterator[StoredEvent]:
        """Events with ``after < position [<= upto]`` in position order, filtered like
        :meth:`backfill.store.EventStore.read` (what was committed when the read began)."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        events = self._committed_after(int(after), upto)

        def keep(e: StoredEvent) -> bool:
            return (
                (not stream_prefix or e.stream.startswith(stream_prefix))
                and (since is None or e.at >= since)
                and (until is None or e.at < until)
            )

        return iter([e for e in events if keep(e)] if (stream_prefix or since or until) else events)

    def read_batches(self, after: int = 0, **kwargs: Any) -> Iterator[list[StoredEvent]]:
        """Like :meth:`read`, in lists of up to ``batch_size`` events."""
        batch_size = kwargs.get("batch_size", 10000)
        it = self.read(after, **kwargs)
        while batch := list(itertools.islice(it, batch_size)):
            yield batch

    def read_payloads(self, after: int = 0, *, batch_size: int = 20000) -> Iterator[list[Payload]]:
        """Batches of ``(position, type, version, data)`` after ``after``, in order."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        events = self._committed_after(int(after), None)
        for s in range(0, len(events), batch_size):
            yield [(e.position, e.type, e.version, e.data) for e in events[s : s + batch_size]]

    def positions_of(self, keys: Sequence[str]) -> dict[str, int]:
        """``{key: position}`` of the committed events with these idempotency keys."""
        with self._b.state:
            return {k: self._b.keys[k] for k in keys if k in self._b.keys}

    def head(self) -> int:
        """The greatest committed position (0 when the log is empty)."""
        with self._b.state:
            return self._b.positions[-1] if self._b.positions else 0

    def first_position(self) -> int:
        """The smallest stored position (0 when the log is empty)."""
        with self._b.state:
            return self._b.positions[0] if self._b.positions else 0

    def log_identity(self) -> str | None:
        """This log's random id (one per backend)."""
        return self._b.identity

    def pruned_up_to(self) -> int:
        """0: the in-memory log is never pruned (``backfill db prune`` is PostgreSQL's)."""
        return 0

    def count(self) -> int:
        """Number of stored events."""
        with self._b.state:
            return len(self._b.positions)

    def wait(self, after: int, timeout: float, *, poll: float | None = None) -> bool:
        """Block until an event with position > ``after`` is committed (True) or ``timeout``
        seconds pass (False); wakes on a commit, and re-checks every ``poll`` seconds."""
        poll = self.poll if poll is None else poll
        deadline = time.monotonic() + max(0.0, timeout)
        with self._b.state:
            while True:
                if self._b.positions and self._b.positions[-1] > after:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._b.state.wait(min(poll, remaining))

    # -- checkpoints and snapshots ------------------------------------------------------------

    def get_checkpoint(self, name: str) -> int:
        """The position checkpoint ``name`` was last set to (0 when never set)."""
        with self._b.state:
            return self._b.checkpoints.get(name, 0)

    def set_checkpoint(self, name: str, position: int) -> None:
        """Set checkpoint ``name`` on its own."""
        self._b.commit(_Pending(checkpoints={name: int(position)}))

    def save_snapshot(self, name: str, position: int, version: str, payload: bytes, *, keep: int | None = None) -> None:
        """Store snapshot ``name`` and set checkpoint ``name``, at once (see :class:`Snapshots`)."""
        tx = MemoryAppendTransaction(self._b, self)
        tx.save_snapshot(name, position, version, payload, keep=keep)
        tx._finish(True)

    def _snapshot(self, name: str, version: str, upto: int | None) -> tuple[int, bytes] | None:
        with self._b.state:
            for s in reversed(self._b.snapshots.get(name, [])):
                if s.version == str(version) and (upto is None or s.position <= upto):
                    return s.position, s.payload
        return None

    def load_snapshot(self, name: str, version: str) -> tuple[int, bytes] | None:
        """``(position, payload)`` of the newest snapshot ``name`` of ``version``, or None."""
        return self._snapshot(name, version, None)

    def snapshot_before(self, name: str, position: int, version: str) -> tuple[int, bytes] | None:
        """The newest snapshot ``name`` of ``version`` at or before ``position``, or None."""
        return self._snapshot(name, version, int(position))

    def snapshot_from(self, name: str, position: int, version: str) -> tuple[int, bytes] | None:
        """The oldest snapshot ``name`` of ``version`` at or after ``position``, or None."""
        with self._b.state:
            for s in self._b.snapshots.get(name, []):
                if s.version == str(version) and s.position >= int(position):
                    return s.position, s.payload
        return None

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> MemoryEventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_REQUIRED_TEXT = ("namespace", "backfill", "backfill_uid", "model", "node", "job_name", "job_uid", "reason")


def _check_row(row: RunRow) -> None:
    for name in _REQUIRED_TEXT:
        if getattr(row, name) is None:
            raise ValueError(f"run {row.backfill_uid}/{row.attempt}: {name} must not be null")
    if row.admitted_at is None or row.admitted_at.tzinfo is None:
        raise ValueError(f"run {row.backfill_uid}/{row.attempt}: admitted_at must be timezone-aware")
    if row.result is not None and row.result not in RESULTS:
        raise ValueError(f"run {row.backfill_uid}/{row.attempt}: unknown result {row.result!r}")


class MemoryRunStore:
    """The run history of a :class:`MemoryBackend` (the :class:`RunRows` protocol)."""

    def __init__(self, backend: MemoryBackend) -> None:
        self._b = backend

    def apply(self, rows: Sequence[RunRow], checkpoint: str, position: int) -> None:
        """Upsert ``rows`` by (backfill_uid, attempt, segment), last wins, and set ``checkpoint``,
        atomically; raises :class:`ValueError` (and changes nothing) on an invalid row."""
        latest: dict[tuple[str, int, int], RunRow] = {}
        for row in rows:
            _check_row(row)
            latest[row.identity] = row
        with self._b.state:
            self._b.runs_rows.update(latest)
            self._b.checkpoints[checkpoint] = int(position)

    def get_checkpoint(self, name: str) -> int:
        """The position checkpoint ``name`` was last set to (0 when never set)."""
        return self._b.events.get_checkpoint(name)

    def _rows(self) -> list[RunRow]:
        with self._b.state:
            return list(self._b.runs_rows.values())

    def query(
        self,
        namespace: str | None = None,
        backfill: str | None = None,
        model: str | None = None,
        result: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
        newest: bool = False,
    ) -> list[RunRow]:
        """Runs matching every given filter, oldest admission first (as RunStore.query)."""
        rows = [
            r
            for r in self._rows()
            if (namespace is None or r.namespace == namespace)
            and (backfill is None or r.backfill == backfill)
            and (model is None or r.model == model)
            and (result is None or (r.result is None if result == "running" else r.result == result))
            and (since is None or r.admitted_at >= since)
        ]
        rows.sort(key=lambda r: (r.admitted_at, r.backfill_uid, r.attempt, r.segment), reverse=newest)
        if limit is not None:
            rows = rows[:limit]
        return rows[::-1] if newest else rows

    def latest(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The latest segment of each (namespace, backfill), as the ``latest_runs`` view."""
        best: dict[tuple[str, str], RunRow] = {}
        for r in self._rows():
            if namespace is not None and r.namespace != namespace:
                continue
            k = (r.namespace, r.backfill)
            if k not in best or (r.admitted_at, r.attempt, r.segment) > (best[k].admitted_at, best[k].attempt, best[k].segment):
                best[k] = r
        return [{c: getattr(best[k], c) for c in RUN_COLUMNS} for k in sorted(best)]

    def model_totals(self, namespace: str | None = None, model: str | None = None) -> list[dict[str, Any]]:
        """Per (namespace, model) attempts, outcomes, useful and wasted seconds, as the
        ``model_run_totals`` view."""
        groups: dict[tuple[str, str], list[RunRow]] = {}
        for r in self._rows():
            if (namespace is None or r.namespace == namespace) and (model is None or r.model == model):
                groups.setdefault((r.namespace, r.model), []).append(r)
        out = []
        for (ns, m), rs in sorted(groups.items()):
            count = lambda res: sum(1 for r in rs if r.result == res)  # noqa: E731
            out.append(
                {
                    "namespace": ns,
                    "model": m,
                    "attempts": len(rs),
                    "succeeded": count("succeeded"),
                    "preempted": count("preempted"),
                    "failed": count("failed"),
                    "deadline_exceeded": count("deadline_exceeded"),
                    "cancelled": count("cancelled"),
                    "running": count(None),
                    "useful_seconds": float(sum(r.useful_seconds for r in rs)),
                    "wasted_seconds": float(sum(r.wasted_seconds for r in rs)),
                }
            )
        return out

    def preemptions_by_reason(self, namespace: str | None = None, model: str | None = None) -> list[dict[str, Any]]:
        """Per (namespace, model, reason) over preempted runs: count and wasted seconds, as the
        ``preemptions_by_reason`` view."""
        groups: dict[tuple[str, str, str], list[RunRow]] = {}
        for r in self._rows():
            if r.result == "preempted" and (namespace is None or r.namespace == namespace) and (model is None or r.model == model):
                groups.setdefault((r.namespace, r.model, r.reason), []).append(r)
        return [
            {"namespace": ns, "model": m, "reason": reason, "preemptions": len(rs), "wasted_seconds": float(sum(r.wasted_seconds for r in rs))}
            for (ns, m, reason), rs in sorted(groups.items())
        ]


_named_lock = threading.Lock()
_named: dict[tuple[str, str], MemoryBackend] = {}


def memory_backend(name: str = "", schema: str = "backfill") -> MemoryBackend:
    """A fresh backend (``name`` empty) or the process-wide backend ``(name, schema)``."""
    if not name:
        return MemoryBackend()
    with _named_lock:
        backend = _named.get((name, schema))
        if backend is None:
            backend = _named[(name, schema)] = MemoryBackend()
        return backend


def _refusal(r: EventRecord) -> str:
    """Why PostgreSQL would refuse ``r`` (:func:`backfill.store.eventlog.refuses_record`), or ""
    when it would not: the same records are refused by both stores (the contract suite)."""
    if r.at.tzinfo is None:
        return "'at' must be timezone-aware"
    for name, text in (("type", r.type), ("stream", r.stream), ("idempotency_key", r.idempotency_key), ("data", r.data)):
        try:
            text.encode("utf-8")
        except UnicodeError as exc:
            return f"{name} is not UTF-8: {exc}"
        if name != "data" and NUL in text:
            return f"{name} holds a NUL character (PostgreSQL text holds none)"
    try:
        data = json.loads(r.data)
    except (TypeError, ValueError) as exc:
        return f"data is not JSON: {exc}"
    if JSON_NUL in r.data and nul_path(data, "data"):
        return "data holds \\u0000 (PostgreSQL jsonb holds none)"
    return ""


__all__ = ["MemoryBackend", "MemoryEventStore", "MemoryRunStore", "MemoryAppendTransaction", "memory_backend"]
