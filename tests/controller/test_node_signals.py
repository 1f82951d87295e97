"""Node-level signals from another namespace gate a namespaced controller's Models (real apiserver).

cluster-contract: a GamingSession is "gaming intent for that node"; a GPULease "blocks backfill
on its node, and on every model whose spec.gpu.shared equals its group". Neither says "in the
same namespace": a session or lease created in any namespace for the node (or shared group) of
one of our Models cancels our running Job on that node and keeps our waiting declarations from
admission while it holds, even when the controller watches one namespace only
(``settings.namespace``, the deploy/overlays/namespaced overlay). Found by fault injection: a
GamingSession in another namespace left the Job Running.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client

from backfill.core import events as ev
from backfill.core.events import decode_many

from ..conftest import temporary_namespace
from .conftest import GROUP, VERSION, drop_node_signals, now_s, ts, wait_for

pytestmark = pytest.mark.kube


@pytest.fixture
def other_namespace(kube_api):
    """A second namespace, not the controller's; its sessions and leases are deleted after."""
    with temporary_namespace(kube_api, before_delete=lambda name: drop_node_signals(kube_api, name)) as name:
        yield name


def _jobs_of(kube, name: str) -> list:
    return [j for j in kube.jobs() if j.metadata.labels.get("modelbackfill.ai.flexinfer/name") == name]


def _cancels(c, name: str) -> list[tuple[int, str]]:
    rows = list(c.events.read(0))
    return [
        (e.attempt, e.reason)
        for e in decode_many([(r.type, r.version, r.data) for r in rows])
        if isinstance(e, ev.AttemptCancelled) and e.backfill == name
    ]


def _waiting(kube, name: str, reason: str) -> dict:
    return wait_for(
        lambda: (st := kube.status(name)).get("phase") == "WaitingForIdle" and st.get("reason") == reason and st,
        timeout=10,
        what=f"{name}: WaitingForIdle/{reason}",
    )


# (plural, kind, spec builder (node, group) -> spec, the reason it gives)
SIGNALS: dict[str, tuple[str, str, Any, str]] = {
    "gaming session on the node": (
        "gamingsessions", "GamingSession", lambda node, group: {"nodeName": node, "mode": "gaming", "owner": "player"},
        "GamingIntent",
    ),
    "GPU lease on the node": (
        "gpuleases", "GPULease",
        lambda node, group: {"node": node, "owner": "trainer", "priority": 10, "expiresAt": ts(now_s() + timedelta(hours=1))},
        "GPULeaseActive",
    ),
    "GPU lease on the shared group": (
        "gpuleases", "GPULease", lambda node, group: {"group": group, "node": f"{node}-elsewhere", "owner": "trainer"},
        "GPULeaseActive",
    ),
}


def _cancels_and_gates(kube, start_controller, other_namespace: str, signal: str) -> None:
    """A namespaced controller's running Job on the node is cancelled by ``signal`` created in
    ``other_namespace``, a declaration waiting on the node is not admitted while it holds, and
    the node is free again once it is gone."""
    plural, kind, spec_of, reason = SIGNALS[signal]
    # A node and group of this test's own: the controller under test watches these kinds in
    # every namespace, so another test's objects on a shared node name must not count here.
    node, group = f"node-{secrets.token_hex(4)}", f"pool-{secrets.token_hex(4)}"
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node=node, shared=group)
    kube.model("llama", node=node, shared=group)
    c = start_controller()  # namespaced: settings.namespace = kube.ns
    assert c.settings.namespace == kube.ns != other_namespace
    kube.backfill("running", model="gemma", idleFor="1s")
    job = wait_for(lambda: _jobs_of(kube, "running"), timeout=10, what="running: Job created")[0]
    kube.run_job(job.metadata.name)
    wait_for(lambda: kube.status("running").get("phase") == "Running", what="running: phase Running")

    # The signal, in a namespace the controller does not own, for our Model's node (or group).
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": "hold"}, "spec": spec_of(node, group)}
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, other_namespace, plural, body)
    wait_for(lambda: kube.job(job.metadata.name) is None, timeout=10, what="the running Job cancelled")
    st = _waiting(kube, "running", reason)
    assert st["attempts"] == 1 and not st.get("jobName")
    wait_for(lambda: _cancels(c, "running"), timeout=5, what="the cancel decision in the log")
    assert _cancels(c, "running") == [(1, reason)]

    # While it holds: a declaration waiting on the same node is not admitted (idleFor 1s is long
    # past), and neither is the cancelled one again.
    kube.backfill("waiting", model="llama", idleFor="1s")
    st = _waiting(kube, "waiting", reason)
    assert st.get("attempts", 0) == 0
    with pytest.raises(AssertionError):
        wait_for(kube.jobs, timeout=3.0, what="no Job while the signal holds")
    assert kube.status("waiting")["reason"] == kube.status("running")["reason"] == reason

    # The positive control: once the signal is gone, the node is free again (one Job at a time).
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, other_namespace, plural, "hold")
    admitted = wait_for(kube.jobs, timeout=15, what="a Job once the signal is gone")
    assert len(admitted) == 1


@pytest.mark.parametrize("signal", sorted(SIGNALS))
def test_a_signal_in_another_namespace_cancels_and_gates_a_namespaced_controller(
    kube, start_controller, other_namespace, signal
):
    _cancels_and_gates(kube, start_controller, other_namespace, signal)


@pytest.fixture
def as_namespaced_overlay(kube_api, kube_cluster, kube_namespace, monkeypatch):
    """The controllers started by ``start_controller`` talk to the apiserver as the namespaced
    overlay's ServiceAccount (impersonated), under the overlay's RBAC (kustomize build of
    deploy/overlays/namespaced, watching and running in the test's namespace): what the
    deployment grants must be enough for the node signals of another namespace."""
    from ..ship.test_rbac import DEPLOY, apply_rbac, delete_cluster_scoped

    ns = kube_namespace
    objects = apply_rbac(kube_api, DEPLOY / "overlays/namespaced", {"flexinfer-system": ns, "ml-models": ns})
    user = f"system:serviceaccount:{ns}:modelbackfill-controller"
    admin_client = kube_cluster.api_client

    def impersonating() -> client.ApiClient:
        api = admin_client()
        api.set_default_header("Impersonate-User", user)
        return api

    monkeypatch.setattr(kube_cluster, "api_client", impersonating)
    try:
        yield user
    finally:
        monkeypatch.undo()
        delete_cluster_scoped(kube_api, objects)


@pytest.mark.parametrize("signal", ["gaming session on the node", "GPU lease on the shared group"])
def test_the_namespaced_overlays_rbac_lets_the_controller_see_another_namespaces_signals(
    as_namespaced_overlay, kube, start_controller, other_namespace, signal
):
    _cancels_and_gates(kube, start_controller, other_namespace, signal)
