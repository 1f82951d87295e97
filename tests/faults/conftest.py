"""Fixtures of the fault-injection suite: a cluster of its own (audit log, one identity per
replica, may be paused), the controllable PostgreSQL (tests/conftest.py), and controllers run
as real subprocesses (:mod:`tests.faults.harness`)."""

from __future__ import annotations

import pytest

from tests.conftest import ENVTEST_CRD_PATHS, say, temporary_namespace

from .harness import ControllerProcess, JobPlayer, Kube

REPLICAS = ("replica-a", "replica-b")


@pytest.fixture(scope="session")
def fault_cluster(request: pytest.FixtureRequest):
    """A kube-apiserver + etcd for the fault tests only: it may be SIGSTOPped, writes an audit
    log of every mutating request, knows one bearer-token identity per replica, and serves
    watches from etcd (no watch cache)."""
    from tests.envtest.cluster import WRITES_AUDIT_POLICY, LocalCluster, ensure_binaries

    # --watch-cache=false: watches are served by etcd itself, so compacting etcd expires a
    # resourceVersion for real (410 Gone) instead of the watch cache replaying it.
    cluster = LocalCluster(
        ensure_binaries(), ["--watch-cache=false"], audit_policy=WRITES_AUDIT_POLICY, users=REPLICAS
    )
    try:
        cluster.start()
        cluster.apply_crds(ENVTEST_CRD_PATHS)
        say(request.config, f"faults: kube-apiserver (audit log, users {', '.join(REPLICAS)}) ready at {cluster.host}")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def fault_api(fault_cluster):
    fault_cluster.resume()  # a failed test may have left it paused
    api = fault_cluster.api_client()
    try:
        yield api
    finally:
        fault_cluster.resume()
        api.close()


@pytest.fixture
def fault_ns(fault_api):
    with temporary_namespace(fault_api, "f") as name:
        yield name


@pytest.fixture
def kube(fault_api, fault_ns) -> Kube:
    return Kube(fault_api, fault_ns)


@pytest.fixture
def player(kube) -> JobPlayer:
    return JobPlayer(kube)


@pytest.fixture
def controllers(fault_cluster, fault_ns, controlled_pg, tmp_path):
    """``controllers(identity="replica-a", server=None, **env) -> ControllerProcess`` (not
    started; ``server``: talk to the apiserver through e.g. a proxy) on the test namespace and the controllable PostgreSQL; every process is killed afterwards and its
    log tail printed when the test failed."""
    pg, schema = controlled_pg
    made: list[ControllerProcess] = []

    def make(identity: str = REPLICAS[0], server: str | None = None, **env: str) -> ControllerProcess:
        proc = ControllerProcess(
            kubeconfig=fault_cluster.kubeconfig_for(identity, server),
            database_url=pg.url,
            schema=schema,
            namespace=fault_ns,
            log_path=tmp_path / f"{identity}.log",
            identity=identity,
            env=dict(env),
        )
        made.append(proc)
        return proc

    make.pg, make.schema = pg, schema  # type: ignore[attr-defined]
    yield make
    for proc in made:
        proc.kill()
        print(proc.tail(25))


@pytest.fixture
def proxy(fault_cluster):
    """A pass-through TCP proxy in front of the fault apiserver (one replica can be cut off alone)."""
    from .proxy import TcpProxy

    p = TcpProxy("127.0.0.1", int(fault_cluster.host.rsplit(":", 1)[1])).start()
    try:
        yield p
    finally:
        p.stop()
