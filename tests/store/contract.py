"""Store contract tests, written once for any backend.

A backend's test module subclasses :class:`StoreContract` (the subclass name must start with
``Test`` so pytest collects it) and provides the ``stores`` fixture: a :class:`Stores` bundle
with the event store, the run store and two backend hooks the contract cannot express through
the public API (an append that sends no wake-up, and a wake-up with no event).

The contract:

- append returns increasing positions in input order; empty appends do nothing;
- idempotency: a key already stored, or repeated inside one batch (first wins), is stored once;
- read: position order, ``after``/``upto``, stream prefix and time filters, pagination;
  ``read_payloads``: the same rows as four columns, in batches of ``batch_size`` (no empty one);
- concurrent writers + a tailing reader: the reader, always asking for ``position > last seen``,
  ends up with every event exactly once, in strictly increasing order;
- the held-open transaction: while an append's transaction is open, a later append never
  becomes visible before it; after commit both are read in order;
- atomicity: a failed append or a failed run-row batch changes nothing, checkpoint included;
- wait(): wakes on the backend's wake-up quickly, works without it (poll), and a wake-up with
  no event is not mistaken for one;
- snapshots: saved with the checkpoint of the same name (atomically, also inside an append
  transaction), the newest of the caller's code version is loaded (another version's never),
  ``snapshot_before`` picks the newest at or before a position, only the newest K are kept,
  payloads come back byte for byte;
- the log's id: one per log, the same at every read;
- both stores satisfy the protocols of ``backfill.store.interface``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from msgspec.structs import replace

from backfill.core.records import EventRecord, StoredEvent
from backfill.core.runs import RunRow
from backfill.store.interface import RecordRefusedError

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def record(key: str, *, at: datetime | None = None, stream: str = "model/ns/M0001", type: str = "ForegroundRequest", **data: Any) -> EventRecord:
    """An EventRecord with a realistic JSON payload."""
    at = at or T0
    payload = {"type": type, "model": stream.rsplit("/", 1)[-1], "at": at.isoformat(), "source": "test", "count": 1, **data}
    return EventRecord(type=type, version=1, stream=stream, idempotency_key=key, at=at, data=json.dumps(payload))


def run_row(uid: str = "uid-1", attempt: int = 1, **changes: Any) -> RunRow:
    base = RunRow(
        namespace="ns",
        backfill="bf",
        backfill_uid=uid,
        model="M0001",
        node="node-a",
        job_name=f"bf-{attempt}",
        job_uid="",
        attempt=attempt,
        generation=1,
        admitted_at=T0 + timedelta(minutes=attempt),
        started_at=None,
        ended_at=None,
        result=None,
        reason="",
        running_seconds=0.0,
        deciding_position=attempt,
    )
    return replace(base, **changes)


@dataclass
class Stores:
    """What a backend hands the contract.

    Attributes:
        events: the event store (``append``, ``begin``, ``read``, ``head``, ``wait``,
            ``get_checkpoint``).
        runs: the run store (``apply``, ``query``, ``get_checkpoint``, ``latest``,
            ``model_totals``, ``preemptions_by_reason``).
        append_silently: appends records *without* the wake-up signal (e.g. no NOTIFY).
        wake_without_event: sends the wake-up signal with no new event.
    """

    events: Any
    runs: Any
    append_silently: Callable[[Sequence[EventRecord]], None]
    wake_without_event: Callable[[], None]


class StoreContract:
    """The contract suite; subclass it and provide the ``stores`` fixture."""

    #: True when a later append waits for an open append transaction (a write lock), rather
    #: than committing and staying invisible (a visibility horizon).
    appends_are_serialized: bool = False

    @pytest.fixture
    def stores(self) -> Stores:  # pragma: no cover - provided by the backend's subclass
        raise NotImplementedError

    # -- identity -----------------------------------------------------------------------------

    def test_the_log_has_one_id_that_every_read_gives(self, stores: Stores) -> None:
        """The leader writes it into the Lease; replicas on separate stores differ in it."""
        first = stores.events.log_identity()
        assert isinstance(first, str) and len(first) >= 16
        stores.events.append([record("id/1")])
        assert stores.events.log_identity() == first

    # -- append -------------------------------------------------------------------------------

    def test_append_returns_increasing_positions_in_input_order(self, stores: Stores) -> None:
        first = stores.events.append([record(f"a/{i}") for i in range(5)])
        second = stores.events.append([record(f"b/{i}") for i in range(3)])
        positions = first + second
        assert all(isinstance(p, int) and p >= 1 for p in positions)
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        assert [e.idempotency_key for e in stores.events.read()] == [f"a/{i}" for i in range(5)] + [f"b/{i}" for i in range(3)]
        assert stores.events.head() == positions[-1]

    def test_empty_append_and_empty_log(self, stores: Stores) -> None:
        assert stores.events.head() == 0
        assert stores.events.append([]) == []
        assert list(stores.events.read()) == []
        assert stores.events.head() == 0

    def test_reappending_a_stored_key_stores_it_once(self, stores: Stores) -> None:
        [p1, p2] = stores.events.append([record("k1", n=1), record("k2", n=2)])
        again = stores.events.append([record("k2", n=99), record("k3", n=3), record("k1", n=99)])
        assert again[0] is None and again[2] is None
        assert isinstance(again[1], int) and again[1] > p2
        events = list(stores.events.read())
        assert [e.idempotency_key for e in events] == ["k1", "k2", "k3"]
        assert [json.loads(e.data)["n"] for e in events] == [1, 2, 3]  # the originals were kept
        assert stores.events.append([record("k1"), record("k2"), record("k3")]) == [None, None, None]
        assert stores.events.head() == again[1]

    def test_positions_of_stored_keys(self, stores: Stores) -> None:
        assert stores.events.positions_of([]) == {}
        [a, b] = stores.events.append([record("pk/a"), record("pk/b")])
        assert stores.events.positions_of(["pk/b", "pk/missing", "pk/a"]) == {"pk/a": a, "pk/b": b}
        with stores.events.begin() as tx:
            [c] = tx.append([record("pk/c")])
            assert stores.events.positions_of(["pk/c"]) == {}  # not committed yet
        assert stores.events.positions_of(["pk/c"]) == {"pk/c": c}

    def test_key_repeated_inside_one_batch_keeps_the_first(self, stores: Stores) -> None:
        result = stores.events.append([record("x", n=1), record("y", n=2), record("x", n=3), record("y", n=4), record("z", n=5)])
        assert result[2] is None and result[3] is None
        assert result[0] < result[1] < result[4]
        events = list(stores.events.read())
        assert [(e.idempotency_key, json.loads(e.data)["n"]) for e in events] == [("x", 1), ("y", 2), ("z", 5)]
        assert [e.position for e in events] == [result[0], result[1], result[4]]

    def test_read_returns_what_was_appended(self, stores: Stores) -> None:
        at = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=timezone.utc)
        rec = EventRecord(
            type="JobFailed",
            version=3,
            stream="backfill/ns/some-name",
            idempotency_key="uid-1/rv-42",
            at=at,
            data=json.dumps({"type": "JobFailed", "reason": "BackoffLimitExceeded", "text": "héllo \"quoted\" \\ ✓", "n": [1, 2.5, None, True]}),
        )
        before = datetime.now(timezone.utc) - timedelta(seconds=5)
        [position] = stores.events.append([rec])
        [ev] = list(stores.events.read())
        assert isinstance(ev, StoredEvent)
        assert ev.position == position
        assert (ev.type, ev.version, ev.stream, ev.idempotency_key, ev.at) == (rec.type, rec.version, rec.stream, rec.idempotency_key, rec.at)
        assert json.loads(ev.data) == json.loads(rec.data)
        assert ev.at.utcoffset() == timedelta(0) and ev.recorded_at.utcoffset() == timedelta(0)
        assert before <= ev.recorded_at <= datetime.now(timezone.utc) + timedelta(seconds=5)

    @pytest.mark.parametrize(
        "bad",
        [
            EventRecord("X", 1, "s", "bad", T0, "{not json"),
            EventRecord("X", 1, "s", "bad", T0, '{"node": "a\\u0000b"}'),  # jsonb holds no NUL
            EventRecord("X", 1, "s", "bad\x00key", T0, "{}"),  # nor text
            EventRecord("X", 1, "s\x00", "bad", T0, "{}"),
            EventRecord("X", 1, "s", "bad", T0, '{"node": "\ud800"}'),  # not UTF-8 (a lone surrogate)
            EventRecord("X", 1, "s", "bad\udfff", T0, "{}"),
            EventRecord("X", 1, "s", "bad", T0.replace(tzinfo=None), "{}"),
        ],
        ids=["not-json", "json-nul", "key-nul", "stream-nul", "data-surrogate", "key-surrogate", "naive-at"],
    )
    def test_a_record_the_log_cannot_hold_is_refused_and_nothing_of_its_batch_is_stored(self, stores: Stores, bad: EventRecord) -> None:
        """RecordRefusedError (a ValueError), the same records in both stores: the spool sets
        such a record aside instead of retrying it for ever (a store away raises anything else)."""
        stores.events.append([record("ok/0")])
        with pytest.raises(RecordRefusedError):
            stores.events.append([record("ok/1"), bad, record("ok/2")])
        assert issubclass(RecordRefusedError, ValueError)
        assert [e.idempotency_key for e in stores.events.read()] == ["ok/0"]
        [p] = stores.events.append([record("ok/1")])  # and the store is still usable
        assert p > 0

    def test_rolled_back_transaction_stores_nothing(self, stores: Stores) -> None:
        stores.events.append([record("kept")])
        with pytest.raises(RuntimeError):
            with stores.events.begin() as tx:
                tx.append([record("lost/1"), record("lost/2")])
                raise RuntimeError("boom")
        assert [e.idempotency_key for e in stores.events.read()] == ["kept"]
        [p] = stores.events.append([record("lost/1")])
        assert p > 1

    # -- read ---------------------------------------------------------------------------------

    def test_read_after_upto_and_pagination(self, stores: Stores) -> None:
        positions = stores.events.append([record(f"e/{i}") for i in range(25)])
        everything = list(stores.events.read())
        assert [e.position for e in everything] == positions
        assert [e.position for e in stores.events.read(batch_size=4)] == positions
        assert [e.position for e in stores.events.read(positions[9])] == positions[10:]
        assert [e.position for e in stores.events.read(positions[9], upto=positions[14], batch_size=2)] == positions[10:15]
        assert list(stores.events.read(positions[-1])) == []
        assert list(stores.events.read(upto=0)) == []

    def test_read_payloads_in_batches(self, stores: Stores) -> None:
        records = [record(f"p/{i}", n=i) for i in range(9)]
        positions = stores.events.append(records)
        expected = [(p, r.type, r.version, json.loads(r.data)) for p, r in zip(positions, records)]

        def batches(after: int = 0, batch_size: int = 20000) -> list[list[tuple[int, str, int, Any]]]:
            return [[(p, t, v, json.loads(d)) for p, t, v, d in b] for b in stores.events.read_payloads(after, batch_size=batch_size)]

        assert batches() == [expected]
        assert batches(batch_size=3) == [expected[0:3], expected[3:6], expected[6:9]]  # no empty batch after a full last one
        assert batches(batch_size=4) == [expected[0:4], expected[4:8], expected[8:9]]
        assert batches(positions[4], batch_size=2) == [expected[5:7], expected[7:9]]
        assert batches(positions[-1]) == []
        with pytest.raises(ValueError):
            next(iter(stores.events.read_payloads(0, batch_size=0)))

    def test_read_filters_by_stream_prefix_and_time(self, stores: Stores) -> None:
        recs = [
            record("1", stream="model/ns/M_1", at=T0),
            record("2", stream="model/ns/MX1", at=T0 + timedelta(minutes=1)),
            record("3", stream="backfill/ns/b", at=T0 + timedelta(minutes=2)),
            record("4", stream="model/ns/M_1", at=T0 + timedelta(minutes=3)),
            record("5", stream="model/other/M", at=T0 + timedelta(minutes=4)),
        ]
        stores.events.append(recs)

        def keys(**kw: Any) -> list[str]:
            return [e.idempotency_key for e in stores.events.read(**kw)]

        assert keys(stream_prefix="model/") == ["1", "2", "4", "5"]
        assert keys(stream_prefix="model/ns/M_") == ["1", "4"]  # '_' is literal, not a wildcard
        assert keys(stream_prefix="model/ns/") == ["1", "2", "4"]
        assert keys(since=T0 + timedelta(minutes=1)) == ["2", "3", "4", "5"]
        assert keys(until=T0 + timedelta(minutes=2)) == ["1", "2"]
        assert keys(since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=4), stream_prefix="model/") == ["2", "4"]
        assert keys(stream_prefix="model/", batch_size=1) == ["1", "2", "4", "5"]

    # -- concurrency --------------------------------------------------------------------------

    def test_concurrent_writers_and_a_tailing_reader_see_every_event_once_in_order(self, stores: Stores) -> None:
        writers, batches, per_batch = 4, 25, 20
        returned: list[int] = []
        returned_lock = threading.Lock()
        errors: list[BaseException] = []
        done = threading.Event()

        def write(w: int) -> None:
            try:
                for b in range(batches):
                    batch = [record(f"w{w}/{b}/{i}", n=i) for i in range(per_batch)]
                    batch.append(record(f"shared/{b}"))  # every writer sends it; stored once
                    result = stores.events.append(batch)
                    with returned_lock:
                        returned.extend(p for p in result if p is not None)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        seen: list[StoredEvent] = []

        def tail() -> None:
            last = 0
            try:
                while True:
                    finished = done.is_set()
                    for ev in stores.events.read(last, batch_size=7):
                        seen.append(ev)
                        last = ev.position
                    if finished:
                        return
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        reader = threading.Thread(target=tail)
        reader.start()
        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        done.set()
        reader.join(60)
        assert not errors, errors

        expected_keys = {f"w{w}/{b}/{i}" for w in range(writers) for b in range(batches) for i in range(per_batch)}
        expected_keys |= {f"shared/{b}" for b in range(batches)}
        positions = [e.position for e in seen]
        assert all(a < b for a, b in zip(positions, positions[1:])), "tailing reader saw positions out of order"
        assert [e.idempotency_key for e in seen].count("shared/0") == 1
        assert len(seen) == len(expected_keys) and {e.idempotency_key for e in seen} == expected_keys
        assert sorted(returned) == positions  # what the appends returned is exactly what was read
        assert [e.position for e in stores.events.read()] == positions

    def test_held_open_transaction_hides_later_appends_until_it_commits(self, stores: Stores) -> None:
        stores.events.append([record("before")])
        later: list[Any] = []
        errors: list[BaseException] = []

        def append_later() -> None:
            try:
                later.extend(stores.events.append([record("later")]))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        observed: list[list[str]] = []
        with stores.events.begin() as tx:
            [earlier] = tx.append([record("earlier")])
            writer = threading.Thread(target=append_later)
            writer.start()
            deadline = time.monotonic() + 0.8
            while time.monotonic() < deadline:
                observed.append([e.idempotency_key for e in stores.events.read()])
                time.sleep(0.02)
            still_waiting = writer.is_alive()
        writer.join(10)
        assert not errors, errors
        assert not writer.is_alive()

        # While "earlier" was uncommitted, no reader may see "later" (it would then skip
        # "earlier" for good): here, nothing new was visible at all.
        assert observed and all(keys == ["before"] for keys in observed), observed
        if self.appends_are_serialized:
            assert still_waiting, "the later append should wait for the open transaction"
        events = list(stores.events.read())
        assert [e.idempotency_key for e in events] == ["before", "earlier", "later"]
        assert events[1].position == earlier and later == [events[2].position]
        assert events[0].position < events[1].position < events[2].position

    # -- checkpoints and runs -----------------------------------------------------------------

    def test_checkpoints(self, stores: Stores) -> None:
        assert stores.events.get_checkpoint("runs") == 0
        assert stores.runs.get_checkpoint("runs") == 0
        stores.runs.apply([], "runs", 7)
        assert stores.events.get_checkpoint("runs") == 7
        assert stores.runs.get_checkpoint("runs") == 7
        assert stores.runs.get_checkpoint("other") == 0
        with stores.events.begin() as tx:
            [p] = tx.append([record("x")])
            tx.set_checkpoint("actor", p)
        assert stores.events.get_checkpoint("actor") == p

    def test_run_rows_upsert_and_query(self, stores: Stores) -> None:
        live = run_row("uid-1", 1)
        stores.runs.apply([live], "runs", 1)
        assert stores.runs.query() == [live]
        ended = replace(
            live,
            job_uid="job-uid",
            started_at=T0 + timedelta(minutes=2),
            ended_at=T0 + timedelta(minutes=12),
            result="preempted",
            reason="ForegroundDemand",
            running_seconds=600.0,
            deciding_position=9,
        )
        other = run_row("uid-2", 1, backfill="bf2", model="M0002", admitted_at=T0 + timedelta(minutes=30))
        second = run_row("uid-1", 2, admitted_at=T0 + timedelta(hours=1), result="succeeded", ended_at=T0 + timedelta(hours=2), running_seconds=900.0)
        stores.runs.apply([ended, other, second], "runs", 9)
        assert stores.runs.query() == [ended, other, second]
        assert stores.runs.query(backfill="bf") == [ended, second]
        assert stores.runs.query(model="M0002") == [other]
        assert stores.runs.query(result="preempted") == [ended]
        assert stores.runs.query(result="running") == [other]
        assert stores.runs.query(namespace="nope") == []
        assert stores.runs.query(since=T0 + timedelta(minutes=30)) == [other, second]
        assert stores.runs.query(limit=2) == [ended, other]
        assert stores.runs.get_checkpoint("runs") == 9

    def test_duplicate_rows_in_one_apply_last_wins(self, stores: Stores) -> None:
        a = run_row("u", 1)
        b = replace(a, result="failed", reason="BackoffLimitExceeded", ended_at=T0 + timedelta(hours=1))
        stores.runs.apply([a, b], "runs", 3)
        assert stores.runs.query() == [b]

    def test_failed_apply_changes_neither_rows_nor_checkpoint(self, stores: Stores) -> None:
        original = run_row("uid-1", 1)
        stores.runs.apply([original], "runs", 10)
        updated = replace(original, result="succeeded", ended_at=T0 + timedelta(hours=1), running_seconds=60.0)
        broken = run_row("uid-1", 2, result="exploded")  # violates the result CHECK
        with pytest.raises(Exception):
            stores.runs.apply([updated, run_row("uid-3", 1), broken], "runs", 20)
        assert stores.runs.get_checkpoint("runs") == 10
        assert stores.events.get_checkpoint("runs") == 10
        assert stores.runs.query() == [original]
        stores.runs.apply([updated], "runs", 20)  # and the store is still usable
        assert stores.runs.query() == [updated] and stores.runs.get_checkpoint("runs") == 20

    def test_views(self, stores: Stores) -> None:
        h = timedelta(hours=1)
        rows = [
            run_row("u1", 1, result="succeeded", ended_at=T0 + h, running_seconds=900.0),
            run_row("u1", 2, admitted_at=T0 + 2 * h, result="preempted", reason="ForegroundDemand", ended_at=T0 + 3 * h, running_seconds=100.0),
            run_row("u1", 3, admitted_at=T0 + 4 * h, result="preempted", reason="ForegroundDemand", ended_at=T0 + 5 * h, running_seconds=50.0),
            run_row("u1", 4, admitted_at=T0 + 6 * h, result="preempted", reason="GamingIntent", ended_at=T0 + 7 * h, running_seconds=25.0),
            run_row("u1", 5, admitted_at=T0 + 8 * h),  # live
            run_row("u2", 1, backfill="other", model="M0002", result="failed", reason="BackoffLimitExceeded", ended_at=T0 + h, running_seconds=30.0),
            run_row("u2", 2, backfill="other", model="M0002", admitted_at=T0 + 2 * h, result="deadline_exceeded", ended_at=T0 + 3 * h, running_seconds=1800.0),
        ]
        stores.runs.apply(rows, "runs", 1)

        latest = {(r["namespace"], r["backfill"]): r for r in stores.runs.latest()}
        assert set(latest) == {("ns", "bf"), ("ns", "other")}
        assert latest[("ns", "bf")]["attempt"] == 5 and latest[("ns", "bf")]["result"] is None
        assert latest[("ns", "other")]["attempt"] == 2 and latest[("ns", "other")]["result"] == "deadline_exceeded"

        totals = {r["model"]: r for r in stores.runs.model_totals()}
        m1, m2 = totals["M0001"], totals["M0002"]
        assert (m1["attempts"], m1["succeeded"], m1["preempted"], m1["failed"]) == (5, 1, 3, 0)
        assert m1["useful_seconds"] == pytest.approx(900.0) and m1["wasted_seconds"] == pytest.approx(175.0)
        assert (m2["attempts"], m2["succeeded"], m2["failed"], m2["deadline_exceeded"]) == (2, 0, 1, 1)
        assert m2["useful_seconds"] == 0 and m2["wasted_seconds"] == pytest.approx(1830.0)
        assert stores.runs.model_totals(model="M0002") == [m2]

        by_reason = {(r["model"], r["reason"]): r for r in stores.runs.preemptions_by_reason()}
        assert set(by_reason) == {("M0001", "ForegroundDemand"), ("M0001", "GamingIntent")}
        assert by_reason[("M0001", "ForegroundDemand")]["preemptions"] == 2
        assert by_reason[("M0001", "ForegroundDemand")]["wasted_seconds"] == pytest.approx(150.0)
        assert by_reason[("M0001", "GamingIntent")]["preemptions"] == 1

    def test_run_segments(self, stores: Stores) -> None:
        """Issue 11: one row per run segment of the same attempt; a preempted segment's kept
        seconds count as useful in the views, the rest as wasted."""
        h = timedelta(hours=1)
        seg1 = run_row("u9", 1, result="preempted", reason="ForegroundDemand", ended_at=T0 + h, running_seconds=100.0,
                       segment=1, completed_indexes="0-2", kept_seconds=70.0)
        seg2 = run_row("u9", 1, admitted_at=T0 + 2 * h, result="succeeded", reason="Completed", ended_at=T0 + 3 * h,
                       running_seconds=50.0, segment=2, completed_indexes="3-4")
        stores.runs.apply([seg1, seg2], "runs", 1)
        stores.runs.apply([seg2], "runs", 2)  # an upsert of segment 2 leaves segment 1 alone
        assert stores.runs.query() == [seg1, seg2]
        (totals,) = stores.runs.model_totals()
        assert (totals["attempts"], totals["succeeded"], totals["preempted"]) == (2, 1, 1)
        assert totals["useful_seconds"] == pytest.approx(70.0 + 50.0) and totals["wasted_seconds"] == pytest.approx(30.0)
        (by_reason,) = stores.runs.preemptions_by_reason()
        assert by_reason["wasted_seconds"] == pytest.approx(30.0)
        (latest,) = stores.runs.latest()
        assert (latest["attempt"], latest["segment"], latest["completed_indexes"]) == (1, 2, "3-4")

    # -- snapshots ----------------------------------------------------------------------------

    def test_protocols(self, stores: Stores) -> None:
        from backfill.store.interface import EventLog, RunRows, Snapshots

        assert isinstance(stores.events, EventLog) and isinstance(stores.events, Snapshots)
        assert isinstance(stores.runs, RunRows)

    def test_no_snapshot_and_round_trip(self, stores: Stores) -> None:
        assert stores.events.load_snapshot("projector", "v1") is None
        assert stores.events.snapshot_before("projector", 10**9, "v1") is None
        payload = bytes(range(256)) * 4096 + b"\x00end"  # 1 MiB with NUL bytes and every byte value
        stores.events.save_snapshot("projector", 42, "v1", payload)
        assert stores.events.load_snapshot("projector", "v1") == (42, payload)
        assert stores.events.get_checkpoint("projector") == 42  # written with it
        assert stores.events.load_snapshot("other", "v1") is None

    def test_snapshot_of_another_code_version_is_never_loaded(self, stores: Stores) -> None:
        stores.events.save_snapshot("projector", 10, "v1", b"old-format")
        assert stores.events.load_snapshot("projector", "v2") is None  # the caller refolds
        stores.events.save_snapshot("projector", 20, "v2", b"new-format")
        stores.events.save_snapshot("projector", 30, "v1", b"old-format-later")
        assert stores.events.load_snapshot("projector", "v2") == (20, b"new-format")
        assert stores.events.load_snapshot("projector", "v1") == (30, b"old-format-later")
        assert stores.events.snapshot_before("projector", 25, "v1") == (10, b"old-format")

    def test_snapshot_before_a_position(self, stores: Stores) -> None:
        for p in (100, 200, 300):
            stores.events.save_snapshot("projector", p, "v", f"at {p}".encode(), keep=10)
        assert stores.events.snapshot_before("projector", 99, "v") is None
        assert stores.events.snapshot_before("projector", 100, "v") == (100, b"at 100")
        assert stores.events.snapshot_before("projector", 299, "v") == (200, b"at 200")
        assert stores.events.snapshot_before("projector", 10**12, "v") == (300, b"at 300")

    def test_only_the_newest_snapshots_are_kept(self, stores: Stores) -> None:
        for p in range(1, 8):
            stores.events.save_snapshot("projector", p * 10, "v", str(p).encode(), keep=3)
        stores.events.save_snapshot("runs", 5, "v", b"r")  # another name is kept apart
        assert stores.events.snapshot_before("projector", 49, "v") is None  # 10..40 deleted
        assert stores.events.snapshot_before("projector", 50, "v") == (50, b"5")
        assert stores.events.load_snapshot("projector", "v") == (70, b"7")
        assert stores.events.load_snapshot("runs", "v") == (5, b"r")
        stores.events.save_snapshot("projector", 70, "v", b"replaced", keep=3)  # same position again
        assert stores.events.load_snapshot("projector", "v") == (70, b"replaced")
        assert stores.events.snapshot_before("projector", 50, "v") == (50, b"5")

    def test_the_newest_snapshot_of_every_other_version_is_kept_for_a_rollback(self, stores: Stores) -> None:
        for p in (10, 20, 30):
            stores.events.save_snapshot("projector", p, "v6", f"v6 {p}".encode(), keep=2)
        for p in (40, 50, 60, 70):
            stores.events.save_snapshot("projector", p, "v7", f"v7 {p}".encode(), keep=2)
        # v7 keeps its newest 2; v6, the release before, keeps its newest (it pushed all out)
        assert stores.events.load_snapshot("projector", "v6") == (30, b"v6 30")
        assert stores.events.snapshot_before("projector", 29, "v6") is None
        assert stores.events.snapshot_before("projector", 59, "v7") is None
        assert stores.events.snapshot_from("projector", 0, "v7") == (60, b"v7 60")
        stores.events.save_snapshot("projector", 80, "v6", b"v6 80", keep=2)  # rolled back: v7's newest stays
        assert stores.events.snapshot_from("projector", 0, "v7") == (70, b"v7 70")
        assert stores.events.load_snapshot("projector", "v6") == (80, b"v6 80")
        assert stores.events.snapshot_before("projector", 79, "v6") == (30, b"v6 30")

    def test_snapshot_inside_an_append_transaction_is_atomic(self, stores: Stores) -> None:
        with pytest.raises(RuntimeError):
            with stores.events.begin() as tx:
                [p] = tx.append([record("s/1")])
                tx.save_snapshot("projector", p, "v", b"state")
                raise RuntimeError("boom")
        assert stores.events.load_snapshot("projector", "v") is None
        assert stores.events.get_checkpoint("projector") == 0 and stores.events.head() == 0
        with stores.events.begin() as tx:
            [p] = tx.append([record("s/1")])
            tx.save_snapshot("projector", p, "v", b"state")
        assert stores.events.load_snapshot("projector", "v") == (p, b"state")
        assert stores.events.get_checkpoint("projector") == p

    def test_snapshot_payload_must_be_bytes(self, stores: Stores) -> None:
        with pytest.raises(TypeError):
            stores.events.save_snapshot("projector", 1, "v", "text, not bytes")
        with pytest.raises(ValueError):
            stores.events.save_snapshot("projector", 1, "v", b"x", keep=0)
        assert stores.events.load_snapshot("projector", "v") is None
        assert stores.events.get_checkpoint("projector") == 0

    def test_first_position(self, stores: Stores) -> None:
        assert stores.events.first_position() == 0
        positions = stores.events.append([record(f"f/{i}") for i in range(3)])
        assert stores.events.first_position() == positions[0]
        assert stores.events.count() == 3
        assert stores.events.pruned_up_to() == 0  # only ``backfill db prune`` moves it (tests/store/test_restore.py)

    def test_snapshot_from_a_position(self, stores: Stores) -> None:
        stores.events.save_snapshot("projector", 150, "other", b"x", keep=10)
        for p in (100, 200, 300):
            stores.events.save_snapshot("projector", p, "v", f"at {p}".encode(), keep=10)
        assert stores.events.snapshot_from("projector", 1, "v") == (100, b"at 100")
        assert stores.events.snapshot_from("projector", 101, "v") == (200, b"at 200")
        assert stores.events.snapshot_from("projector", 300, "v") == (300, b"at 300")
        assert stores.events.snapshot_from("projector", 301, "v") is None
        assert stores.events.snapshot_from("projector", 120, "other") == (150, b"x")

    # -- wait ---------------------------------------------------------------------------------

    def test_wait_returns_at_once_when_there_is_news_and_times_out_otherwise(self, stores: Stores) -> None:
        [p] = stores.events.append([record("a")])
        t = time.monotonic()
        assert stores.events.wait(p - 1, timeout=5) is True
        assert time.monotonic() - t < 1.0
        t = time.monotonic()
        assert stores.events.wait(p, timeout=0.4, poll=0.1) is False
        assert 0.35 <= time.monotonic() - t < 3.0

    def test_wait_wakes_quickly_on_the_wake_up_signal(self, stores: Stores) -> None:
        head = stores.events.head()
        timer = threading.Timer(0.3, lambda: stores.events.append([record("news")]))
        timer.start()
        t = time.monotonic()
        try:
            # A 30 s poll: only the wake-up signal can end this wait in time.
            assert stores.events.wait(head, timeout=10, poll=30) is True
        finally:
            timer.join()
        assert time.monotonic() - t < 2.0
        assert [e.idempotency_key for e in stores.events.read(head)] == ["news"]

    def test_wait_polls_when_the_wake_up_signal_is_missing(self, stores: Stores) -> None:
        head = stores.events.head()
        timer = threading.Timer(0.3, lambda: stores.append_silently([record("quiet")]))
        timer.start()
        t = time.monotonic()
        try:
            assert stores.events.wait(head, timeout=10, poll=0.2) is True
        finally:
            timer.join()
        assert time.monotonic() - t < 3.0
        assert [e.idempotency_key for e in stores.events.read(head)] == ["quiet"]

    def test_wake_up_without_an_event_is_not_news(self, stores: Stores) -> None:
        head = stores.events.head()
        timer = threading.Timer(0.1, stores.wake_without_event)
        timer.start()
        try:
            assert stores.events.wait(head, timeout=0.6, poll=0.2) is False
        finally:
            timer.join()
