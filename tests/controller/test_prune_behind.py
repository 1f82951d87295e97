"""A replica (or a ``backfill replay``) that falls behind while ``backfill db prune`` drops the events after its position
folds on from the newest snapshot, never over the gap (a trial: a standby paused during a prune
skipped them, and once it took over deleted a running Job as unexplained and left a run open
for ever). Real PostgreSQL (a prune is PostgreSQL's), no apiserver."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from backfill.cli import main
from backfill.controller import ControllerConfigError
from backfill.controller.loop import Controller
from backfill.controller.metrics import Metrics
from backfill.core.events import encode
from backfill.core.projector import fold_all
from backfill.core.state import World
from backfill.settings import Settings
from backfill.store import projection
from backfill.store.eventlog import EventStore
from backfill.store.runs import RunStore
from tests.controller.test_catch_up import _offline_api
from tests.store.test_restore import _log

pytestmark = pytest.mark.db

BEHIND = 600  # the replica's position when it stops reading
SNAPSHOT = 1800  # the snapshot the prune keeps; partitions of 50 drop up to it


def _behind(pg_schema, pg_engine):
    """The log stored, a controller folded up to BEHIND, then the rest stored, a snapshot at
    SNAPSHOT and the log pruned under it; returns (controller, store, log)."""
    log = _log()
    assert len(log) > SNAPSHOT + 100
    es, runs = EventStore(pg_engine, partition_size=50), RunStore(pg_engine)
    es.append([encode(e, k) for _, e, k in log[:BEHIND]])
    c = Controller(Settings(), _offline_api(), es, runs, Metrics())
    c.catch_up()
    assert c.position == BEHIND
    es.append([encode(e, k) for _, e, k in log[BEHIND:]])
    projection.save(es, fold_all(World(), [(p, e) for p, e, _ in log[:SNAPSHOT]]))
    for checkpoint in ("runs", "runs-counted"):  # the acting replica's: every run row stored and counted
        runs.apply([], checkpoint, log[-1][0])
    url, schema = pg_schema
    assert main(["db", "prune", "--before", "2999-01-01T00:00:00Z", "--database-url", url, "--schema", schema]) == 0
    assert es.pruned_up_to() == SNAPSHOT
    return c, es, log


def test_a_replica_behind_a_prune_folds_on_from_the_snapshot(pg_schema, pg_engine):
    c, es, log = _behind(pg_schema, pg_engine)
    try:
        keys = c.catch_up()
        whole = fold_all(World(), [(p, e) for p, e, _ in log])  # what folding every event gives
        assert c.position == log[-1][0] and c.world == whole
        assert keys == set(whole.backfills)  # every backfill is decided again
        assert c.snapshot_position == SNAPSHOT
    finally:
        c.spool.stop(0.5)
        c.actor.close()


def test_a_replica_behind_a_prune_with_no_snapshot_to_continue_folds_nothing(pg_schema, pg_engine):
    c, es, log = _behind(pg_schema, pg_engine)
    try:
        with pg_engine.begin() as conn:  # the snapshot gone (another release's only, say)
            conn.execute(sa.text("DELETE FROM snapshots"))
        before = c.world
        with pytest.raises(ControllerConfigError, match=r"pruned up to position 1800, past this replica's position 600"):
            c.catch_up()
        assert c.position == BEHIND and c.world is before  # fail-closed: nothing folded over the gap
    finally:
        c.spool.stop(0.5)
        c.actor.close()


class _PrunedAfterFirstBatch:
    """``es`` whose reads come in batches of 100, and whose log is pruned (by the CLI, as an
    operator would) right after the first batch is handed out."""

    def __init__(self, es: EventStore, prune) -> None:
        self._es, self._prune = es, prune

    def __getattr__(self, name):
        return getattr(self._es, name)

    def read_payloads(self, after: int = 0, *, batch_size: int = 20000):
        for i, batch in enumerate(self._es.read_payloads(after, batch_size=100)):
            yield batch
            if i == 0:
                self._prune()


def test_a_replay_the_log_is_pruned_under_stops_with_one_line(pg_schema, pg_engine):
    log = _log()
    es, runs = EventStore(pg_engine, partition_size=50), RunStore(pg_engine)
    es.append([encode(e, k) for _, e, k in log])
    projection.save(es, fold_all(World(), [(p, e) for p, e, _ in log[:SNAPSHOT]]))
    for checkpoint in ("runs", "runs-counted"):
        runs.apply([], checkpoint, log[-1][0])
    url, schema = pg_schema

    def prune() -> None:
        assert main(["db", "prune", "--before", "2999-01-01T00:00:00Z", "--database-url", url, "--schema", schema]) == 0

    fed: list[int] = []

    class Auditor:
        def feed_many(self, batch) -> None:
            fed.extend(p for p, _ in batch)

    with pytest.raises(projection.PrunedMeanwhile) as raised:
        projection.replay(_PrunedAfterFirstBatch(es, prune), Auditor())
    # the batches read ahead before the prune are fed (100 or 200), nothing past the gap
    assert len(fed) in (100, 200) and fed == list(range(1, len(fed) + 1))
    assert f"pruned up to position 1800 while it was read (at position {len(fed)})" in str(raised.value)
