"""A key or stream too long for a btree index row is stored bounded (backfill.core.storable):
a fault trial's Model ``status.lastActiveTime`` with a 9,000-digit fraction (a date-time the
API server accepts) became a 9 kB key, PostgreSQL refused every append (``index row requires
9080 bytes``) and nothing was admitted anywhere until each replica restarted."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from backfill.controller.translate import Translator
from backfill.core import events as ev
from backfill.core.storable import MAX_INDEXED_CHARS

NOW = datetime(2026, 12, 5, 21, 50, tzinfo=timezone.utc)


def _model(last_active: str, rv: str) -> dict:
    meta = {"namespace": "n", "name": "m", "uid": "u-m", "resourceVersion": rv}
    return {"metadata": meta, "spec": {"nodeSelector": {"kubernetes.io/hostname": "node-a"}}, "status": {"phase": "Ready", "lastActiveTime": last_active}}


def test_a_long_fraction_in_last_active_time_is_stored_and_a_resend_is_a_duplicate(event_store):
    rng = random.Random(7)
    stamp = (NOW - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%S")
    digits = "".join(rng.choice("0123456789") for _ in range(9000))
    other = digits[:-1] + ("1" if digits[-1] != "1" else "2")  # differs only at the very end
    tr = Translator()
    pairs = [p for p in tr.model("ADDED", _model(f"{stamp}.{digits}Z", "1"), NOW) if isinstance(p[0], ev.ForegroundRequest)]
    assert len(pairs) == 1 and len(pairs[0][1]) > 9000  # the translator's key holds the raw text
    record = ev.encode(*pairs[0])
    assert len(record.idempotency_key) <= MAX_INDEXED_CHARS and record.idempotency_key.startswith("fg/u-m/")
    assert event_store.append([record]) != [None]  # stored (it raised ProgramLimitExceeded before)
    assert event_store.append([ev.encode(*pairs[0])]) == [None]  # the same value again: a duplicate
    # another value that differs only past the head is another key (not taken for a duplicate)
    second = ev.encode(pairs[0][0].model_copy(update={"at": NOW}), f"fg/u-m/{stamp}.{other}Z")
    assert second.idempotency_key != record.idempotency_key
    assert event_store.append([second]) != [None]
    stored = list(event_store.read())
    assert [s.idempotency_key for s in stored] == [record.idempotency_key, second.idempotency_key]
    assert ev.decode(stored[0].type, stored[0].version, stored[0].data) == pairs[0][0]
