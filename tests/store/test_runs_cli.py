"""``backfill runs`` shows a resumable declaration's segments in its table (a new user found the
table hid ``completed_indexes``/``useful_seconds``/``wasted_seconds``; only CSV/JSON had them)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from backfill.cli import main
from backfill.store.runs import RunStore
from tests.store.contract import T0, run_row

pytestmark = pytest.mark.db


def test_the_runs_table_shows_segments_with_their_indexes_and_useful_and_wasted_seconds(pg_schema, pg_engine, capsys) -> None:
    url, schema = pg_schema
    first = run_row("u", 1, segment=1, started_at=T0, ended_at=T0 + timedelta(seconds=24), result="preempted",
                    reason="ForegroundDemand", running_seconds=24.0, completed_indexes="0-1", kept_seconds=14.0)  # fmt: skip
    second = run_row("u", 1, segment=2, started_at=T0 + timedelta(seconds=60), ended_at=T0 + timedelta(seconds=70),
                     result="succeeded", reason="Completed", running_seconds=10.0, completed_indexes="2-3")  # fmt: skip
    RunStore(pg_engine).apply([first, second], "runs", 9)
    assert main(["runs", "--database-url", url, "--schema", schema]) == 0
    out = capsys.readouterr().out
    for column in ("completed_indexes", "useful_seconds", "wasted_seconds"):
        assert column in out
    lines = {line.split("│")[4].strip(): [c.strip() for c in line.split("│")] for line in out.splitlines() if "bf-1" in line}
    assert lines["1"][-4:-1] == ["0-1", "14", "10"]  # 24 s ran: 14 kept (up to the last index), 10 wasted
    assert lines["2"][-4:-1] == ["2-3", "10", "0"]


def test_a_table_without_resumable_rows_keeps_its_columns(pg_schema, pg_engine, capsys) -> None:
    url, schema = pg_schema
    RunStore(pg_engine).apply([run_row("u", 1)], "runs", 1)
    assert main(["runs", "--database-url", url, "--schema", schema]) == 0
    assert "completed_indexes" not in capsys.readouterr().out


def _one_error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("backfill: error: "), lines
    return lines[0]


@pytest.mark.parametrize("ref", ["a/b/c", "/bf-1", "ns/", ""])
def test_a_malformed_backfill_reference_is_refused_as_replay_refuses_it(pg_schema, pg_engine, capsys, ref) -> None:
    """`runs --backfill a/b/c` showed "0 run(s)" (the reference was split at its last slash)."""
    url, schema = pg_schema
    RunStore(pg_engine).apply([run_row("u", 1)], "runs", 1)
    assert main(["runs", "--database-url", url, "--schema", schema, "--backfill", ref]) == 2
    assert _one_error_line(capsys) == f"backfill: error: --backfill must be NAMESPACE/NAME or NAME, got {ref!r}"
    if ref.count("/") != 1 or not all(ref.split("/")):  # replay, through the same parser
        assert main(["replay", "--database-url", url, "--schema", schema, "--backfill", ref]) == 2
        assert _one_error_line(capsys) == f"backfill: error: --backfill must be NAMESPACE/NAME or NAME, got {ref!r}"


def test_a_backfill_reference_selects_by_name_or_namespace_and_name(pg_schema, pg_engine, capsys) -> None:
    url, schema = pg_schema
    row = run_row("u", 1)
    RunStore(pg_engine).apply([row], "runs", 1)
    for ref, expected in ((row.backfill, 1), (f"{row.namespace}/{row.backfill}", 1), (f"other/{row.backfill}", 0)):
        assert main(["runs", "--database-url", url, "--schema", schema, "--backfill", ref, "-o", "json"]) == 0
        import json

        assert len(json.loads(capsys.readouterr().out)) == expected, ref


@pytest.mark.parametrize("command", [["runs"], ["replay"], ["recommend", "--backfill", "ns/bf"]], ids=" ".join)
def test_a_schema_never_migrated_says_to_run_db_upgrade(pg_url, capsys, command) -> None:
    """`runs` before any `db upgrade` printed psycopg's raw 'relation "runs" does not exist'."""
    schema = "never_migrated"
    assert main([*command, "--database-url", pg_url, "--schema", schema]) == 2
    table = "runs" if command == ["runs"] else "events"
    assert _one_error_line(capsys) == (
        f'backfill: error: schema {schema} is not migrated (relation "{table}" does not exist): '
        f"run `backfill db upgrade --schema {schema}` on the same database first"
    )


