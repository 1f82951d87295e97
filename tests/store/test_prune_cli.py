"""``backfill db prune``: drops what a snapshot covers, exports first, one-line refusals."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from backfill.cli import main
from backfill.store.eventlog import EventStore
from backfill.core.state import World
from backfill.store.projection import PROJECTION, code_version, dump_world
from backfill.store.runs import RunStore
from tests.store.contract import record, run_row

pytestmark = pytest.mark.db

LATER = "2999-01-01T00:00:00Z"


def _snapshot_at(position: int) -> bytes:
    """A snapshot payload this release can start from, at ``position`` (an empty projection)."""
    return dump_world(World()._replace(position=position))


def _prune(pg_schema: tuple[str, str], *args: str) -> int:
    url, schema = pg_schema
    return main(["db", "prune", "--database-url", url, "--schema", schema, *args])


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("backfill: error: "), lines
    return lines[0]


def _nothing_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if line.strip()]
    assert captured.err.strip() == "" and len(lines) == 1 and lines[0].startswith("nothing to prune in schema "), captured
    return lines[0]


def test_nothing_to_prune_exits_0_with_one_line_saying_why_and_exports_no_file(pg_schema, pg_engine, tmp_path: Path, capsys) -> None:
    """A scheduled prune with nothing prunable used to fail (exit 2, "error: nothing pruned")
    and leave a 0-byte --export file."""
    _, schema = pg_schema
    store = EventStore(pg_engine, partition_size=10)
    store.append([record(f"e/{i}") for i in range(25)])
    export = tmp_path / "old-events.csv"
    assert _prune(pg_schema, "--before", LATER, "--export", str(export)) == 0
    line = _nothing_line(capsys)
    assert line == f"nothing to prune in schema {schema}: no snapshot 'projection' of code version '{code_version()}': nothing is covered"
    assert not export.exists()
    store.save_snapshot("projection", 5, "another-release", b"s")  # not one this release can start from
    assert _prune(pg_schema, "--before", LATER) == 0
    assert "no snapshot 'projection'" in _nothing_line(capsys)
    store.save_snapshot(PROJECTION, 5, code_version(), b"s")  # this release's, but it cannot be read
    assert _prune(pg_schema, "--before", LATER) == 0
    assert "of code version '" + code_version() + "' this release can read (1 cannot be read): nothing is covered" in _nothing_line(capsys)
    store.save_snapshot(PROJECTION, 5, code_version(), _snapshot_at(5))
    kept = b"position,recorded_at,type,version,stream,idempotency_key,at,data\n"  # an earlier export's header
    export.write_bytes(kept)  # an existing export file is left as it was
    assert _prune(pg_schema, "--before", LATER, "--export", str(export)) == 0
    assert "ends at position 10, after snapshot 'projection' at 5" in _nothing_line(capsys)
    assert export.read_bytes() == kept
    assert _prune(pg_schema, "--before", "yesterday") == 2  # a bad argument is still an error
    assert "--before" in _one_error_line(capsys)
    assert store.count() == 25


def test_prune_exports_and_drops_covered_partitions_and_keeps_runs(pg_schema, pg_engine, tmp_path: Path, capsys) -> None:
    store = EventStore(pg_engine, partition_size=10)
    store.append([record(f"e/{i}") for i in range(25)])
    RunStore(pg_engine).apply([run_row("u", 1)], "runs", 25)
    store.save_snapshot(PROJECTION, 25, code_version(), _snapshot_at(25))
    export = tmp_path / "old-events.csv"
    assert _prune(pg_schema, "--before", LATER, "--export", str(export)) == 0
    printed = capsys.readouterr().out
    assert "dropped 2 partition(s)" in printed and "20 events, positions 1-20" in printed
    assert "exported 20" in printed and f"code version '{code_version()}'" in printed
    assert [int(r["position"]) for r in csv.DictReader(export.open())] == list(range(1, 21))
    assert store.first_position() == 21 and store.count() == 5
    assert len(RunStore(pg_engine).query()) == 1
    # a pinned code version with no snapshot drops nothing
    assert _prune(pg_schema, "--before", LATER, "--code-version", "v2") == 0
    assert "no snapshot 'projection' of code version 'v2'" in _nothing_line(capsys)


def test_a_snapshot_name_that_never_existed_is_an_error_not_nothing_to_prune(pg_schema, pg_engine, capsys) -> None:
    """A regression trial: ``db prune --snapshot nosuch`` printed "nothing to prune" and exited 0,
    so a scheduled prune with a typo would never prune and never say so."""
    _, schema = pg_schema
    store = EventStore(pg_engine, partition_size=10)
    store.append([record(f"e/{i}") for i in range(25)])
    store.save_snapshot(PROJECTION, 25, code_version(), _snapshot_at(25))
    assert _prune(pg_schema, "--before", LATER, "--snapshot", "projecton") == 2
    assert _one_error_line(capsys) == (
        f"backfill: error: db prune: no snapshot named 'projecton' (names: 'projection') in schema {schema}: nothing dropped"
    )
    assert store.count() == 25 and store.first_position() == 1


@pytest.mark.parametrize("target", ["notes", "fifo", "directory", "no-directory"])
def test_an_export_target_that_is_no_export_is_refused_before_anything_is_dropped(pg_schema, pg_engine, tmp_path: Path, capsys, target) -> None:
    """A day-2 trial: ``--export notes.txt`` (a file of the operator's) got the rows appended after
    its own text and the partitions were dropped; ``db restore`` then refused the file, and the
    way back needed hand-editing. ``--export`` naming a FIFO hung for ever. Both are refused in one
    line before the prune; an earlier export (its header first) is still appended to."""
    import os

    store = EventStore(pg_engine, partition_size=10)
    store.append([record(f"e/{i}") for i in range(25)])
    store.save_snapshot(PROJECTION, 25, code_version(), _snapshot_at(25))
    export = tmp_path / "out"
    expected = {"notes": "the file exists and is not an export of backfill db prune", "fifo": "not a regular file",
                "directory": "not a regular file", "no-directory": "give a file in an existing directory"}[target]  # fmt: skip
    if target == "notes":
        export.write_text("hello world\n")
    elif target == "fifo":
        os.mkfifo(export)
    elif target == "directory":
        export.mkdir()
    else:
        export = tmp_path / "missing" / "out.csv"
    assert _prune(pg_schema, "--before", LATER, "--export", str(export)) == 2
    assert expected in _one_error_line(capsys)
    assert store.first_position() == 1 and store.count() == 25  # nothing dropped
    if target == "notes":
        assert export.read_text() == "hello world\n"
    # an export of an earlier prune (its header first) is appended to
    earlier = tmp_path / "earlier.csv"
    earlier.write_text("position,recorded_at,type,version,stream,idempotency_key,at,data\n")
    assert _prune(pg_schema, "--before", LATER, "--export", str(earlier)) == 0
    assert [int(r["position"]) for r in csv.DictReader(earlier.open())] == list(range(1, 21))


def _request(key: str, i: int):
    """A stored foreground request (an event a restore can decode), ``i`` seconds into 2026."""
    from datetime import datetime, timedelta, timezone

    from backfill.core import events as ev
    from backfill.core.events import encode

    at = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=i)
    return encode(ev.ForegroundRequest(at=at, namespace="ns", model="m", source="ingest"), key)


def test_an_export_of_another_log_is_refused_and_one_of_this_log_appended_to(pg_url, pg_schema, pg_engine, tmp_path: Path, capsys) -> None:
    """A trial: ``--export`` naming another schema's export took this log's positions 1-11000
    after that log's 1-1000, and ``db restore`` then refused the file, the only copy of both.
    The last row of an existing export must be this log's: pruned by it, or (restored since)
    held by it under the same idempotency key."""
    from backfill.store.engine import make_engine
    from backfill.store.migrate import drop_schema, upgrade

    other = pg_schema[1] + "_other"
    upgrade(pg_url, other)
    engine = make_engine(pg_url, other)
    try:
        theirs = EventStore(engine, partition_size=10)
        theirs.append([_request(f"theirs/{i}", i) for i in range(25)])
        theirs.save_snapshot(PROJECTION, 25, code_version(), _snapshot_at(25))
        export = tmp_path / "theirs.csv"
        assert _prune((pg_url, other), "--before", LATER, "--export", str(export)) == 0
    finally:
        engine.dispose()
        drop_schema(pg_url, other)
    theirs_rows = export.read_bytes()
    assert theirs_rows.count(b"\n") == 21  # the header and their positions 1-20

    ours = EventStore(pg_engine, partition_size=10)
    ours.append([_request(f"ours/{i}", i) for i in range(25)])
    ours.save_snapshot(PROJECTION, 25, code_version(), _snapshot_at(25))
    capsys.readouterr()
    assert _prune(pg_schema, "--before", LATER, "--export", str(export)) == 2
    assert "its last row (position 20) is not an event of this log (never pruned): an export of another log?" in _one_error_line(capsys)
    assert export.read_bytes() == theirs_rows and ours.first_position() == 1 and ours.count() == 25

    # this log's own export: appended to by the next prune, and after a restore, again
    mine = tmp_path / "ours.csv"
    assert _prune(pg_schema, "--before", LATER, "--export", str(mine)) == 0
    ours.append([_request(f"ours/{i}", i) for i in range(25, 40)])
    ours.save_snapshot(PROJECTION, 40, code_version(), _snapshot_at(40))
    assert _prune(pg_schema, "--before", LATER, "--export", str(mine)) == 0
    assert [int(r["position"]) for r in csv.DictReader(mine.open())] == list(range(1, 41))
    url, schema = pg_schema
    assert main(["db", "restore", "--database-url", url, "--schema", schema, str(mine)]) == 0
    assert ours.first_position() == 1 and ours.count() == 40
    assert _prune(pg_schema, "--before", LATER, "--export", str(mine)) == 0  # the restored rows, exported again
    assert [int(r["position"]) for r in csv.DictReader(mine.open())] == list(range(1, 41)) * 2
    # a re-trial: another log's export whose last position (20) lies below this log's prune
    # (40) passed a check of the position alone; this log exported position 20 into ours.csv
    ours.append([_request(f"ours/{i}", i) for i in range(40, 55)])
    ours.save_snapshot(PROJECTION, 55, code_version(), _snapshot_at(55))
    capsys.readouterr()
    assert _prune(pg_schema, "--before", LATER, "--export", str(export)) == 2
    assert f"its last row (position 20) is not this log's export of that position (it was exported to {mine})" in _one_error_line(capsys)
    assert export.read_bytes() == theirs_rows and ours.first_position() == 41
