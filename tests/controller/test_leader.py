"""Leader election on a coordination.k8s.io/v1 Lease, on the real API server."""

from __future__ import annotations

import pytest
from kubernetes import client

from backfill.controller.leader import LeaderElector

pytestmark = pytest.mark.kube


def _elector(api, ns: str, identity: str) -> LeaderElector:
    return LeaderElector(api, name="mbf-leader", namespace=ns, identity=identity, duration=15, renew=5)


def test_a_leader_stops_acting_before_its_lease_lapses(kube_api, kube_namespace):
    """A new user's trial: with a lease (1 s) shorter than the renew period (5 s), the leader
    acted for 5 s after each renew while a standby took the lapsed Lease after 1 s: two leaders.
    The leader's own deadline now never passes the Lease: ``duration - renew`` after the start of
    its renew (none at all here; Settings refuses such timing), 2 s for a 3 s lease renewed every
    second."""
    import time

    short = LeaderElector(kube_api, name="short", namespace=kube_namespace, identity="a", duration=1, renew=5)
    assert short.try_acquire() is True
    assert not short.is_leader()
    t0 = time.monotonic()
    a = LeaderElector(kube_api, name="tight", namespace=kube_namespace, identity="a", duration=3, renew=1)
    b = LeaderElector(kube_api, name="tight", namespace=kube_namespace, identity="b", duration=3, renew=1)
    assert a.try_acquire() is True and a.is_leader()
    time.sleep(max(0.0, t0 + 2.05 - time.monotonic()))
    assert not a.is_leader()  # 2 s after the renew started: done, a second before the Lease lapses
    time.sleep(1.2)
    assert b.try_acquire() is True and b.is_leader() and not a.is_leader()


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


def test_a_standby_says_who_leads_once_and_a_leader_says_when_it_lost_the_lease(kube_api, kube_namespace, caplog):
    """A standby logged nothing at all (a new user running two replicas could not tell that the
    second one waits, nor for whom), and a leader whose Lease another candidate took over did not
    say it had lost it."""
    import logging
    from datetime import datetime, timedelta, timezone

    caplog.set_level(logging.INFO, logger="backfill.controller.leader")
    a, b = _elector(kube_api, kube_namespace, "a"), _elector(kube_api, kube_namespace, "b")
    assert a.try_acquire() is True
    assert b.try_acquire() is False and b.try_acquire() is False
    standby = [r.getMessage() for r in caplog.records if r.getMessage().startswith("standing by")]
    assert standby == [f"standing by: leader lease {kube_namespace}/mbf-leader is held by a"]
    # b takes the Lease over as if a had not renewed for a whole lease duration (b's clock is ahead)
    b.clock = lambda: datetime.now(timezone.utc) + timedelta(seconds=16)
    assert b.try_acquire() is True
    caplog.clear()
    assert a.try_acquire() is False and not a.is_leader()
    assert a.try_acquire() is False
    lost = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lost == [("WARNING", f"lost leader lease {kube_namespace}/mbf-leader: it is held by b now")]
