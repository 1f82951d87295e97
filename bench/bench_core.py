"""Core benchmarks: in-memory fold rate, full replay from PostgreSQL, and simulate of the whole
Alibaba trace. Prints one table with the measured values and their ratio to the issue's targets.

Usage: .venv/bin/python bench/bench_core.py [--database-url URL] [--repeat N]
Targets (issue #3): replay >= 200k events/s folded from PostgreSQL; simulate of the whole 23-day
Alibaba trace (87 models) <= 2 s.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backfill.core.events import decode_many, encode  # noqa: E402
from backfill.core.perf import paused_gc  # noqa: E402
from backfill.core.projector import fold  # noqa: E402
from backfill.core.state import World  # noqa: E402
from backfill.settings import Settings  # noqa: E402
from backfill.sim.cluster import SimParams, simulate  # noqa: E402
from backfill.sim.traces import read_trace  # noqa: E402
from backfill.store import EventStore, make_engine, reset, resolve_database_url  # noqa: E402

TRACE = ROOT.parent / "shared" / "data" / "traces" / "alibaba-genai-2026" / "lora_request_trace.csv"
DEFAULT = SimParams(idle_for=1800, max_run=1800, repeat_after=86400, job=900)  # the CLI defaults
HEAVY = SimParams(idle_for=1800, max_run=1800, repeat_after=60, job=900)  # the acceptance test's parameters


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--database-url", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    console = Console(width=160)
    say = Console(stderr=True).log  # progress on stderr, the table on stdout
    trace = read_trace(TRACE, "alibaba-genai")

    rows = []
    for label, params in (("simulate whole trace, CLI defaults (repeatAfter 24h)", DEFAULT), ("simulate whole trace, repeatAfter 1m", HEAVY)):
        result = None

        def run():
            nonlocal result
            result = simulate(trace, params)

        say(f"{label} ...")
        secs = best(run, args.repeat)
        rows.append((label, f"{secs:.2f} s", f"{len(result.events):,} events, {len(result.runs):,} runs", "<= 2 s", f"{2.0 / secs:.2f}x"))
    events = [(p, e) for p, e, _ in result.events]  # the heavy run: 300k events

    def fold_all():
        w = World()
        with paused_gc():
            for p, e in events:
                w = fold(w, e, p)

    say("fold in memory ...")
    secs = best(fold_all, args.repeat)
    rows.append(("fold in memory", f"{len(events) / secs:,.0f} ev/s", f"{len(events):,} events", "-", "-"))

    url, _ = resolve_database_url(Settings(**({"database_url": args.database_url} if args.database_url else {})))
    reset(url, "bench_core")
    engine = make_engine(url, "bench_core")
    es = EventStore(engine)
    records = [encode(e, k) for _, e, k in result.events]
    for i in range(0, len(records), 20000):
        es.append(records[i : i + 20000])

    def read_only():
        for _ in es.read_payloads(0, batch_size=20000):
            pass

    def replay():
        w = World()
        f = fold
        with paused_gc():  # as `backfill replay` and the controller's start-up refold do
            for batch in es.read_payloads(0, batch_size=20000):
                decoded = decode_many([(t, v, d) for _, t, v, d in batch])
                for row, e in zip(batch, decoded):
                    w = f(w, e, row[0])

    n = len(records)
    say("reading and replaying from PostgreSQL ...")
    secs_read = best(read_only, args.repeat)
    rows.append(("read from PostgreSQL (lean rows, no decode)", f"{n / secs_read:,.0f} ev/s", f"{n:,} events", "-", "-"))
    secs = best(replay, args.repeat)
    rows.append(("full replay: read + decode + fold", f"{n / secs:,.0f} ev/s", f"{n:,} events", ">= 200,000 ev/s", f"{(n / secs) / 200000:.2f}x"))
    es.close()

    table = Table(title="backfill core benchmark (best of %d)" % args.repeat)
    for c in ("measurement", "value", "size", "target", "value / target"):
        table.add_column(c)
    for r in rows:
        table.add_row(*r)
    console.print(table)


if __name__ == "__main__":
    main()
