"""The README's local command, ``backfill controller --kubeconfig KC``, as a subprocess on the test
API server: with nothing created by hand but a Model, a CronJob and a ModelBackfill in a fresh
namespace it reconciles the ModelBackfill (leader election is off unless asked for); with
``--leader-elect`` and a missing Lease namespace it stops with one line naming the fix; with
``--leader-elect`` it holds the Lease and a SIGTERM releases it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.controller.conftest import Kube, wait_for
from tests.envtest.cluster import free_port

pytestmark = [pytest.mark.kube, pytest.mark.db]

BACKFILL = str(Path(sys.executable).parent / "backfill")
PHASES = {"WaitingForIdle", "Starting", "Running", "Cancelling", "Succeeded", "Failed", "Suspended", "Blocked"}
GRACE_SECONDS = 30  # deploy/base/deployment.yaml terminationGracePeriodSeconds


@pytest.fixture
def schema(pg_url):
    from backfill.store.migrate import drop_schema

    name = f"t_{secrets.token_hex(6)}"
    yield name
    drop_schema(pg_url, name)


def _env(pg_url: str, schema: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")}
    env.update(
        BACKFILL_DATABASE_URL=pg_url,
        BACKFILL_SCHEMA=schema,
        BACKFILL_METRICS_ADDRESS=f"127.0.0.1:{free_port()}",
        **extra,
    )
    return env


def _declare(kube_api, ns: str) -> Kube:
    kube = Kube(kube_api, ns)
    # a node of its own: the controller watches every namespace, and other tests' GPULeases and
    # GamingSessions on the shared node names would hold this one (correctly) too
    kube.model("gemma", node=f"node-{secrets.token_hex(4)}")
    kube.cronjob("model-eval-gauntlet")
    kube.backfill("mbf", idleFor="1h")
    return kube


def _stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"not stopped within terminationGracePeriodSeconds ({GRACE_SECONDS}s):\n{err[-3000:]}")
    return proc.returncode, err


def _stderr_until(proc: subprocess.Popen, marker: str, timeout: float = 90) -> list[str]:
    """The controller's stderr lines up to and including the first that contains ``marker``.
    Read on a thread: ``readline`` blocks while the controller is quiet, so a deadline checked
    between reads never fires. Returns early (without the marker) when the process closes
    stderr; raises AssertionError when the marker has not come within ``timeout`` seconds."""
    import threading

    lines: list[str] = []

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if marker in line:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_for(lambda: not reader.is_alive(), timeout=timeout, interval=0.05, what=f"a stderr line with {marker!r}")
    return lines


def test_readme_command_reconciles_without_any_namespace_or_lease(kube_cluster, kube_api, kube_namespace, pg_url, schema):
    kube = _declare(kube_api, kube_namespace)
    identity = f"readme-{secrets.token_hex(3)}"
    proc = subprocess.Popen(
        [BACKFILL, "controller", "--kubeconfig", kube_cluster.kubeconfig_path],
        env=_env(pg_url, schema, BACKFILL_IDENTITY=identity), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        status = wait_for(
            lambda: proc.poll() is None and kube.status("mbf").get("phase") and kube.status("mbf"),
            timeout=90, interval=0.2, what="the ModelBackfill gets a status phase",
        )
    finally:
        rc, err = _stop(proc)
    assert status["phase"] in PHASES
    assert status["phase"] == "WaitingForIdle" and status["reason"] == "IdleWindow", status  # idleFor 1h
    assert rc == 0, err[-3000:]
    leases = client.CoordinationV1Api(kube_api).list_lease_for_all_namespaces().items
    assert not [le for le in leases if (le.spec.holder_identity or "") == identity], "leader election is off by default"


def test_leader_elect_with_a_missing_lease_namespace_is_one_line_with_the_fix(kube_cluster, pg_url, schema):
    missing = f"no-such-ns-{secrets.token_hex(3)}"
    proc = subprocess.run(
        [BACKFILL, "controller", "--kubeconfig", kube_cluster.kubeconfig_path, "--leader-elect"],
        env=_env(pg_url, schema, BACKFILL_LEASE_NAMESPACE=missing), capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stderr.splitlines() if line.strip()]  # every line is JSON
    errors = [r["msg"] for r in records if r["msg"].startswith("backfill: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert f"'{missing}' does not exist" in errors[0] and f"kubectl create namespace {missing}" in errors[0]
    assert "--lease-namespace" in errors[0]


def test_leader_elect_env_holds_the_lease_and_sigterm_releases_it(kube_cluster, kube_api, kube_namespace, pg_url, schema):
    kube = _declare(kube_api, kube_namespace)
    identity = f"le-{secrets.token_hex(3)}"
    coord = client.CoordinationV1Api(kube_api)

    def holder() -> str | None:
        try:
            return coord.read_namespaced_lease("modelbackfill-controller", kube_namespace).spec.holder_identity
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    proc = subprocess.Popen(
        [BACKFILL, "controller", "--kubeconfig", kube_cluster.kubeconfig_path],
        env=_env(pg_url, schema, BACKFILL_LEADER_ELECT="true", BACKFILL_LEASE_NAMESPACE=kube_namespace,
                 BACKFILL_IDENTITY=identity),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: proc.poll() is None and holder() == identity, timeout=60, interval=0.2, what="the Lease is held")
        wait_for(lambda: kube.status("mbf").get("phase"), timeout=60, interval=0.2, what="a status phase")
    finally:
        rc, err = _stop(proc)
    assert rc == 0, err[-3000:]
    assert not holder(), "a graceful stop releases the Lease"
    # It stands for leadership only once it can act (fault breaker: a replica that took the Lease
    # while refolding its log cancelled nothing until the refold ended).
    msgs = [json.loads(line).get("msg", "") for line in err.splitlines() if line.startswith("{")]
    folded = next(i for i, m in enumerate(msgs) if m.startswith("folded the log up to position"))
    acquired = next(i for i, m in enumerate(msgs) if m.startswith("acquired leader lease"))
    assert folded < acquired, f"the Lease was acquired before the log was folded: {msgs[:acquired + 1]}"


def test_every_line_the_controller_writes_is_one_json_object(kube_cluster):
    """The first stderr line ("using the embedded PostgreSQL server ...") was plain text while
    the rest of the log was JSON. On the embedded server (the README's local try-out), from the
    first line to the last after SIGTERM."""
    import shutil
    import tempfile

    # not under pytest's basetemp (see tests/conftest.py: pgserver needs a directory it can open up)
    data = Path(tempfile.mkdtemp(prefix="backfill-test-embedded-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")}
    env.update(BACKFILL_DATA_DIR=str(data), BACKFILL_METRICS_ADDRESS=f"127.0.0.1:{free_port()}")
    proc = subprocess.Popen(
        [BACKFILL, "controller", "--kubeconfig", kube_cluster.kubeconfig_path],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=data,
    )
    try:
        lines = _stderr_until(proc, '"controller started')
        assert proc.poll() is None, "".join(lines)[-3000:]
    finally:
        rc, rest = _stop(proc)
        shutil.rmtree(data, ignore_errors=True)
    lines = [line for line in "".join(lines).splitlines() + rest.splitlines() if line.strip()]
    assert rc == 0, "\n".join(lines)[-3000:]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON object: {line!r}") from None
    assert all(isinstance(r, dict) and {"time", "level", "msg", "logger"} <= set(r) for r in records), records
    assert records[0]["msg"].startswith("using the embedded PostgreSQL server with its data in "), records[0]
    assert any(r["msg"].startswith("database schema backfill at revision ") for r in records), records
    assert records[-1]["msg"] == "controller stopped", records[-1]


@pytest.mark.parametrize("renewed_ago, warned", [(0, True), (120, False)])
def test_without_leader_election_a_lease_held_by_another_controller_is_a_warning(
    kube_cluster, kube_api, kube_namespace, pg_url, schema, renewed_ago, warned
):
    """A new user's trial: a controller started without ``--leader-elect`` beside a replica that
    holds the Lease acted with no word that another controller leads. The Lease is written here
    as client-go writes it: held by ``other`` for 60 s, renewed now (warned) or 120 s ago (expired:
    nothing to say)."""
    from datetime import datetime, timedelta, timezone

    renewed = (datetime.now(timezone.utc) - timedelta(seconds=renewed_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    other = f"other-{secrets.token_hex(3)}"
    client.CoordinationV1Api(kube_api).create_namespaced_lease(kube_namespace, {
        "metadata": {"name": "modelbackfill-controller"},
        "spec": {"holderIdentity": other, "leaseDurationSeconds": 60, "acquireTime": renewed, "renewTime": renewed},
    })
    proc = subprocess.Popen(
        [BACKFILL, "controller", "--kubeconfig", kube_cluster.kubeconfig_path],
        env=_env(pg_url, schema, BACKFILL_LEASE_NAMESPACE=kube_namespace), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        lines = _stderr_until(proc, '"controller started')
        assert proc.poll() is None, "".join(lines)[-3000:]
    finally:
        rc, rest = _stop(proc)
    assert rc == 0, rest[-3000:]
    msgs = [json.loads(line)["msg"] for line in "".join(lines).splitlines() + rest.splitlines() if line.startswith("{")]
    warnings = [m for m in msgs if m.startswith("leader election is off, but ")]
    if warned:
        assert warnings == [
            f"leader election is off, but {other} holds the leader Lease {kube_namespace}/modelbackfill-controller: "
            "another controller is running, and both will admit and cancel backfill Jobs; stop one, or run this one "
            "with --leader-elect"
        ], msgs
    else:
        assert warnings == [], msgs


def test_the_start_up_heap_is_frozen_once_the_watchers_synced(kube_cluster, kube_api, kube_namespace, pg_url, schema):
    """Full collections traversed the whole start-up heap (the imported client models and
    schemas) while holding the interpreter lock: 85-155 ms stalls of the cancel path, measured by
    ``bench/bench_latency.py``. ``backfill controller`` freezes it once its watchers synced, after
    "controller started", and says how many objects (the interpreter's count)."""
    _declare(kube_api, kube_namespace)
    proc = subprocess.Popen(
        [BACKFILL, "controller", "--kubeconfig", kube_cluster.kubeconfig_path],
        env=_env(pg_url, schema), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        lines = _stderr_until(proc, "start-up heap frozen", timeout=60)
    finally:
        rc, rest = _stop(proc)
    records = [json.loads(line) for line in lines if line.strip()]
    msgs = [r["msg"] for r in records]
    frozen = [m for m in msgs if m.startswith("start-up heap frozen: ")]
    assert len(frozen) == 1, msgs + rest.splitlines()[-20:]
    assert msgs.index(frozen[0]) > next(i for i, m in enumerate(msgs) if m.startswith("controller started"))
    assert int(frozen[0].split()[3]) > 50_000, frozen  # the kubernetes client's models alone are more
    assert "start-up heap frozen" not in rest  # once
    assert rc == 0, rest[-3000:]
