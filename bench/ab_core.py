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
read + decode + ``fold_all``, as the bench's replay row: the log stored and vacuumed by the
probe, then read and folded by a second fresh interpreter of the same checkout, as ``backfill
replay`` runs; ``--database-url``, else
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
if url:  # store the log for the replay probe (run next, in a fresh interpreter)
    from bench.bench_core import _store_log
    engine, es = _store_log(url, sys.argv[2], records)
    try:
        import sqlalchemy as sa
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM (ANALYZE) events, event_keys"))  # a log at rest (bench_core._settle; inline: older checkouts lack it)
    finally:
        es.close()
        engine.dispose()
    out["stored"] = len(records)
print(json.dumps(out))
"""

#: The replay of the log the probe stored, in a fresh interpreter of the same checkout (as the
#: bench's replay row and ``backfill replay``): ``argv`` = URL, schema, events; one JSON line.
_REPLAY_PROBE = r"""
import json, sys
from backfill.store import EventStore, make_engine
from bench.bench_core import _read_and_replay
engine = make_engine(sys.argv[1], sys.argv[2])
es = EventStore(engine)
try:
    print(json.dumps({"replay": int(sys.argv[3]) / _read_and_replay(es, 3)["replay"]}))
finally:
    es.close()
    engine.dispose()
"""


def probe(checkout: Path, database_url: str = "") -> dict[str, float]:
    """The figures of ``checkout`` (a directory holding ``backfill/``), measured in a fresh
    interpreter; with ``database_url`` the replay too. Raises RuntimeError with the end of the
    probe's stderr when it fails there."""
    if not database_url:
        return _run(checkout, _PROBE)
    from backfill.store import drop_schema

    schema = f"ab_core_{os.getpid()}"
    try:  # the scratch schema dropped however the probes end
        out = _run(checkout, _PROBE, database_url, schema)
        out.update(_run(checkout, _REPLAY_PROBE, database_url, schema, str(int(out.pop("stored")))))
        return out
    finally:
        drop_schema(database_url, schema)


def _run(checkout: Path, script: str, *args: str) -> dict[str, float]:
    """``script`` in a fresh interpreter with ``checkout`` first on its path; its last line of
    output as JSON. Raises RuntimeError with the end of its stderr when it fails."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    out = subprocess.run([sys.executable, "-c", script, *args], cwd=checkout, env=env, capture_output=True, text=True)
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
