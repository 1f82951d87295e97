"""After ``backfill db prune``: ``backfill replay`` starts from a snapshot the pruned log can
continue (it reported every decision after the prune as divergent), a rolled-back first append
is not taken for a prune, and ``backfill db restore`` loads an export back so that a release
with another state version can refold the log from position 1 (issue 10, retention)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from backfill.cli import main
from backfill.core.events import decode_many, encode
from backfill.core.timefmt import rfc3339
from backfill.core.projector import fold_all
from backfill.core.state import World
from backfill.sim.cluster import SimParams, simulate
from backfill.sim.traces import Trace
from backfill.store import projection
from backfill.store.eventlog import EventStore
from tests.store.contract import record

pytestmark = pytest.mark.db

LATER = "2999-01-01T00:00:00Z"


def _log():
    """A simulated log: 3 models, 60 requests each, a repeating job: about 2,300 events with
    about 700 admissions spread over the whole log."""
    reqs = {f"m{i}": [(float(t * 4000 + i), 1.0) for t in range(60)] for i in range(3)}
    return simulate(Trace("spread", reqs), SimParams(idle_for=600, max_run=1800, repeat_after=600, job=300)).events


def _cli(pg_schema, *args: str) -> int:
    url, schema = pg_schema
    return main([*args, "--database-url", url, "--schema", schema])


def _pruned(pg_schema, pg_engine, tmp_path: Path, capsys):
    """The log stored (partitions of 50), a snapshot of this release at its middle, pruned
    with an export; returns (store, log, export file)."""
    log = _log()
    es = EventStore(pg_engine, partition_size=50)
    es.append([encode(e, k) for _, e, k in log])
    projection.save(es, fold_all(World(), [(p, e) for p, e, _ in log][: len(log) // 2]))
    export = tmp_path / "pruned.csv"
    assert _cli(pg_schema, "db", "prune", "--before", LATER, "--export", str(export)) == 0
    capsys.readouterr()
    assert es.pruned_up_to() == 1150 and es.first_position() == 1151  # 23 partitions of 50, below the snapshot at 1155
    return es, log, export


def _decisions(log, after: int = 0, upto: int | None = None) -> int:
    return sum(
        1 for p, e, _ in log if after < p <= (upto or p) and type(e).__name__ in ("AttemptAdmitted", "AttemptCancelled")
    )


def _replayed(capsys) -> str:
    err = capsys.readouterr().err
    return " ".join(err.split())


def test_replay_of_a_pruned_log_starts_from_a_snapshot_it_can_continue(pg_schema, pg_engine, tmp_path, capsys):
    es, log, _ = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    # before: folded from an empty world, every decision after the prune diverged (exit 1)
    assert _cli(pg_schema, "replay", "--limit", "0") == 0
    err = _replayed(capsys)
    snap = len(log) // 2
    held = _decisions(log, 1150, snap)  # retained, but before the snapshot: counted, not hidden
    assert held > 0
    assert (f"starting from the snapshot at position {snap} (the log was pruned up to position 1150: the decisions up "
            f"to it are gone; {held} kept decision(s) between it and the snapshot are not checked") in err  # fmt: skip
    assert f"checked {_decisions(log, snap)} decisions" in err and "divergen" not in err
    # ... and shown in the trail, marked unchecked (a day-2 trial: the trail showed nothing before
    # the oldest kept snapshot, about 45 minutes with the defaults)
    assert _cli(pg_schema, "replay", "--limit", "100000") == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "│" in line and line.split("│")[1].strip().isdigit()]
    positions = [int(line.split("│")[1]) for line in rows]
    unchecked = [int(line.split("│")[1]) for line in rows if "(unchecked)" in line]
    assert unchecked == [p for p, e, _ in log if 1150 < p <= snap and type(e).__name__ in ("AttemptAdmitted", "AttemptCancelled")]
    assert positions == sorted(positions) and len(positions) == held + _decisions(log, snap)
    # --since before the prune: the snapshot before it is gone; the one after the prune stands in,
    # and the decisions made before the oldest event kept are said to be gone (not "checked 0")
    assert _cli(pg_schema, "replay", "--limit", "0", "--since", "1970-01-01T00:00:00Z") == 0
    err = _replayed(capsys)
    assert f"starting from the snapshot at position {snap}" in err
    oldest = log[1150][1].at  # position 1151, the first one kept
    assert f"the oldest event kept happened at {rfc3339(oldest)}: decisions before it are gone" in err


def test_replay_and_start_of_a_pruned_log_without_a_snapshot_of_this_release_refuse(pg_schema, pg_engine, tmp_path, capsys, monkeypatch):
    es, _, _ = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    monkeypatch.setattr(projection, "code_version", lambda: "7-a-later-release")
    assert projection.latest(es) is None
    why = projection.unrebuildable(es)
    assert why is not None and "pruned up to position 1150" in why and "backfill db restore" in why
    assert _cli(pg_schema, "replay", "--limit", "0") == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("backfill: error: ") and "7-a-later-release" in lines[0]


def test_a_first_append_that_rolled_back_is_not_a_prune(pg_engine):
    es = EventStore(pg_engine, partition_size=50)
    with pytest.raises(RuntimeError):
        with es.begin() as tx:
            tx.append([record(f"lost/{i}") for i in range(3)])
            raise RuntimeError("the connection dropped")
    es.append([record("kept/1")])
    # the position sequence is not transactional: the log starts at 4, and was never pruned
    assert es.first_position() == 4 and es.pruned_up_to() == 0
    assert projection.unrebuildable(es) is None


def test_restore_loads_the_export_back_and_a_later_release_refolds_from_position_1(pg_schema, pg_engine, tmp_path, capsys, monkeypatch):
    es, log, export = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    key_of = {p: k for p, _, k in log}
    assert [int(r["position"]) for r in csv.DictReader(export.open())] == list(range(1, 1151))
    monkeypatch.setattr(projection, "code_version", lambda: "7-a-later-release")
    assert _cli(pg_schema, "db", "restore", str(export)) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "restored 1,150 events (positions 1-1150) into partition events_p000000000001 (positions 1-1150)" in printed
    assert "with 1,150 idempotency keys" in printed
    assert es.pruned_up_to() == 0 and es.first_position() == 1 and es.count() == len(log)
    assert projection.unrebuildable(es) is None  # the later release refolds from position 1
    rows = [row for batch in es.read_payloads(0) for row in batch]
    assert [r[0] for r in rows] == [p for p, _, _ in log]
    refolded = fold_all(World(), zip([r[0] for r in rows], decode_many([(t, v, d) for _, t, v, d in rows])))
    assert refolded == fold_all(World(), [(p, e) for p, e, _ in log])
    # the keys are back: a re-delivered old event is not appended again
    assert es.append([encode(log[10][1], key_of[11])]) == [None]
    # and replay checks every decision of the whole log again
    assert _cli(pg_schema, "replay", "--limit", "0") == 0
    err = _replayed(capsys)
    assert f"checked {_decisions(log)} decisions" in err and "starting from the snapshot" not in err
    # a prune can drop the restored partition again once a snapshot of this release covers it
    projection.save(es, refolded)
    assert _cli(pg_schema, "db", "prune", "--before", LATER, "--export", str(export)) == 0  # the same file again
    # (the restored partition of 1,150 positions, then the 23 full ones of 50 after it)
    assert "dropped 24 partition(s)" in capsys.readouterr().out and es.pruned_up_to() == 2300
    # and the release after that restores the file, which now holds positions 1-1150 twice
    monkeypatch.setattr(projection, "code_version", lambda: "8-the-release-after")
    assert projection.unrebuildable(es) is not None
    assert _cli(pg_schema, "db", "restore", str(export)) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "restored 2,300 events (positions 1-2300)" in printed and "(1,150 rows given more than once, loaded once)" in printed
    assert es.pruned_up_to() == 0 and es.count() == len(log)


def _one_error(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("backfill: error: db restore: "), lines
    return lines[0]


def test_restore_refuses_what_would_leave_a_wrong_log_and_writes_nothing(pg_schema, pg_engine, tmp_path, capsys):
    es, log, export = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    count = es.count()
    text = export.read_text().splitlines(keepends=True)
    header, body = text[0], text[1:]
    # position 1 twice, with different contents (another log's export)
    other = tmp_path / "other.csv"
    other.write_text(header + body[0].replace("sim/cronjob", "another/cronjob"))
    assert "sim/cronjob" in body[0]
    assert _cli(pg_schema, "db", "restore", str(export), str(other)) == 2
    assert "position 1 is given twice with different contents" in _one_error(capsys)
    # a partial export: the first 100 positions missing, or a partition in the middle (a trial:
    # a hole, restored as if whole; positions have gaps, so only prune's counts can tell)
    partial = tmp_path / "partial.csv"
    partial.write_text(header + "".join(body[100:]))
    assert _cli(pg_schema, "db", "restore", str(partial)) == 2
    assert "positions 1-50 held 50 events when backfill db prune dropped them, the files give 0" in _one_error(capsys)
    holed = tmp_path / "holed.csv"
    holed.write_text(header + "".join(body[:500] + body[550:]))
    assert _cli(pg_schema, "db", "restore", str(holed)) == 2
    assert "positions 501-550 held 50 events when backfill db prune dropped them, the files give 0" in _one_error(capsys)
    # columns in another order, named so by the header: COPY's HEADER only skips that line
    swapped = tmp_path / "swapped.csv"
    swapped.write_text(header.replace("stream,idempotency_key", "idempotency_key,stream") + "".join(body))
    assert _cli(pg_schema, "db", "restore", str(swapped)) == 2
    assert "swapped.csv: not an export of backfill db prune: its first line is 'position,recorded_at,type,version,idempotency_key" in _one_error(capsys)
    # rows no release can read: an unknown type, data no event class accepts
    assert body[11].startswith("12,") and ",JobCreated," in body[11]
    bogus = tmp_path / "bogus.csv"
    bogus.write_text(header + "".join(body[:11]) + body[11].replace(",JobCreated,", ",Bogus,", 1) + "".join(body[12:]))
    assert _cli(pg_schema, "db", "restore", str(bogus)) == 2
    assert "the event at position 12 cannot be read by this release: unknown event type 'Bogus'" in _one_error(capsys)
    zero = tmp_path / "zero.csv"
    zero.write_text(header + "0," + body[0].split(",", 1)[1] + "".join(body[1:]))
    assert _cli(pg_schema, "db", "restore", str(zero)) == 2
    assert "position 0 is not a position of the log (they start at 1)" in _one_error(capsys)
    # a retained position (a row of the live log): never overwritten
    retained = tmp_path / "retained.csv"
    row = body[-1].split(",", 1)
    retained.write_text(header + "".join(body) + f"1151,{row[1]}")
    assert _cli(pg_schema, "db", "restore", str(retained)) == 2
    assert "position 1151 is not a pruned one (the log was pruned up to position 1150" in _one_error(capsys)
    # not an export at all
    junk = tmp_path / "junk.csv"
    junk.write_text("a,b\n1,2\n")
    assert _cli(pg_schema, "db", "restore", str(junk)) == 2
    assert "junk.csv: not an export of backfill db prune: its first line is 'a,b', not 'position,recorded_at," in _one_error(capsys)
    junk.write_text(header + "one,2\n")
    assert _cli(pg_schema, "db", "restore", str(junk)) == 2
    error = _one_error(capsys)
    assert "junk.csv: not an export of backfill db prune (CSV with a header line: position, recorded_at," in error
    assert error.endswith("(line 2)")  # which line to look at
    # two rows run together (an export cut mid-row, appended to: an adversarial trial)
    merged = tmp_path / "merged.csv"
    merged.write_text(header + "".join(body[:40]) + body[40][:30] + "".join(body[41:]))
    assert _cli(pg_schema, "db", "restore", str(merged)) == 2
    assert "extra data after last expected column (line 42)" in _one_error(capsys)
    assert _cli(pg_schema, "db", "restore", str(tmp_path / "missing.csv")) == 2
    assert "not a file" in capsys.readouterr().err
    assert es.count() == count and es.pruned_up_to() == 1150  # nothing written by any of them
    # the same rows given twice are loaded once: a prune after a restore appends the restored
    # rows to the same export file again (a trial: refused as "given twice", a dead end)
    assert _cli(pg_schema, "db", "restore", str(export), str(export)) == 0
    assert "(1,150 rows given more than once, loaded once)" in " ".join(capsys.readouterr().out.split())
    # a log that was never pruned (here: after the restore) has nothing to restore
    assert _cli(pg_schema, "db", "restore", str(export)) == 2
    assert "never pruned" in _one_error(capsys)
    assert es.count() == len(log)


def test_restore_with_a_missing_start_acknowledged(pg_schema, pg_engine, tmp_path, capsys):
    es, log, export = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    with es.begin() as tx:  # a log pruned before revision 0004: prune recorded nothing to check against
        tx.connection.execute("DELETE FROM pruned_partitions")
    text = export.read_text().splitlines(keepends=True)
    partial = tmp_path / "partial.csv"
    partial.write_text(text[0] + "".join(text[101:]))
    assert _cli(pg_schema, "db", "restore", str(partial)) == 2
    assert "start at position 101, so positions 1-100 are missing" in _one_error(capsys)
    # as if positions 1-100 had never been stored
    assert _cli(pg_schema, "db", "restore", "--missing-start-ok", str(partial)) == 0
    assert "restored 1,050 events (positions 101-1150)" in " ".join(capsys.readouterr().out.split())
    assert es.pruned_up_to() == 0 and es.first_position() == 101 and es.count() == len(log) - 100


def _indexes(conn, table: str) -> list[str]:
    """The index definitions of ``table`` with its name taken out (comparable across partitions)."""
    rows = conn.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = %s", (table,)).fetchall()
    return sorted(d.split(" ON ", 1)[1].replace(table, "T") for (d,) in rows)


def test_restore_fills_and_indexes_the_partition_before_it_takes_the_logs_write_lock(pg_schema, pg_engine, tmp_path, capsys):
    """Appends wait for a restore from its write lock to its commit. The rows' insert and the
    partition's index builds (ATTACH built them) ran under that lock; now the partition is
    complete when the lock is taken, and ATTACH adopts its indexes: the restored partition has
    exactly the indexes of a partition the log made itself, and no constraint of its own."""
    from backfill.store.retention import restore

    es, log, export = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    seen: dict[str, object] = {}
    with es.begin() as tx:
        conn = tx.connection

        def lock() -> None:
            seen["rows"] = conn.execute("SELECT count(*) FROM events_p000000000001").fetchone()[0]
            seen["indexes"] = _indexes(conn, "events_p000000000001")
            tx.lock()

        restore(conn, [export], lock)
    with es.begin() as tx:
        conn = tx.connection
        assert seen["rows"] == 1150
        made_by_the_log = _indexes(conn, "events_p000000001151")
        assert len(made_by_the_log) == 2 and seen["indexes"] == made_by_the_log  # the primary key and the stream index
        assert _indexes(conn, "events_p000000000001") == made_by_the_log  # adopted, not built twice
        constraints = conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'events_p000000000001'::regclass AND contype = 'c'"
        ).fetchall()
        assert constraints == []
    assert es.pruned_up_to() == 0 and es.count() == len(log)


def test_prune_waits_for_a_restore_and_records_what_it_drops(pg_schema, pg_engine, tmp_path, capsys):
    """A trial: a restore committed between a prune's list of partitions and its drops, which
    then left a hole above the restored positions. Prune and restore now take one lock."""
    es, log, export = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    with es.begin() as tx:
        rows = tx.connection.execute("SELECT lo, hi, events, export FROM pruned_partitions ORDER BY lo").fetchall()
    assert [(lo, hi, n) for lo, hi, n, _ in rows] == [(lo, lo + 50, 50) for lo in range(1, 1151, 50)]
    assert {e for *_, e in rows} == {str(export)}
    projection.save(es, fold_all(World(), [(p, e) for p, e, _ in log]))
    with es.begin() as tx:  # a restore holding the retention lock
        tx.connection.execute("SELECT pg_advisory_xact_lock(1650879592, hashtext(current_schema()))")
        assert _cli(pg_schema, "db", "prune", "--before", LATER) == 2  # waits up to the lock timeout, then fails
        assert "lock timeout" in capsys.readouterr().err
    assert es.pruned_up_to() == 1150  # it dropped nothing
    assert _cli(pg_schema, "db", "prune", "--before", LATER) == 0
    assert es.pruned_up_to() == 2300


def test_a_prune_after_a_restore_keeps_the_key_of_an_event_delivered_again(pg_schema, pg_engine, tmp_path, capsys, monkeypatch):
    """A review: a pruned event's key delivered again (appended at a new position), then the
    export restored (the key keeps its newer position), then the restored partition pruned
    again: prune deleted the key by its text alone, and the next delivery was stored twice."""
    es, log, export = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    again = encode(log[20][1], log[20][2])  # position 21's event and key, pruned
    [p] = es.append([again])
    assert p == len(log) + 1
    assert _cli(pg_schema, "db", "restore", str(export)) == 0
    capsys.readouterr()
    projection.save(es, fold_all(World(), [(q, e) for q, e, _ in log] + [(p, log[20][1])]))
    assert _cli(pg_schema, "db", "prune", "--before", LATER) == 0
    assert es.pruned_up_to() >= 1150 and "dropped" in capsys.readouterr().out
    assert es.append([again]) == [None]  # still known: the retained event at ``p`` owns it


def test_prune_counts_only_a_snapshot_this_release_can_start_from(pg_schema, pg_engine, tmp_path, capsys):
    """A review: a corrupt newest snapshot counted as covering, and the prune dropped what the
    only readable one needed; start-up could then not rebuild the state."""
    es, log, _ = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    es.save_snapshot(projection.PROJECTION, 1800, projection.code_version(), b"\x80 not a pickle")
    unreadable: list[str] = []
    assert projection.latest(es, unreadable=unreadable).position == len(log) // 2 == 1155 and unreadable
    assert _cli(pg_schema, "db", "prune", "--before", LATER) == 0
    assert "after snapshot 'projection' at 1155" in capsys.readouterr().out
    assert es.pruned_up_to() == 1150  # nothing the readable snapshot needs was dropped
    assert projection.latest(es, unreadable=[]).position == 1155 and projection.unrebuildable(es, []) is None


def test_recommend_on_a_pruned_log_says_it_reads_only_what_was_kept(pg_schema, pg_engine, tmp_path, capsys):
    """A day-2 trial: ``recommend --backfill`` on a pruned log used the kept history ("3
    foreground requests") without saying the rest was gone."""
    from backfill.sim.history import from_log

    es, log, _ = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    (m0,) = from_log(es, pg_schema[1], [("model", "sim", "m0")])
    kept = sum(1 for p, e, _ in log if p > 1150 and type(e).__name__ == "ForegroundRequest" and e.model == "m0")
    assert len(m0.requests) == kept > 0
    assert m0.note == f"sim/m0: {kept} foreground requests (the log was pruned up to position 1150: only what it kept after that is read)"


def test_an_interrupted_export_is_cut_back_to_whole_rows_and_restores(pg_schema, pg_engine, tmp_path, capsys, monkeypatch):
    """An adversarial trial: a prune whose export filled the disk left a row cut off; the next
    prune appended to it, exited 0 and dropped the partitions, and ``db restore`` refused the
    file (their only copy). Now a failed export is cut back to where it was (nothing dropped),
    a part row a killed prune left is cut off by the next prune, and the file restores whole."""
    from backfill.store import retention

    log = _log()
    es = EventStore(pg_engine, partition_size=50)
    es.append([encode(e, k) for _, e, k in log])
    projection.save(es, fold_all(World(), [(p, e) for p, e, _ in log][: len(log) // 2]))
    monkeypatch.chdir(tmp_path)
    export = tmp_path / "pruned.csv"
    real, calls, sizes = retention._write_all, [], []

    def disk_fills(fh, data):
        calls.append(len(data))
        if len(calls) == 3:  # the third partition's rows: half of them fit
            real(fh, data[: len(data) // 2])
            raise OSError(28, "No space left on device")
        real(fh, data)
        sizes.append(export.stat().st_size)

    monkeypatch.setattr(retention, "_write_all", disk_fills)
    assert _cli(pg_schema, "db", "prune", "--before", LATER, "--export", "pruned.csv") == 2
    err = capsys.readouterr().err.strip()
    assert err == "backfill: error: db prune: [Errno 28] No space left on device", err
    assert es.pruned_up_to() == 100  # the two partitions whose export was whole
    assert export.stat().st_size == sizes[-1] and export.read_bytes().endswith(b"\n")
    assert [int(r["position"]) for r in csv.DictReader(export.open())] == list(range(1, 101))
    # a prune killed mid-row leaves a part row (no line end)
    with export.open("ab") as fh:
        fh.write(b"101,2026-12-06 18:12:06.0365")
    monkeypatch.setattr(retention, "_write_all", real)
    assert _cli(pg_schema, "db", "prune", "--before", LATER, "--export", "pruned.csv") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "cut an incomplete last row (28 bytes) off pruned.csv" in out and "dropped 21 partition(s)" in out
    assert es.pruned_up_to() == 1150
    assert [int(r["position"]) for r in csv.DictReader(export.open())] == list(range(1, 1151))
    with es.begin() as tx:  # a relative --export is recorded as the file it names (a trial: `rel.csv`)
        recorded = {r[0] for r in tx.connection.execute("SELECT export FROM pruned_partitions")}
    assert recorded == {str(export)}
    monkeypatch.setattr(projection, "code_version", lambda: "7-a-later-release")
    assert _cli(pg_schema, "db", "restore", str(export)) == 0
    assert "restored 1,150 events (positions 1-1150)" in " ".join(capsys.readouterr().out.split())
    assert es.pruned_up_to() == 0 and es.count() == len(log)


def test_a_restore_stopped_inside_its_transaction_does_not_hold_the_log(pg_schema, pg_engine, tmp_path, capsys, monkeypatch):
    """An adversarial trial stopped ``db restore`` (SIGSTOP) while it held the log's write lock:
    every append failed, and ``/readyz`` said so, until it was continued. Its session now keeps
    the idle-in-transaction timeout (the other timeouts stay off: a large export loads for long):
    here the restore waits 3 s inside its transaction after its last statement, an append made
    meanwhile is stored once the server ends the restore's session (1 s), and the restore fails
    having written nothing."""
    import threading
    import time

    from backfill.store import retention

    es, log, export = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    count = es.count()
    monkeypatch.setenv("BACKFILL_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", "1")
    locked = threading.Event()
    real = retention.restore

    def restore_then_stop(conn, sources, lock_log, **kw):
        result = real(conn, sources, lock_log, **kw)  # the write lock is held from here to the commit
        locked.set()
        time.sleep(3)
        return result

    monkeypatch.setattr(retention, "restore", restore_then_stop)
    appended: list[float] = []

    def append_meanwhile():
        locked.wait(30)
        t0 = time.monotonic()
        es.append([record("after/restore")])
        appended.append(time.monotonic() - t0)

    t = threading.Thread(target=append_meanwhile)
    t.start()
    assert _cli(pg_schema, "db", "restore", str(export)) == 2
    t.join(30)
    assert "db restore: " in capsys.readouterr().err
    assert appended and appended[0] < 2.5, appended  # not held for the 3 s the restore stood still
    assert es.count() == count + 1 and es.pruned_up_to() == 1150  # the append stored, nothing restored


def test_recommend_backfill_finds_a_declaration_whose_applied_event_was_pruned(pg_schema, pg_engine, tmp_path, capsys):
    """A trial: once a prune dropped a declaration's ``BackfillApplied`` (its spec never changed
    after), ``recommend --backfill`` said "is not in the log", exit 2, though the snapshot the
    pruned log continues from holds it. Bare names are resolved from it too."""
    from backfill.sim.cluster import backfill_name

    es, log, _ = _pruned(pg_schema, pg_engine, tmp_path, capsys)
    name = backfill_name("m0")
    applied = [p for p, e, _ in log if type(e).__name__ == "BackfillApplied" and e.name == name]
    assert applied and max(applied) <= es.pruned_up_to()  # every BackfillApplied of it is gone
    kept = sum(1 for p, e, _ in log if p > 1150 and type(e).__name__ == "ForegroundRequest" and e.model == "m0")
    for target in (f"sim/{name}", name):
        assert _cli(pg_schema, "recommend", "--backfill", target, "--idle-for-values", "10m,20m") == 0, capsys.readouterr().err
        printed = capsys.readouterr()
        assert f"sim/{name}: model m0, {kept} foreground requests" in " ".join((printed.out + printed.err).split())
