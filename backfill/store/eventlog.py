"""The append-only event log on PostgreSQL.

Ordering guarantee (what makes tailing safe)
--------------------------------------------
A reader that has seen every event up to position ``p`` and then asks for ``position > p`` must
never miss an event that commits later with a smaller position. Sequences alone do not give
that: two transactions can take positions 7 and 8 and commit as 8 then 7. Every append therefore
takes the log's write lock before it reserves positions and holds it until commit, so appends
are serialized and positions become visible in order. The write lock is a transaction-level
advisory lock, ``pg_advisory_xact_lock(1650879591, hashtext(<schema>))`` (one per schema):
unlike ``LOCK TABLE events IN EXCLUSIVE MODE`` it never conflicts with (auto)vacuum, and like it
it never blocks readers (``read``, ``head``). A rolled-back append leaves a gap in the positions,
which readers simply never see filled; nothing ever skips a gap on a timer. Anything else that
inserts into ``events`` must take the same lock (:meth:`AppendTransaction.lock`).

Idempotency
-----------
Each record carries an ``idempotency_key``, unique in ``event_keys`` (``events`` is partitioned
by position, see :mod:`backfill.store.retention`). Under the lock the append looks up which keys
of the batch are already stored, drops those and later repeats inside the batch (the first
occurrence wins), reserves exactly as many positions as remain from the position sequence,
makes sure partitions cover them (creating the next one ahead when needed) and COPYs the rows
into ``events`` and their keys into ``event_keys``. Re-appending a stored key therefore neither
stores it again nor burns a position.

Snapshots
---------
:meth:`EventStore.save_snapshot` stores a projection's serialized state (opaque bytes) at a
position, tagged with the code version that wrote it, and moves the checkpoint of the same name
to that position in the same transaction; it keeps the newest ``keep`` snapshots of the name.
:meth:`EventStore.load_snapshot` returns the newest one *of the caller's code version* (a
snapshot of another version is never returned, so the caller refolds from the log instead of
misreading it); :meth:`EventStore.snapshot_before` the newest at or before a position.

Speed
-----
Measured on the embedded server with 200k ~150-byte events (see ``bench/bench_store.py``):
binary COPY straight into ``events`` with pre-checked keys ran at ~85% of a raw binary COPY of
the same rows in the same batches before partitioning, and at 64-82% (batches of 1,000 and
10,000) with the partitions and the second COPY into ``event_keys``; prototypes of a COPY into a temp staging table followed by
``INSERT ... SELECT ... ON CONFLICT DO NOTHING RETURNING`` reached ~55% (batches of 10,000; ~25%
with 1,000) and ``executemany`` in pipeline mode ~40%, so neither is used. Reads use keyset pagination
on ``position`` with a binary cursor and build :class:`StoredEvent` from the fetched tuples with
``itertools.starmap``. :meth:`EventStore.read_payloads` reads the next batch on a helper thread
while the caller folds one. The helper needs the interpreter lock for every chunk it takes off
the socket: with Python's default 5 ms switch interval the overlap was small (1.05-1.15x on a full
replay); start-up and ``backfill replay`` fold inside :func:`backfill.core.perf.long_fold` (a
0.2 ms switch interval), where the read-ahead gave 1.31x and the switch interval 1.26x on the
log of foreground requests (``python -m bench --only replay``, rows "read-ahead" and "switch
interval", 2026-12-05).

Wake-ups
--------
An append issues ``pg_notify('backfill_events_<schema>', <last position>)`` in its transaction.
:meth:`EventStore.wait` LISTENs on that channel, but treats a notification only as a hint to look
at :meth:`EventStore.head` again, and polls ``head()`` every ``poll`` seconds regardless.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy.engine import Engine

from backfill.core.records import EventRecord, StoredEvent
from backfill.errorlines import error_line
from backfill.store.engine import engine_schema
from backfill.store.interface import RecordRefusedError
from backfill.store.retention import DEFAULT_PARTITION_SIZE, ensure_partitions, list_partitions, pruned_up_to

_COLUMNS = "position, recorded_at, type, version, stream, idempotency_key, at, data::text"
_COPY_SQL = "COPY events (position, type, version, stream, idempotency_key, at, data) FROM STDIN (FORMAT BINARY)"
_COPY_TYPES = ("int8", "text", "int2", "text", "text", "timestamptz", "bytea")
_COPY_KEYS_SQL = "COPY event_keys (idempotency_key, position) FROM STDIN (FORMAT BINARY)"
_COPY_KEYS_TYPES = ("text", "int8")
_COPY_CHUNK = 50_000  # rows per COPY statement of a large append
#: Snapshots of one name kept by :meth:`EventStore.save_snapshot` unless told otherwise.
DEFAULT_SNAPSHOT_KEEP = 3
_JSONB_V1 = b"\x01"  # jsonb binary wire format: version byte + JSON text
#: The write lock: a transaction-level advisory lock in the two-key space ("bflg", schema hash).
_LOCK_SQL = "SELECT pg_advisory_xact_lock(1650879591, hashtext(%s))"


def channel_name(schema: str) -> str:
    """The NOTIFY channel of the log in ``schema`` (at most 63 characters)."""
    name = f"backfill_events_{schema}"
    if len(name) > 63:
        name = "backfill_events_" + hashlib.sha256(schema.encode()).hexdigest()[:32]
    return name


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def get_checkpoint(conn: psycopg.Connection[Any], name: str) -> int:
    """The stored position of checkpoint ``name`` (0 when never set), on a psycopg connection."""
    row = conn.execute("SELECT position FROM checkpoints WHERE name = %s", (name,)).fetchone()
    return int(row[0]) if row else 0


def set_checkpoint(conn: psycopg.Connection[Any], name: str, position: int) -> None:
    """Upsert checkpoint ``name`` inside the caller's transaction, on a psycopg connection."""
    conn.execute(
        "INSERT INTO checkpoints (name, position, updated_at) VALUES (%s, %s, now()) "
        "ON CONFLICT (name) DO UPDATE SET position = EXCLUDED.position, updated_at = EXCLUDED.updated_at",
        (name, int(position)),
    )


