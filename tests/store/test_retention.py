"""Partitions of the event log and ``prune`` (PostgreSQL only: partitioning is the database's)."""

from __future__ import annotations

import csv
import io
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from backfill.store.eventlog import EventStore
from backfill.store.retention import Partition, list_partitions, prune
from backfill.store.runs import RunStore
from tests.store.contract import record, run_row

pytestmark = pytest.mark.db

SIZE = 10


@pytest.fixture
def small(pg_engine) -> EventStore:
    """An EventStore whose appends create partitions of 10 positions."""
    store = EventStore(pg_engine, poll=0.2, partition_size=SIZE)
    try:
        yield store
    finally:
        store.close()


def _conn(store: EventStore) -> psycopg.Connection:
    cargs, cparams = store.engine.dialect.create_connect_args(store.engine.url)
    return psycopg.connect(*cargs, **cparams, **store.engine.info_connect_args)


def _partitions(store: EventStore) -> list[Partition]:
    with _conn(store) as conn:
        return list_partitions(conn)


def _prune(store: EventStore, before: datetime, version: str = "v1", export: Path | None = None):
    with _conn(store) as conn:
        conn.autocommit = True
        return prune(conn, before, snapshot="projector", code_version=version, export=export)


LATER = datetime.now(timezone.utc) + timedelta(days=1)


def test_appends_create_partitions_ahead_and_reads_cross_them(small: EventStore) -> None:
    assert _partitions(small) == []  # a fresh log: the first append creates the first partition
    positions = small.append([record(f"e/{i}") for i in range(3)])
    assert [(p.lo, p.hi) for p in _partitions(small)] == [(1, 11)]
    positions += small.append([record(f"e/{i}") for i in range(3, 35)])
    # positions 1..35 stored; partitions cover half a partition beyond the head (35 + 5)
    assert [(p.lo, p.hi) for p in _partitions(small)] == [(1, 11), (11, 21), (21, 31), (31, 41)]
    assert positions == list(range(1, 36))
    assert [e.position for e in small.read(15, batch_size=4)] == list(range(16, 36))
    assert [p for batch in small.read_payloads(8, batch_size=3) for p, *_ in batch] == list(range(9, 36))
    with _conn(small) as conn:
        per_partition = dict(conn.execute("SELECT tableoid::regclass::text, count(*) FROM events GROUP BY 1").fetchall())
    assert per_partition == {"events_p000000000001": 10, "events_p000000000011": 10, "events_p000000000021": 10, "events_p000000000031": 5}


def test_a_rolled_back_append_that_created_a_partition_leaves_the_store_usable(small: EventStore) -> None:
    small.append([record(f"a/{i}") for i in range(3)])  # positions 1-3: partition 1-10
    with pytest.raises(RuntimeError):
        with small.begin() as tx:
            tx.append([record(f"b/{i}") for i in range(3)])  # 4-6: creates partition 11-20 ...
            raise RuntimeError("boom")  # ... which rolls back with it
    assert [(p.lo, p.hi) for p in _partitions(small)] == [(1, 11)]
    # 7-15: within half a partition of the end the store believed it had (21): it must
    # notice that partition 11-20 is gone
    positions = small.append([record(f"b/{i}") for i in range(9)])
    assert positions == list(range(7, 16))
    assert small.count() == 12 and [(p.lo, p.hi) for p in _partitions(small)] == [(1, 11), (11, 21)]


def test_another_replica_sees_partitions_created_by_the_first(small: EventStore, pg_engine) -> None:
    other = EventStore(pg_engine, partition_size=SIZE)
    small.append([record(f"a/{i}") for i in range(14)])
    assert other.append([record(f"b/{i}") for i in range(14)]) == list(range(15, 29))
    assert small.append([record("c")]) == [29]


def _fill(store: EventStore, n: int, prefix: str = "e") -> list[int]:
    return store.append([record(f"{prefix}/{i}") for i in range(n)])


def test_prune_refuses_without_a_covering_snapshot_of_the_code_version(small: EventStore) -> None:
    _fill(small, 35)
    result = _prune(small, LATER)
    assert result.dropped == () and "no snapshot 'projector' of code version 'v1'" in result.stopped
    small.save_snapshot("projector", 35, "v0", b"old code")
    result = _prune(small, LATER)  # another version's snapshot does not count
    assert result.dropped == () and "no snapshot" in result.stopped
    small.save_snapshot("projector", 8, "v1", b"state")
    result = _prune(small, LATER)
    assert result.dropped == () and "ends at position 10, after snapshot 'projector' at 8" in result.stopped
    assert small.count() == 35


