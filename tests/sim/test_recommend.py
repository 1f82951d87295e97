"""``backfill recommend`` (issue #11 part 3) on the real Alibaba trace and on the event log.

Expected values come from the independent oracle (``oracle.py``) over rows read with the csv
module; the recommendation is re-derived here from them (the smallest idleFor within limits).
"""

from __future__ import annotations

import json

import pytest

from backfill.cli import main

from .oracle import bound_oracle, oracle
from .test_simulate import ALIBABA, _rows_for

LADDER = [60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200]


def _recommend(capsys, *args):
    assert main(["recommend", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def m0002_rows():
    return _rows_for(ALIBABA, "M0002")


def _expected(rows, job, shards, repeat_after, max_run, delta, max_waste, max_per_day):
    days = (rows[-1][0] - rows[0][0]) / 86400
    _, _, bound, idle = bound_oracle(rows, job, shards, repeat_after, max_run)
    points = []
    for idle_for in LADDER:
        o = oracle(rows, idle_for, job, repeat_after, max_run, delta=delta, shards=shards)
        ran = o["useful"] + o["wasted"]
        ok = (o["wasted"] / ran if ran else 0) <= max_waste and o["preempted"] / days <= max_per_day
        points.append((idle_for, o, ok))  # within limits; recommended only if also useful > 0
    return points, bound, idle, days


@pytest.mark.parametrize("shards, repeat_after, delta", [(1, 60, 0), (4, 60, 2), (3, 86400, 6)])
def test_recommend_on_the_real_trace_matches_the_oracle(capsys, m0002_rows, shards, repeat_after, delta):
    got = _recommend(
        capsys, "--trace", str(ALIBABA), "--format", "alibaba-genai", "--model", "M0002", "--job", "15m",
        "--repeat-after", f"{repeat_after}s", "--cancel-latency", f"{delta}s", "--shards", str(shards),
        "--max-waste", "0.05", "--max-preemptions-per-day", "3",
    )
    (m,) = got["models"]
    points, bound, idle, days = _expected(m0002_rows, 900, shards, repeat_after, 1800, delta, 0.05, 3)
    assert [p["idle_for"] for p in m["points"]] == LADDER
    for p, (idle_for, o, ok) in zip(m["points"], points):
        assert (p["attempts"], p["succeeded"], p["preempted"]) == (o["attempts"], o["succeeded"], o["preempted"]), idle_for
        assert p["useful"] == pytest.approx(o["useful"]) and p["wasted"] == pytest.approx(o["wasted"])
        assert p["overlap"] == pytest.approx(o["overlap"])
        assert p["bound"] == pytest.approx(bound) and p["idle"] == pytest.approx(idle)
        assert p["bound_share"] == pytest.approx(o["useful"] / bound)
        assert p["idle_share"] == pytest.approx(o["useful"] / idle)
        assert p["preemptions_per_day"] == pytest.approx(o["preempted"] / days)
        assert (not p["violates"]) == ok, idle_for
    first_ok = next((i for i, o, ok in points if ok and o["useful"] > 0), None)
    assert (m["recommended"] or {}).get("idle_for") == first_ok


def test_more_shards_pick_the_most_useful_at_the_smallest_idle_for(capsys, m0002_rows):
    got = _recommend(
        capsys, "--trace", str(ALIBABA), "--format", "alibaba-genai", "--model", "M0002", "--repeat-after", "1m",
        "--shards", "1,6", "--idle-for-values", "10m,30m", "--max-waste", "1", "--max-preemptions-per-day", "1000",
    )
    (m,) = got["models"]
    assert [(p["shards"], p["idle_for"]) for p in m["points"]] == [(1, 600), (1, 1800), (6, 600), (6, 1800)]
    six = oracle(m0002_rows, 600, 900, 60, 1800, shards=6)
    one = oracle(m0002_rows, 600, 900, 60, 1800, shards=1)
    best = 6 if six["useful"] > one["useful"] else 1
    assert (m["recommended"]["idle_for"], m["recommended"]["shards"]) == (600, best)


def test_max_overlap_limits_the_recommendation(capsys, m0002_rows):
    got = _recommend(
        capsys, "--trace", str(ALIBABA), "--format", "alibaba-genai", "--model", "M0002", "--repeat-after", "1m",
        "--cancel-latency", "5s", "--max-waste", "1", "--max-preemptions-per-day", "1000", "--max-overlap", "10m",
    )
    (m,) = got["models"]
    first = next(i for i in LADDER if oracle(m0002_rows, i, 900, 60, 1800, delta=5)["overlap"] <= 600)
    assert m["recommended"]["idle_for"] == first
    assert all("max_overlap" in p["violates"] for p in m["points"] if p["idle_for"] < first)


def test_table_plot_and_none_within_limits(capsys, tmp_path):
    png = tmp_path / "tradeoff.png"
    args = ["recommend", "--trace", str(ALIBABA), "--format", "alibaba-genai", "--model", "M0002", "--model", "M0001",
            "--repeat-after", "1m", "--max-preemptions-per-day", "0", "--plot", str(png)]
    assert main(args) == 0
    cap = capsys.readouterr()
    assert "M0002: no idleFor in the ladder is within the limits and does useful work" in cap.out
    assert "M0001: no idleFor in the ladder is within the limits and does useful work" in cap.out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"written to {png}" in cap.err


def test_from_the_event_log_equals_the_trace(pg_url, capsys, m0002_rows):
    schema = "sim_recommend"
    assert main([
        "simulate", "--trace", str(ALIBABA), "--format", "alibaba-genai", "--model", "M0002", "--idle-for", "30m",
        "--job", "15m", "--repeat-after", "1m", "--cancel-latency", "6s", "--database-url", pg_url, "--schema", schema, "--json",
    ]) == 0
    capsys.readouterr()
    log = _recommend(capsys, "--database-url", pg_url, "--schema", schema, "--backfill", "sim/bf-m0002", "--shards", "1,2")
    # defaults measured in the log: job = median succeeded run, latency = p95 demand -> Job gone, repeatAfter from the spec
    assert log["parameters"] | {"idle_for_values": None} == {
        "job": 900.0, "max_run": 1800.0, "repeat_after": 60.0, "cancel_latency": 6.0, "idle_for_values": None, "shards": [1, 2],
    }
    trace = _recommend(
        capsys, "--trace", str(ALIBABA), "--format", "alibaba-genai", "--model", "M0002", "--job", "15m",
        "--repeat-after", "1m", "--cancel-latency", "6s", "--shards", "1,2",
    )
    assert log["models"][0]["points"] == trace["models"][0]["points"]
    assert log["models"][0]["recommended"] == trace["models"][0]["recommended"]
    o = oracle(m0002_rows, 1800, 900, 60, 1800, delta=6)
    p = next(p for p in log["models"][0]["points"] if p["idle_for"] == 1800 and p["shards"] == 1)
    assert (p["preempted"], p["useful"]) == (o["preempted"], pytest.approx(o["useful"]))
    # --model NS/NAME reads the same requests
    by_model = _recommend(capsys, "--database-url", pg_url, "--schema", schema, "--model", "sim/M0002", "--job", "15m",
                          "--repeat-after", "1m", "--cancel-latency", "6s", "--shards", "1,2")
    assert by_model["models"][0]["points"] == trace["models"][0]["points"]
    # an unknown declaration is a one-line error
    assert main(["recommend", "--database-url", pg_url, "--schema", schema, "--backfill", "sim/nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["backfill: error: ModelBackfill sim/nope is not in the log"]
    # a bare name, as runs and replay take it (a new user's trial): the one namespace that has it
    bare = _recommend(capsys, "--database-url", pg_url, "--schema", schema, "--backfill", "bf-m0002", "--shards", "1,2")
    assert bare["models"] == log["models"]
    assert main(["recommend", "--database-url", pg_url, "--schema", schema, "--backfill", "nope"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["backfill: error: ModelBackfill nope is not in the log"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--idle-for-values", ""], "--idle-for-values: give at least one value"),
        (["--idle-for-values", "5m,ten"], "--idle-for-values: invalid duration"),
        (["--idle-for-values", "0s,5m"], "--idle-for-values: every value must be greater than zero"),
        # a new user's trial: an empty value between commas swept the others and said nothing
        (["--idle-for-values", "5m,,10m"], "--idle-for-values: '5m,,10m' has an empty value between commas"),
        (["--shards", "1,,4"], "--shards: '1,,4' has an empty value between commas"),
        (["--shards", "0,4"], "--shards: give integers from 1 to 10000"),
        (["--shards", "four"], "--shards: 'four' is not a comma-separated list"),
        (["--max-waste", "2"], "--max-waste 2: give a share from 0 to 1"),
        (["--max-preemptions-per-day", "-1"], "--max-preemptions-per-day -1: must be >= 0"),
        (["--max-overlap", "soon"], "--max-overlap: invalid duration"),
        (["--repeat-after", "30s"], "--repeat-after must be 0 (one-shot) or at least 1m"),
        (["--job", "0s"], "backfill: error: --job: must be greater than zero"),
        (["--model", "nope"], "no requests for model(s) nope"),
        (["--backfill", "ns/x"], "do not combine it with --trace"),
        (["--plot", "/nonexistent-dir/x.png"], "--plot: directory /nonexistent-dir does not exist"),
    ],
)
def test_bad_arguments_are_one_line_errors(args, fragment, capsys):
    base = ["recommend", "--trace", str(ALIBABA), "--format", "alibaba-genai"]
    if "--model" not in args and "--backfill" not in args:
        base += ["--model", "M0002"]
    assert main([*base, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("backfill: error:") and fragment in err[0], err


@pytest.mark.parametrize(
    "args, fragment",
    [
        ([], "give --trace FILE, --backfill NAMESPACE/NAME or --model NAMESPACE/NAME"),
        (["--backfill", "a/b/c"], "--backfill must be NAMESPACE/NAME or NAME, got 'a/b/c'"),  # a bare NAME is taken
        (["--backfill", "a/b", "--model", "a/m"], "either --backfill or --model"),
        (["--trace", str(ALIBABA), "--format", "alibaba-genai"], "--model is required: "),
    ],
)
def test_missing_or_conflicting_sources(args, fragment, capsys):
    assert main(["recommend", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("backfill: error:") and fragment in err[0], err


def test_a_value_without_useful_work_is_never_recommended(tmp_path, capsys):
    # one 3-minute gap: idleFor 1m fits a 1m job, 5m fits nothing (no attempt, so within every limit)
    csv = tmp_path / "t.csv"
    csv.write_text("model,timestamp\nm,2026-01-01T00:00:00Z\nm,2026-01-01T00:03:00Z\n")
    got = _recommend(capsys, "--trace", str(csv), "--job", "1m", "--idle-for-values", "1m,5m")
    (m,) = got["models"]
    assert [(p["idle_for"], p["useful"], p["violates"]) for p in m["points"]] == [(60, 60.0, []), (300, 0.0, [])]
    assert m["recommended"]["idle_for"] == 60
    got = _recommend(capsys, "--trace", str(csv), "--job", "1m", "--idle-for-values", "5m")
    assert got["models"][0]["recommended"] is None


def test_a_format_without_a_trace_is_a_one_line_error(capsys):
    """``--format`` names the format of a ``--trace`` file; without one it was silently ignored
    (found in ``simulate`` by a new user's trial; ``recommend`` shares the option)."""
    assert main(["recommend", "--format", "azure-llm", "--backfill", "ns/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["backfill: error: --format azure-llm applies to a --trace file; give --trace FILE, or leave --format out"]


def test_a_median_job_of_zero_seconds_is_not_used_and_said_so(pg_schema, event_store, capsys):
    """A new user's trial: Jobs marked succeeded within their creation's second measure 0 s; the
    header said "job 15m0s" (the default, taken silently) above "median 0s"."""
    from datetime import datetime, timedelta, timezone

    from backfill.core import events as ev
    from backfill.core.events import encode

    url, schema = pg_schema
    t = datetime(2026, 12, 1, tzinfo=timezone.utc)
    spec = {"modelRef": "m", "templateRef": "t", "idleFor": "1m", "maxRunDuration": "30m", "repeatAfter": "1m"}
    events = [
        ev.BackfillApplied(at=t, namespace="ns", name="bf", uid="u1", generation=1, spec=spec),
        ev.ForegroundRequest(at=t, namespace="ns", model="m", source="trace"),
        ev.ForegroundRequest(at=t + timedelta(hours=2), namespace="ns", model="m", source="trace"),
        ev.AttemptAdmitted(at=t + timedelta(minutes=1), namespace="ns", backfill="bf", uid="u1", attempt=1, generation=1, job_name="bf-j-1", model="m"),
        ev.JobCreated(at=t + timedelta(minutes=1), namespace="ns", backfill="bf", name="bf-j-1", uid="j1"),
        ev.JobSucceeded(at=t + timedelta(minutes=1), namespace="ns", backfill="bf", name="bf-j-1", uid="j1"),
    ]
    event_store.append([encode(e, f"k{i}") for i, e in enumerate(events)])
    got = _recommend(capsys, "--database-url", url, "--schema", schema, "--backfill", "ns/bf", "--idle-for-values", "1m")
    assert got["parameters"]["job"] == 900.0  # the default, as the header says
    assert main(["recommend", "--database-url", url, "--schema", schema, "--backfill", "ns/bf", "--idle-for-values", "1m"]) == 0
    err = capsys.readouterr().err
    assert "1 succeeded run (median 0s: too short to simulate, not used; give --job)" in err, err


def test_a_bare_backfill_name_in_two_namespaces_asks_for_the_namespace(pg_schema, event_store, capsys):
    from datetime import datetime, timezone

    from backfill.core import events as ev
    from backfill.core.events import encode

    url, schema = pg_schema
    t = datetime(2026, 12, 1, tzinfo=timezone.utc)
    spec = {"modelRef": "m", "templateRef": "t", "idleFor": "1m", "maxRunDuration": "30m"}
    event_store.append([
        encode(ev.BackfillApplied(at=t, namespace=ns, name="bf", uid=f"u-{ns}", generation=1, spec=spec), f"k-{ns}")
        for ns in ("team-b", "team-a")
    ])
    assert main(["recommend", "--database-url", url, "--schema", schema, "--backfill", "bf"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "backfill: error: ModelBackfill bf is in 2 namespaces (team-a, team-b): give --backfill NAMESPACE/NAME"
    ]
