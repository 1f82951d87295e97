"""``simulate`` on the real Alibaba trace against an independent oracle, then ``replay`` over it."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from backfill.cli import main
from backfill.sim.traces import read_trace

from .oracle import busy_spans, oracle

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"
ALIBABA = DATA / "alibaba-genai-2026" / "lora_request_trace.csv"
AZURE = DATA / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"


def _rows_for(path: Path, model: str) -> list[tuple[float, float]]:
    """Read M0002's requests with the csv module only (independent of the project's reader)."""
    import csv
    from datetime import datetime, timezone

    out = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["checkpoint_model_version_id"] == model:
                t = datetime.strptime(row["gmt_create"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
                out.append((t, float(row["exec_time_seconds"] or 0)))
    return out


@pytest.fixture(scope="module")
def m0002_expected():
    reqs = _rows_for(ALIBABA, "M0002")
    assert len(reqs) == 8234  # shared/data/README.md
    return oracle(reqs, idle_for=1800, job=900, repeat_after=60, max_run=1800)


def test_oracle_agrees_with_the_data_readme():
    # README: "the busiest model (M0002, 8,234 requests) has 134 such windows" (gaps > 30 min)
    spans = busy_spans(_rows_for(ALIBABA, "M0002"))
    assert sum(1 for a, b in zip(spans, spans[1:]) if b[0] - a[1] > 1800) == 134


def test_simulate_m0002_matches_the_oracle_and_replays_clean(pg_url, capsys, m0002_expected):
    schema = "sim_m0002"
    args = [
        "simulate", "--trace", str(ALIBABA), "--format", "alibaba-genai", "--model", "M0002",
        "--idle-for", "30m", "--job", "15m", "--repeat-after", "1m", "--cancel-latency", "0s", "--max-run", "30m",
        "--database-url", pg_url, "--schema", schema, "--json",
    ]
    assert main(args) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    got = rows["M0002"]
    exp = m0002_expected
    assert (got["attempts"], got["succeeded"], got["preempted"], got["deadline_exceeded"]) == (
        exp["attempts"], exp["succeeded"], exp["preempted"], exp["deadline"]
    )
    assert got["useful"] == pytest.approx(exp["useful"])
    assert got["wasted"] == pytest.approx(exp["wasted"])
    assert got["idle_windows"] == exp["windows"] == 134
    # The stored run rows agree too.
    assert main(["runs", "--database-url", pg_url, "--schema", schema, "-o", "json", "--result", "succeeded"]) == 0
    stored = json.loads(capsys.readouterr().out)
    assert len(stored) == exp["succeeded"]
    assert sum(r["running_seconds"] for r in stored) == pytest.approx(exp["useful"])
    # Replay re-derives every recorded decision.
    assert main(["replay", "--database-url", pg_url, "--schema", schema, "--limit", "0"]) == 0
    assert "no divergence" in capsys.readouterr().out


def test_cancel_latency_becomes_overlap_and_waste(m0002_expected):
    from backfill.sim.cluster import SimParams, simulate
    from backfill.sim.report import summarize

    trace = read_trace(ALIBABA, "alibaba-genai").filtered(["M0002"])
    params = SimParams(idle_for=1800, job=900, repeat_after=60, cancel_latency=6)
    (rep,) = summarize(trace, params, simulate(trace, params))
    exp = oracle(_rows_for(ALIBABA, "M0002"), 1800, 900, 60, 1800, delta=6)
    assert (rep.preempted, rep.overlap, rep.wasted) == (exp["preempted"], pytest.approx(exp["overlap"]), pytest.approx(exp["wasted"]))
    assert rep.overlap == pytest.approx(6 * rep.preempted)


def test_deadline_exceeded_when_the_job_outlasts_max_run():
    from backfill.sim.cluster import SimParams, simulate
    from backfill.sim.report import summarize

    trace = read_trace(ALIBABA, "alibaba-genai").filtered(["M0002"])
    params = SimParams(idle_for=1800, job=3600, max_run=1200, repeat_after=0)
    (rep,) = summarize(trace, params, simulate(trace, params))
    exp = oracle(_rows_for(ALIBABA, "M0002"), 1800, 3600, 0, 1200)
    assert (rep.attempts, rep.deadline_exceeded, rep.preempted) == (exp["attempts"], exp["deadline"], exp["preempted"])
    assert rep.deadline_exceeded == 1  # then Failed: terminal


def test_dense_azure_trace_never_admits_with_a_long_window():
    from backfill.sim.cluster import SimParams, simulate

    trace = read_trace(AZURE, "azure-llm")
    result = simulate(trace, SimParams(idle_for=300, job=60))  # longest gap is 217 s
    assert trace.count == 8819 and result.runs == []


def test_bad_trace_rows_give_one_line_errors_and_nothing_stored(tmp_path, pg_url, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("model,timestamp,duration_s\nm,2024-01-01T00:00:00Z,1\nm,not-a-time,2\n")
    code = main(["simulate", "--trace", str(bad), "--format", "csv", "--database-url", pg_url, "--schema", "sim_bad"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"backfill: error: {bad}:3: bad timestamp 'not-a-time'"]
    neg = tmp_path / "neg.csv"
    neg.write_text("model,timestamp,duration_s\nm,2024-01-01T00:00:00Z,-1\n")
    assert main(["simulate", "--trace", str(neg), "--format", "csv", "--no-store"]) == 2
    assert ":2: service time must be a finite number >= 0" in capsys.readouterr().err
    # nothing was written: the schema was never created
    import sqlalchemy as sa

    from backfill.store import make_engine

    with make_engine(pg_url, "public").connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'sim_bad'")).scalar() == 0


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--idle-for", "10 minutes"], "--idle-for: invalid duration"),
        (["--repeat-after", "30s"], "--repeat-after must be 0 (one-shot) or at least 1m"),
        (["--job", "-5m"], "--job: duration '-5m' is negative"),
        (["--format", "parquet"], "--format"),
        # a new user's trial: the synthetic workload ran and the --format was silently ignored
        (["--format", "alibaba-genai"], "--format alibaba-genai applies to a --trace file"),
        (["--model", "nope"], "no requests for model(s) nope"),
    ],
)
def test_bad_arguments_are_one_line_errors(args, fragment, capsys):
    assert main(["simulate", "--no-store", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("backfill: error:") and fragment in err[0]


def test_synthetic_default_is_seeded_and_reproducible(capsys):
    assert main(["simulate", "--no-store", "--json", "--days", "1"]) == 0
    first = capsys.readouterr().out
    assert main(["simulate", "--no-store", "--json", "--days", "1"]) == 0
    assert capsys.readouterr().out == first
    rows = json.loads(first)
    assert [r["model"] for r in rows] == ["syn-0", "syn-1", "syn-2", "syn-3", "TOTAL"]
    assert rows[-1]["requests"] > 100


def test_simulate_store_refuses_a_schema_holding_a_log_no_simulation_wrote(pg_schema, pg_engine, capsys):
    """A re-trial: ``simulate --schema backfill`` recreated a live controller's schema; the
    controller then folded the simulation's events as real ones. A simulation's own schema is
    recreated again as before."""
    from backfill.core import events as ev
    from backfill.core.events import encode
    from backfill.store import EventStore

    url, schema = pg_schema
    sim = f"{schema}_sim"
    args = ["simulate", "--days", "0.05", "--database-url", url]
    try:
        assert main([*args, "--schema", sim]) == 0  # a new schema
        assert main([*args, "--schema", sim]) == 0  # a simulation's: recreated
        capsys.readouterr()
        assert main([*args, "--schema", schema]) == 2  # migrated, empty: a controller that appended nothing yet
        assert "it holds an event log no simulation wrote" in capsys.readouterr().err
        es = EventStore(pg_engine)
        es.append([encode(ev.ForegroundRequest(at=datetime(2026, 1, 1, tzinfo=timezone.utc), namespace="ns", model="m", source="ingest"), "req/1")])
        assert main([*args, "--schema", schema]) == 2
        (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert line == (
            f"backfill: error: --schema {schema}: it holds an event log no simulation wrote (a controller's?), and simulate "
            "--store recreates its schema: give another (the default is simulation)"
        )
        assert es.count() == 1  # untouched
    finally:
        from backfill.store.migrate import drop_schema

        drop_schema(url, sim)


def test_simulate_store_refuses_a_schema_holding_anything_a_simulation_did_not_write(pg_schema, pg_engine, capsys):
    """A new user's trial: ``simulate --schema public`` dropped the user's table there (exit 0),
    and ``--schema information_schema`` dropped PostgreSQL's own catalog views (every later
    migration then failed). A schema holding anything but a simulation's log is refused in one
    line, nothing dropped; ``information_schema`` is no schema name of ours; an empty schema is
    recreated."""
    url, schema = pg_schema
    other = f"{schema}_other"
    args = ["simulate", "--days", "0.05", "--database-url", url]
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{other}"')
        conn.exec_driver_sql(f'CREATE TABLE "{other}".keepme (x int)')
        conn.exec_driver_sql(f'INSERT INTO "{other}".keepme VALUES (7)')
    try:
        assert main([*args, "--schema", other]) == 2
        (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert line == (
            f"backfill: error: --schema {other}: it holds objects no simulation wrote (keepme), and simulate --store "
            "recreates its schema: give another (the default is simulation)"
        )
        with pg_engine.connect() as conn:
            assert conn.exec_driver_sql(f'SELECT x FROM "{other}".keepme').scalar() == 7
        assert main([*args, "--schema", "information_schema"]) == 2
        (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert "information_schema" in line and line.startswith("backfill: error:")
        with pg_engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM information_schema.tables").scalar() > 0
        # a type of its own that a column elsewhere uses (a re-trial: an enum-only schema passed as
        # empty, and the DROP ... CASCADE took public.orders.mood with it)
        with pg_engine.begin() as conn:
            conn.exec_driver_sql(f'DROP TABLE "{other}".keepme')
            conn.exec_driver_sql(f"""CREATE TYPE "{other}".mood AS ENUM ('ok', 'sad')""")
            conn.exec_driver_sql(f'CREATE TABLE "{schema}".orders (id int, mood "{other}".mood)')
        assert main([*args, "--schema", other]) == 2
        assert "it holds objects no simulation wrote (mood)" in capsys.readouterr().err
        with pg_engine.connect() as conn:
            cols = conn.exec_driver_sql(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %(s)s AND table_name = 'orders' ORDER BY 1",
                {"s": schema},
            ).scalars().all()
        assert cols == ["id", "mood"]
        with pg_engine.begin() as conn:
            conn.exec_driver_sql(f'DROP TABLE "{schema}".orders')
            conn.exec_driver_sql(f'DROP TYPE "{other}".mood')
        assert main([*args, "--schema", other]) == 0  # empty now: recreated with the simulation
    finally:
        from backfill.store.migrate import drop_schema

        drop_schema(url, other)
