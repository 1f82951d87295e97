"""Snapshots of the projection (issue 10): the controller starts from the newest one and folds
only the tail, to exactly the state a full refold gives; a snapshot of another code version is
never read; ``backfill replay --since`` starts from the snapshot before it without divergence."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from backfill.core.events import decode_many
from backfill.core.projector import fold_all
from backfill.core.state import World
from backfill.store import EventStore, make_engine
from backfill.store import projection

from .conftest import now_s, ts, wait_for

pytestmark = pytest.mark.kube


def _refold(url: str, schema: str) -> World:
    engine = make_engine(url, schema)
    es = EventStore(engine)
    try:
        pairs = [
            (row[0], e)
            for batch in es.read_payloads(0)
            for row, e in zip(batch, decode_many([(t, v, d) for _, t, v, d in batch]))
        ]
    finally:
        es.close()
        engine.dispose()
    return fold_all(World(), pairs)


def _running_with_a_snapshot(kube, start_controller, name: str):
    """A controller that snapshots after every event (keeping them all, so one before any later
    time still exists), and one running attempt of ``name``."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", lastActiveTime=ts(now_s() - timedelta(minutes=5)))
    c = start_controller(snapshot_every_events=1, snapshot_keep=1000)
    kube.backfill(name, idleFor="1s")
    wait_for(lambda: kube.jobs(), timeout=15, what="the Job")
    wait_for(lambda: c.snapshot_position > 0, what="a snapshot")
    return c


def test_restart_loads_the_snapshot_and_folds_only_the_tail(kube, start_controller, pg_schema):
    url, schema = pg_schema
    c1 = _running_with_a_snapshot(kube, start_controller, "snap")
    c1.stop()
    saved = c1.snapshot_position

    # events after the snapshot: a foreground request the second controller must fold from the log
    kube.set_status("models", "gemma", {"lastActiveTime": ts(now_s())})
    c2 = start_controller()
    assert c2.snapshot_position >= saved > 0
    wait_for(lambda: not kube.jobs() or all(j.metadata.deletion_timestamp for j in kube.jobs()), timeout=10, what="the cancel")
    # the Job's deletion in the log and folded (else stop() stores it after the loop stopped folding)
    wait_for(lambda: any(r.type == "JobDeleted" for r in c2.events.read(saved)), timeout=10, what="JobDeleted recorded")
    wait_for(lambda: c2.spool.settled(c2.position) and c2.position == c2.events.head(), what="the spool to settle")
    c2.stop()
    full = _refold(url, schema)
    assert c2.position == full.position
    assert c2.world == full  # the snapshot + tail equals a fold of the whole log


def test_a_snapshot_of_another_code_version_is_never_read(pg_schema):
    url, schema = pg_schema
    engine = make_engine(url, schema)
    es = EventStore(engine)
    try:
        es.save_snapshot(projection.PROJECTION, 10, "not-this-code", b"\x80garbage")
        assert projection.latest(es) is None
        good = World()._replace(position=0)
        es.save_snapshot(projection.PROJECTION, 0, projection.code_version(), projection.dump_world(good))
        assert projection.latest(es) == good
    finally:
        es.close()
        engine.dispose()


def test_replay_since_starts_from_the_snapshot_before_it(kube, start_controller, pg_schema):
    url, schema = pg_schema
    c = _running_with_a_snapshot(kube, start_controller, "later")
    since = datetime.now(timezone.utc)
    kube.set_status("models", "gemma", {"lastActiveTime": ts(now_s() + timedelta(seconds=1))})
    wait_for(lambda: not [j for j in kube.jobs() if not j.metadata.deletion_timestamp], timeout=10, what="the cancel")
    wait_for(lambda: c.spool.settled(c.position), what="the spool to settle")
    out = subprocess.run(
        [sys.executable, "-m", "backfill.cli", "replay", "--database-url", url, "--schema", schema, "--since", since.isoformat()],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "starting from the snapshot at position" in out.stderr
    assert "no divergence" in out.stdout
