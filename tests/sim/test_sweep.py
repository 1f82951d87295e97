"""The fast sweep (``backfill.sim.sweep``) equals the projector-driven simulation.

On the real Alibaba trace, for the busiest models and parameter sets that reach every branch:
shards, cancel latency (also longer than idleFor, when the preempted Job is still going when the
next window is due), a long cooldown reaching across gaps, one-shot, and jobs longer than maxRun;
then on random traces and parameters.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill.sim.cluster import SimParams, simulate
from backfill.sim.report import summarize
from backfill.sim.sweep import outcome_of
from backfill.sim.traces import Trace, read_trace

from .test_simulate import ALIBABA

CASES = [
    SimParams(idle_for=1800, job=900, repeat_after=60),
    SimParams(idle_for=60, job=900, shards=3, repeat_after=60, cancel_latency=6),
    SimParams(idle_for=30, job=1800, shards=6, repeat_after=3600, cancel_latency=120),  # latency > idleFor
    SimParams(idle_for=300, job=600, shards=2, repeat_after=86400, cancel_latency=1),
    SimParams(idle_for=120, job=3600, shards=4, repeat_after=60, max_run=1800, cancel_latency=3),
    SimParams(idle_for=120, job=2400, repeat_after=60, max_run=1800),  # deadline, then Failed
    SimParams(idle_for=600, job=1200, shards=5, repeat_after=0, cancel_latency=2),  # one-shot
    SimParams(idle_for=45, job=7, shards=7, repeat_after=60, cancel_latency=0.5),  # 1 s shards, sub-second latency
]


@pytest.fixture(scope="module")
def busiest():
    trace = read_trace(ALIBABA, "alibaba-genai")
    top = sorted(trace.requests, key=lambda m: (-len(trace.requests[m]), m))[:3]
    return trace.filtered(top)


@pytest.mark.parametrize("params", CASES, ids=lambda p: f"if{p.idle_for:g}-job{p.job:g}x{p.shards}-ra{p.repeat_after:g}-max{p.max_run:g}-d{p.cancel_latency:g}")
def test_sweep_equals_the_projector_driven_simulation(busiest, params):
    reports = summarize(busiest, params, simulate(busiest, params))
    assert len(reports) == 3
    for rep in reports:
        got = outcome_of(busiest.requests[rep.model], params)
        assert (got.attempts, got.succeeded, got.preempted, got.deadline_exceeded) == (
            rep.attempts, rep.succeeded, rep.preempted, rep.deadline_exceeded
        ), rep.model
        assert got.useful == pytest.approx(rep.useful, abs=1e-6)
        assert got.wasted == pytest.approx(rep.wasted, abs=1e-6)
        assert got.overlap == pytest.approx(rep.overlap, abs=1e-6)


@st.composite
def cases(draw):
    t0 = 1_700_000_000
    times = sorted(draw(st.lists(st.integers(0, 30_000), min_size=2, max_size=30)))
    reqs = [(t0 + t, float(draw(st.integers(0, 600)))) for t in times]
    shards = draw(st.integers(1, 5))
    params = SimParams(
        idle_for=draw(st.integers(1, 2400)),
        job=draw(st.integers(1, 1200)) * shards,
        shards=shards,
        repeat_after=draw(st.one_of(st.just(0), st.integers(60, 5000))),
        max_run=draw(st.integers(1, 5000)),
        cancel_latency=draw(st.integers(0, 900)),  # also longer than idleFor and than busy spans
    )
    return reqs, params


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_sweep_equals_the_simulation_on_random_traces(case):
    reqs, params = case
    trace = Trace("random", {"m": reqs})
    (rep,) = summarize(trace, params, simulate(trace, params))
    got = outcome_of(reqs, params)
    assert (got.attempts, got.succeeded, got.preempted, got.deadline_exceeded) == (
        rep.attempts, rep.succeeded, rep.preempted, rep.deadline_exceeded
    )
    assert (got.useful, got.wasted, got.overlap) == (
        pytest.approx(rep.useful, abs=1e-6), pytest.approx(rep.wasted, abs=1e-6), pytest.approx(rep.overlap, abs=1e-6)
    )
