"""``python -m bench``: every figure of the project in one table, written to ``BENCHMARKS.md``.

Usage::

    python -m bench [--quick] [--only NAME[,NAME]] [--output PATH] [--database-url URL]

Groups, in the order they run (``--only`` takes these names):

- ``store``: :mod:`bench.bench_store`, EventStore.append vs a raw binary COPY of the same rows,
  the raw read rate, and the compiled decode path vs pydantic validation;
- ``fold``: :mod:`bench.bench_core`, fold in memory at 100, 1,000 and 10,000 ModelBackfills and
  the ratio 10k / 100 (flatness), one event at a time (``fold``) and in a batch (``fold_all``);
- ``simulate``: ``simulate`` of the whole Alibaba trace with ``--repeat-after 1m``;
- ``replay``: full replay from PostgreSQL (read + decode + fold) of that simulation's events, and of a log of foreground requests (the start-up scenario), vs
  the raw read of the same rows, and ``backfill replay``'s audit of them (every decision checked);
- ``latency``: :mod:`bench.bench_latency`, foreground demand -> Job DELETE, ours vs the floor,
  with PostgreSQL up and stopped, and the upstream poller;
- ``scale``: :mod:`bench.bench_scale`, 10,000 ModelBackfills on 1,000 Models with a 5-million-
  event log: cold start, idle CPU, resident memory, 1,000 admissions at once.

``--quick`` (a CI smoke run, under a minute) uses tiny sizes: a synthetic trace instead of the
Alibaba one, 16 Models in the latency run, 10 Models / 100 ModelBackfills / a 20,000-event log
and 3 s of idle in the scale run (the figures are then only a smoke signal), and ``latency`` and
``scale`` share one kube-apiserver (a full run starts one for each). Progress and each
benchmark's own tables go to stderr; the one table to stdout, and with the date, machine and
commit to ``--output``: by default ``BENCHMARKS.md`` at the repository root for a full-size run of
every group, nothing for ``--quick`` or ``--only`` (the file holds the latest whole table). The sections a
person added below the generated notes (measurements side by side, experiments) are kept.
Exit status 1 when a group failed (its row says so).
Nothing is asserted: a missed target is a ``NO`` in the table.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.rows import COLUMNS, Row, history, machine, markdown  # noqa: E402

GROUPS = ("store", "fold", "simulate", "replay", "latency", "scale")

QUICK = {
    "store_events": 2_000, "repeat": 1, "fold_events": 3_000, "replay_requests": 3_000,
    "latency": ["--models", "16", "--samples", "3", "--burst", "2", "--group", "1", "--gap", "0.1", "--workers", "8", "--pause", "1"],
    "scale": {"models": 10, "backfills": 100, "log_events": 20_000, "idle": 3.0, "workers": 8, "settle": 1.0},
}
FULL = {
    "store_events": 200_000, "repeat": 3, "fold_events": 200_000, "replay_requests": 1_000_000,
    "latency": [],
    "scale": {"models": 1000, "backfills": 10000, "log_events": 5_000_000, "idle": 60.0, "workers": 16, "admission_timeout": 240.0},
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run of every benchmark, well under a minute)")
    ap.add_argument("--only", default=None, help=f"comma-separated groups to run (of {', '.join(GROUPS)}; default all)")
    ap.add_argument(
        "--output", type=Path, default=None,
        help="where to write the table (default BENCHMARKS.md for a full-size run of every group; --quick or --only write none unless given)",
    )
    ap.add_argument("--database-url", default=None, help="PostgreSQL URL (default: BACKFILL_DATABASE_URL, else the embedded server)")
    args = ap.parse_args(argv)
    only = [g.strip() for g in (args.only or "").split(",") if g.strip()]
    bad = [g for g in only if g not in GROUPS]
    if bad:
        ap.error(f"--only: unknown group(s) {', '.join(bad)} (choose from {', '.join(GROUPS)})")
    if args.only is not None and not only:
        # a new user's trial: ``--only ,`` ran every group at full size and rewrote BENCHMARKS.md
        ap.error(f"--only: no group named (choose from {', '.join(GROUPS)}; leave --only out to run them all)")
    args.groups = [g for g in GROUPS if not only or g in only]
    if args.output is not None:
        # checked before the run, not after it (a trial: 12 minutes of results lost to a typo)
        parent = args.output.resolve().parent
        if not parent.is_dir() or not os.access(parent, os.W_OK) or args.output.is_dir():
            ap.error(f"--output: cannot write {args.output} (its directory must exist and be writable)")
    return args


class Terminated(BaseException):
    """SIGTERM arrived (``timeout``, a CI's kill): unwinds the run like Ctrl-C, so the child
    measuring a replay is stopped, the scratch schema dropped and the embedded PostgreSQL
    stopped (a trial: SIGTERM left the child and the server running). Not an ``Exception``: a
    group's failure handler does not catch it."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _terminated)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    err = Console(stderr=True, width=160)
    size = QUICK if args.quick else FULL
    rep = size["repeat"]
    started = time.monotonic()
    rows: list[Row] = []
    failed: list[str] = []
    state: dict[str, Any] = {}

    def url() -> str:
        if "url" not in state:
            from backfill.settings import Settings
            from backfill.store import resolve_database_url

            state["url"], _ = resolve_database_url(Settings(**({"database_url": args.database_url} if args.database_url else {})))
        return state["url"]

    def simulated() -> Any:
        if "sim" not in state:
            from bench import bench_core

            trace = bench_core.quick_trace() if args.quick else bench_core.alibaba()
            label = "synthetic trace (quick)" if args.quick else "whole Alibaba trace"
            state["sim_rows"], state["sim"] = bench_core.simulate_rows(trace, 1 if args.quick else 2, label)
        return state["sim"]

    def cluster() -> tuple[Any, Path | None]:
        """The kube-apiserver ``latency`` and ``scale`` share in a quick run (a full run gives each
        its own, so the latency run's 5,000 objects do not weigh on the scale run)."""
        if not args.quick:
            return None, None
        if "cluster" not in state:
            from bench import bench_scale

            audit_dir = Path(tempfile.mkdtemp(prefix="backfill-bench-"))
            state["audit_dir"] = audit_dir
            state["cluster"] = bench_scale.start_cluster(audit_dir)
        return state["cluster"], state["audit_dir"] / "audit.log"

    def g_store() -> list[Row]:
        from bench import bench_store

        return bench_store.rows(bench_store.measure(url(), size["store_events"], rep, err)) + [
            bench_store.restore_lock(url(), size["store_events"], rep)
        ]

    def g_fold() -> list[Row]:
        from bench import bench_core

        return bench_core.fold_rows(events=size["fold_events"], repeat=rep)

    def g_simulate() -> list[Row]:
        simulated()
        return state["sim_rows"]

    def g_replay() -> list[Row]:
        from bench import bench_core

        simulated()
        return bench_core.replay_rows(url(), state.pop("sim"), rep, schema=f"bench_core_{os.getpid()}", requests=size["replay_requests"])  # the only reference

    def g_latency() -> list[Row]:
        from bench import bench_latency

        bench_latency.console = Console(stderr=True, width=150)
        extra = ["--database-url", args.database_url] if args.database_url else []
        c, audit = cluster()
        return bench_latency.run(bench_latency.build_parser().parse_args(size["latency"] + extra), cluster=c, audit_log=audit)

    def g_scale() -> list[Row]:
        from bench import bench_scale

        c, audit = cluster()
        return bench_scale.run(**size["scale"], database_url=args.database_url, cluster=c, audit_path=audit)

    runners: dict[str, Callable[[], list[Row]]] = {
        "store": g_store, "fold": g_fold, "simulate": g_simulate, "replay": g_replay, "latency": g_latency, "scale": g_scale,
    }
    try:
        for g in args.groups:
            err.rule(f"bench: {g}")
            t = time.monotonic()
            try:
                got = runners[g]()
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - one failed group must not hide the others
                traceback.print_exc()
                failed.append(g)
                # Where it failed too (the innermost frame of the bench's own code), so that the
                # table alone says which step: a full run's "store: FAILED" on a statement timeout
                # did not say which statement.
                where = [f for f in traceback.extract_tb(exc.__traceback__) if "/bench/" in f.filename.replace("\\", "/")]
                at = f" (at {Path(where[-1].filename).name}:{where[-1].lineno}, {where[-1].name})" if where else ""
                got = [Row(f"{g}: FAILED", None, "s", note=f"{type(exc).__name__}: {exc}".splitlines()[0] + at)]
            rows += got
            err.print(f"[dim]bench: {g} done in {time.monotonic() - t:.1f} s[/dim]")
    finally:
        if "cluster" in state:
            state["cluster"].stop()
            import shutil

            shutil.rmtree(state["audit_dir"], ignore_errors=True)

    seconds = time.monotonic() - started
    info = machine()
    table = Table(title=f"modelbackfill benchmarks ({'quick' if args.quick else 'full'} sizes), {info['date']}")
    for c in COLUMNS:
        table.add_column(c, justify="left" if c in ("figure", "met") else "right")
    for r in rows:
        table.add_row(*r.cells())
    Console(width=170).print(table)
    print(f"machine: {info['cores']} cores ({info['cpu']}), {info['memory']}, Python {info['python']}, commit {info['commit']}; {seconds:.0f} s")
    notes = [f"groups run: {', '.join(args.groups)}"]
    whole = args.groups == list(GROUPS) and not args.quick
    output = args.output if args.output is not None else (ROOT / "BENCHMARKS.md" if whole else None)
    if output is None:
        print("BENCHMARKS.md not written: it holds the latest full-size run of every group (pass --output PATH to write this one)")
        return 1 if failed else 0
    previous = output.read_text() if output.exists() else ""
    command = "python -m bench" + (" --quick" if args.quick else "") + (f" --only {','.join(args.groups)}" if args.only is not None else "")
    output.write_text(markdown(rows, info, "quick" if args.quick else "full", seconds, notes, command) + history(previous))
    print(f"wrote {output}")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Terminated:
        print("bench: terminated (SIGTERM)", file=sys.stderr)
        sys.exit(143)
