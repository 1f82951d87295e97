"""Issue #11 part 2: ``simulate --shards`` and the clairvoyant bound.

Checked against the independent oracles of ``oracle.py`` (on the real Alibaba trace and on random
traces), against an exhaustive search over every schedule of small integer instances (the bound
is the optimum), and as properties: simulated useful <= bound <= total idle time.
"""

from __future__ import annotations

import json
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill.cli import main
from backfill.sim.bound import clairvoyant, gaps_us
from backfill.sim.cluster import SimParams, simulate
from backfill.sim.report import summarize
from backfill.sim.traces import Trace, read_trace

from .oracle import bound_oracle, oracle
from .test_simulate import ALIBABA, _rows_for


@pytest.fixture(scope="module")
def alibaba():
    return read_trace(ALIBABA, "alibaba-genai")


@pytest.fixture(scope="module")
def m0002_rows():
    return _rows_for(ALIBABA, "M0002")


def _report(trace, params):
    (rep,) = summarize(trace, params, simulate(trace, params))
    return rep


# (idle_for, job, shards, repeat_after, max_run, delta): seconds
REAL_CASES = [
    (1800, 900, 1, 60, 1800, 0),
    (600, 900, 3, 60, 1800, 6),
    (300, 1800, 6, 3600, 1800, 2),
    (60, 600, 10, 86400, 1800, 0),
    (120, 3600, 4, 60, 1800, 5),  # job longer than maxRun: only resumed attempts can finish
    (900, 1200, 2, 0, 1800, 1),  # one-shot
]


@pytest.mark.parametrize("idle_for, job, shards, repeat_after, max_run, delta", REAL_CASES)
def test_shards_on_the_real_trace_match_the_oracle(alibaba, m0002_rows, idle_for, job, shards, repeat_after, max_run, delta):
    trace = alibaba.filtered(["M0002"])
    params = SimParams(idle_for=idle_for, job=job, shards=shards, repeat_after=repeat_after, max_run=max_run, cancel_latency=delta)
    rep = _report(trace, params)
    exp = oracle(m0002_rows, idle_for, job, repeat_after, max_run, delta=delta, shards=shards)
    assert (rep.attempts, rep.succeeded, rep.preempted, rep.deadline_exceeded) == (
        exp["attempts"], exp["succeeded"], exp["preempted"], exp["deadline"]
    )
    assert rep.useful == pytest.approx(exp["useful"])
    assert rep.wasted == pytest.approx(exp["wasted"])
    assert rep.overlap == pytest.approx(exp["overlap"])
    jobs, _, useful, idle = bound_oracle(m0002_rows, job, shards, repeat_after, max_run)
    assert (rep.bound_jobs, rep.bound_useful, rep.idle) == (jobs, pytest.approx(useful), pytest.approx(idle))
    assert rep.useful <= rep.bound_useful <= rep.idle


def test_shards_keep_work_that_one_shard_loses(alibaba, m0002_rows):
    trace = alibaba.filtered(["M0002"])
    one = _report(trace, SimParams(idle_for=600, job=1800, repeat_after=60))
    six = _report(trace, SimParams(idle_for=600, job=1800, shards=6, repeat_after=60))
    assert six.useful > one.useful and six.wasted < one.wasted
    # with one shard nothing of a preempted attempt is useful: useful = succeeded x job
    assert one.useful == pytest.approx(one.succeeded * 1800)


def test_the_bound_carries_the_cooldown_across_gaps(m0002_rows):
    # repeatAfter 24h over 23 days: at most one job per day, whatever the gaps
    jobs, _, useful, _ = bound_oracle(m0002_rows, 900, 1, 86400, 1800)
    b = clairvoyant(gaps_us(m0002_rows), job=900, repeat_after=86400, max_run=1800)
    assert b.jobs == jobs and b.useful == pytest.approx(useful)
    span_days = (m0002_rows[-1][0] - m0002_rows[0][0]) / 86400
    assert b.jobs <= span_days + 1


