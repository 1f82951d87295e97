"""The store interface: what the controller, replay and simulate need from a backend.

Three protocols, satisfied by the PostgreSQL store (:class:`backfill.store.EventStore`,
:class:`backfill.store.RunStore`) and the in-memory one (:mod:`backfill.store.memory`), both
checked by the same contract suite (``tests/store/contract.py``):

- :class:`EventLog`: the append-only, totally ordered log with idempotency keys, reads after a
  position, the head, waiting for news, and checkpoints;
- :class:`Snapshots`: serialized projections (opaque bytes) per name and code version, saved with
  the checkpoint of the same name;
- :class:`RunRows`: one row per Job attempt, upserted with its projection's checkpoint.

:func:`open_store` builds a :class:`Store` from :class:`~backfill.settings.Settings`; the URL
picks the backend: ``memory://[name]`` or a PostgreSQL URL (``postgresql+psycopg://...``; unset:
the embedded server).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from backfill.core.records import EventRecord, StoredEvent
from backfill.core.runs import RunRow

if TYPE_CHECKING:
    from backfill.settings import Settings

class RecordRefusedError(ValueError):
    """The log refuses a record of the batch for what it holds, not for being away: ``data``
    that is not JSON or holds a NUL, a string that is not UTF-8, a naive ``at``, an indexed
    value over the index's limit (PostgreSQL: SQLSTATE classes 22, data exception, and 54,
    program limit exceeded; and psycopg's own refusal to send such a value). Appending the
    same record again can never succeed; nothing of the batch is stored. The spool sets such
    a record aside instead of retrying it for ever (:mod:`backfill.controller.spool`)."""


#: A row of :meth:`EventLog.read_payloads`: ``(position, type, version, data)``.
Payload = tuple[int, str, int, str]


@runtime_checkable
class AppendTx(Protocol):
    """An open append transaction (from :meth:`EventLog.begin`): everything done through it
    becomes visible at once when the block ends, or not at all if it raises."""

    def lock(self) -> None:
        """Take the log's write lock now (held until the transaction ends; idempotent)."""

    def append(self, records: Sequence[EventRecord]) -> list[int | None]:
        """As :meth:`EventLog.append`, inside this transaction."""

    def set_checkpoint(self, name: str, position: int) -> None:
        """Set checkpoint ``name`` in this transaction."""

    def save_snapshot(self, name: str, position: int, version: str, payload: bytes, *, keep: int | None = None) -> None:
        """As :meth:`Snapshots.save_snapshot`, inside this transaction."""


@runtime_checkable
class EventLog(Protocol):
    """The event log. Positions are global, strictly increasing and never reused (gaps where
    an append rolled back); a reader asking for ``position > p`` never misses an event that
    commits later with a smaller position (appends are serialized by a write lock)."""

    def append(self, records: Sequence[EventRecord]) -> list[int | None]:
        """Append in one transaction; per record its new position, or None when its
        idempotency key is already stored or repeated earlier in ``records`` (first wins).
        Raises :class:`RecordRefusedError` on a record it cannot hold (``data`` not JSON, a
        naive ``at``, ...); then nothing is stored."""

    def begin(self) -> AbstractContextManager[AppendTx]:
        """An append transaction (commit at the end of the block, roll back if it raises)."""

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
        """Events with ``after < position [<= upto]`` in position order; filters: stream
        prefix (literal), ``since <= at``, ``at < until``."""

    def read_batches(self, after: int = 0, **kwargs: Any) -> Iterator[list[StoredEvent]]:
        """As :meth:`read`, in lists of up to ``batch_size``."""

    def read_payloads(self, after: int = 0, *, batch_size: int = 20000) -> Iterator[list[Payload]]:
        """Batches of ``(position, type, version, data)`` after ``after`` (the fold's fast path)."""

    def positions_of(self, keys: Sequence[str]) -> dict[str, int]:
        """``{key: position}`` of the stored events with these idempotency keys (missing keys
        are absent; keys of pruned events too)."""

    def head(self) -> int:
        """The greatest committed position (0 when empty)."""

    def first_position(self) -> int:
        """The smallest stored position (0 when empty; above 1 once old events were pruned, or
        when the first appends rolled back: positions are not transactional)."""

    def log_identity(self) -> str | None:
        """This log's random id, the same for every process that uses it (None: a schema that
        has none yet). The leader writes it into the Lease (:mod:`backfill.controller.leader`)."""

    def pruned_up_to(self) -> int:
        """The last position ``backfill db prune`` dropped (0: nothing was ever pruned). Every
        event after it is retained and none at or before it is; a gap left by an append that
        rolled back is not a prune."""

    def count(self) -> int:
        """Number of stored events."""

    def wait(self, after: int, timeout: float, *, poll: float | None = None) -> bool:
        """Block until ``head() > after`` (True) or ``timeout`` seconds pass (False)."""

    def get_checkpoint(self, name: str) -> int:
        """Checkpoint ``name`` (0 when never set)."""

    def set_checkpoint(self, name: str, position: int) -> None:
        """Set checkpoint ``name`` on its own."""

    def close(self) -> None:
        """Release background resources (a LISTEN connection); the store stays usable."""


