"""``Controller.catch_up`` folds runs of foreground requests with the batch fold (issue 10) and
still gives what folding one event at a time gives: the same world, the same woken backfills and
the same run rows (middle tier: the in-memory store, no apiserver)."""

from __future__ import annotations

import random
from types import SimpleNamespace

from kubernetes import client

from backfill.controller.loop import Controller
from backfill.controller.metrics import Metrics
from backfill.core import events as ev
from backfill.core.events import encode
from backfill.core.projector import affected, fold, only_position_moved
from backfill.core.runs import run_rows
from backfill.core.state import World
from backfill.settings import Settings
from backfill.sim.cluster import SimParams, simulate
from backfill.sim.traces import Trace
from backfill.store.memory import MemoryBackend, MemoryEventStore, MemoryRunStore
from backfill.store.projection import code_version


def _offline_api() -> client.ApiClient:
    """An API client of no cluster: its calls are refused at once (port 9, discard). The
    default one has no host at all, and urllib3 warned of a URL without a scheme."""
    return client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))


def _trace() -> Trace:
    # 6 models over two days: bursts of requests (long runs of ForegroundRequest in the log)
    # between quiet spells (admissions, Job facts and cancels between the runs).
    rnd = random.Random(11)
    requests = {}
    for m in range(6):
        t, reqs = 0.0, []
        while t < 2 * 86400:
            burst = rnd.randrange(1, 400)
            for _ in range(burst):
                reqs.append((t, rnd.choice([0.0, 0.5, 3.0])))
                t += rnd.choice([0.1, 1.0, 5.0])
            t += rnd.choice([600.0, 3600.0, 7200.0])
        requests[f"model-{m}"] = reqs
    return Trace("bursts", requests)


def test_catch_up_equals_folding_one_event_at_a_time():
    result = simulate(_trace(), SimParams(idle_for=300, max_run=1800, repeat_after=60, job=900, cancel_latency=2))
    log = [(pos, e) for pos, e, _ in result.events]
    kinds = {type(e).__name__ for _, e in log}
    assert {"ForegroundRequest", "AttemptAdmitted", "JobSucceeded", "AttemptCancelled", "JobDeleted"} <= kinds
    assert len(log) > 5000  # more than one read batch (5,000): a run may span two batches

    # the reference: the per-event loop (fold, affected unless only the position moved,
    # run_rows), over the same chunks the controller catches up on
    rnd = random.Random(5)
    chunks, i = [], 0
    while i < len(log):
        n = rnd.choice([1, 3, 40, 700, 6000])
        chunks.append((i, min(len(log), i + n)))
        i += n
    world, rows, expected_keys = World(), {}, []
    for lo, hi in chunks:
        keys = set()
        for pos, e in log[lo:hi]:
            before, world = world, fold(world, e, pos)
            if not only_position_moved(before, world):
                keys.update(affected(world, e))
            for row in run_rows(before, world, e):
                rows[row.identity] = row
        expected_keys.append(keys)

    backend = MemoryBackend()
    events, runs = MemoryEventStore(backend), MemoryRunStore(backend)
    c = Controller(Settings(), _offline_api(), events, runs, Metrics())
    only_requests = 0
    try:
        for (lo, hi), keys in zip(chunks, expected_keys):
            assert events.append([encode(e, k) for _, e, k in result.events[lo:hi]]) == [pos for pos, _ in log[lo:hi]]
            assert c.catch_up() == keys, (lo, hi)
            only_requests += keys != set() and all(type(e).__name__ == "ForegroundRequest" for _, e in log[lo:hi])
    finally:
        c.spool.stop(0.5)
        c.actor.close()
    assert only_requests >= 10  # chunks whose woken backfills come from requests alone
    assert c.world == world and c.position == log[-1][0]
    assert {r.identity: r for r in runs.query()} == rows
    assert runs.get_checkpoint("runs") == log[-1][0]


def test_a_snapshot_moves_the_runs_checkpoint_in_a_quiet_cluster():
    # A trial: with no run row changing (every declaration done, suspended or Blocked), the
    # ``runs`` checkpoint stayed where the last row change left it and blocked every prune.
    log = simulate(_trace(), SimParams(idle_for=300, max_run=1800, repeat_after=0, job=900)).events  # one-shot: few rows
    backend = MemoryBackend()
    events, runs = MemoryEventStore(backend), MemoryRunStore(backend)
    events.append([encode(e, k) for _, e, k in log])
    c = Controller(Settings(snapshot_every_events=1), _offline_api(), events, runs, Metrics())
    try:
        c.catch_up()
        last_row = runs.get_checkpoint("runs")
        quiet = [ev.ForegroundRequest(at=log[-1][1].at, namespace="sim", model="model-0", source="ingest") for _ in range(50)]
        head = events.append([encode(e, f"quiet/{i}") for i, e in enumerate(quiet)])[-1]
        c.catch_up()
        assert runs.get_checkpoint("runs") == last_row < head  # no row changed: catch-up leaves it
        c._maybe_snapshot()
        assert events.load_snapshot("projection", code_version())[0] == head
        assert runs.get_checkpoint("runs") == head
    finally:
        c.spool.stop(0.5)
        c.actor.close()


def _last_row_change(log) -> int:
    """The position of the last event of ``log`` that changed a run row, folding one event at a
    time (the reference, not catch_up)."""
    world, last = World(), 0
    for pos, e, _ in log:
        before, world = world, fold(world, e, pos)
        if run_rows(before, world, e):
            last = pos
    return last


def _sum(metrics: Metrics, name: str, **labels: str) -> float:
    """The sum of every sample ``name`` of ``metrics`` whose labels include ``labels``."""
    return sum(
        s.value for m in metrics.registry.collect() for s in m.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )  # fmt: skip


