"""``simulate``'s fast path gives exactly the plain path's results.

The plain path (``fast=False``) validates every event with pydantic, asks ``decide`` after every
Job end and records each attempt after every event; the fast path builds its own observations
and decision records in their compiled forms (:func:`backfill.core.events.build`), skips the
decision at a Job's end (it schedules the repeat wake-up itself) and records an attempt when the
next admission replaces it. Both are run independently here and compared field by field (the
fast path's events as its log gives them back from their compiled forms): the log (positions,
events, idempotency keys, the stored JSON), the run rows, useful seconds, overlap, the final
world and the report.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill.core import events as ev
from backfill.core.events import encode
from backfill.sim.cluster import SimParams, simulate
from backfill.sim.report import summarize, total
from backfill.sim.traces import Trace, read_trace, synthetic

ALIBABA = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "alibaba-genai-2026" / "lora_request_trace.csv"


def _same(trace: Trace, params: SimParams) -> int:
    """Assert both paths agree on everything; returns the number of runs (so a case that
    exercises nothing is visible)."""
    plain = simulate(trace, params, fast=False)
    fast = simulate(trace, params)
    assert [(p, k) for p, _, k in fast.events] == [(p, k) for p, _, k in plain.events]
    # the fast path holds its own events in their compiled forms; the log gives the events
    held = fast.events.compiled()
    setup = (ev.CronJobSeen, ev.ModelReady, ev.BackfillApplied)  # validated in both paths
    assert all(type(e) in ev.COMPILED for _, e, _ in held if not isinstance(e, setup))
    assert sum(type(e) in ev.COMPILED for _, e, _ in held) == len(held) - sum(isinstance(e, setup) for _, e, _ in plain.events)
    assert list(fast.events) == fast.events[:] == [fast.events[i] for i in range(len(fast.events))]
    assert fast.events == plain.events == list(plain.events)
    for (_, f, k), (_, p, _) in zip(fast.events, plain.events):
        assert type(f) is type(p) and f == p
        assert encode(f, k) == encode(p, k)  # the stored row: type, stream, key, at, JSON text
    assert fast.runs == plain.runs
    assert fast.useful == plain.useful and fast.overlap == plain.overlap
    assert fast.world == plain.world
    reports = summarize(trace, params, fast)
    assert reports == summarize(trace, params, plain) and total(reports) == total(summarize(trace, params, plain))
    return len(plain.runs)


# two busy spans an hour apart, then a request 20 minutes after the second idle window opened
TINY = Trace("tiny", {"m": [(0.0, 10.0), (4000.0, 0.0), (4000.0 + 1800 + 600, 0.0), (20000.0, 0.0)]})
SYN = synthetic(seed=7, models=6, days=1.0)

CASES = {
    "repeat 1m": SimParams(idle_for=300, max_run=1800, repeat_after=60, job=600),
    "one-shot": SimParams(idle_for=300, max_run=1800, repeat_after=0, job=600),
    "deadline": SimParams(idle_for=300, max_run=400, repeat_after=60, job=600, cancel_latency=2.5),
    "shards and latency": SimParams(idle_for=300, max_run=1800, repeat_after=120, job=900, shards=4, cancel_latency=5),
    "signal granularity": SimParams(idle_for=600, max_run=1800, repeat_after=60, job=300, signal_granularity=60),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fast_path_equals_plain_path_on_a_synthetic_trace(name: str) -> None:
    assert _same(SYN, CASES[name]) > 0


def test_fast_path_equals_plain_path_on_a_tiny_trace() -> None:
    assert _same(TINY, SimParams(idle_for=1800, job=3600, max_run=7200, repeat_after=0)) == 3  # preempted at 4000 s and 6400 s, then one success


def test_fast_path_equals_plain_path_on_alibaba_models() -> None:
    trace = read_trace(ALIBABA, "alibaba-genai")
    few = trace.filtered(sorted(trace.requests, key=lambda m: len(trace.requests[m]))[-4:-1])  # busy, not the busiest
    assert _same(few, SimParams(idle_for=1800, max_run=1800, repeat_after=60, job=900)) > 100


@settings(max_examples=40, deadline=None)
@given(
    gaps=st.lists(st.tuples(st.integers(0, 3), st.floats(0, 4000), st.floats(0, 300)), min_size=1, max_size=40),
    idle_for=st.sampled_from([60.0, 300.0, 900.0]),
    job=st.sampled_from([30.0, 200.0, 700.0]),
    max_run=st.sampled_from([100.0, 1800.0]),
    repeat_after=st.sampled_from([0.0, 60.0, 500.0]),
    shards=st.integers(1, 3),
    latency=st.sampled_from([0.0, 1.0, 30.0]),
)
def test_fast_path_equals_plain_path_on_random_traces(gaps, idle_for, job, max_run, repeat_after, shards, latency) -> None:
    requests: dict[str, list[tuple[float, float]]] = {}
    clock = [1_700_000_000.0] * 4
    for model, gap, service in gaps:  # arrivals of up to 4 models, some at the same instant
        clock[model] += round(gap)
        requests.setdefault(f"m{model}", []).append((clock[model], round(service, 1)))
    params = SimParams(idle_for=idle_for, max_run=max_run, repeat_after=repeat_after, job=job, shards=shards, cancel_latency=latency)
    _same(Trace("random", requests), params)
