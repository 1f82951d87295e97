"""``backfill.controller.run`` wired end to end (leader election on), and ``backfill controller`` errors."""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request

import pytest

from backfill.cli import main
from backfill.settings import Settings

from .conftest import Kube, wait_for

pytestmark = pytest.mark.kube


@pytest.fixture(autouse=True)
def _thaw_the_heap():
    """``run`` freezes the start-up heap once synced (``gc.freeze``: the whole test process's
    here); thawed after each test, so later tests see the collector as a process starts it
    (``tests/core/test_perf_gc.py`` failed after a test here ran long enough to sync)."""
    import gc

    yield
    gc.unfreeze()


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except Exception as exc:  # noqa: BLE001
        return getattr(exc, "code", 0)


def _post(url: str, headers: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=b"{}", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def _gauges(port: int) -> dict[str, float]:
    """The leadership gauges of a /metrics scrape (``flexinfer_model_backfill_`` cut off)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("flexinfer_model_backfill_leader", "flexinfer_model_backfill_foreign_event_log"):
            out[name.removeprefix("flexinfer_model_backfill_")] = float(value)
    return out


def test_run_wires_leader_http_and_loop(kube_cluster, kube_api, kube_namespace, pg_schema, tmp_path):
    from backfill.controller import run
    from tests.envtest.cluster import free_port

    url, schema = pg_schema
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    settings = Settings(
        kubeconfig=kube_cluster.kubeconfig_path,
        namespace=kube_namespace,
        database_url=url,
        metrics_address=f"127.0.0.1:{port}",
        leader_elect=True,  # off by default (controller-runtime convention)
        lease_name="mbf-run",
        lease_namespace=kube_namespace,
        watch_timeout_seconds=5,
        ingest_token_file=token_file,
        event_partition_size=1000,  # a trial: run() built its own store and left the default (1,000,000)
    )
    stop = threading.Event()
    t = threading.Thread(target=run, args=(settings, schema), kwargs={"stop": stop, "configure_logging": False}, daemon=True)
    t.start()
    kube = Kube(kube_api, kube_namespace)
    try:
        wait_for(lambda: _get(f"http://127.0.0.1:{port}/readyz") == 200, timeout=15, what="/readyz 200")
        assert _get(f"http://127.0.0.1:{port}/healthz") == 200
        code, headers = _post(f"http://127.0.0.1:{port}/v1/foreground", {"Content-Type": "application/json"})
        assert code == 401 and headers.get("WWW-Authenticate", "").startswith("Bearer")
        kube.model("gemma")
        kube.backfill("wired", template="absent")
        st = wait_for(lambda: kube.status("wired").get("phase") == "Blocked" and kube.status("wired"), what="Blocked")
        assert st["reason"] == "TemplateNotFound"
        lease = kube_cluster.get_json(f"/apis/coordination.k8s.io/v1/namespaces/{kube_namespace}/leases/mbf-run")
        assert lease["spec"]["holderIdentity"]
        assert _gauges(port) == {"leader": 1.0, "foreign_event_log": 0.0}
        # Another log's replica takes the Lease (a replica on a separate store): this one stands
        # by, is not ready, and says so in a series an alert reads (ModelBackfillSplitEventLog).
        # A re-trial: the error line and /readyz were the only signals.
        from datetime import datetime, timezone

        from kubernetes import client

        from backfill.controller.leader import LOG_ANNOTATION

        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        client.CoordinationV1Api(kube_api).patch_namespaced_lease("mbf-run", kube_namespace, {
            "metadata": {"annotations": {LOG_ANNOTATION: "another-log"}},
            "spec": {"holderIdentity": "elsewhere", "acquireTime": now, "renewTime": now, "leaseDurationSeconds": 3600},
        })  # fmt: skip
        wait_for(lambda: _gauges(port) == {"leader": 0.0, "foreign_event_log": 1.0}, timeout=20, what="foreign_event_log 1")
        assert _get(f"http://127.0.0.1:{port}/readyz") == 503
    finally:
        stop.set()
        t.join(timeout=15)
    assert not t.is_alive()
    from backfill.store import make_engine
    from backfill.store.retention import list_partitions

    engine = make_engine(url, schema)
    try:
        fairy = engine.raw_connection()
        try:
            parts = list_partitions(fairy.driver_connection)
        finally:
            fairy.close()
    finally:
        engine.dispose()
    assert parts and all(p.hi - p.lo == 1000 for p in parts), parts  # BACKFILL_EVENT_PARTITION_SIZE applied


def test_a_stopping_leader_releases_the_lease_before_it_stops_its_threads(kube_cluster, kube_api, kube_namespace, pg_schema, monkeypatch):
    """A fault trial: SIGTERM with PostgreSQL hung stopped the preemptor at once, but the Lease
    was released only after the controller's threads were joined (5 s, the loop stuck in a
    read): the replica held the Lease and cancelled nothing, and a demand waited 4-5 s. The
    Lease is released first now (the replica cancels as the leader until then)."""
    from backfill.controller import run
    from backfill.controller.loop import Controller
    from tests.envtest.cluster import free_port

    url, schema = pg_schema
    port = free_port()
    seen: list = []
    stop_threads = Controller.stop

    def stop(self, *args, **kwargs):
        lease = kube_cluster.get_json(f"/apis/coordination.k8s.io/v1/namespaces/{kube_namespace}/leases/mbf-stop")
        seen.append(lease["spec"].get("holderIdentity"))
        return stop_threads(self, *args, **kwargs)

    monkeypatch.setattr(Controller, "stop", stop)
    settings = Settings(
        kubeconfig=kube_cluster.kubeconfig_path, namespace=kube_namespace, database_url=url,
        metrics_address=f"127.0.0.1:{port}", leader_elect=True, lease_name="mbf-stop", lease_namespace=kube_namespace,
        identity="stopping", watch_timeout_seconds=5,
    )  # fmt: skip
    stop_event = threading.Event()
    t = threading.Thread(target=run, args=(settings, schema), kwargs={"stop": stop_event, "configure_logging": False}, daemon=True)
    t.start()
    try:
        wait_for(lambda: _get(f"http://127.0.0.1:{port}/readyz") == 200, timeout=20, what="/readyz 200")
        wait_for(lambda: _gauges(port).get("leader") == 1.0, timeout=20, what="leading")
    finally:
        stop_event.set()
        t.join(timeout=20)
    assert not t.is_alive()
    assert seen == [None], seen  # released (no holder) when the threads' stop began


def test_controller_command_bad_settings(capsys, tmp_path):
    handlers = logging.getLogger().handlers[:]
    # the controller's lines are JSON log objects: the error is the msg of the only one
    assert main(["controller", "--kubeconfig", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and json.loads(err)["msg"] == f"backfill: error: kubeconfig {tmp_path / 'missing'} does not exist"
    for bad in ("nowhere", "127.0.0.1:99999", "127.0.0.1:-1", ":80x"):
        assert main(["controller", "--metrics-address", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        assert json.loads(err)["msg"] == f"backfill: error: settings: --metrics-address: {bad!r} is not host:port with a port from 0 to 65535"
    assert logging.getLogger().handlers == handlers  # the JSON handler is not left on the root logger


@pytest.mark.db
@pytest.mark.parametrize("case", ["empty token", "missing token", "address in use", "missing lease namespace"])
def test_a_setting_checked_without_the_database_fails_before_the_migration(case, kube_cluster, pg_url, tmp_path, monkeypatch, capsys):
    """A new user's trial: ``--lease-namespace nope``, an empty or missing ingest token file and
    an HTTP address in use were reported only after the migration, the refold and every
    watcher's start (10 lines, 2.5 s); the empty file's message named the file twice. Now one
    line, and the schema is not even created."""
    import secrets
    import socket

    import sqlalchemy as sa

    schema = f"t_{secrets.token_hex(6)}"
    token = tmp_path / "token"
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    for k in [k for k in __import__("os").environ if k.startswith("BACKFILL_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("BACKFILL_DATABASE_URL", pg_url)
    monkeypatch.setenv("BACKFILL_SCHEMA", schema)
    monkeypatch.setenv("BACKFILL_METRICS_ADDRESS", "127.0.0.1:0")
    args = ["controller", "--kubeconfig", kube_cluster.kubeconfig_path]
    if case == "empty token":
        token.write_text(" \n")
        monkeypatch.setenv("BACKFILL_INGEST_TOKEN_FILE", str(token))
        expected = f"ingest token file {token}: the file is empty"
    elif case == "missing token":
        monkeypatch.setenv("BACKFILL_INGEST_TOKEN_FILE", str(token))
        expected = f"ingest token file {token}: No such file or directory"
    elif case == "address in use":
        address = "127.0.0.1:%d" % busy.getsockname()[1]
        monkeypatch.setenv("BACKFILL_METRICS_ADDRESS", address)
        expected = f"HTTP server on {address}: [Errno 98] Address already in use"
    else:
        args += ["--leader-elect", "--lease-namespace", f"nope-{secrets.token_hex(3)}"]
        expected = f"leader election: the Lease namespace '{args[-1]}' does not exist"
    handlers = logging.getLogger().handlers[:]
    try:
        assert main(args) == 2
    finally:
        busy.close()
        logging.getLogger().handlers[:] = handlers
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]
    errors = [r["msg"] for r in records if r["msg"].startswith("backfill: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"backfill: error: {expected}"), records
    assert errors[0].count(str(token)) <= 1
    assert not [r for r in records if "migrated at start" in r["msg"] or "watch" in r["msg"]], records
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :s"), {"s": schema}).all()
    finally:
        engine.dispose()
    assert found == []  # no migration ran