def test_an_acting_replica_counts_every_run_row_once_and_its_checkpoint_follows_the_snapshot():
    # The metrics follow the rows after they are stored; the ``runs-counted`` checkpoint moves
    # with each counted batch and, in a quiet cluster, with the snapshot (as ``runs``: every
    # checkpoint holds back ``backfill db prune``). A standby keeps its changes (none counted).
    result = simulate(_trace(), SimParams(idle_for=300, max_run=1800, repeat_after=60, job=900, cancel_latency=2))
    log = [(pos, e, k) for pos, e, k in result.events]
    ended = [r for r in result.runs if r.result is not None]
    assert len(result.runs) > 20 and ended
    replicas = []
    for acting in (True, False):
        backend = MemoryBackend()
        events, runs = MemoryEventStore(backend), MemoryRunStore(backend)
        c = Controller(Settings(snapshot_every_events=1), _offline_api(), events, runs, Metrics(), leader=SimpleNamespace(is_leader=lambda a=acting: a))
        replicas.append((c, events, runs))
        half = len(log) // 2
        events.append([encode(e, k) for _, e, k in log[:half]])
        c.catch_up()  # the start-up refold: nothing is counted before start() ends
        assert c._uncounted and _sum(c.metrics, "flexinfer_model_backfill_starts_total") == 0
        c._live = True  # as start() leaves it
        c.catch_up()  # no new event: what start-up kept is counted now (when acting)
        assert bool(c._uncounted) is not acting
        for i in range(half, len(log), 997):  # batches of rows, counted as they come
            events.append([encode(e, k) for _, e, k in log[i : i + 997]])
            c.catch_up()
    (leader, events, runs), (standby, _, standby_runs) = replicas
    try:
        by_result: dict[str, int] = {}
        for r in ended:  # the simulator's own rows, not the controller's
            by_result[r.result] = by_result.get(r.result, 0) + 1
        for res, n in by_result.items():
            assert _sum(leader.metrics, "flexinfer_model_backfill_completions_total", result=res) == n, res
        assert _sum(leader.metrics, "flexinfer_model_backfill_starts_total") == len(result.runs)
        assert _sum(standby.metrics, "flexinfer_model_backfill_starts_total") == 0
        assert not leader._uncounted and len(standby._uncounted) > 0
        assert standby_runs.get_checkpoint("runs-counted") == 0  # a standby counts nothing
        counted = runs.get_checkpoint("runs-counted")
        assert counted == _last_row_change(log) > 0
        quiet = [ev.ForegroundRequest(at=log[-1][1].at, namespace="sim", model="model-0", source="ingest") for _ in range(50)]
        head = events.append([encode(e, f"quiet/{i}") for i, e in enumerate(quiet)])[-1]
        leader.catch_up()
        assert runs.get_checkpoint("runs-counted") == counted < head  # no row changed: catch-up leaves it
        leader._maybe_snapshot()
        assert runs.get_checkpoint("runs-counted") == runs.get_checkpoint("runs") == head
    finally:
        for c, _, _ in replicas:
            c.spool.stop(0.5)
            c.actor.close()


def test_rows_stored_and_not_counted_before_a_restart_are_counted_by_the_next_leader():
    # An adversarial trial: the leader died; the standby folded and stored the rows that ended
    # meanwhile (the ``runs`` checkpoint moved past them) and was then restarted (a rolling
    # update) before it took over: the start-up refold skipped every row up to ``runs``, and
    # those changes were counted by no replica. Likewise a leader killed between storing a
    # batch's rows and counting them.
    result = simulate(_trace(), SimParams(idle_for=300, max_run=1800, repeat_after=60, job=900, cancel_latency=2))
    log = [(pos, e, k) for pos, e, k in result.events]
    backend = MemoryBackend()
    events, runs = MemoryEventStore(backend), MemoryRunStore(backend)
    half = len(log) // 2

    def replica(acting: bool) -> Controller:
        c = Controller(Settings(), _offline_api(), events, runs, Metrics(), leader=SimpleNamespace(is_leader=lambda: acting))
        # what start() does around its refold: the checkpoints read, the log folded, then live
        c._runs_checkpoint, c._counted_checkpoint = runs.get_checkpoint("runs"), runs.get_checkpoint("runs-counted")
        c.catch_up()
        c._runs_checkpoint = c._counted_checkpoint = 0
        c._live = True
        return c

    events.append([encode(e, k) for _, e, k in log[:half]])
    leader = replica(acting=True)
    leader.catch_up()
    standby = replica(acting=False)
    events.append([encode(e, k) for _, e, k in log[half:]])  # the leader is gone: it folds none of these
    standby.catch_up()
    assert runs.get_checkpoint("runs") > runs.get_checkpoint("runs-counted") > 0  # stored, not counted
    restarted = replica(acting=True)  # the standby, restarted, then leading
    restarted.catch_up()
    try:
        for res in {r.result for r in result.runs if r.result}:
            n = sum(r.result == res for r in result.runs)
            assert _sum(leader.metrics, "flexinfer_model_backfill_completions_total", result=res) + _sum(
                restarted.metrics, "flexinfer_model_backfill_completions_total", result=res
            ) == n, res
        starts = _sum(leader.metrics, "flexinfer_model_backfill_starts_total") + _sum(restarted.metrics, "flexinfer_model_backfill_starts_total")
        assert starts == len(result.runs)
        assert 0 < _sum(restarted.metrics, "flexinfer_model_backfill_starts_total") < len(result.runs)
        assert not restarted._uncounted and runs.get_checkpoint("runs-counted") == _last_row_change(log)
    finally:
        for c in (leader, standby, restarted):
            c.spool.stop(0.5)
            c.actor.close()