def test_simulate_cli_prints_the_bound_and_idle(capsys):
    args = ["simulate", "--no-store", "--json", "--trace", str(ALIBABA), "--format", "alibaba-genai", "--model", "M0002",
            "--idle-for", "10m", "--job", "15m", "--shards", "3", "--repeat-after", "1m"]
    assert main(args) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    m = rows["M0002"]
    exp = oracle(_rows_for(ALIBABA, "M0002"), 600, 900, 60, 1800, shards=3)
    assert m["useful"] == pytest.approx(exp["useful"])
    assert m["ratio"] == pytest.approx(m["useful"] / m["bound_useful"])
    assert m["idle_share"] == pytest.approx(m["useful"] / m["idle"])


@pytest.mark.parametrize("args, fragment", [(["--shards", "0"], "--shards"), (["--job", "1s", "--shards", "5000000"], "--shards")])
def test_bad_shards_are_one_line_errors(args, fragment, capsys):
    assert main(["simulate", "--no-store", "--days", "0.1", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("backfill: error:") and fragment in err[0]


# ------------------------------------------------------------------ exhaustive optimum


def _exhaustive(gaps, shard, shards, repeat_after):
    """Most shards any schedule fits: at every integer instant wait or start a shard (integer
    instances: an optimal schedule can be shifted left onto integer starts)."""
    horizon = gaps[-1][1] if gaps else 0

    @lru_cache(maxsize=None)
    def best(t, left, free, ended):
        if t >= horizon or ended:
            return 0
        out = best(t + 1, left, free, ended)  # wait
        if t >= free and any(a <= t and t + shard <= b for a, b in gaps):
            if left == 1:
                out = max(out, 1 + best(t + shard + repeat_after, shards, t + shard + repeat_after, repeat_after == 0))
            else:
                out = max(out, 1 + best(t + shard, left - 1, free, False))
        return out

    return best(0, shards, 0, False)


@st.composite
def integer_gaps(draw):
    cuts = sorted(draw(st.lists(st.integers(0, 36), min_size=2, max_size=8, unique=True)))
    return [(a, b) for a, b in zip(cuts[::2], cuts[1::2])]


@settings(max_examples=200, deadline=None)
@given(integer_gaps(), st.integers(1, 6), st.integers(1, 4), st.integers(0, 8))
def test_the_bound_is_the_exhaustive_optimum(gaps, shard, shards, repeat_after):
    b = clairvoyant([(a * 10**6, z * 10**6) for a, z in gaps], job=shard * shards, shards=shards, repeat_after=repeat_after)
    assert b.shards == _exhaustive(tuple(gaps), shard, shards, repeat_after)
    assert b.useful == pytest.approx(b.shards * shard)


# ------------------------------------------------------------------ random traces


@st.composite
def traces(draw):
    n = draw(st.integers(2, 25))
    t0 = 1_700_000_000
    times = sorted(draw(st.lists(st.integers(0, 40_000), min_size=n, max_size=n)))
    reqs = [(t0 + t, float(draw(st.integers(0, 900)))) for t in times]
    return reqs


@st.composite
def params(draw):
    idle_for = draw(st.integers(1, 3600))
    shard = draw(st.integers(1, 1800))
    shards = draw(st.integers(1, 6))
    repeat_after = draw(st.one_of(st.just(0), st.integers(60, 7200)))
    max_run = draw(st.integers(1, 7200))
    delta = draw(st.integers(0, min(idle_for, 30)))
    return SimParams(idle_for=idle_for, job=shard * shards, shards=shards, repeat_after=repeat_after, max_run=max_run, cancel_latency=delta)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(), params())
def test_random_traces_useful_le_bound_le_idle_and_match_the_oracle(reqs, p):
    trace = Trace("random", {"m": reqs})
    rep = _report(trace, p)
    assert rep.useful <= rep.bound_useful + 1e-6
    assert rep.bound_useful <= rep.idle + 1e-6
    exp = oracle(reqs, p.idle_for, p.job, p.repeat_after, p.max_run, delta=p.cancel_latency, shards=p.shards)
    assert (rep.attempts, rep.succeeded, rep.preempted, rep.deadline_exceeded) == (
        exp["attempts"], exp["succeeded"], exp["preempted"], exp["deadline"]
    )
    assert rep.useful == pytest.approx(exp["useful"]) and rep.wasted == pytest.approx(exp["wasted"])
    jobs, _, useful, idle = bound_oracle(reqs, p.job, p.shards, p.repeat_after, p.max_run)
    assert (rep.bound_jobs, rep.bound_useful, rep.idle) == (jobs, pytest.approx(useful), pytest.approx(idle))