def save_snapshot(
    conn: psycopg.Connection[Any], name: str, position: int, version: str, payload: bytes, keep: int = DEFAULT_SNAPSHOT_KEEP
) -> None:
    """Store snapshot ``name`` at ``position`` by code ``version``, set checkpoint ``name`` to
    ``position`` and keep of ``name`` only the newest ``keep`` snapshots of ``version`` and the
    newest one of every other version (by position), all inside the caller's transaction. The
    other versions' newest stay so that a rollback to the release that wrote one can start from
    it (a trial: the upgraded release's snapshots pushed the older release's out, and after a
    prune the rollback could not start). Saving the same (name, version, position) again
    replaces its payload."""
    if keep < 1:
        raise ValueError("keep must be >= 1")
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"snapshot payload must be bytes, not {type(payload).__name__}")
    conn.execute(
        "INSERT INTO snapshots (name, code_version, position, created_at, payload) VALUES (%s, %s, %s, now(), %s) "
        "ON CONFLICT (name, code_version, position) DO UPDATE SET payload = EXCLUDED.payload, created_at = EXCLUDED.created_at",
        (name, str(version), int(position), bytes(payload)),
    )
    set_checkpoint(conn, name, position)
    conn.execute(
        "DELETE FROM snapshots s WHERE s.name = %(name)s AND CASE WHEN s.code_version = %(version)s "
        "THEN (s.position, s.created_at) < (SELECT position, created_at FROM snapshots WHERE name = %(name)s "
        "AND code_version = %(version)s ORDER BY position DESC, created_at DESC OFFSET %(skip)s LIMIT 1) "
        "ELSE EXISTS (SELECT 1 FROM snapshots t WHERE t.name = s.name AND t.code_version = s.code_version "
        "AND (t.position, t.created_at) > (s.position, s.created_at)) END",
        {"name": name, "version": str(version), "skip": keep - 1},
    )


