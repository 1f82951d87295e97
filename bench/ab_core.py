"""Side by side: the core figures of two or more checkouts, interleaved in one run.

Usage::

    git worktree add ../ab-base <commit>
    python -m bench.ab_core ../ab-base . [--rounds 3] [--replay [--database-url URL]]

For each round, each checkout in turn runs in a fresh interpreter (``PYTHONPATH`` = the
checkout, so its own ``backfill`` is imported; the interpreter is this one) and prints three
figures: ``simulate`` of the whole Alibaba trace with ``--repeat-after 1m`` (seconds, best of 3),
``fold_all`` of that simulation's log (events/s, best of 5: the fold of ``backfill replay`` and
of start-up) and ``fold`` one event at a time of the fold group's 10,000-ModelBackfill mix
(events/s, best of 5); with ``--replay`` also the full replay of that log from PostgreSQL
(events/s, best of 3: stored in a fresh schema, then ``_read_and_replay`` of ``bench_core``:
read + decode + ``fold_all``, as the bench's replay row, but last in the probe's own
interpreter after its simulation, where the bench's row reads in a fresh process: comparable
between checkouts, about 1.2x below the table's figure; ``--database-url``, else
``BACKFILL_DATABASE_URL``, else the embedded server). Interleaving the checkouts round by round keeps a noisy machine's drift
out of the comparison (the development VM varies by up to 2x from one minute to the next). The
checkouts must both have ``bench/bench_core.py`` and sit next to ``../shared/data`` (the trace).
Nothing is written: copy the table into ``BENCHMARKS.md`` by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

#: Run inside each checkout (its ``backfill`` and ``bench`` on ``sys.path``): one JSON line.
_PROBE = r"""
import json, sys
from bench.bench_core import HEAVY, alibaba, fold_events, fold_world
from backfill.core.fold import fold, fold_all
from backfill.core.perf import paused_gc
from backfill.core.state import World
from backfill.sim.cluster import simulate
from bench.rows import best

trace = alibaba()
kept = []
sim = best(lambda: kept.append(simulate(trace, HEAVY)), 3)
log = [(p, e) for p, e, _ in kept[-1].events]
out = {"simulate_s": sim}
url = sys.argv[1] if len(sys.argv) > 1 else ""
if url:
    from backfill.core.events import encode
    records = [encode(e, k) for _, e, k in kept[-1].events]
kept.clear()

def batch():
    with paused_gc():
        fold_all(World(), log)

world, models, keys = fold_world(10_000)
pairs = list(enumerate(fold_events(models, keys, 200_000), world.position + 1))

def one():
    w = world
    with paused_gc():
        for i, e in pairs:
            w = fold(w, e, i)

out.update(fold_all_sim_log=len(log) / best(batch, 5), fold_10k=len(pairs) / best(one, 5))
if url:  # last, in a heap without the simulation (as a replaying process)
    import gc, os
    from backfill.store import drop_schema
    from bench.bench_core import _read_and_replay, _store_log
    n = len(log)
    del log, world, models, keys, pairs, trace
    gc.collect()
    schema = f"ab_core_{os.getpid()}"
    try:  # the scratch schema dropped however the probe ends
        engine, es = _store_log(url, schema, records)
        del records
        try:
            import sqlalchemy as sa
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text("VACUUM (ANALYZE) events, event_keys"))  # a log at rest (bench_core._settle; inline: older checkouts lack it)
            out["replay"] = n / _read_and_replay(es, 3)["replay"]
        finally:
            es.close()
            engine.dispose()
    finally:
        drop_schema(url, schema)
print(json.dumps(out))
"""


def probe(checkout: Path, database_url: str = "") -> dict[str, float]:
    """The figures of ``checkout`` (a directory holding ``backfill/``), measured in a fresh
    interpreter; with ``database_url`` the replay too. Raises RuntimeError with the end of the
    probe's stderr when it fails there."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    argv = [sys.executable, "-c", _PROBE] + ([database_url] if database_url else [])
    out = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True)
    if out.returncode != 0:  # say why (a trial: the message was the probe's source, its stderr dropped)
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"the probe failed in {checkout} (exit {out.returncode}):\n{tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the rounds, print a Markdown table (one row per checkout and
    round) and each figure's best per checkout. Returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.ab_core", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="+", type=Path, help="directories holding backfill/ (two or more)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every checkout once (default 3)")
    parser.add_argument("--replay", action="store_true", help="also the full replay of the simulation's log from PostgreSQL")
    parser.add_argument("--database-url", default=None, help="PostgreSQL for --replay (default: BACKFILL_DATABASE_URL, else the embedded server)")
    args = parser.parse_args(argv)
    if len(args.checkouts) < 2 or args.rounds < 1:
        parser.error("give two or more checkouts and --rounds >= 1")
    for c in args.checkouts:
        if not (c / "backfill").is_dir():
            parser.error(f"{c}: no backfill/ here")
    url = ""
    if args.replay:
        from backfill.settings import Settings
        from backfill.store import resolve_database_url

        url, _ = resolve_database_url(Settings(**({"database_url": args.database_url} if args.database_url else {})))
    results: dict[Path, list[dict[str, float]]] = {c: [] for c in args.checkouts}
    replay_head = " replay from PostgreSQL, simulation log |" if url else ""
    print(f"| checkout | round | simulate | fold_all, simulation log | fold, 10,000 ModelBackfills |{replay_head}")
    print("|---|---:|---:|---:|---:|" + ("---:|" if url else ""))
    for r in range(1, args.rounds + 1):
        for c in args.checkouts:
            f = probe(c.resolve(), url)
            results[c].append(f)
            replay = f" {f['replay']:,.0f} ev/s |" if url else ""
            print(f"| {c} | {r} | {f['simulate_s']:.2f} s | {f['fold_all_sim_log']:,.0f} ev/s | {f['fold_10k']:,.0f} ev/s |{replay}", flush=True)
    print()
    for c, fs in results.items():
        replay = f", replay {max(f['replay'] for f in fs):,.0f} ev/s" if url else ""
        print(
            f"best of {c}: simulate {min(f['simulate_s'] for f in fs):.2f} s, fold_all {max(f['fold_all_sim_log'] for f in fs):,.0f} ev/s, "
            f"fold 10k {max(f['fold_10k'] for f in fs):,.0f} ev/s{replay}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
