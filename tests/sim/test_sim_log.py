"""The simulated log (``SimResult.events``, a :class:`backfill.sim.cluster.SimLog`): requests
enter in the order a heap of all of them gives (their microsecond, then their index in the
model's list, also for a list that is not sorted), and a result pickles like the list it was."""

from __future__ import annotations

import pickle
import random

from backfill.sim.cluster import SimParams, simulate
from backfill.sim.traces import Trace

PARAMS = SimParams(idle_for=60, job=120, max_run=1800, repeat_after=60)


def _request_order(result) -> list[tuple[str, int]]:
    return [(k.split("/")[2], int(k.split("/")[3])) for _, _, k in result.events.compiled() if k.startswith("trace/")]


def _expected(requests: dict[str, list[tuple[float, float]]]) -> list[tuple[str, int]]:
    """Every request by (its microsecond, its model's place in the trace, its index): the
    module docstring's order for arrivals, computed here without the simulator."""
    rank = {m: r for r, m in enumerate(requests)}
    keyed = [(round(t * 1e6), rank[m], i, m) for m, reqs in requests.items() for i, (t, _) in enumerate(reqs)]
    return [(m, i) for _, _, i, m in sorted(keyed)]


def test_unsorted_requests_tied_within_a_microsecond_keep_their_index_order():
    """A differential trial: 100.0000004 s listed before 100.0000001 s (the same microsecond once
    rounded) were swapped when the simulator sorted the floats."""
    requests = {"a": [(100.0000004, 50.0), (100.0000001, 0.0), (1000.0, 0.0), (5000.0, 0.0)]}
    result = simulate(Trace("tied", requests), PARAMS)
    assert _request_order(result) == [("a", 0), ("a", 1), ("a", 2), ("a", 3)] == _expected(requests)


def test_random_unsorted_traces_enter_in_heap_order():
    rnd = random.Random(11)
    for _ in range(30):
        requests = {
            f"m{m}": [(1_000_000 + rnd.choice([0, 1e-7, 3e-7, 1, 60, 600]) * rnd.randint(0, 40), rnd.choice([0.0, 5.0])) for _ in range(rnd.randint(1, 12))]
            for m in range(rnd.randint(1, 3))
        }
        result = simulate(Trace("random", requests), PARAMS)
        assert _request_order(result) == _expected(requests)


def test_a_result_pickles():
    requests = {"a": [(0.0, 10.0), (4000.0, 0.0), (9000.0, 0.0)], "b": [(10.0, 0.0), (7000.0, 5.0)]}
    result = simulate(Trace("t", requests), PARAMS)
    back = pickle.loads(pickle.dumps(result))
    assert len(back.events) == len(result.events) > 10
    assert back.events == result.events and back.runs == result.runs and back.world == result.world
    assert back.useful == result.useful and back.overlap == result.overlap
