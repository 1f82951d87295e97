"""A record the event log refuses for what it holds is set aside, never retried for ever at the
spool's head (before: one such record, a NUL PostgreSQL refused, made every later append fail,
and nothing anywhere was admitted again until a restart). On the in-memory store, which refuses
the same records as PostgreSQL (``tests/store/contract.py``)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

from msgspec.structs import replace

from backfill.controller.spool import MAX_REFUSED_IN_A_ROW, Spool
from backfill.core import events as ev
from backfill.store.interface import RecordRefusedError
from backfill.store.memory import MemoryEventStore, memory_backend

from .conftest import wait_for

T0 = datetime(2026, 12, 6, 16, 0, tzinfo=timezone.utc)


class Poisoning:
    """The memory store's append, with the record of every key in ``keys`` given a NUL in its
    data first (an encoding that let one through, as before ``backfill.core.storable``)."""

    def __init__(self, store: MemoryEventStore, keys: set[str]) -> None:
        self.store, self.keys, self.calls = store, keys, 0

    def append(self, records):
        self.calls += 1
        return self.store.append([replace(r, data=r.data[:-1] + ',"x":"\\u0000"}') if r.idempotency_key in self.keys else r for r in records])


def _request(model: str, i: int) -> tuple:
    return ev.ForegroundRequest(at=T0 + timedelta(seconds=i), namespace="ns", model=model, source="ingest"), f"req/{model}/{i}"


def _spool(append) -> tuple[Spool, threading.Event]:
    committed = threading.Event()
    store = append.store if isinstance(append, Poisoning) else None
    spool = Spool(append.append, store.positions_of if store else (lambda keys: {}), committed.set, backoff_initial=0.05, backoff_max=0.05)
    return spool, committed


def test_a_refused_record_is_set_aside_and_the_rest_are_appended_in_order():
    store = MemoryEventStore(memory_backend())
    poisoned = Poisoning(store, {"req/gemma/3"})
    spool, _ = _spool(poisoned)
    try:
        pairs = [_request("gemma" if i == 3 else "other", i) for i in range(8)]
        entries = spool.put(pairs)
        assert spool.wait_committed(entries, 5)
        keys = [e.idempotency_key for e in store.read()]
        assert keys == [k for _, k in pairs if k != "req/gemma/3"]  # every other one, in arrival order
        assert len(keys) == 7
        refused = entries[3]
        assert (refused.position, spool.refused) == (0, 1)
        assert refused.refused == "event 'req/gemma/3': data holds \\u0000 (PostgreSQL jsonb holds none)"
        assert [e.position for e in entries if e is not refused] == [e.position for e in store.read()]
        # an observation set aside is a doubt until a later one of the same object and type is appended
        assert [e.record.idempotency_key for e in spool.doubts()] == ["req/gemma/3"]
        assert spool.settled(store.head()) and spool.backlog == 0
        spool.put([_request("other", 10)])
        wait_for(lambda: store.head() == 8, what="other's request appended")
        assert len(spool.doubts()) == 1  # another object's observation replaces nothing
        older = spool.put([(ev.ForegroundRequest(at=T0, namespace="ns", model="gemma", source="ingest"), "req/gemma/old")])
        assert spool.wait_committed(older, 5) and older[0].position > 0
        assert len(spool.doubts()) == 1  # nor one of the same object that happened before it
        later = spool.put([_request("gemma", 11)])
        assert spool.wait_committed(later, 5) and later[0].position > 0
        assert spool.doubts() == []
    finally:
        spool.stop(timeout=1)


def test_a_batch_is_split_only_as_far_as_the_refused_record():
    """1,000 entries with one refused: a handful of appends (halves), not one per entry."""
    store = MemoryEventStore(memory_backend())
    down = threading.Event()
    down.set()
    poisoned = Poisoning(store, {"req/m/700"})

    class Gate:  # holds the writer until all 1,000 are spooled, so they go as one batch
        store = poisoned.store

        def append(self, records):
            while down.is_set():
                down.wait(0.01)
            return poisoned.append(records)

    spool, _ = _spool(Gate())
    try:
        entries = spool.put([_request("m", i) for i in range(1000)])
        down.clear()
        assert spool.wait_committed(entries, 10)
        assert store.count() == 999 and [e.position for e in entries].count(0) == 1
        assert poisoned.calls <= 2 * 10 + 1, poisoned.calls  # log2(1000) levels, two appends each at most
    finally:
        spool.stop(timeout=1)


def test_a_store_that_refuses_everything_is_retried_not_emptied():
    """Past MAX_REFUSED_IN_A_ROW refusals with nothing accepted between, the store is taken to
    refuse everything (a schema or server problem): the rest wait and are retried, as while it
    is away, and go in once it accepts again."""
    refusing = threading.Event()
    refusing.set()
    store = MemoryEventStore(memory_backend())

    class Refusing:
        def append(self, records):
            if refusing.is_set():
                raise RecordRefusedError("every record refused (test: a schema problem)")
            return store.append(records)

    spool = Spool(Refusing().append, store.positions_of, lambda: None, backoff_initial=0.05, backoff_max=0.05)
    try:
        entries = spool.put([_request("m", i) for i in range(50)])
        wait_for(lambda: spool.refused == MAX_REFUSED_IN_A_ROW and not spool.healthy, what="the refusals stop at the bound")
        assert spool.backlog == 50 - MAX_REFUSED_IN_A_ROW and spool.refused == MAX_REFUSED_IN_A_ROW
        refusing.clear()
        assert spool.wait_committed(entries, 5)
        assert store.count() == 50 - MAX_REFUSED_IN_A_ROW and spool.healthy
    finally:
        spool.stop(timeout=1)
