"""The ``backfill`` command: simulate, replay, runs, db upgrade/prune/shell/url, controller.

Bad arguments and unreadable inputs end with one line ``backfill: error: ...`` on stderr and
exit code 2; a replay that finds a divergent decision exits 1.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer
from typer._click import exceptions as click_exc  # typer >= 0.20 vendors its click
from rich.console import Console
from rich.table import Table

from .core.durations import DurationError, format_duration, parse_duration
from .core.timefmt import rfc3339
from .settings import Settings

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="modelbackfill: turn a warm model's idle time into bounded background Jobs.",
)
db_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Database schema management.")
app.add_typer(db_app, name="db")

# Wide enough for the simulate table when stdout is a pipe or file (rich would assume 80).
out = Console() if sys.stdout.isatty() else Console(width=200)
err = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=200)


class CLIError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def _seconds(text: str, what: str) -> float:
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise CLIError(f"{what}: {exc}") from None


def _time(text: str | None, what: str) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
        # a time without a zone is read as UTC (as trace times are)
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        raise CLIError(f"{what}: {text!r} is not an RFC 3339 time in range, such as 2024-11-15T00:00:00Z") from None


def _db_error(exc: BaseException) -> str:
    """The first line of a database/driver error, without SQLAlchemy's noise."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _store(database_url: str | None, schema: str, *, quiet: bool = False, probe: bool = False):
    """(url, engine) bound to ``schema`` (not migrated). The embedded server when no URL is set.

    Raises CLIError (one line) for a bad schema name, a malformed URL, an embedded server that
    cannot start or, with ``probe``, a server that does not answer.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from .store import make_engine, resolve_database_url, validate_schema

    try:
        validate_schema(schema)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    try:
        settings = Settings(**({"database_url": database_url} if database_url else {}))
        url, note = resolve_database_url(settings)
        engine = make_engine(url, schema)
    except (ValueError, SQLAlchemyError, OSError, RuntimeError) as exc:
        raise CLIError(f"database: {_db_error(exc)}") from None
    if note and not quiet:
        err.print(f"[dim]{note}[/dim]", highlight=False)
    if probe:
        try:
            with engine.connect():
                pass
        except Exception as exc:  # noqa: BLE001 - any driver error: one line
            raise CLIError(f"database: {_db_error(exc)}") from None
    return url, engine


DatabaseOpt = typer.Option(None, "--database-url", envvar="BACKFILL_DATABASE_URL", help="PostgreSQL URL; unset: the embedded server in .backfill/pg.")


# ----------------------------------------------------------------------------- simulate


class TraceFormat(str, Enum):
    alibaba_genai = "alibaba-genai"
    azure_llm = "azure-llm"
    csv = "csv"


@app.command()
def simulate(
    trace: Optional[Path] = typer.Option(None, "--trace", help="Foreground request trace; unset: the seeded synthetic workload."),
    fmt: TraceFormat = typer.Option(TraceFormat.csv, "--format", help="Trace format."),
    model: list[str] = typer.Option([], "--model", metavar="NAME", help="Only these models (repeatable)."),
    idle_for: str = typer.Option("30m", "--idle-for", help="spec.idleFor (Go duration)."),
    max_run: str = typer.Option("30m", "--max-run", help="spec.maxRunDuration (Go duration)."),
    repeat_after: str = typer.Option("24h", "--repeat-after", help="spec.repeatAfter (Go duration; 0 = one-shot)."),
    job: str = typer.Option("15m", "--job", help="How long the background work takes when undisturbed."),
    cancel_latency: str = typer.Option("0s", "--cancel-latency", help="From demand to the Job being gone (Go duration)."),
    seed: int = typer.Option(7, "--seed", help="Synthetic workload: random seed."),
    synthetic_models: int = typer.Option(4, "--synthetic-models", min=1, max=1000, help="Synthetic workload: models."),
    days: float = typer.Option(2.0, "--days", min=0.01, max=366, help="Synthetic workload: days."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a timeline PNG here."),
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("simulation", "--schema", help="PostgreSQL schema to (re)create for this run."),
    store: bool = typer.Option(True, "--store/--no-store", help="Write events and runs to the database."),
    as_json: bool = typer.Option(False, "--json", help="Print the per-model results as JSON."),
) -> None:
    """Drive the real projector through a simulated cluster over a foreground request trace."""
    from .sim.cluster import SimParams
    from .sim.cluster import simulate as run_sim
    from .sim.report import plot as draw, summarize, total
    from .sim.traces import TraceError, read_trace, synthetic

    params = SimParams(
        idle_for=_seconds(idle_for, "--idle-for"),
        max_run=_seconds(max_run, "--max-run"),
        repeat_after=_seconds(repeat_after, "--repeat-after"),
        job=_seconds(job, "--job"),
        cancel_latency=_seconds(cancel_latency, "--cancel-latency"),
    )
    if params.idle_for <= 0 or params.max_run <= 0 or params.job <= 0:
        raise CLIError("--idle-for, --max-run and --job must be greater than zero")
    if 0 < params.repeat_after < 60:
        raise CLIError("--repeat-after must be 0 (one-shot) or at least 1m (seed contract)")
    try:
        tr = read_trace(trace, fmt.value) if trace is not None else synthetic(seed, synthetic_models, days)
        tr = tr.filtered(model)
    except TraceError as exc:
        raise CLIError(str(exc)) from None
    if plot is not None:
        plot = _plot_path(plot)
    if store:
        _store(database_url, schema, probe=True)  # fail before simulating, not after
    from rich.progress import Progress

    t0 = time.perf_counter()
    with Progress(console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("simulating", total=tr.count)
        result = run_sim(tr, params, progress=lambda n: bar.advance(task, n))
    sim_seconds = time.perf_counter() - t0
    reports = summarize(tr, params, result)
    stored = ""
    if store:
        stored = _write_simulation(database_url, schema, result)
    if as_json:
        print(json.dumps([r.__dict__ | {"ratio": r.ratio} for r in reports + [total(reports)]], indent=2))
    else:
        _print_reports(tr, params, reports, total(reports))
    if plot is not None:
        try:
            n = draw(tr, result, plot)
        except (OSError, ValueError) as exc:
            raise CLIError(f"--plot {plot}: {getattr(exc, 'strerror', None) or exc}") from None
        more = f" (the {n} busiest of {len(tr.requests)})" if len(tr.requests) > n else ""
        err.print(f"timeline of {n} model(s){more} written to {plot}", highlight=False)
    err.print(
        f"simulated {tr.count} requests ({tr.skipped} rows without a model skipped), {len(result.events)} events, "
        f"{len(result.runs)} runs in {sim_seconds:.2f}s{stored}",
        highlight=False,
    )


_PLOT_FORMATS = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def _plot_path(plot: Path) -> Path:
    """Check a --plot target: a file name with a supported suffix in an existing directory."""
    if not str(plot) or str(plot) in (".", "..") or plot.is_dir():
        raise CLIError(f"--plot {str(plot)!r}: give a file name such as timeline.png")
    if plot.suffix.lower() not in _PLOT_FORMATS:
        raise CLIError(f"--plot {plot}: use one of {', '.join(_PLOT_FORMATS)}")
    if not plot.parent.is_dir():
        raise CLIError(f"--plot: directory {plot.parent} does not exist")
    return plot


def _write_simulation(database_url: str | None, schema: str, result: Any) -> str:
    """Recreate ``schema`` and store every simulated event and run row; one-line errors."""
    from sqlalchemy.exc import SQLAlchemyError

    from .core.events import encode
    from .store import EventStore, RunStore, make_engine, reset

    url, _ = _store(database_url, schema, quiet=True)
    t0 = time.perf_counter()
    try:
        reset(url, schema)
        engine = make_engine(url, schema)
        records = [encode(e, k) for _, e, k in result.events]
        es = EventStore(engine)
        positions = es.append(records)
        expected = [p for p, _, _ in result.events]
        if positions != expected:
            raise CLIError(f"schema {schema}: stored positions differ from the simulated ones; the run is incomplete")
        RunStore(engine).apply(result.runs, "runs", expected[-1] if expected else 0)
        es.close()
        engine.dispose()
    except (SQLAlchemyError, OSError) as exc:
        raise CLIError(f"schema {schema}: {_db_error(exc)} (the schema may hold a partial run)") from None
    return f"; stored in schema {schema!r} in {time.perf_counter() - t0:.2f}s (backfill replay --schema {schema})"


def _fmt_s(v: float) -> str:
    return f"{v:,.0f}"


def _print_reports(tr: Any, params: Any, reports: list, tot: Any) -> None:
    table = Table(
        title=(
            f"{tr.name}: idleFor {format_duration(params.idle_for)}, job {format_duration(params.job)}, "
            f"maxRun {format_duration(params.max_run)}, repeatAfter {format_duration(params.repeat_after)}, "
            f"cancel latency {format_duration(params.cancel_latency)}"
        )
    )
    cols = ["model", "requests", "idle windows", "attempts", "succeeded", "preempted", "deadline", "useful s", "wasted s", "overlap s", "bound jobs", "bound s", "ratio"]
    for c in cols:
        table.add_column(c, justify="left" if c == "model" else "right")
    for r in reports + [tot]:
        table.add_row(
            r.model, str(r.requests), str(r.idle_windows), str(r.attempts), str(r.succeeded), str(r.preempted),
            str(r.deadline_exceeded), _fmt_s(r.useful), _fmt_s(r.wasted), _fmt_s(r.overlap), str(r.bound_jobs),
            _fmt_s(r.bound_useful), f"{r.ratio:.3f}" if r.ratio is not None else "-",
            end_section=r is reports[-1],
        )
    out.print(table)


# ----------------------------------------------------------------------------- replay


@app.command()
def replay(
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema of the log."),
    backfill: Optional[str] = typer.Option(None, "--backfill", help="Only decisions of NAMESPACE/NAME."),
    since: Optional[str] = typer.Option(None, "--since", help="Only print decisions at or after this time (RFC 3339; no zone = UTC)."),
    until: Optional[str] = typer.Option(None, "--until", help="Only print decisions before this time (RFC 3339; no zone = UTC)."),
    limit: int = typer.Option(50, "--limit", min=0, help="Print the most recent N trail rows (0 = none)."),
) -> None:
    """Re-fold the log, print the decision trail, and fail on the first divergent decision.

    The whole log is always folded (state depends on everything before); --since/--until and
    --backfill only narrow what is printed and checked.
    """
    from .core.audit import WINDOW, Auditor
    from .core.events import EventDecodeError, decode_many
    from .store import EventStore

    key = None
    if backfill is not None:
        if backfill.count("/") != 1 or not all(backfill.split("/")):
            raise CLIError("--backfill must be NAMESPACE/NAME")
        key = tuple(backfill.split("/"))
    lo, hi = _time(since, "--since"), _time(until, "--until")
    _, engine = _store(database_url, schema)
    es = EventStore(engine)
    auditor = Auditor(backfill=key)  # type: ignore[arg-type]
    from .core.perf import paused_gc

    t0 = time.perf_counter()
    n = 0
    try:
        with paused_gc():
            for batch in es.read_payloads(0, batch_size=20000):
                try:
                    events = decode_many([(t, v, d) for _, t, v, d in batch])
                except EventDecodeError as exc:
                    raise CLIError(f"schema {schema}: {exc}") from None
                for row, e in zip(batch, events):
                    auditor.feed(row[0], e)
                n += len(batch)
    except Exception as exc:  # database errors: one line
        if isinstance(exc, CLIError):
            raise
        from sqlalchemy.exc import SQLAlchemyError
        import psycopg

        if isinstance(exc, (SQLAlchemyError, psycopg.Error)):
            raise CLIError(f"schema {schema}: {str(exc).splitlines()[0]}") from None
        raise
    finally:
        es.close()
    elapsed = time.perf_counter() - t0
    trail = [t for t in auditor.trail if (lo is None or t.at >= lo) and (hi is None or t.at < hi)]
    if limit:
        table = Table(title=f"decision trail ({len(trail)} admits/cancels; the most recent {min(limit, len(trail))})")
        for c in ("position", "at", "backfill", "decision", "reason", "cause", "cause event", "s after cause"):
            table.add_column(c)
        for t in trail[-limit:]:
            table.add_row(
                str(t.position), rfc3339(t.at) or "", f"{t.namespace}/{t.backfill}", t.decision, t.reason,
                str(t.cause or ""), t.cause_type or "", f"{t.latency_seconds:.3f}" if t.latency_seconds is not None else "",
            )
        out.print(table)
    rate = n / elapsed if elapsed > 0 else 0
    err.print(
        f"replayed {n} events in {elapsed:.2f}s ({rate:,.0f} events/s); checked {auditor.checked} decisions; "
        f"{len(auditor.unverifiable)} unverifiable (made on a state more than {WINDOW} events older than the decision)",
        highlight=False,
    )
    if auditor.divergences:
        d = auditor.divergences[0]
        err.print(
            f"backfill: divergence at position {d.position}: recorded {d.recorded}; the projector derives {d.derived} "
            f"({len(auditor.divergences)} divergent decision(s) in all)",
            highlight=False,
        )
        raise typer.Exit(1)
    out.print("no divergence")


# ----------------------------------------------------------------------------- runs


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


class ResultFilter(str, Enum):
    succeeded = "succeeded"
    failed = "failed"
    preempted = "preempted"
    deadline_exceeded = "deadline_exceeded"
    cancelled = "cancelled"
    running = "running"


@app.command()
def runs(
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema."),
    backfill: Optional[str] = typer.Option(None, "--backfill", help="NAMESPACE/NAME or NAME."),
    model: Optional[str] = typer.Option(None, "--model", help="Only runs of this model."),
    result: Optional[ResultFilter] = typer.Option(None, "--result", help="Only runs with this result (running = not ended yet)."),
    since: Optional[str] = typer.Option(None, "--since", help="Runs admitted at or after this time (RFC 3339; no zone = UTC)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the most recent N runs (printed oldest first)."),
    output: OutputFormat = typer.Option(OutputFormat.table, "--output", "-o"),
) -> None:
    """Run history (one row per Job attempt) with filters, as a table, CSV or JSON."""
    from .store import RunStore

    ns = name = None
    if backfill:
        ns, _, name = backfill.rpartition("/")
        ns = ns or None
    lo = _time(since, "--since")
    _, engine = _store(database_url, schema, quiet=output != OutputFormat.table)
    try:
        rows = RunStore(engine).query(namespace=ns, backfill=name, model=model, result=result.value if result else None, since=lo, limit=limit, newest=True)
    except Exception as exc:
        raise CLIError(f"schema {schema}: {str(exc).splitlines()[0]}") from None
    fields = [
        "namespace", "backfill", "model", "node", "attempt", "job_name", "job_uid", "generation", "admitted_at",
        "started_at", "ended_at", "result", "reason", "running_seconds", "deciding_position",
    ]
    def val(r: Any, f: str) -> Any:
        v = getattr(r, f)
        return rfc3339(v) if isinstance(v, datetime) else v
    if output == OutputFormat.json:
        print(json.dumps([{f: val(r, f) for f in fields} for r in rows], indent=2))
    elif output == OutputFormat.csv:
        w = csv.writer(sys.stdout)
        w.writerow(fields)
        for r in rows:
            w.writerow(["" if val(r, f) is None else val(r, f) for f in fields])
    else:
        table = Table(title=f"{len(rows)} run(s)")
        shown = ["backfill", "model", "attempt", "job_name", "admitted_at", "ended_at", "result", "reason", "running_seconds"]
        for c in shown:
            table.add_column(c)
        for r in rows:
            table.add_row(*[
                (f"{r.namespace}/{r.backfill}" if f == "backfill" else f"{r.running_seconds:,.0f}" if f == "running_seconds" else str(val(r, f) or ""))
                for f in shown
            ])
        out.print(table)


# ----------------------------------------------------------------------------- db


@db_app.command("upgrade")
def db_upgrade(
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema."),
    revision: str = typer.Option("head", "--revision"),
) -> None:
    """Apply the Alembic migrations (creates the schema if needed)."""
    from .store import current, upgrade

    url, _ = _store(database_url, schema)
    try:
        upgrade(url, schema, revision)
    except Exception as exc:
        raise CLIError(f"db upgrade: {str(exc).splitlines()[0]}") from None
    out.print(f"schema {schema} at revision {current(url, schema)}")


@db_app.command("prune")
def db_prune(
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema."),
    before: str = typer.Option(..., "--before", help="Drop only events recorded before this time (RFC 3339; no zone = UTC)."),
    export: Optional[Path] = typer.Option(None, "--export", help="Append the dropped events to this CSV file first (COPY format, header)."),
    snapshot: str = typer.Option("projector", "--snapshot", help="The snapshot that must cover a dropped partition."),
    code_version: Optional[str] = typer.Option(None, "--code-version", help="Its code version; default: that of the newest snapshot."),
) -> None:
    """Drop the oldest partitions of the event log that a snapshot covers (the runs table is kept).

    A partition goes only when all its events were recorded before --before, the snapshot and
    every checkpoint are at or past its last position, and it is not the one being written.
    Stops at the first partition that is not; says why in one line when nothing was dropped.
    """
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    from .store import make_engine
    from .store.retention import prune

    cut = _time(before, "--before")
    if export is not None and (export.is_dir() or not export.parent.is_dir()):
        raise CLIError(f"--export {export}: give a file in an existing directory")
    url, probe_engine = _store(database_url, schema, probe=True)
    probe_engine.dispose()
    settings = Settings(**({"database_url": database_url} if database_url else {}))
    engine = make_engine(url, schema, timeouts=False, poolclass=NullPool)  # an export may take long
    try:
        fairy = engine.raw_connection()
        try:
            conn = fairy.driver_connection
            conn.autocommit = True
            # DETACH waits for an ACCESS EXCLUSIVE lock: never queue in front of readers for long.
            conn.execute(f"SET lock_timeout = {round(settings.db_lock_timeout_seconds * 1000)}")
            version = code_version
            if version is None:
                row = conn.execute(
                    "SELECT code_version FROM snapshots WHERE name = %s ORDER BY position DESC, created_at DESC LIMIT 1", (snapshot,)
                ).fetchone()
                if row is None:
                    raise CLIError(f"nothing pruned: no snapshot {snapshot!r} in schema {schema}")
                version = row[0]
            result = prune(conn, cut, snapshot=snapshot, code_version=version, export=export)  # type: ignore[arg-type]
        finally:
            fairy.close()
    except (sa.exc.SQLAlchemyError, OSError) as exc:
        raise CLIError(f"db prune: {_db_error(exc)}") from None
    except Exception as exc:  # psycopg errors (lock timeout, missing tables): one line
        if isinstance(exc, CLIError):
            raise
        raise CLIError(f"db prune: {_db_error(exc)}") from None
    finally:
        engine.dispose()
    if not result.dropped:
        raise CLIError(f"nothing pruned: {result.stopped}")
    first, last = result.dropped[0].lo, result.dropped[-1].hi - 1
    exported = f", exported {result.exported:,} to {export}" if export is not None else ""
    out.print(
        f"dropped {len(result.dropped)} partition(s) of schema {schema}: {result.events:,} events, positions {first}-{last}"
        f"{exported} (snapshot {snapshot!r} of code version {version!r})",
        highlight=False,
        soft_wrap=True,
    )
    if result.stopped:
        out.print(f"kept the rest: {result.stopped}", highlight=False, soft_wrap=True)


# ----------------------------------------------------------------------------- controller


@app.command()
def controller(
    kubeconfig: Optional[Path] = typer.Option(None, "--kubeconfig", help="kubeconfig file; unset: in-cluster, else ~/.kube/config."),
    namespace: Optional[str] = typer.Option(None, "--namespace", help="Watch only this namespace; unset: all."),
    database_url: Optional[str] = DatabaseOpt,
    metrics_address: Optional[str] = typer.Option(None, "--metrics-address", help="host:port for /metrics, /healthz, /readyz."),
    lease_name: Optional[str] = typer.Option(None, "--lease-name", help="Leader-election Lease name."),
    lease_namespace: Optional[str] = typer.Option(None, "--lease-namespace", help="Leader-election Lease namespace."),
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema."),
) -> None:
    """Run the Kubernetes controller (settings from BACKFILL_* and these flags)."""
    from pydantic import ValidationError

    flags = dict(kubeconfig=kubeconfig, namespace=namespace, database_url=database_url, metrics_address=metrics_address,
                 lease_name=lease_name, lease_namespace=lease_namespace)
    try:
        settings = Settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        e = exc.errors()[0]
        raise CLIError(f"settings: {'.'.join(str(x) for x in e['loc'])}: {e['msg']}") from None
    host, sep, port = settings.metrics_address.rpartition(":")
    if not sep or not port.isdigit():
        raise CLIError(f"--metrics-address {settings.metrics_address!r} is not host:port")
    from .controller import run
    from .controller.kube import KubeConfigError, api_client
    from .store import upgrade

    try:
        api_client(settings).close()
    except KubeConfigError as exc:
        raise CLIError(str(exc)) from None
    url, _ = _store(settings.database_url, schema)
    try:
        upgrade(url, schema)
    except Exception as exc:
        raise CLIError(f"db upgrade: {str(exc).splitlines()[0]}") from None
    from .controller import ControllerConfigError

    try:
        run(settings.model_copy(update={"database_url": url}), schema=schema)
    except (ControllerConfigError, KubeConfigError) as exc:
        raise CLIError(str(exc)) from None


def _libpq_url(url: str) -> str:
    """The SQLAlchemy URL as a libpq one (``postgresql://``) for psql."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@db_app.command("shell")
def db_shell(
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema (the search_path)."),
) -> None:
    """Open psql on the database with the schema as search_path (keeps the embedded server up meanwhile)."""
    import os
    import shutil
    import subprocess

    if shutil.which("psql") is None:
        raise CLIError("psql is not installed (Debian: apt-get install postgresql-client)")
    url, _ = _store(database_url, schema, probe=True)
    env = dict(os.environ, PGOPTIONS=f"-c search_path={schema}")
    raise typer.Exit(subprocess.run(["psql", _libpq_url(url)], env=env).returncode)


@db_app.command("url")
def db_url(
    database_url: Optional[str] = DatabaseOpt,
) -> None:
    """Print the database URL in libpq form (for psql and other tools).

    The embedded server stops when the last backfill process using it exits: use
    `backfill db shell` for it, or keep another backfill command running.
    """
    url, _ = _store(database_url, "backfill", quiet=True)
    print(_libpq_url(url))


# ----------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. Returns the exit code (0 ok, 1 divergence/failure, 2 usage)."""
    try:
        rv = app(args=argv, prog_name="backfill", standalone_mode=False)
    except CLIError as exc:
        err.print(f"backfill: error: {exc}", highlight=False, soft_wrap=True)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except click_exc.NoArgsIsHelpError as exc:
        err.print(exc.ctx.get_help() if exc.ctx else str(exc), highlight=False)
        return 2
    except click_exc.ClickException as exc:
        err.print(f"backfill: error: {exc.format_message()}", highlight=False, soft_wrap=True)
        return 2
    except typer.Abort:
        err.print("backfill: aborted", highlight=False)
        return 130
    return rv if isinstance(rv, int) else 0  # non-standalone click returns an Exit's code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
