"""``simulate`` and ``recommend`` refuse a trace that could need more than ``--max-attempts``
attempts (an adversarial trial: a two-row trace from 1971 to 9000 ran for minutes and took
3 GB before it was killed). The bound must hold: no simulation admits more than it says."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill.cli import main
from backfill.sim.cluster import SimParams, attempts_bound, simulate
from backfill.sim.traces import Trace

from .test_simulate import ALIBABA

HEAVY = SimParams(idle_for=1800, max_run=1800, repeat_after=60, job=900)


@st.composite
def traces(draw):
    requests = {}
    for m in range(draw(st.integers(1, 3))):
        arrivals = sorted(draw(st.lists(st.integers(0, 20_000), min_size=1, max_size=25)))
        requests[f"m{m}"] = [(float(t), float(draw(st.integers(0, 600)))) for t in arrivals]
    return Trace("random", requests)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    traces(),
    st.sampled_from([60, 300, 1800]),  # idleFor
    st.sampled_from([60, 900, 4000]),  # job
    st.sampled_from([120, 1800]),  # maxRunDuration
    st.sampled_from([0, 60, 600]),  # repeatAfter
    st.sampled_from([1, 4]),  # shards
    st.sampled_from([0.0, 5.0]),  # cancel latency
)
def test_no_simulation_admits_more_attempts_than_the_bound(trace, idle_for, job, max_run, repeat_after, shards, delta):
    p = SimParams(idle_for=idle_for, max_run=max_run, repeat_after=repeat_after, job=job, shards=shards, cancel_latency=delta)
    attempts = {(r.backfill, r.attempt) for r in simulate(trace, p).runs}
    assert len(attempts) <= attempts_bound(trace.requests, p)


def test_the_bound_counts_the_job_as_simulated_not_as_asked():
    """A review: 10,000 shards of 1.49 us each make a 14.9 ms job 14.9 ms... rounded to 1 us
    each: 10 ms as simulated, so more cycles fit than ``--job`` says."""
    p = SimParams(idle_for=60, repeat_after=60, job=0.0149, shards=10_000)
    trace = Trace("two", {"m": [(0.0, 0.0), (600.0, 0.0)]})
    attempts = {(r.backfill, r.attempt) for r in simulate(trace, p).runs}
    assert len(attempts) <= attempts_bound(trace.requests, p)
    assert attempts_bound(trace.requests, p) == 2 * 2 + 1 + int(600 // (10_000 * 1e-6 + 60))


def test_the_bound_on_the_whole_alibaba_trace():
    from backfill.sim.traces import read_trace

    t = read_trace(ALIBABA, "alibaba-genai")
    # Independently: per model, 2 per request + 1 + one per 15m job + 1m cooldown of its span.
    expected = sum(2 * len(r) + 1 + int((r[-1][0] - r[0][0]) // 960) for r in t.requests.values() if r)
    assert attempts_bound(t.requests, HEAVY) == expected


def _wide(tmp_path: Path) -> Path:
    p = tmp_path / "wide.csv"
    p.write_text("model,timestamp\nm,1971-01-02T00:00:00Z\nm,9000-12-30T00:00:00Z\n")
    return p


def test_a_trace_spanning_millennia_is_one_line_error_not_hours(tmp_path, capsys):
    args = ["--trace", str(_wide(tmp_path)), "--format", "csv", "--job", "1m", "--repeat-after", "1m"]
    for cmd in (["simulate", "--no-store", "--idle-for", "1m"], ["recommend"]):
        assert main([*cmd, *args]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        span = (datetime(9000, 12, 30) - datetime(1971, 1, 2)).total_seconds()
        n = 2 * 2 + 1 + int(span // 120)  # two requests, one model; a 1m job + 1m cooldown per cycle
        assert line.startswith(f"backfill: error: the trace could need up to {n:,} attempts"), line
        assert "more than --max-attempts 500,000" in line


def test_a_year_typo_at_the_default_repeat_is_refused(tmp_path, capsys):
    """A new user's trial: ``9998`` for ``2024`` at the default ``--repeat-after 24h`` could need
    2.9 million attempts, under the earlier default limit of 5,000,000: it ran for 3 minutes and
    grew to 8.8 GB before it was killed."""
    p = tmp_path / "typo.csv"
    p.write_text("model,timestamp\nm,2024-01-01T00:00:00Z\nm,9998-12-31T00:00:00Z\n")
    assert main(["simulate", "--no-store", "--trace", str(p), "--format", "csv"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    span = (datetime(9998, 12, 31) - datetime(2024, 1, 1)).total_seconds()
    n = 2 * 2 + 1 + int(span // (15 * 60 + 86400))  # the defaults: --job 15m, --repeat-after 24h
    assert 500_000 < n < 5_000_000
    assert line.startswith(f"backfill: error: the trace could need up to {n:,} attempts"), line


def test_max_attempts_raises_the_limit(tmp_path, capsys):
    p = tmp_path / "year.csv"
    p.write_text("model,timestamp\nm,2026-01-01T00:00:00Z\nm,2026-01-03T00:00:00Z\n")  # 2 days: 1,445 at most
    base = ["simulate", "--no-store", "--trace", str(p), "--format", "csv", "--idle-for", "1m", "--job", "1m", "--repeat-after", "1m"]
    assert main([*base, "--max-attempts", "1000"]) == 2
    assert "up to 1,445 attempts" in capsys.readouterr().err
    assert main([*base, "--max-attempts", "1445"]) == 0


def test_a_trace_that_is_a_device_is_refused_unread(tmp_path, capsys):
    """An adversarial trial: ``simulate --trace /dev/zero`` read until the machine ran out of
    memory (18.6 GB after 40 s). A trace is a file or a pipe; a device is one line, unread."""
    for cmd in (["simulate", "--no-store"], ["recommend"]):
        for device in ("/dev/zero", "/dev/urandom"):
            assert main([*cmd, "--trace", device, "--format", "csv"]) == 2
            (line,) = capsys.readouterr().err.strip().splitlines()
            assert line == f"backfill: error: {device}: not a file (a device or socket): give a trace file, or a pipe", line
    # a pipe is read (a shell's <(zcat trace.csv.gz))
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("model,timestamp\nm,2024-01-01T00:00:00Z\nm,2024-01-01T01:00:00Z\n"))
    writer.start()
    assert main(["simulate", "--no-store", "--json", "--trace", str(fifo), "--format", "csv"]) == 0
    writer.join(5)
    import json

    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["m"]["requests"], rows["m"]["attempts"]) == (2, 1)  # one idle hour: one 15m Job


def test_an_rfc3339_timestamp_out_of_range_is_said_as_a_date(tmp_path, capsys):
    """A new user's trial: ``9999-01-01T00:00:00Z`` was "out of range (Unix seconds between 1970
    and 9999 expected; milliseconds?)": the value was no Unix seconds, and 9999 read as inside."""
    p = tmp_path / "far.csv"
    p.write_text("model,timestamp\nm,2024-01-01T00:00:00Z\nm,9999-01-01T00:00:00Z\n")
    assert main(["simulate", "--no-store", "--trace", str(p), "--format", "csv"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith("timestamp '9999-01-01T00:00:00Z' is out of range (from 1970-01-01 up to, not including, 9999-01-01)"), line


def test_a_synthetic_workload_stops_at_its_request_limit():
    from backfill.sim.traces import SyntheticTooLarge, synthetic

    whole = synthetic(7, 3, 1.0)
    n = sum(len(r) for r in whole.requests.values())
    assert n > 1000
    assert synthetic(7, 3, 1.0, max_requests=n).requests == whole.requests
    try:
        synthetic(7, 3, 1.0, max_requests=n - 1)
    except SyntheticTooLarge as exc:
        assert exc.limit == n - 1
    else:
        raise AssertionError("no SyntheticTooLarge")


def test_a_synthetic_workload_too_large_is_refused_before_it_is_built(capsys):
    """A new user's trial: ``--synthetic-models 1000 --days 366`` (both in their ranges) grew past
    5 GB in a minute before the bound was computed, and the refusal said to narrow the trace."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert main(["simulate", "--no-store", "--synthetic-models", "1000", "--days", "366"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "backfill: error: the synthetic workload (--synthetic-models 1,000, --days 366) holds more than 250,001 requests, so it "
        "could need more than --max-attempts 500,000 attempts (up to 2 a request): lower --days or --synthetic-models, or raise "
        "--max-attempts"
    )
    # at most the limit's requests were built (about 100 bytes each), not a year of 1,000 models
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 400_000  # KiB
    # within the limit, the exact bound decides (its advice is for a synthetic workload too)
    from backfill.sim.traces import synthetic

    n = sum(len(r) for r in synthetic(7, 4, 1.0).requests.values())  # the defaults' seed and models, one day
    limit = 2 * n + 3  # the requests fit (n + 2 allowed); two attempts each and one per model do not
    assert main(["simulate", "--no-store", "--days", "1", "--max-attempts", str(limit)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("backfill: error: the trace could need up to ") and line.endswith(
        f"more than --max-attempts {limit:,}: lower --days or --synthetic-models, or raise --max-attempts"
    ), line


def test_one_day_is_said_as_one_day(tmp_path, capsys):
    """A new user's trial read "span 1 days"."""
    p = tmp_path / "day.csv"
    p.write_text("model,timestamp\nm,2026-01-01T00:00:00Z\nm,2026-01-02T00:00:00Z\n")
    assert main(["simulate", "--no-store", "--trace", str(p), "--format", "csv", "--job", "1m", "--repeat-after", "1m", "--max-attempts", "10"]) == 2
    assert "(a model's requests span 1 day, --job 1m0s + --repeat-after 1m0s)" in capsys.readouterr().err
