"""The store contract on the in-memory backend, plus how :func:`open_store` picks a backend."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from backfill.core.records import EventRecord
from backfill.settings import Settings
from backfill.store import open_store
from backfill.store.memory import MemoryBackend, MemoryEventStore, MemoryRunStore
from tests.store.contract import StoreContract, Stores, record


class TestMemoryStore(StoreContract):
    appends_are_serialized = True  # one threading.Lock held by the open append transaction

    @pytest.fixture
    def stores(self) -> Stores:
        backend = MemoryBackend()
        backend.events.poll = 0.2

        def append_silently(records: Sequence[EventRecord]) -> None:
            with backend.events.begin(notify=False) as tx:
                tx.append(records)

        return Stores(events=backend.events, runs=backend.runs, append_silently=append_silently, wake_without_event=backend.wake)


def test_open_store_memory_urls() -> None:
    fresh_a = open_store(Settings(database_url="memory://"))
    fresh_b = open_store(Settings(database_url="memory://"))
    assert isinstance(fresh_a.events, MemoryEventStore) and isinstance(fresh_a.runs, MemoryRunStore)
    fresh_a.events.append([record("only-in-a")])
    assert fresh_b.events.head() == 0  # memory:// is a new store each time

    named = open_store(Settings(database_url="memory://shared-test", poll_fallback_seconds=0.25, snapshot_keep=2))
    named.events.append([record("x")])
    again = open_store(Settings(database_url="memory://shared-test"))
    assert [e.idempotency_key for e in again.events.read()] == ["x"]  # same name, same store
    assert open_store(Settings(database_url="memory://shared-test"), "other").events.head() == 0  # per schema
    assert named.events.poll == 0.25 and named.events.snapshot_keep == 2


def test_open_store_rejects_other_urls_and_bad_schemas() -> None:
    with pytest.raises(ValueError):
        open_store(Settings(database_url="mysql://h/db"))
    with pytest.raises(ValueError):
        open_store(Settings(database_url="memory://"), "Bad-Schema")
