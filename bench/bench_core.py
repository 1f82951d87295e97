"""Core benchmarks: in-memory fold rate by world size, full replay from PostgreSQL against the raw
read rate, and simulate of the whole Alibaba trace.

Usage: .venv/bin/python bench/bench_core.py [--database-url URL] [--repeat N]

Targets (issue 10): fold in memory >= 500k events/s, flat from 100 to 10,000 ModelBackfills;
full replay (read + decode + fold) from PostgreSQL >= 200k events/s; simulate of the whole
23-day Alibaba trace (87 models) with ``--repeat-after 1m`` <= 2 s. The functions here return
:class:`bench.rows.Row` lists; ``python -m bench`` puts them in its one table.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from backfill.core import events as ev  # noqa: E402
from backfill.core.events import encode  # noqa: E402
from backfill.core.perf import long_fold, paused_gc  # noqa: E402
from backfill.core.projector import fold, fold_all  # noqa: E402
from backfill.core.state import World  # noqa: E402
from backfill.sim.cluster import SimParams, SimResult, simulate  # noqa: E402
from backfill.sim.traces import Trace, read_trace, synthetic  # noqa: E402
from bench.rows import TRACE, Row, best  # noqa: E402

DEFAULT = SimParams(idle_for=1800, max_run=1800, repeat_after=86400, job=900)  # the CLI defaults
HEAVY = SimParams(idle_for=1800, max_run=1800, repeat_after=60, job=900)  # the acceptance test's parameters
FOLD_TARGET = 500_000.0
REPLAY_TARGET = 200_000.0
SIMULATE_TARGET = 2.0
FOLD_SIZES = (100, 1_000, 10_000)
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def alibaba() -> Trace:
    """The whole Alibaba GenAI 2026 LoRA trace (``../shared/data/traces`` next to the checkout)."""
    return read_trace(TRACE, "alibaba-genai")


def simulate_rows(trace: Trace, repeat: int, label: str = "whole Alibaba trace") -> tuple[list[Row], SimResult]:
    """``simulate`` of ``trace`` with ``--repeat-after 1m`` (best of ``repeat``), against the
    2 s target; returns the row and the simulation's result (its events feed the replay)."""
    result: list[SimResult] = []

    def run() -> None:
        result.clear()  # not the previous run's result alive meanwhile (as a ``simulate`` process runs)
        result.append(simulate(trace, HEAVY))

    secs = best(run, repeat)
    r = result[0]
    return [
        Row(
            "simulate --repeat-after 1m",
            secs,
            "s",
            target=SIMULATE_TARGET,
            higher_is_better=False,
            note=f"{label}: {trace.count:,} requests on {len(trace.requests)} models -> "
            f"{len(r.events):,} events, {len(r.runs):,} runs; best of {repeat}",
        )
    ], r


