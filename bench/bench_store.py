"""Benchmark of the event store: append vs raw COPY, raw read rate, and decoding.

Usage::

    .venv/bin/python bench/bench_store.py [--events N] [--repeat R] [--database-url URL]

Runs against ``--database-url`` / ``BACKFILL_DATABASE_URL`` or, when neither is set, the
embedded server in ``BACKFILL_DATA_DIR`` (default ``.backfill``), in a scratch schema that is
dropped at the end. Measured side by side in one run (median of ``--repeat`` runs each):

- events/s appended by :meth:`EventStore.append` in batches of 1,000 and 10,000 (one
  transaction per batch, into an empty log);
- events/s of a raw binary COPY of the same rows, in the same batches, into an unpartitioned
  scratch table with the same columns, defaults and indexes plus a UNIQUE idempotency key (the
  table shape before partitioning), and the ratio (target >= 50%); the append writes the
  partitioned ``events`` and ``event_keys``;
- events/s read back by :meth:`EventStore.read` over the whole log (``StoredEvent`` objects,
  before any JSON decoding);
- events/s decoded by :func:`backfill.core.events.decode_many` from rows as
  :meth:`EventStore.read_payloads` returns them (PostgreSQL's ``jsonb`` text), old path
  (pydantic validation of the whole batch, ``validate=True``) vs the new compiled path
  (orjson), on the event mix of a simulation (synthetic workload, ``--repeat-after 1m``:
  about 95% ForegroundRequest, the rest admissions, Job facts and cancels);
- (``python -m bench`` only, :func:`restore_lock`) how long ``backfill db restore`` holds the
  log's write lock against the whole restore.

Rows look like real ones: type ``ForegroundRequest``, stream ``model/ns/M0001``..``M0087``,
key ``fg/<i>``, ``data`` a ~150-byte JSON object.

``--storage N`` instead measures what the log costs on disk: it appends N events of a
simulation's mix, rewritten the way the controller records them (ForegroundRequest from
``status.lastActiveTime`` with the key ``fg/<Model uid>/<lastActiveTime>``; the admissions,
Job facts and cancels as simulated), plus one run row per simulated attempt, runs ``VACUUM
ANALYZE`` and prints ``pg_total_relation_size`` (heap + TOAST + indexes) of ``events`` (its
partitions), ``event_keys`` and ``runs``, per event and per million events (docs/storage.md).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any
from datetime import datetime, timedelta, timezone
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from backfill.core.events import decode_many, encode  # noqa: E402
from backfill.core.perf import paused_gc  # noqa: E402
from backfill.core.records import EventRecord  # noqa: E402
from backfill.settings import Settings  # noqa: E402
from backfill.store.engine import make_engine, normalize_url, resolve_database_url  # noqa: E402
from backfill.store.eventlog import EventStore  # noqa: E402
from backfill.store.migrate import drop_schema, upgrade  # noqa: E402
from bench.rows import Row  # noqa: E402

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def make_records(n: int) -> list[EventRecord]:
    out = []
    for i in range(n):
        model = f"M{i % 87 + 1:04d}"
        at = T0 + timedelta(milliseconds=250 * i)
        data = json.dumps(
            {
                "type": "ForegroundRequest",
                "namespace": "ns",
                "model": model,
                "at": at.isoformat(),
                "source": "trace",
                "count": 1,
                "busy_until": (at + timedelta(milliseconds=500 + (i % 17) * 137)).isoformat(),
            },
            separators=(",", ":"),
        )
        out.append(EventRecord("ForegroundRequest", 1, f"model/ns/{model}", f"fg/{i}", at, data))
    return out


def simulated_records(n: int) -> list[EventRecord]:
    """About ``n`` records of a simulation's event mix (the synthetic workload)."""
    from backfill.sim.cluster import SimParams, simulate
    from backfill.sim.traces import synthetic

    days = 1.0
    while True:
        result = simulate(synthetic(seed=7, models=30, days=days), SimParams(idle_for=1800, max_run=1800, repeat_after=60, job=900))
        if len(result.events) >= n or days > 365:
            return [encode(e, k) for _, e, k in result.events[:n]]
        days *= max(1.2, n / max(1, len(result.events)) * 1.1)