@runtime_checkable
class Snapshots(Protocol):
    """Serialized projections. The payload is opaque bytes to the store; ``version`` is the
    code version that wrote it, and a snapshot is only ever returned to the same version."""

    def save_snapshot(self, name: str, position: int, version: str, payload: bytes, *, keep: int | None = None) -> None:
        """Store snapshot ``name`` at ``position`` and set checkpoint ``name`` to ``position``
        in one transaction; keep the newest ``keep`` (default: the store's) of ``name``."""

    def load_snapshot(self, name: str, version: str) -> tuple[int, bytes] | None:
        """``(position, payload)`` of the newest snapshot ``name`` of ``version``, or None."""

    def snapshot_before(self, name: str, position: int, version: str) -> tuple[int, bytes] | None:
        """The newest snapshot ``name`` of ``version`` at or before ``position``, or None."""

    def snapshot_from(self, name: str, position: int, version: str) -> tuple[int, bytes] | None:
        """The oldest snapshot ``name`` of ``version`` at or after ``position``, or None."""


@runtime_checkable
class RunRows(Protocol):
    """Run history: one :class:`~backfill.core.runs.RunRow` per (backfill_uid, attempt)."""

    def apply(self, rows: Sequence[RunRow], checkpoint: str, position: int) -> None:
        """Upsert ``rows`` (last of a key wins) and set ``checkpoint``, atomically; raises and
        changes nothing when a row is invalid (e.g. an unknown ``result``)."""

    def get_checkpoint(self, name: str) -> int:
        """Checkpoint ``name`` (0 when never set); the same checkpoints as the event log's."""

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
        """Runs matching every filter, oldest admission first (see RunStore.query)."""

    def latest(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The latest attempt of each (namespace, backfill)."""

    def model_totals(self, namespace: str | None = None, model: str | None = None) -> list[dict[str, Any]]:
        """Per (namespace, model): attempts, outcomes, useful and wasted seconds."""

    def preemptions_by_reason(self, namespace: str | None = None, model: str | None = None) -> list[dict[str, Any]]:
        """Per (namespace, model, reason): preemptions and wasted seconds."""


class EventStoreLike(EventLog, Snapshots, Protocol):
    """An event log that also keeps snapshots (what both backends provide)."""


@dataclass
class Store:
    """A built store: the event log (with snapshots), the run rows, and how to close both.

    Attributes:
        events: the event log.
        runs: the run history.
        url: the backend URL (``memory://...`` or the PostgreSQL URL).
        schema: the PostgreSQL schema (also the in-memory store's namespace).
        note: a human note when the embedded PostgreSQL server was started, else None.
    """

    events: EventStoreLike
    runs: RunRows
    url: str
    schema: str
    note: str | None = None
    _close: Callable[[], None] = field(default=lambda: None, repr=False)

    def close(self) -> None:
        """Close the log's background connection and dispose of the connection pool."""
        self._close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


MEMORY_SCHEME = "memory://"


def open_store(settings: Settings, schema: str | None = None) -> Store:
    """Build the store ``settings`` configures.

    Args:
        settings: ``database_url`` picks the backend: ``memory://`` (a fresh in-process store),
            ``memory://NAME`` (the in-process store of that name, shared by every caller in the
            process), a PostgreSQL URL, or unset (the embedded PostgreSQL server in
            ``data_dir``). The database timeouts, ``poll_fallback_seconds``,
            ``event_partition_size`` and ``snapshot_keep`` apply.
        schema: the PostgreSQL schema (default ``backfill``); it must be migrated already.

    Raises:
        ValueError: a URL that is neither ``memory://`` nor PostgreSQL, or a bad schema name.
    """
    from backfill.store.engine import DEFAULT_SCHEMA, validate_schema

    schema = validate_schema(schema or DEFAULT_SCHEMA)
    url = settings.database_url or ""
    if url.startswith(MEMORY_SCHEME):
        from backfill.store.memory import MemoryEventStore, MemoryRunStore, memory_backend

        backend = memory_backend(url[len(MEMORY_SCHEME) :], schema)
        events = MemoryEventStore(backend, poll=settings.poll_fallback_seconds, snapshot_keep=settings.snapshot_keep)
        return Store(events=events, runs=MemoryRunStore(backend), url=url, schema=schema, _close=events.close)

    from backfill.store.engine import make_engine, resolve_database_url
    from backfill.store.eventlog import EventStore
    from backfill.store.runs import RunStore

    url, note = resolve_database_url(settings)
    engine = make_engine(url, schema, settings=settings)
    events = EventStore(
        engine,
        poll=settings.poll_fallback_seconds,
        partition_size=settings.event_partition_size,
        snapshot_keep=settings.snapshot_keep,
    )

    def close() -> None:
        events.close()
        engine.dispose()

    return Store(events=events, runs=RunStore(engine), url=url, schema=schema, note=note, _close=close)


__all__ = [
    "AppendTx",
    "EventLog",
    "Snapshots",
    "RunRows",
    "EventStoreLike",
    "Payload",
    "Store",
    "MEMORY_SCHEME",
    "open_store",
]
