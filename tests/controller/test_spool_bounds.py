"""The spool's bounds while the store is away: records and payload bytes (a fault trial: 151
changes of a GamingSession with a 900 kB field took a replica from 126 to 403 MB; the record
bound alone would have let 100,000 of them in), and the headroom a producer leaves to others."""

from __future__ import annotations

from datetime import datetime, timezone

from backfill.controller.spool import Spool
from backfill.core import events as ev
from backfill.core.events import encode

T0 = datetime(2026, 12, 5, 22, 0, tzinfo=timezone.utc)


def _down_spool(**kw) -> Spool:
    def append(records):
        raise ConnectionError("the store is down")

    return Spool(append, lambda keys: {}, lambda: None, backoff_initial=60, backoff_max=60, **kw)


def _session(i: int, node_chars: int) -> tuple:
    return ev.GamingIntentStarted(at=T0, namespace="n", session=f"s{i}", node="x" * node_chars), f"gaming/s{i}"


def test_payload_bytes_are_bounded_as_records_are():
    spool = _down_spool(max_records=100_000, max_bytes=1 << 20)
    try:
        big = [_session(i, 200_000) for i in range(10)]
        size = len(encode(*big[0]).data)
        taken = spool.put(big)
        assert len(taken) == (1 << 20) // size == 5 and spool.dropped == 5  # five of about 200 kB fit in 1 MiB
        # a small one still fits in what is left; another big one does not
        assert len(spool.put([_session(100, 10)])) == 1 and spool.put([_session(101, 200_000)]) == []
        assert spool.dropped == 6 and sum(len(e.record.data) for e in spool.unfolded(0)) <= 1 << 20
    finally:
        spool.stop(timeout=0.1)


def test_headroom_leaves_its_share_of_records_and_bytes():
    spool = _down_spool(max_records=10, max_bytes=1 << 20)
    try:
        assert len(spool.put([_session(i, 10) for i in range(8)], headroom=5)) == 5
        assert len(spool.put([_session(10 + i, 10) for i in range(8)])) == 5  # the rest, to the others
        big = _down_spool(max_records=100, max_bytes=1 << 20)
        try:  # half the bytes for a producer leaving half the records
            size = len(encode(*_session(0, 100_000)).data)
            assert len(big.put([_session(i, 100_000) for i in range(20)], headroom=50)) == (1 << 19) // size
        finally:
            big.stop(timeout=0.1)
    finally:
        spool.stop(timeout=0.1)


def test_refused_reports_are_not_dropped_observations_and_a_resend_takes_no_room():
    """A second trial: ingest reports refused for room were counted and logged as dropped
    observations (every watcher relisted twice once the store was back), and a re-send of
    reports already held was refused too."""
    spool = _down_spool(max_records=10, max_bytes=1 << 20)
    try:
        first = spool.put([_session(i, 10) for i in range(5)], headroom=5, refusable=True)
        assert len(first) == 5
        again = spool.put([_session(i, 10) for i in range(5)], headroom=5, refusable=True)  # a re-send
        assert again == first  # the entries already waiting: no room taken, nothing refused
        assert spool.put([_session(9, 10)], headroom=5, refusable=True) == []  # refused: no room left
        assert spool.dropped == 0 and spool.backlog == 5
        assert len(spool.put([_session(20 + i, 10) for i in range(6)])) == 5  # observations: dropped past the bound
        assert spool.dropped == 1
    finally:
        spool.stop(timeout=0.1)