def test_prune_drops_covered_partitions_and_their_keys_but_never_runs(small: EventStore, pg_engine) -> None:
    runs = RunStore(pg_engine)
    rows = [run_row("u1", 1, deciding_position=3), run_row("u1", 2, deciding_position=12)]
    runs.apply(rows, "runs", 34)
    _fill(small, 35)
    small.save_snapshot("projector", 25, "v1", b"state")
    result = _prune(small, LATER)
    assert [p.name for p in result.dropped] == ["events_p000000000001", "events_p000000000011"]
    assert result.events == 20 and result.exported == 0
    assert "events_p000000000021 ends at position 30, after snapshot 'projector' at 25" in result.stopped
    assert small.first_position() == 21 and small.count() == 15 and small.head() == 35
    assert [e.position for e in small.read()] == list(range(21, 36))
    assert runs.query() == rows  # run history is never pruned
    # keys of kept events still deduplicate; keys of pruned ones are gone with them
    assert small.append([record("e/25"), record("e/3")]) == [None, 36]
    with _conn(small) as conn:
        assert conn.execute("SELECT count(*) FROM event_keys").fetchone()[0] == 16


def test_prune_stops_at_a_partition_with_events_recorded_after_the_cut_off(small: EventStore) -> None:
    _fill(small, 20, "old")
    time.sleep(0.05)
    cut = datetime.now(timezone.utc)
    time.sleep(0.05)
    _fill(small, 15, "new")
    small.save_snapshot("projector", 35, "v1", b"state")
    result = _prune(small, cut)
    assert [p.lo for p in result.dropped] == [1, 11]
    assert "events_p000000000021 holds events recorded until" in result.stopped
    assert _prune(small, cut).dropped == ()  # nothing more to do


def test_prune_never_drops_the_partition_being_written_or_one_a_checkpoint_still_needs(small: EventStore) -> None:
    _fill(small, 25)
    small.save_snapshot("projector", 25, "v1", b"state")
    small.set_checkpoint("runs", 9)
    result = _prune(small, LATER)
    assert result.dropped == () and "ends at position 10, after checkpoint 'runs' at 9" in result.stopped
    small.set_checkpoint("runs", 25)
    result = _prune(small, LATER)
    assert [p.lo for p in result.dropped] == [1, 11]
    assert "events_p000000000021 (positions 21-30) is not full yet (head 25)" in result.stopped


def test_prune_exports_the_rows_it_drops(small: EventStore, tmp_path: Path) -> None:
    _fill(small, 35)
    small.save_snapshot("projector", 35, "v1", b"state")
    before = {e.position: e for e in small.read(upto=30)}
    out = tmp_path / "events.csv"
    result = _prune(small, LATER, export=out)
    assert result.exported == result.events == 30
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [int(r["position"]) for r in rows] == list(range(1, 31))
    assert [r["idempotency_key"] for r in rows] == [before[p].idempotency_key for p in range(1, 31)]
    # the export loads back into a table of the same shape
    with _conn(small) as conn:
        conn.execute("CREATE TEMP TABLE restored (LIKE events)")
        with conn.cursor().copy("COPY restored FROM STDIN (FORMAT csv, HEADER)") as copy:
            copy.write(out.read_bytes())
        assert conn.execute("SELECT count(*), min(position), max(position) FROM restored").fetchone() == (30, 1, 30)


def test_prune_rejects_a_naive_cut_off(small: EventStore) -> None:
    with pytest.raises(ValueError):
        _prune(small, datetime(2026, 1, 1))


def test_a_partition_bound_past_a_bigint_is_a_fault_of_the_log_not_a_refused_record(pg_engine):
    """An adversarial trial: with a partition size past a bigint every append's new partition
    was refused with SQLSTATE 22003, which the spool took for a record the log refuses: every
    fresh event was set aside (lost) while ``/readyz`` said ok. It is a fault of the log's own
    layout (:class:`LogLayoutError`), retried like the store being away; the settings now also
    refuse such a size."""
    from backfill.store.eventlog import LogLayoutError
    from backfill.store.interface import RecordRefusedError

    store = EventStore(pg_engine, partition_size=10**19)
    try:
        with pytest.raises(LogLayoutError, match="cannot make room for 1 position") as info:
            store.append([record("k1")])
        assert not isinstance(info.value, RecordRefusedError)
        assert getattr(info.value.__cause__, "sqlstate", None) == "22003"  # numeric value out of range
        # nothing of it stayed but the position it took (a gap, as every append rolled back leaves)
        assert EventStore(pg_engine, partition_size=SIZE).append([record("k1")]) == [2]
    finally:
        store.close()


def test_a_partition_caught_mid_detach_is_left_out_of_the_list(pg_engine) -> None:
    """A trial: a ``backfill replay`` run while a prune detached a partition died with
    "partition ... has an unexpected bound: None" (the catalog gave the leaving partition no
    bound). The rows the catalog query gives are those of the real schema, plus such a one."""
    es = EventStore(pg_engine, partition_size=10)
    es.append([record(f"k/{i}") for i in range(25)])
    fairy = pg_engine.raw_connection()
    try:
        conn = fairy.driver_connection
        real = list_partitions(conn)
        assert [(p.lo, p.hi) for p in real] == [(1, 11), (11, 21), (21, 31)]

        class Catalog:
            """The connection, with a partition being detached among the catalog's rows."""

            def execute(self, sql, *args):
                rows = conn.execute(sql, *args).fetchall()

                class Result:
                    def fetchall(self):
                        return [("events_p000000000001", None)] + [r for r in rows if r[0] != "events_p000000000001"]

                return Result()

        assert list_partitions(Catalog()) == real[1:]
    finally:
        fairy.close()
