"""Start-up on a log that starts above position 1 (real apiserver, real PostgreSQL).

- A fresh log whose first appends rolled back starts at, say, position 4: the controller took
  that for a pruned log and refused to start ("the event log was pruned ... holds no snapshot").
- A pruned log with no snapshot of the starting release (a change of the state's code version)
  cannot be rebuilt: the controller refuses, naming the way back; after ``backfill db restore``
  of the prune's export it starts and folds the log from position 1.
- A prune landing while start-up folds does not stop it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from kubernetes import client

from backfill.cli import main
from backfill.controller import ControllerConfigError
from backfill.controller.loop import Controller
from backfill.controller.metrics import Metrics
from backfill.core import events as ev
from backfill.core.events import encode
from backfill.core.projector import fold_all
from backfill.core.state import World
from backfill.settings import Settings
from backfill.store import EventStore, RunStore, projection

from .conftest import now_s


def _requests(namespace: str, n: int, start) -> list:
    """``n`` foreground requests on Model ``m`` a minute apart, each busy for 30 s."""
    return [
        ev.ForegroundRequest(at=start + timedelta(minutes=i), namespace=namespace, model="m", source="ingest", busy_until=start + timedelta(minutes=i, seconds=30))
        for i in range(n)
    ]


def test_a_log_whose_first_appends_rolled_back_is_not_taken_for_a_pruned_one(start_controller, pg_engine, kube_namespace):
    es = EventStore(pg_engine)
    reqs = _requests(kube_namespace, 5, now_s() - timedelta(hours=2))
    with pytest.raises(RuntimeError):
        with es.begin() as tx:
            tx.append([encode(e, f"req/{i}") for i, e in enumerate(reqs[:3])])
            raise RuntimeError("the connection dropped")
    es.append([encode(e, f"req/{i}") for i, e in enumerate(reqs)])
    assert es.first_position() == 4
    c = start_controller()  # used to raise ControllerConfigError: "the event log was pruned (it starts at position 4)"
    assert c.world.models[(kube_namespace, "m")].busy_until == reqs[-1].busy_until


def _start_refused(store, pg_engine, namespace) -> pytest.ExceptionInfo:
    """Start a Controller on event store ``store`` that must refuse: the ControllerConfigError."""
    c = Controller(Settings(namespace=namespace), client.ApiClient(), store, RunStore(pg_engine), Metrics())
    with pytest.raises(ControllerConfigError) as refused:
        try:
            c.start()
        finally:
            c.stop(timeout=1.0)
    return refused


def test_a_pruned_log_without_a_snapshot_of_this_release_refuses_until_the_export_is_restored(
    start_controller, pg_schema, pg_engine, kube_namespace, tmp_path, monkeypatch, capsys
):
    url, schema = pg_schema
    es = EventStore(pg_engine, partition_size=20)
    reqs = _requests(kube_namespace, 70, now_s() - timedelta(hours=3))
    es.append([encode(e, f"req/{i}") for i, e in enumerate(reqs)])
    projection.save(es, fold_all(World(), enumerate(reqs, 1)))  # the snapshot of the release that prunes
    export = tmp_path / "events.csv"
    assert main(["db", "prune", "--database-url", url, "--schema", schema, "--before", "2999-01-01T00:00:00Z", "--export", str(export)]) == 0
    assert es.pruned_up_to() == 60

    monkeypatch.setattr(projection, "code_version", lambda: "7-the-next-release")  # its state has another shape
    refused = _start_refused(es, pg_engine, kube_namespace)
    assert "pruned up to position 60" in str(refused.value) and "backfill db restore" in str(refused.value)

    capsys.readouterr()
    assert main(["db", "restore", str(export), "--database-url", url, "--schema", schema]) == 0
    assert "restored 60 events (positions 1-60)" in capsys.readouterr().out
    c = start_controller()
    # folded from position 1: every request is in the state, none of them from a snapshot
    assert c.snapshot_position == 0 and c.position >= 70
    assert c.world.models[(kube_namespace, "m")].busy_until == reqs[-1].busy_until
    assert c.world.models[(kube_namespace, "m")].busy_pos == 70


def test_an_unreadable_newest_snapshot_is_passed_over_for_an_older_one_that_covers_the_prune(
    start_controller, pg_schema, pg_engine, kube_namespace
):
    """A trial: with the newest snapshot truncated, the controller refused to start on a pruned
    log ("this release's snapshot cannot be read ... the events a rebuild needs are gone")
    though an older readable snapshot covered the prune."""
    url, schema = pg_schema
    es = EventStore(pg_engine, partition_size=20)
    reqs = _requests(kube_namespace, 70, now_s() - timedelta(hours=3))
    es.append([encode(e, f"req/{i}") for i, e in enumerate(reqs)])
    projection.save(es, fold_all(World(), list(enumerate(reqs, 1))[:62]), keep=5)
    projection.save(es, fold_all(World(), enumerate(reqs, 1)), keep=5)
    assert main(["db", "prune", "--database-url", url, "--schema", schema, "--before", "2999-01-01T00:00:00Z"]) == 0
    assert es.pruned_up_to() == 60
    with es.begin() as tx:
        tx.connection.execute("UPDATE snapshots SET payload = substring(payload from 1 for 20) WHERE position = 70")
    unreadable: list[str] = []
    assert projection.latest(es, unreadable=unreadable).position == 62
    assert len(unreadable) == 1 and unreadable[0].startswith("the snapshot at position 70: unreadable snapshot")
    c = start_controller()
    assert c.snapshot_position == 62 and c.position >= 70
    assert c.world.models[(kube_namespace, "m")].busy_until == reqs[-1].busy_until


class _PrunedWhileRead:
    """The controller's EventStore, except that the first ``read_payloads`` runs ``during``
    (a real prune, on its own connection) after its first batch: another replica's snapshot and
    a scheduled ``backfill db prune`` landing while start-up folds the log."""

    def __init__(self, store, during) -> None:
        self._store, self._during = store, during

    def read_payloads(self, *args, **kwargs):
        during, self._during = self._during, None
        for i, batch in enumerate(self._store.read_payloads(*args, **kwargs)):
            yield batch
            if i == 0 and during is not None:
                during()

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_start_up_goes_on_when_a_prune_lands_while_it_folds(pg_schema, pg_engine, kube_namespace, capsys):
    """Start-up refused when a prune dropped events past where it began folding ("start
    again"); it now reads on, and a gap a prune leaves is folded over from the newer snapshot
    (``tests/controller/test_prune_behind.py``): here the whole tail was read before the prune."""
    url, schema = pg_schema
    es = EventStore(pg_engine, partition_size=20)
    reqs = _requests(kube_namespace, 70, now_s() - timedelta(hours=3))
    es.append([encode(e, f"req/{i}") for i, e in enumerate(reqs)])
    pairs = list(enumerate(reqs, 1))
    projection.save(es, fold_all(World(), pairs[:30]), keep=5)  # start-up will fold from 30

    def snapshot_and_prune() -> None:
        projection.save(es, fold_all(World(), pairs), keep=5)  # the leader's newer snapshot
        assert main(["db", "prune", "--database-url", url, "--schema", schema, "--before", "2999-01-01T00:00:00Z"]) == 0

    c = Controller(Settings(namespace=kube_namespace), client.ApiClient(), _PrunedWhileRead(es, snapshot_and_prune), RunStore(pg_engine), Metrics())
    try:
        c.start()
        assert es.pruned_up_to() == 60
        assert c.position == 70 and c.world == fold_all(World(), pairs)
    finally:
        c.stop(timeout=1.0)