def world_events(backfills: int, per_model: int = 10) -> tuple[list[Any], list[tuple[str, str]], list[tuple[str, str]]]:
    """The events the watchers would record for ``backfills`` ModelBackfills on ``backfills /
    per_model`` Ready Models and one CronJob template; returns them with the model and backfill
    keys."""
    n_models = max(1, backfills // per_model)
    template = {"spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}}
    out: list[Any] = [ev.CronJobSeen(at=T0, namespace="ns", name="tpl", job_template=template)]
    models = [("ns", f"m-{i:05d}") for i in range(n_models)]
    for i, (ns, m) in enumerate(models):
        out.append(ev.ModelReady(at=T0, namespace=ns, model=m, node=f"node-{i:05d}"))
    keys = []
    for i in range(backfills):
        ns, m = models[i % n_models]
        name = f"bf-{i:05d}"
        spec = {"modelRef": m, "templateRef": "tpl", "idleFor": "30m", "maxRunDuration": "15m"}
        out.append(ev.BackfillApplied(at=T0, namespace=ns, name=name, uid=f"uid-{i}", generation=1, spec=spec))
        keys.append((ns, name))
    return out, models, keys


def fold_world(backfills: int, per_model: int = 10) -> tuple[World, list[tuple[str, str]], list[tuple[str, str]]]:
    """The world :func:`world_events` builds (folded one event at a time, positions from 1),
    with the model and backfill keys."""
    events, models, keys = world_events(backfills, per_model)
    w = World()
    for pos, e in enumerate(events, 1):
        w = fold(w, e, pos)
    return w, models, keys


def fold_events(
    models: list[tuple[str, str]], keys: list[tuple[str, str]], n: int, seed: int = 1, gen: dict[tuple[str, str], int] | None = None, start: int = 0
) -> list[Any]:
    """``n`` events of the hot path: 98% ForegroundRequest (``lastActiveTime`` bumps on random
    Models, a second apart), 1% Model re-observations (ModelReady), 1% re-applied ModelBackfill
    specs (BackfillApplied, next generation). For a longer log in chunks: ``start`` (the number
    of events before this chunk: its first is ``start`` seconds later) and one ``gen`` dict (the
    generations applied so far) across the calls, a ``seed`` per chunk."""
    rnd = random.Random(seed)
    out: list[Any] = []
    gen = {} if gen is None else gen
    for i in range(start, start + n):
        at = T0 + timedelta(hours=1, seconds=i)
        k = rnd.random()
        if k < 0.98:
            ns, m = models[rnd.randrange(len(models))]
            out.append(ev.ForegroundRequest(at=at, namespace=ns, model=m, source="lastActiveTime", busy_until=at + timedelta(seconds=60)))
        elif k < 0.99:
            j = rnd.randrange(len(models))
            ns, m = models[j]
            out.append(ev.ModelReady(at=at, namespace=ns, model=m, node=f"node-{j:05d}"))
        else:
            j = rnd.randrange(len(keys))
            ns, name = keys[j]
            g = gen[keys[j]] = gen.get(keys[j], 1) + 1
            spec = {"modelRef": models[j % len(models)][1], "templateRef": "tpl", "idleFor": f"{30 + g}m", "maxRunDuration": "15m"}
            out.append(ev.BackfillApplied(at=at, namespace=ns, name=name, uid=f"uid-{j}", generation=g, spec=spec))
    return out


def fold_rows(sizes: tuple[int, ...] = FOLD_SIZES, events: int = 200_000, repeat: int = 3) -> list[Row]:
    """Fold rates (events/s, best of ``repeat``) of :func:`fold_events` on a world of each size,
    both ways the controller folds: one event at a time (:func:`fold`, a World after every event:
    the live loop, the preemptor, ``simulate``) and in a batch (:func:`fold_all`: start-up and
    catch-up, where runs of foreground requests go through a transient map), each batch rate with
    the per-event rate of the same run as its baseline; plus the flatness ratios (largest /
    smallest world)."""
    rows, batch_rows = [], []
    rates: dict[int, float] = {}
    batch_rates: dict[int, float] = {}
    for size in sizes:
        world, models, keys = fold_world(size)
        batch = fold_events(models, keys, events)
        start = world.position
        pairs = list(enumerate(batch, start + 1))
        for e in batch[:2000]:  # warm up (the first world's first events pay for imports and caches)
            fold(world, e, start + 1)
        fold_all(world, pairs[:2000])

        def run() -> None:
            w = world
            f = fold
            with paused_gc():
                for i, e in pairs:
                    w = f(w, e, i)

        def run_batch() -> None:
            with paused_gc():
                fold_all(world, pairs)

        rates[size] = len(batch) / best(run, repeat)
        batch_rates[size] = len(batch) / best(run_batch, repeat)
        sizes_note = (
            f"{size:,} ModelBackfills on {len(models):,} Models; {len(batch):,} events (98% ForegroundRequest, "
            f"1% ModelReady, 1% BackfillApplied); best of {repeat}"
        )
        rows.append(Row(f"fold in memory, {size:,} ModelBackfills", rates[size], "ev/s", target=FOLD_TARGET, note=f"one event at a time (fold: the live loop); {sizes_note}"))
        batch_rows.append(
            Row(
                f"fold_all in memory (start-up, catch-up), {size:,} ModelBackfills",
                batch_rates[size],
                "ev/s",
                baseline=rates[size],
                baseline_name="one at a time",
                target=FOLD_TARGET,
                note=f"the batch fold (fold_all: runs of ForegroundRequest in a transient map); {sizes_note}",
            )
        )
    lo, hi = min(sizes), max(sizes)
    flat = "flat means a ratio near 1.00x (the fold's cost per event independent of the world size)"
    rows.append(Row(f"fold flatness, {hi:,} / {lo:,} ModelBackfills", rates[hi], "ev/s", baseline=rates[lo], baseline_name=f"{lo:,}", note=flat))
    batch_rows.append(
        Row(f"fold_all flatness, {hi:,} / {lo:,} ModelBackfills", batch_rates[hi], "ev/s", baseline=batch_rates[lo], baseline_name=f"{lo:,}", note=flat)
    )
    return rows + batch_rows


def _store_log(url: str, schema: str, records: list[Any]) -> tuple[Any, Any]:
    """A fresh schema ``schema`` holding ``records`` (appended in batches of 20,000, positions
    from 1); returns ``(engine, EventStore)``. Call :func:`_settle` once every row is in."""
    from backfill.store import EventStore, make_engine, reset

    reset(url, schema)
    engine = make_engine(url, schema)
    es = EventStore(engine)
    for i in range(0, len(records), 20000):
        es.append(records[i : i + 20000])
    return engine, es


def _settle(engine: Any) -> None:
    """``VACUUM (ANALYZE)`` the log just written (``events`` and its idempotency keys), so that
    its reads are measured on a log at rest (as autovacuum leaves one): the autovacuum a million
    fresh rows call for otherwise ran during the measurement on a 2-core host (the raw read of
    the request log 76-142k ev/s in some runs, against 500-600k in others)."""
    import sqlalchemy as sa

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM (ANALYZE) events, event_keys"))


def _stored(url: str, schema: str, records: list[Any], more: Iterable[list[Any]] = ()) -> None:
    """:func:`_store_log` of ``records``, then each batch of ``more`` appended, the log settled
    (:func:`_settle`) and the store closed: ready for :func:`measure_in_fresh_process`. The
    caller drops ``schema``."""
    engine, es = _store_log(url, schema, records)
    try:
        for batch in more:
            es.append(batch)
        _settle(engine)
    finally:
        es.close()
        engine.dispose()


def _read_and_replay(es: Any, repeat: int, variants: bool = False) -> dict[str, float]:
    """Seconds, best of ``repeat`` each, to read and fold the whole log of ``es``:

    - ``read``: the raw read (no decode);
    - ``replay``: read + decode (every event in its compiled form, ``lean=True``, as start-up
      and catch-up decode) + the batch fold, inside :func:`backfill.core.perf.long_fold` (collector
      paused, a 0.2 ms switch interval);

    and with ``variants``, the same replay with one thing changed each (the baselines of the
    request log's rows): ``default_switch`` (the collector paused, the interpreter's default
    5 ms switch interval), ``pydantic`` (every event a pydantic instance, ``lean=False``),
    ``serial`` (each batch read only once the one before is folded: no read-ahead).
    """
    from backfill.core.events import decode_rows
    from backfill.store.projection import payloads

    def read_only() -> None:
        for _ in es.read_payloads(0, batch_size=20000):
            pass

    def replay(lean: bool = True, fold_context: Any = long_fold) -> None:
        w = World()
        with fold_context():
            for batch in payloads(es, 0, batch_size=20000, lean=lean):
                w = fold_all(w, batch)

    def serial() -> None:
        w, after = World(), 0
        with long_fold():
            while rows := es._payload_batch(after, 20000):
                w = fold_all(w, decode_rows(rows, lean=True))
                after = rows[-1][0]

    out = {"read": best(read_only, repeat), "replay": best(replay, repeat)}
    if variants:
        out["default_switch"] = best(lambda: replay(fold_context=paused_gc), repeat)
        out["pydantic"] = best(lambda: replay(lean=False), repeat)
        out["serial"] = best(serial, repeat)
    return out


def _measure_stored(url: str, schema: str, repeat: int, variants: bool = False, audit: bool = False) -> dict[str, Any]:
    """In this process: :func:`_read_and_replay` of the log stored in ``schema`` (seconds), and
    with ``audit`` the seconds of ``backfill replay``'s audit of it (``"audit"``, best of
    ``repeat``) with the auditor's counts (``"checked"``, ``"divergent"``, ``"unverifiable"``)."""
    from backfill.store import EventStore, make_engine

    engine = make_engine(url, schema)
    es = EventStore(engine)
    try:
        out: dict[str, Any] = dict(_read_and_replay(es, repeat, variants))
        if audit:
            audited: list[Any] = []

            def run_audit() -> None:  # what ``backfill replay`` does: every decision checked against its basis
                from backfill.core.audit import Auditor
                from backfill.store import projection

                a = Auditor()
                with long_fold():
                    projection.replay(es, a)
                audited[:] = [a]

            out["audit"] = best(run_audit, repeat)
            a = audited[0]
            out.update(checked=a.checked, divergent=len(a.divergences), unverifiable=len(a.unverifiable))
        return out
    finally:
        es.close()
        engine.dispose()


def measure_in_fresh_process(url: str, schema: str, repeat: int, variants: bool = False, audit: bool = False) -> dict[str, Any]:
    """:func:`_measure_stored` in a new interpreter (``spawn``): the replay runs in a heap of its
    own, as a ``backfill replay`` or a controller's start-up does, not in one the benchmarks
    before it (10,000-object worlds, the simulation) have grown. Side by side on one stored
    log, a process that had simulated replayed it at 187k ev/s and a fresh one at 226-233k
    (BENCHMARKS.md, 2026-12-06 10:05 UTC). Returns the child's dict; raises what it raised."""
    import multiprocessing

    # Pool's exit terminates the child: an interrupted run (Ctrl-C, SIGTERM) does not wait for
    # the measurement to end nor leave it running (a trial: both happened with an executor).
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_measure_stored, (url, schema, repeat, variants, audit))


def replay_rows(url: str, result: SimResult, repeat: int = 3, schema: str = "bench_core", requests: int = 1_000_000) -> list[Row]:
    """Full replay (read + decode + fold, as ``backfill replay`` and the start-up refold do) of
    ``result``'s events from PostgreSQL, against the raw read of the same rows (no decode); the
    same for a log shaped as the issue's start-up scenario (``requests`` events, 98% foreground
    requests on 10,000 ModelBackfills, :func:`fold_events`); and ``backfill replay``'s audit of
    the simulation's log.

    Each log is stored from this process and read and folded in a fresh one
    (:func:`measure_in_fresh_process`). Pass the only reference to ``result``: it is released
    once its events are stored.
    """
    from backfill.store import drop_schema

    records = [encode(e, k) for _, e, k in result.events]
    del result
    n = len(records)
    try:  # the scratch schema is dropped however the run ends (a trial: interrupted, it stayed)
        _stored(url, schema, records)
        del records
        secs = measure_in_fresh_process(url, schema, repeat, audit=True)
    finally:
        drop_schema(url, schema)
    read_rate, replay_rate, audit_rate = n / secs["read"], n / secs["replay"], n / secs["audit"]
    setup, models, keys = world_events(10_000)
    m = len(setup) + requests
    gen: dict[tuple[str, str], int] = {}

    def chunks() -> Iterator[list[Any]]:  # in chunks: a million records at once would hold ~1 GB
        for start in range(0, requests, 100_000):
            chunk = fold_events(models, keys, min(100_000, requests - start), seed=start + 1, gen=gen, start=start)
            yield [encode(e, f"bench/{start + i}") for i, e in enumerate(chunk)]

    try:
        _stored(url, schema, [encode(e, f"setup/{i}") for i, e in enumerate(setup)], chunks())
        req = {k: m / v for k, v in measure_in_fresh_process(url, schema, repeat, variants=True).items()}  # events/s
    finally:
        drop_schema(url, schema)
    req_read_rate, req_replay_rate = req["read"], req["replay"]
    return [
        Row(
            "read from PostgreSQL (lean rows, no decode)", read_rate, "ev/s",
            note=f"{n:,} events of the simulation, the log vacuumed first, read in a fresh process (as the replay below); best of {repeat}",
        ),
        Row(
            "full replay from PostgreSQL: read + decode + fold",
            replay_rate,
            "ev/s",
            baseline=read_rate,
            baseline_name="raw read",
            target=REPLAY_TARGET,
            note=f"the simulation's {n:,} events (mostly admissions and their Job facts, with foreground requests and cancels): "
            f"backfill.store.projection.payloads (read + decode, lean=True) and fold_all (the batch fold of start-up) inside perf.long_fold, "
            f"in a fresh process as backfill replay and start-up run, the log vacuumed first (bench_core.measure_in_fresh_process, _settle); ratio = replay / raw read of the same rows; best of {repeat}",
        ),
        Row(
            "full replay from PostgreSQL, a log of foreground requests",
            req_replay_rate,
            "ev/s",
            baseline=req_read_rate,
            baseline_name="raw read",
            target=REPLAY_TARGET,
            note=f"the start-up scenario of issue 10 (a proxy reporting lastActiveTime): {m:,} events, the set-up of 10,000 "
            f"ModelBackfills on 1,000 Models ({len(setup):,} events), then 98% ForegroundRequest, 1% ModelReady, 1% BackfillApplied (the fold rows' mix); "
            f"the same read + decode + fold_all, vacuumed first, in a fresh process; ratio = replay / raw read of the same rows ({req_read_rate:,.0f} ev/s); best of {repeat}",
        ),
        Row(
            "read-ahead: replay of the request log",
            req_replay_rate,
            "ev/s",
            baseline=req["serial"],
            baseline_name="no read-ahead",
            note=f"the row above (the same {m:,} events, read + decode + fold_all), the next batch read on a helper thread while "
            f"one folds; baseline: each batch read only once the one before is folded (read_payloads before it read ahead); "
            f"ratio = the speed-up; best of {repeat}",
        ),
        Row(
            "switch interval 0.2 ms: replay of the request log",
            req_replay_rate,
            "ev/s",
            baseline=req["default_switch"],
            baseline_name="5 ms, the default",
            note=f"the same replay inside backfill.core.perf.long_fold (as start-up and backfill replay fold): the interpreter's "
            f"switch interval 0.2 ms, so the read-ahead thread takes each chunk off the socket without waiting up to 5 ms for the "
            f"lock; baseline: the same with the default interval; ratio = the speed-up; best of {repeat}",
        ),
        Row(
            "compiled events: replay of the request log",
            req_replay_rate,
            "ev/s",
            baseline=req["pydantic"],
            baseline_name="pydantic instances",
            note=f"the same replay, each row decoded to its checked msgspec row (decode_rows(lean=True), as start-up and "
            f"catch-up fold); baseline: every row assembled into its pydantic event; ratio = the speed-up; best of {repeat}",
        ),
        Row(
            "replay audit from PostgreSQL (backfill replay)",
            audit_rate,
            "ev/s",
            baseline=replay_rate,
            baseline_name="replay without checks",
            note=f"the same {n:,} events through backfill.store.projection.replay and an Auditor (read + decode + fold, "
            f"and each of the {secs['checked']:,} decisions re-derived by decide on its basis state: {secs['divergent']} divergent, "
            f"{secs['unverifiable']} unverifiable); no target; best of {repeat}",
        ),
    ]


def quick_trace() -> Trace:
    """A small seeded synthetic trace (for ``--quick``)."""
    return synthetic(seed=7, models=6, days=1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--database-url", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fold-only", action="store_true", help="only the fold rows (seconds, no trace or database)")
    args = ap.parse_args()
    from backfill.settings import Settings
    from backfill.store import resolve_database_url

    console = Console(width=160)
    say = Console(stderr=True).log  # progress on stderr, the table on stdout
    if args.fold_only:
        for r in fold_rows(repeat=args.repeat):
            console.print(" | ".join(r.cells()[:2]))
        return
    say("simulate ...")
    rows, result = simulate_rows(alibaba(), args.repeat)
    sim = [result]
    del result  # replay_rows gets the only reference (it releases the simulation before replaying)
    say("fold in memory ...")
    rows += fold_rows(repeat=args.repeat)
    say("reading and replaying from PostgreSQL ...")
    url, _ = resolve_database_url(Settings(**({"database_url": args.database_url} if args.database_url else {})))
    rows += replay_rows(url, sim.pop(), args.repeat)
    table = Table(title=f"backfill core benchmark (best of {args.repeat})")
    for c in ("figure", "measured", "baseline", "ratio", "target", "met"):
        table.add_column(c)
    for r in rows:
        table.add_row(*r.cells())
    console.print(table)


if __name__ == "__main__":
    main()