def storage(url: str, n: int, console: Console) -> None:
    """Append ``n`` controller-shaped events into a scratch schema and print the table sizes."""
    import uuid

    from backfill.core import events as ev
    from backfill.core.timefmt import rfc3339
    from backfill.sim.cluster import SimParams, simulate
    from backfill.sim.traces import synthetic
    from backfill.store.retention import relation_sizes
    from backfill.store.runs import RunStore

    days, result = 1.0, None
    while True:
        trace = synthetic(seed=7, models=30, days=days)
        result = simulate(trace, SimParams(idle_for=1800, max_run=1800, repeat_after=60, job=900))
        if len(result.events) >= n:
            break
        days *= max(1.2, n / max(1, len(result.events)) * 1.05)
    uids = {}
    records: list[EventRecord] = []
    for _, e, key in result.events[:n]:
        if isinstance(e, ev.ForegroundRequest):
            uid = uids.setdefault(e.model, str(uuid.uuid5(uuid.NAMESPACE_DNS, e.model)))
            e = ev.ForegroundRequest(at=e.at, namespace="flexinfer-system", model=f"model-{e.model.lower()}", source="lastActiveTime")
            key = f"fg/{uid}/{rfc3339(e.at)}"
        records.append(encode(e, key))
    first, last = records[0].at, records[-1].at
    model_days = len(uids) * (last - first).total_seconds() / 86400
    schema = f"bench_{secrets.token_hex(4)}"
    upgrade(url, schema)
    engine = make_engine(url, schema, pool_size=2)
    store = EventStore(engine)
    try:
        t = time.perf_counter()
        for s in range(0, len(records), 10000):
            store.append(records[s : s + 10000])
        seconds = time.perf_counter() - t
        runs = result.runs
        RunStore(engine).apply(runs, "runs", len(records))
        fairy = engine.raw_connection()
        try:
            conn = fairy.driver_connection
            conn.autocommit = True
            conn.execute("VACUUM ANALYZE")
            sizes = relation_sizes(conn)
            parts = conn.execute("SELECT count(*) FROM pg_inherits WHERE inhparent = 'events'::regclass").fetchone()[0]
        finally:
            fairy.close()
        mix = {}
        for r in records:
            mix[r.type] = mix.get(r.type, 0) + 1
        top = ", ".join(f"{k} {v / len(records):.1%}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1])[:4])
        console.print(f"[dim]{len(records):,} events ({top}), {len(uids)} models over {model_days:,.1f} model-days, "
                      f"data {sum(len(r.data) for r in records) / len(records):.0f} B and key "
                      f"{sum(len(r.idempotency_key) for r in records) / len(records):.0f} B on average; appended in {seconds:.1f} s "
                      f"({len(records) / seconds:,.0f}/s), {parts} partition(s) of 1,000,000[/dim]")
        table = Table(title=f"storage, pg_total_relation_size after {len(records):,} events and {len(runs):,} run rows")
        for c in ("table", "bytes", "per event", "per million events", "per model-day"):
            table.add_column(c, justify="left" if c == "table" else "right")
        total = 0
        for name in ("events", "event_keys", "runs"):
            b = sizes[name]
            total += b if name != "runs" else 0
            per = len(runs) if name == "runs" else len(records)
            table.add_row(name, f"{b:,}", f"{b / max(1, per):,.0f} B" + (" per run" if name == "runs" else ""),
                          "-" if name == "runs" else f"{b / len(records) * 1e6 / 2**20:,.0f} MiB", f"{b / model_days / 1024:,.1f} KiB")
        table.add_row("log (events + event_keys)", f"{total:,}", f"{total / len(records):,.0f} B", f"{total / len(records) * 1e6 / 2**20:,.0f} MiB",
                      f"{total / model_days / 1024:,.1f} KiB", end_section=True)
        console.print(table)
    finally:
        store.close()
        engine.dispose()
        drop_schema(url, schema)


def timed(fn: Callable[[], int]) -> float:
    t = time.perf_counter()
    n = fn()
    return n / (time.perf_counter() - t)


def _has_table(engine: Any, name: str) -> bool:
    with engine.begin() as conn:
        return conn.exec_driver_sql(f"SELECT to_regclass('{name}') IS NOT NULL").scalar()


def measure(url: str, events: int = 200_000, repeat: int = 3, console: Console | None = None) -> dict[str, Any]:
    """Append vs raw COPY, raw read and decode, median of ``repeat`` runs, in a scratch schema of
    ``url`` (dropped at the end).

    Returns ``{"med": {measurement: events/s}, "events": n, "decoded": n, "repeat": r}``; the
    measurement names are ``copy1000``, ``append1000``, ``copy10000``, ``append10000``,
    ``read``, and, when :func:`decode_many` has the compiled path (``validate=`` keyword),
    ``decode_old`` and ``decode_new``.
    """
    console = console or Console(stderr=True)
    schema = f"bench_{secrets.token_hex(4)}"
    records = make_records(events)
    avg_bytes = sum(len(r.data) for r in records) / len(records)
    console.print(f"[dim]{len(records):,} events, data {avg_bytes:.0f} bytes on average, schema {schema}[/dim]")

    upgrade(url, schema)
    engine = make_engine(url, schema, pool_size=2)
    store = EventStore(engine)
    try:
        keys_table = _has_table(engine, "event_keys")  # the partitioned layout keeps the keys apart
        logged = "events, event_keys" if keys_table else "events"
        with engine.begin() as conn:
            # The unpartitioned shape of revision 0001: same columns, defaults and indexes, and
            # the idempotency key UNIQUE in the table itself (the append keeps it in event_keys).
            conn.exec_driver_sql("CREATE TABLE scratch (LIKE events INCLUDING ALL)")
            if keys_table:
                conn.exec_driver_sql("CREATE UNIQUE INDEX scratch_idempotency_key ON scratch (idempotency_key)")

        def truncate() -> None:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"TRUNCATE {logged}, scratch RESTART IDENTITY")
            try:  # flush dirty pages now rather than during a measurement (needs privileges)
                with engine.begin() as conn:
                    conn.exec_driver_sql("CHECKPOINT")
            except Exception:  # noqa: BLE001
                pass

        def append(batch: int) -> int:
            for s in range(0, len(records), batch):
                store.append(records[s : s + batch])
            return len(records)

        def raw_copy(batch: int) -> int:
            fairy = engine.raw_connection()
            try:
                conn = fairy.driver_connection
                for s in range(0, len(records), batch):
                    with conn.cursor() as cur:
                        with cur.copy(
                            "COPY scratch (type, version, stream, idempotency_key, at, data) FROM STDIN (FORMAT BINARY)"
                        ) as copy:
                            copy.set_types(("text", "int2", "text", "text", "timestamptz", "bytea"))
                            for r in records[s : s + batch]:
                                copy.write_row((r.type, r.version, r.stream, r.idempotency_key, r.at, b"\x01" + r.data.encode()))
                    conn.commit()
            finally:
                fairy.close()
            return len(records)

        def read() -> int:
            n = 0
            for _ in store.read():
                n += 1
            return n

        # Decoding: the rows of a simulation, appended and read back as the fold gets them.
        compiled = "validate" in inspect.signature(decode_many).parameters
        rows: list[tuple[str, int, str]] = []
        if compiled:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"TRUNCATE {logged}")
            sim = simulated_records(min(events, 200_000))
            for s in range(0, len(sim), 20000):
                store.append(sim[s : s + 20000])
            rows = [(t, v, d) for batch in store.read_payloads(0) for _, t, v, d in batch]
            assert decode_many(rows) == decode_many(rows, validate=True)  # same events either way
            with engine.begin() as conn:
                conn.exec_driver_sql(f"TRUNCATE {logged}")

        def decode_old() -> int:
            for s in range(0, len(rows), 20000):
                decode_many(rows[s : s + 20000], validate=True)
            return len(rows)

        def decode_new() -> int:
            for s in range(0, len(rows), 20000):
                decode_many(rows[s : s + 20000])
            return len(rows)

        count = getattr(store, "count", None) or store.head
        results: dict[str, list[float]] = {}
        with console.status("measuring...") as status:
            for rep in range(repeat):
                for batch in (1000, 10000):
                    status.update(f"run {rep + 1}/{repeat}: batches of {batch:,}")
                    truncate()
                    results.setdefault(f"copy{batch}", []).append(timed(lambda: raw_copy(batch)))
                    results.setdefault(f"append{batch}", []).append(timed(lambda: append(batch)))
                status.update(f"run {rep + 1}/{repeat}: read")
                assert count() == len(records)
                results.setdefault("read", []).append(timed(read))
                if compiled:
                    status.update(f"run {rep + 1}/{repeat}: decode")
                    with paused_gc():
                        results.setdefault("decode_old", []).append(timed(decode_old))
                        results.setdefault("decode_new", []).append(timed(decode_new))
    finally:
        store.close()
        engine.dispose()
        drop_schema(url, schema)
    med = {k: statistics.median(v) for k, v in results.items()}
    return {"med": med, "events": len(records), "decoded": len(rows), "repeat": repeat}


