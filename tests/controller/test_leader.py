"""Leader election on a coordination.k8s.io/v1 Lease, on the real API server."""

from __future__ import annotations

import pytest
from kubernetes import client

from backfill.controller.leader import LeaderElector

pytestmark = pytest.mark.kube


def _elector(api, ns: str, identity: str) -> LeaderElector:
    return LeaderElector(api, name="mbf-leader", namespace=ns, identity=identity, duration=15, renew=5)


def test_one_leader_then_handover_on_release(kube_api, kube_namespace):
    a, b = _elector(kube_api, kube_namespace, "a"), _elector(kube_api, kube_namespace, "b")
    assert a.try_acquire() is True and a.is_leader()
    assert b.try_acquire() is False and not b.is_leader()
    assert a.try_acquire() is True  # renew
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("mbf-leader", kube_namespace)
    assert lease.spec.holder_identity == "a" and lease.spec.lease_duration_seconds == 15
    a.stop(release=True)
    assert not a.is_leader()
    assert b.try_acquire() is True and b.is_leader()
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("mbf-leader", kube_namespace)
    assert lease.spec.holder_identity == "b" and lease.spec.lease_transitions == 1