def _snapshot(conn: psycopg.Connection[Any], name: str, version: str, upto: int | None) -> tuple[int, bytes] | None:
    row = conn.execute(
        "SELECT position, payload FROM snapshots WHERE name = %s AND code_version = %s "
        "AND (%s::bigint IS NULL OR position <= %s::bigint) ORDER BY position DESC LIMIT 1",
        (name, str(version), upto, upto),
    ).fetchone()
    return (int(row[0]), bytes(row[1])) if row else None


class AppendTransaction:
    """An open append transaction (from :meth:`EventStore.begin`).

    Holds the log's write lock from its first :meth:`append` (or :meth:`lock`) until commit,
    so later appends by others wait and positions stay in commit order.
    """

    def __init__(self, store: EventStore, conn: psycopg.Connection[Any]) -> None:
        self._store = store
        self._conn = conn
        self._locked = False

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The underlying psycopg connection (to write more in the same transaction)."""
        return self._conn

    def lock(self) -> None:
        """Take the log's write lock now (held until the transaction ends; idempotent).

        Needed only to write into ``events`` by other means than :meth:`append`."""
        if not self._locked:
            self._conn.execute(_LOCK_SQL, (self._store.schema,))
            self._locked = True

    def append(self, records: Sequence[EventRecord]) -> list[int | None]:
        """Like :meth:`EventStore.append`, inside this transaction (not committed yet)."""
        if not records:
            return []
        self.lock()
        try:
            with self._conn.cursor(binary=True) as cur:
                return self._store._append_locked(cur, records)
        except (psycopg.Error, UnicodeError) as exc:
            if refuses_record(exc):
                raise RecordRefusedError(f"the event log refuses a record of the batch: {error_line(exc)}") from exc
            raise

    def set_checkpoint(self, name: str, position: int) -> None:
        """Set checkpoint ``name`` in this transaction."""
        set_checkpoint(self._conn, name, position)

    def save_snapshot(self, name: str, position: int, version: str, payload: bytes, *, keep: int | None = None) -> None:
        """Like :meth:`EventStore.save_snapshot`, in this transaction."""
        save_snapshot(self._conn, name, position, version, payload, self._store.snapshot_keep if keep is None else keep)


class LogLayoutError(RuntimeError):
    """The log cannot hand out positions (its sequence, or a new partition's bound, out of
    range): a fault of the store, retried like one, never a refusal of the records (an
    adversarial trial: a partition size past bigint made every append's partition ``22003``,
    and the spool set every fresh event aside while ``/readyz`` said ok)."""


def refuses_record(exc: BaseException) -> bool:
    """Whether an append's error is PostgreSQL (or psycopg) refusing a record for what it holds
    (:class:`~backfill.store.interface.RecordRefusedError`): SQLSTATE class 22 (data exception:
    ``\\u0000`` in jsonb, text that is not JSON, ...) or 54 (program limit exceeded: an index row
    over its size), psycopg's refusal to send a value (a NUL in text: a ``DataError`` without a
    SQLSTATE), or a string that does not encode as UTF-8. A connection lost, a statement
    timeout, a lock or a missing table is not: those are retried."""
    if isinstance(exc, UnicodeError):
        return True
    state = getattr(exc, "sqlstate", None) or ""
    return isinstance(exc, psycopg.DataError) or state[:2] in ("22", "54")


def _read_ahead(read: Any, *args: Any) -> Future[Any]:
    """``read(*args)`` on a new daemon thread (``backfill-read-ahead``); its result or its
    exception through the returned future."""
    future: Future[Any] = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(read(*args))
        except BaseException as exc:  # handed to the reader, raised there
            future.set_exception(exc)

    threading.Thread(target=run, name="backfill-read-ahead", daemon=True).start()
    return future


log = logging.getLogger("backfill.store.eventlog")

#: Seconds :meth:`EventStore.close` waits for the LISTEN connection to be free.
CLOSE_WAIT_SECONDS = 2.0


class EventStore:
    """The event log in the schema an engine from :func:`backfill.store.make_engine` is bound to.

    Thread-safe: every call checks a connection out of the engine's pool.

    Args:
        engine: from :func:`backfill.store.make_engine`.
        poll: default polling period of :meth:`wait`, seconds.
        partition_size: positions per partition of ``events`` created by the appends
            (Settings.event_partition_size).
        snapshot_keep: snapshots kept per name by :meth:`save_snapshot` (Settings.snapshot_keep).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        poll: float = 1.0,
        partition_size: int = DEFAULT_PARTITION_SIZE,
        snapshot_keep: int = DEFAULT_SNAPSHOT_KEEP,
    ) -> None:
        if partition_size < 1:
            raise ValueError("partition_size must be >= 1")
        if snapshot_keep < 1:
            raise ValueError("snapshot_keep must be >= 1")
        self._engine = engine
        self.partition_size = partition_size
        self.snapshot_keep = snapshot_keep
        self._covered = 0  # end (exclusive) of the last partition, as last seen under the lock
        self.schema = engine_schema(engine)
        self.channel = channel_name(self.schema)
        self.poll = poll
        self._sequence: str | None = None
        self._listener: psycopg.Connection[Any] | None = None
        self._listener_lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        return self._engine

    # -- connections --------------------------------------------------------------------------

    @contextmanager
    def _raw(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled psycopg connection; rolled back (by the pool) unless committed."""
        fairy = self._engine.raw_connection()
        try:
            yield fairy.driver_connection  # type: ignore[misc]
        finally:
            fairy.close()

    # -- writing ------------------------------------------------------------------------------

    @contextmanager
    def begin(self) -> Iterator[AppendTransaction]:
        """An append transaction: commits when the block ends, rolls back if it raises.

        Use it to append several batches (and set checkpoints) atomically::

            with store.begin() as tx:
                tx.append(records)
                tx.set_checkpoint("actor", position)
        """
        with self._raw() as conn:
            tx = AppendTransaction(self, conn)
            try:
                yield tx
            except BaseException:
                self._covered = 0  # a partition this transaction created is gone again
                try:
                    conn.rollback()
                except Exception:  # noqa: BLE001 - keep the original error; the pool discards a broken connection
                    pass
                raise
            conn.commit()

    def append(self, records: Sequence[EventRecord]) -> list[int | None]:
        """Append ``records`` in one transaction.

        Returns, for each input record, its new position, or None when its idempotency key was
        already stored (or repeated earlier in ``records``: the first occurrence wins). New
        positions increase in input order. Raises
        :class:`~backfill.store.interface.RecordRefusedError` on a record PostgreSQL cannot hold
        (``data`` that is not JSON or holds ``\\u0000``, a naive ``at``, :func:`refuses_record`),
        in which case nothing is stored.
        """
        if not records:
            return []
        with self.begin() as tx:
            return tx.append(records)

    def _sequence_name(self, cur: psycopg.Cursor[Any]) -> str:
        if self._sequence is None:
            cur.execute("SELECT pg_get_serial_sequence('events', 'position')")
            self._sequence = cur.fetchone()[0]  # type: ignore[index]
        return self._sequence  # type: ignore[return-value]

    def _append_locked(self, cur: psycopg.Cursor[Any], records: Sequence[EventRecord]) -> list[int | None]:
        """Append under the write lock (already held by the caller's transaction)."""
        first_index: dict[str, int] = {}
        for i, r in enumerate(records):
            if r.idempotency_key not in first_index:
                first_index[r.idempotency_key] = i
        cur.execute(
            "SELECT idempotency_key FROM event_keys WHERE idempotency_key = ANY(%s)",
            (list(first_index),),
        )
        stored = {row[0] for row in cur.fetchall()}
        fresh = [i for key, i in first_index.items() if key not in stored] if stored else list(first_index.values())
        result: list[int | None] = [None] * len(records)
        n = len(fresh)
        if n == 0:
            return result
        for i in fresh:
            if records[i].at.tzinfo is None:
                raise RecordRefusedError(f"event {records[i].idempotency_key!r}: 'at' must be timezone-aware")
        seq = self._sequence_name(cur)
        # Reserve n consecutive positions. Safe because the write lock serializes appends.
        try:
            cur.execute("SELECT setval(%s::regclass, nextval(%s::regclass) + %s - 1)", (seq, seq, n))
            last = int(cur.fetchone()[0])  # type: ignore[index]
            if last + self.partition_size // 2 >= self._covered:
                self._covered = ensure_partitions(cur.connection, last, self.partition_size)
        except psycopg.Error as exc:
            if refuses_record(exc):  # a data exception of the log's own (a sequence or a bound out of range)
                raise LogLayoutError(f"the event log cannot make room for {n} position(s): {error_line(exc)}") from exc
            raise
        position = last - n + 1
        # One COPY per chunk: each statement stays well inside the statement timeout.
        for s in range(0, n, _COPY_CHUNK):
            chunk = fresh[s : s + _COPY_CHUNK]
            first = position
            with cur.copy(_COPY_SQL) as copy:
                copy.set_types(_COPY_TYPES)
                write = copy.write_row
                for i in chunk:
                    r = records[i]
                    write((position, r.type, r.version, r.stream, r.idempotency_key, r.at, _JSONB_V1 + r.data.encode()))
                    result[i] = position
                    position += 1
            with cur.copy(_COPY_KEYS_SQL) as copy:
                copy.set_types(_COPY_KEYS_TYPES)
                write = copy.write_row
                for p, i in enumerate(chunk, first):
                    write((records[i].idempotency_key, p))
        cur.execute("SELECT pg_notify(%s, %s)", (self.channel, str(last)))
        return result

    # -- reading ------------------------------------------------------------------------------

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
        """Events with ``after < position [<= upto]``, in position order.

        Streams in batches of ``batch_size`` (keyset pagination, each batch its own short read
        transaction) and stops at the first short batch, so a reader tailing a live log sees
        what was committed when it got there. ``data`` is the event's JSON text as PostgreSQL
        renders ``jsonb`` (keys may be reordered, whitespace normalized).

        Filters: ``stream_prefix`` (``stream`` starts with it), ``since`` (``at >= since``),
        ``until`` (``at < until``).
        """
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        where = ["position > %s"]
        params: list[Any] = []
        if upto is not None:
            where.append("position <= %s")
            params.append(int(upto))
        if stream_prefix:
            where.append("stream LIKE %s")
            params.append(_like_prefix(stream_prefix))
        if since is not None:
            where.append("at >= %s")
            params.append(since)
        if until is not None:
            where.append("at < %s")
            params.append(until)
        sql = f"SELECT {_COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY position LIMIT %s"
        return self._read(sql, int(after), params, batch_size)

    def _read(self, sql: str, after: int, params: list[Any], batch_size: int) -> Iterator[StoredEvent]:
        make = StoredEvent
        starmap = itertools.starmap
        while True:
            with self._raw() as conn:
                with conn.cursor(binary=True) as cur:
                    cur.execute(sql, (after, *params, batch_size))
                    rows = cur.fetchall()
            if not rows:
                return
            after = rows[-1][0]
            yield from starmap(make, rows)
            if len(rows) < batch_size:
                return

    def read_batches(self, after: int = 0, **kwargs: Any) -> Iterator[list[StoredEvent]]:
        """Like :meth:`read`, but yields lists of up to ``batch_size`` events."""
        batch_size = kwargs.get("batch_size", 10000)
        it = self.read(after, **kwargs)
        while batch := list(itertools.islice(it, batch_size)):
            yield batch

    def read_payloads(self, after: int = 0, *, batch_size: int = 20000) -> Iterator[list[tuple[int, str, int, str]]]:
        """The replay fast path: batches of ``(position, type, version, data)`` tuples, in order.

        No ``StoredEvent`` objects and only the four columns a fold needs (about 3x the rows/s of
        :meth:`read`). Same consistency as :meth:`read`: stops at the first short batch.

        Read-ahead: after a full batch, the next one is read on a helper thread (its own pooled
        connection) while the caller works on this one, so part of the read overlaps the
        caller's fold (1.05-1.15x on a full replay: the helper needs the interpreter lock for
        every chunk it takes off the socket). A short first batch (the live loop's usual tail)
        starts no thread. An error of a read is raised here, at the batch it would have
        returned. Each read ahead has its own daemon thread, which ends with the read: closing
        the generator early leaves the one under way to finish (bounded by the statement
        timeout) and return its connection, and an interrupted or exiting process does not wait
        for it (with the server-side timeouts off, 0, it would wait until the read answered).
        """
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        rows = self._payload_batch(after, batch_size)
        while len(rows) == batch_size:
            pending = _read_ahead(self._payload_batch, rows[-1][0], batch_size)
            yield rows
            rows = pending.result()
        if rows:
            yield rows

    def _payload_batch(self, after: int, limit: int) -> list[tuple[int, str, int, str]]:
        """Up to ``limit`` rows of :meth:`read_payloads` after ``after`` (one keyset page)."""
        sql = "SELECT position, type, version, data::text FROM events WHERE position > %s ORDER BY position LIMIT %s"
        with self._raw() as conn:
            with conn.cursor(binary=True) as cur:
                cur.execute(sql, (after, limit))
                return cur.fetchall()

    def positions_of(self, keys: Sequence[str]) -> dict[str, int]:
        """The positions of the stored events with these idempotency keys (missing keys are absent).

        Used for an append whose key was already stored (by another replica): a decision that
        names that event as its cause needs its position."""
        if not keys:
            return {}
        with self._raw() as conn:
            # event_keys: one primary-key probe per key (events has no index on the key).
            rows = conn.execute(
                "SELECT idempotency_key, position FROM event_keys WHERE idempotency_key = ANY(%s)", (list(keys),)
            ).fetchall()
        return {k: int(p) for k, p in rows}

    def head(self) -> int:
        """The greatest committed position (0 when the log is empty)."""
        with self._raw() as conn:
            row = conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()
        return int(row[0])  # type: ignore[index]

    def count(self) -> int:
        """Number of stored events."""
        with self._raw() as conn:
            row = conn.execute("SELECT count(*) FROM events").fetchone()
        return int(row[0])  # type: ignore[index]

    # -- waiting ------------------------------------------------------------------------------

    def _connect_listener(self) -> psycopg.Connection[Any]:
        cargs, cparams = self._engine.dialect.create_connect_args(self._engine.url)
        cparams = {**cparams, **getattr(self._engine, "info_connect_args", {})}
        conn = psycopg.connect(*cargs, **cparams, autocommit=True)
        conn.execute(f'LISTEN "{self.channel}"')
        return conn

    def wait(self, after: int, timeout: float, *, poll: float | None = None) -> bool:
        """Block until an event with position > ``after`` is committed, or ``timeout`` seconds.

        Returns True as soon as :meth:`head` exceeds ``after`` (immediately if it already does),
        False on timeout. NOTIFY wakes it early; without NOTIFY (lost, or an append that did not
        send it) it still notices within ``poll`` seconds (default: the store's ``poll``).
        """
        poll = self.poll if poll is None else poll
        deadline = time.monotonic() + max(0.0, timeout)
        if self.head() > after:
            return True
        if not self._listener_lock.acquire(blocking=False):
            return self._poll_until(after, deadline, poll)  # another thread owns the listener
        try:
            while True:
                try:
                    if self._listener is None:
                        self._listener = self._connect_listener()
                    # Listening now: anything committed from here on either notifies or is
                    # seen by this head().
                    if self.head() > after:
                        return True
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    woke = False
                    for _ in self._listener.notifies(timeout=min(poll, remaining), stop_after=1):
                        woke = True
                        break
                    if woke:  # drop queued duplicates: one head() check covers them all
                        for _ in self._listener.notifies(timeout=0):
                            pass
                except psycopg.OperationalError:
                    self._close_listener()
                    return self._poll_until(after, deadline, poll)
        finally:
            self._listener_lock.release()

    def _poll_until(self, after: int, deadline: float, poll: float) -> bool:
        while True:
            if self.head() > after:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(poll, remaining))

    # -- checkpoints --------------------------------------------------------------------------

    def get_checkpoint(self, name: str) -> int:
        """The position checkpoint ``name`` was last set to (0 when never set)."""
        with self._raw() as conn:
            return get_checkpoint(conn, name)

    def set_checkpoint(self, name: str, position: int) -> None:
        """Set checkpoint ``name`` on its own (projections with rows use their store's
        ``apply``, which sets it in the same transaction as the rows)."""
        with self._raw() as conn:
            set_checkpoint(conn, name, position)
            conn.commit()

    # -- snapshots ----------------------------------------------------------------------------

    def save_snapshot(self, name: str, position: int, version: str, payload: bytes, *, keep: int | None = None) -> None:
        """Store snapshot ``name`` (opaque ``payload`` bytes of a projection folded up to
        ``position`` by code ``version``) and set checkpoint ``name`` to ``position``, in one
        transaction; keep only the newest ``keep`` (default: ``snapshot_keep``) of ``name``.

        Raises:
            TypeError: ``payload`` is not bytes. ValueError: ``keep`` < 1.
        """
        with self._raw() as conn:
            save_snapshot(conn, name, position, version, payload, self.snapshot_keep if keep is None else keep)
            conn.commit()

    def load_snapshot(self, name: str, version: str) -> tuple[int, bytes] | None:
        """``(position, payload)`` of the newest snapshot ``name`` written by code ``version``,
        or None (none, or only other versions': the caller folds from the log)."""
        with self._raw() as conn:
            return _snapshot(conn, name, version, None)

    def snapshot_before(self, name: str, position: int, version: str) -> tuple[int, bytes] | None:
        """``(position, payload)`` of the newest snapshot ``name`` of code ``version`` at or
        before ``position`` (for ``replay --since``), or None."""
        with self._raw() as conn:
            return _snapshot(conn, name, version, int(position))

    def snapshot_from(self, name: str, position: int, version: str) -> tuple[int, bytes] | None:
        """``(position, payload)`` of the oldest snapshot ``name`` of code ``version`` at or
        after ``position`` (the first a pruned log can be folded from), or None."""
        with self._raw() as conn:
            row = conn.execute(
                "SELECT position, payload FROM snapshots WHERE name = %s AND code_version = %s AND position >= %s "
                "ORDER BY position LIMIT 1",
                (name, str(version), int(position)),
            ).fetchone()
        return (int(row[0]), bytes(row[1])) if row else None

    def first_position(self) -> int:
        """The smallest stored position (0 when the log is empty); above 1 after a prune, and
        also when the first appends rolled back (the position sequence is not transactional)."""
        with self._raw() as conn:
            row = conn.execute("SELECT coalesce(min(position), 0) FROM events").fetchone()
        return int(row[0])  # type: ignore[index]

    def log_identity(self) -> str | None:
        """This log's random id (``log_identity``, revision 0005), or None for a schema without
        one (never migrated)."""
        with self._raw() as conn:
            try:
                row = conn.execute("SELECT id FROM log_identity ORDER BY created_at LIMIT 1").fetchone()
            except psycopg.errors.UndefinedTable:
                return None
        return str(row[0]) if row else None

    def pruned_up_to(self) -> int:
        """The last position ``backfill db prune`` dropped, 0 when it never dropped any: the
        first partition's first position minus one (partitions start at position 1 and only a
        prune drops one; :mod:`backfill.store.retention`). Unlike ``first_position() - 1`` it
        is not moved by an append that rolled back, which leaves a gap, not a prune."""
        with self._raw() as conn:
            return pruned_up_to(list_partitions(conn))

    # -- lifecycle ----------------------------------------------------------------------------

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def close(self, wait: float = CLOSE_WAIT_SECONDS) -> None:
        """Close the LISTEN connection (the engine stays usable). Waits at most ``wait`` seconds
        for a :meth:`wait` in flight to let go of it; past that the connection is left to its
        thread and the process's exit (a fault trial: with PostgreSQL hung, a SIGTERMed
        controller waited here until the store answered, 52-63 s, past the kubelet's grace)."""
        if not self._listener_lock.acquire(timeout=wait):
            log.warning(f"the event log's LISTEN connection is busy (the database does not answer): not closed after {wait:g}s")
            return
        try:
            self._close_listener()
        finally:
            self._listener_lock.release()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "EventStore",
    "AppendTransaction",
    "DEFAULT_SNAPSHOT_KEEP",
    "channel_name",
    "get_checkpoint",
    "set_checkpoint",
    "save_snapshot",
]