def restore_lock(url: str, events: int = 200_000, repeat: int = 3) -> Row:
    """``backfill db restore`` of ``events`` pruned events: how long it holds the log's write
    lock (appends wait that long), against the whole restore, best of ``repeat``, in a scratch
    schema of ``url`` (dropped at the end). The log: ``events`` rows of a simulation's mix
    (:func:`simulated_records`: restore decodes every row) in 20 partitions (at least 1,000
    events each) under a snapshot, pruned with an export (every full partition)."""
    import contextlib
    import io

    from backfill.cli import main as cli
    from backfill.core.state import World
    from backfill.store import projection
    from backfill.store.retention import restore

    schema = f"bench_{secrets.token_hex(4)}"
    upgrade(url, schema)
    engine = make_engine(url, schema, pool_size=2)
    store = EventStore(engine, partition_size=max(1_000, events // 20))  # the smallest size allowed is 1,000
    export = Path(tempfile.mkdtemp(prefix="backfill-bench-")) / "pruned.csv"
    held, total = [], []
    pruned = 0
    try:
        records = simulated_records(events)
        for s in range(0, len(records), 10_000):
            store.append(records[s : s + 10_000])
        del records
        head = store.head()
        for _ in range(repeat):
            projection.save(store, World(position=head))  # prune needs a snapshot above what it drops
            with contextlib.redirect_stdout(io.StringIO()):
                code = cli(["db", "prune", "--before", "2999-01-01T00:00:00Z", "--export", str(export), "--database-url", url, "--schema", schema])
            pruned = store.pruned_up_to()
            assert code == 0 and pruned > 0, "the bench log was not pruned"
            t: dict[str, float] = {}
            with store.begin() as tx:
                t0 = time.perf_counter()

                def lock() -> None:
                    tx.lock()
                    t["lock"] = time.perf_counter()

                restore(tx.connection, [export], lock)
            end = time.perf_counter()
            held.append(end - t["lock"])
            total.append(end - t0)
            export.unlink()
    finally:
        store.close()
        engine.dispose()
        drop_schema(url, schema)
        shutil.rmtree(export.parent, ignore_errors=True)
    i = min(range(len(held)), key=held.__getitem__)
    return Row(
        "db restore: the log's write lock held",
        held[i] * 1000,
        "ms",
        baseline=total[i] * 1000,
        baseline_name="the whole restore",
        higher_is_better=False,
        note=f"{pruned:,} pruned events (a simulation's mix) restored from prune's export; appends wait this long "
        f"(the attach and the idempotency keys' insert); ratio = held / whole restore; best of {repeat}",
    )


def rows(m: dict[str, Any]) -> list[Row]:
    """The figures of :func:`measure` as :class:`~bench.rows.Row` (append vs raw COPY, raw read,
    compiled decode vs pydantic decode)."""
    med, n, rep = m["med"], m["events"], m["repeat"]
    out = [
        Row(
            f"EventStore.append, batches of {batch:,}",
            med[f"append{batch}"],
            "ev/s",
            baseline=med[f"copy{batch}"],
            baseline_name="raw binary COPY",
            target=0.5 * med[f"copy{batch}"],
            note=f"{n:,} ForegroundRequest rows; target: half the raw COPY rate of the same rows into a "
            f"scratch table of the same shape; median of {rep}",
        )
        for batch in (1000, 10000)
    ]
    out.append(Row("EventStore.read, whole log (raw, no decode)", med["read"], "ev/s", target=200_000, note=f"{n:,} rows; median of {rep}"))
    if "decode_new" in med:
        out.append(
            Row(
                "decode_many, compiled path",
                med["decode_new"],
                "ev/s",
                baseline=med["decode_old"],
                baseline_name="pydantic",
                note=f"{m['decoded']:,} rows of a simulation as PostgreSQL returns them; baseline: decode_many(validate=True), "
                f"one pydantic validation per batch; median of {rep}",
            )
        )
    else:
        out.append(Row("decode_many, compiled path", None, "ev/s", note="not in this build (decode_many has no compiled path)"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="events per measurement (default 200000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is shown (default 3)")
    parser.add_argument("--database-url", default=None, help="PostgreSQL URL (default: BACKFILL_DATABASE_URL, else the embedded server)")
    parser.add_argument("--storage", type=int, default=0, metavar="N", help="measure the on-disk size of N controller-shaped events instead")
    args = parser.parse_args(argv)
    console = Console()

    settings = Settings()
    if args.database_url:
        settings = settings.model_copy(update={"database_url": args.database_url})
    pgdata = (Path(settings.data_dir) / "pg").resolve()
    already_running = settings.database_url is None and (pgdata / "postmaster.pid").exists()
    t = time.perf_counter()
    url, note = resolve_database_url(settings)
    start_seconds = time.perf_counter() - t
    if note:
        state = "joined an already running server" if already_running else "started"
        console.print(f"[dim]{note}; {state} in {start_seconds:.2f} s[/dim]")
    else:
        console.print(f"[dim]server: {normalize_url(url).split('@')[-1]}[/dim]")

    if args.storage:
        storage(url, args.storage, console)
        return 0

    m = measure(url, args.events, args.repeat, console)
    med = m["med"]
    table = Table(title=f"event store, {m['events']:,} events, median of {args.repeat}")
    table.add_column("measurement")
    table.add_column("events/s", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("target", justify="right")
    for batch in (1000, 10000):
        ratio = med[f"append{batch}"] / med[f"copy{batch}"]
        table.add_row(f"raw binary COPY, batches of {batch:,}", f"{med[f'copy{batch}']:,.0f}", "100%", "")
        table.add_row(
            f"EventStore.append, batches of {batch:,}",
            f"{med[f'append{batch}']:,.0f}",
            f"[{'green' if ratio >= 0.5 else 'red'}]{ratio:.0%}[/]",
            ">= 50%",
        )
    ok = med["read"] >= 200_000
    table.add_row("EventStore.read, whole log (raw, no decode)", f"[{'green' if ok else 'red'}]{med['read']:,.0f}[/]", "", ">= 200,000")
    if "decode_new" in med:
        ratio = med["decode_new"] / med["decode_old"]
        table.add_row(f"decode_many, pydantic validation (old), {m['decoded']:,} simulated rows", f"{med['decode_old']:,.0f}", "", "")
        table.add_row(
            "decode_many, compiled path (new), same rows",
            f"{med['decode_new']:,.0f}",
            f"[{'green' if ratio > 1 else 'red'}]{ratio:.2f}x old[/]",
            "> old",
        )
    console.print(table)
    if note:
        console.print(f"embedded server start: {start_seconds:.2f} s ({'joined' if already_running else 'started'})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    raise SystemExit(main())