def test_a_narrow_terminal_wraps_the_runs_table_and_cuts_no_value(pg_schema, pg_engine, monkeypatch) -> None:
    """A new user's 80-column terminal showed job names and times cut short ("…")."""
    import io

    from rich.console import Console

    import backfill.cli as cli

    url, schema = pg_schema
    row = run_row("u", 1, started_at=T0, ended_at=T0 + timedelta(seconds=24), result="preempted", reason="ForegroundDemand")
    RunStore(pg_engine).apply([row], "runs", 1)
    buf = io.StringIO()
    monkeypatch.setattr(cli, "out", Console(file=buf, width=80))
    assert main(["runs", "--database-url", url, "--schema", schema]) == 0
    text = buf.getvalue()
    assert "…" not in text
    cells = "".join(line.split("│")[5].strip() for line in text.splitlines() if line.count("│") > 5)
    assert row.job_name in cells  # the job_name column, its pieces joined back


def test_a_terminal_too_narrow_for_the_columns_lists_each_run_field_by_field(pg_schema, pg_engine, monkeypatch) -> None:
    """At 40 columns and less rich blanked whole columns (a trial: running_seconds vanished)."""
    import io

    from rich.console import Console

    import backfill.cli as cli

    url, schema = pg_schema
    row = run_row("u", 1, started_at=T0, ended_at=T0 + timedelta(seconds=24), result="preempted", reason="ForegroundDemand",
                  running_seconds=24.0)  # fmt: skip
    RunStore(pg_engine).apply([row], "runs", 1)
    buf = io.StringIO()
    monkeypatch.setattr(cli, "out", Console(file=buf, width=40))
    assert main(["runs", "--database-url", url, "--schema", schema]) == 0
    lines = buf.getvalue().splitlines()
    assert lines[0] == "1 run(s)" and "" in lines
    fields = dict(line.split(": ", 1) for line in lines if ": " in line)
    assert fields["job_name"] == row.job_name and fields["running_seconds"] == "24" and fields["result"] == "preempted"
    assert fields["backfill"] == f"{row.namespace}/{row.backfill}"


def test_csv_and_json_print_seconds_to_the_microsecond(pg_schema, pg_engine, capsys) -> None:
    """A new user's trial: ``wasted_seconds`` printed as 6.037611999999999 (a float subtraction)
    beside ``useful_seconds`` 8.962388."""
    import csv
    import io
    import json

    url, schema = pg_schema
    row = run_row("u", 1, started_at=T0, ended_at=T0 + timedelta(seconds=15), result="preempted", reason="ForegroundDemand",
                  running_seconds=15.0, completed_indexes="0", kept_seconds=8.962388)  # fmt: skip
    assert 15.0 - 8.962388 != 6.037612  # the float subtraction the row's property makes
    RunStore(pg_engine).apply([row], "runs", 1)
    assert main(["runs", "--database-url", url, "--schema", schema, "-o", "json"]) == 0
    (got,) = json.loads(capsys.readouterr().out)
    assert (got["useful_seconds"], got["wasted_seconds"]) == (8.962388, 6.037612)
    assert main(["runs", "--database-url", url, "--schema", schema, "-o", "csv"]) == 0
    (line,) = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert (line["useful_seconds"], line["wasted_seconds"]) == ("8.962388", "6.037612")
