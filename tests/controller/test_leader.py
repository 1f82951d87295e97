"""Leader election on a coordination.k8s.io/v1 Lease, on the real API server."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone

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
    short = LeaderElector(kube_api, name="short", namespace=kube_namespace, identity="a", duration=1, renew=5)
    assert short.try_acquire() is True
    assert not short.is_leader()
    t0 = time.monotonic()
    a = LeaderElector(kube_api, name="tight", namespace=kube_namespace, identity="a", duration=3, renew=1)
    b = LeaderElector(kube_api, name="tight", namespace=kube_namespace, identity="b", duration=3, renew=1)
    assert a.try_acquire() is True and a.is_leader()
    assert b.try_acquire() is False  # b sees a's record from here on
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
    caplog.set_level(logging.INFO, logger="backfill.controller.leader")
    a, b = _elector(kube_api, kube_namespace, "a"), _elector(kube_api, kube_namespace, "b")
    assert a.try_acquire() is True
    assert b.try_acquire() is False and b.try_acquire() is False
    standby = [r.getMessage() for r in caplog.records if r.getMessage().startswith("standing by")]
    assert standby == [
        f"standing by: leader lease {kube_namespace}/mbf-leader is held by a (taken over once its record has stayed unchanged for 15 s)"
    ]
    # b takes the Lease over as if it had seen a's record unchanged for a whole lease duration
    b.monotonic = lambda: time.monotonic() + 16
    assert b.try_acquire() is True
    caplog.clear()
    assert a.try_acquire() is False and not a.is_leader()
    assert a.try_acquire() is False
    lost = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lost == [("WARNING", f"lost leader lease {kube_namespace}/mbf-leader: it is held by b now")]


def test_a_standby_whose_clock_runs_ahead_never_takes_a_renewed_lease(kube_api, kube_namespace):
    """helper-19's trial: a standby compared the leader's ``renewTime`` with its own wall clock,
    so one whose clock ran 2.5-4 s ahead (here 60 s) took the Lease over while the leader renewed
    and acted. Now it goes by when it saw the record change (client-go's observedTime)."""
    a = LeaderElector(kube_api, name="skew", namespace=kube_namespace, identity="a", duration=3, renew=1)
    b = LeaderElector(kube_api, name="skew", namespace=kube_namespace, identity="b", duration=3, renew=1,
                      clock=lambda: datetime.now(timezone.utc) + timedelta(seconds=60))  # fmt: skip
    end = time.monotonic() + 4.5  # past the lease duration: a renews every second throughout
    rounds = []
    while time.monotonic() < end:
        assert a.try_acquire() is True and a.is_leader()
        rounds.append(b.try_acquire())
        assert not b.is_leader()
        time.sleep(0.5)
    assert rounds and not any(rounds)
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("skew", kube_namespace)
    assert lease.spec.holder_identity == "a" and (lease.spec.lease_transitions or 0) == 0


def _held_lease(api, namespace: str, name: str, holder: str, duration: int, renewed: datetime | None = None) -> None:
    """A Lease held by ``holder`` for ``duration`` s, acquired and renewed at ``renewed`` (now)."""
    at = (renewed or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    client.CoordinationV1Api(api).create_namespaced_lease(namespace, {
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "acquireTime": at, "renewTime": at},
    })  # fmt: skip


def test_a_new_standby_waits_a_lease_duration_from_its_first_read_of_a_stale_lease(kube_api, kube_namespace):
    """A Lease whose holder stopped renewing an hour ago (by its clock): a candidate cannot tell
    a gone holder from its own clock running ahead, so it takes over only after it has seen the
    record unchanged for the lease duration on its own clock (15 s here, the record's and its own)."""
    _held_lease(kube_api, kube_namespace, "stale", "gone", 15, renewed=datetime.now(timezone.utc) - timedelta(hours=1))
    now = [1000.0]
    b = LeaderElector(kube_api, name="stale", namespace=kube_namespace, identity="b", duration=15, renew=1,
                      monotonic=lambda: now[0])  # fmt: skip
    assert b.try_acquire() is False  # first read at 1000
    now[0] = 1014.9
    assert b.try_acquire() is False
    now[0] = 1015.0
    assert b.try_acquire() is True and b.is_leader()
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("stale", kube_namespace)
    assert lease.spec.holder_identity == "b" and lease.spec.lease_transitions == 1


def test_a_leader_paused_past_its_deadline_says_it_lost_the_lease_when_it_resumes(kube_api, kube_namespace, caplog):
    """A new user's trial: SIGSTOP the leader until the standby takes over, then SIGCONT. The
    resumed replica said only "standing by ... held by b", like a replica that never led: the
    "lost" warning was given only while its own deadline had not passed yet."""
    caplog.set_level(logging.INFO, logger="backfill.controller.leader")
    now = [0.0]
    a = LeaderElector(kube_api, name="paused", namespace=kube_namespace, identity="a", duration=3, renew=1,
                      monotonic=lambda: now[0])  # fmt: skip
    b = LeaderElector(kube_api, name="paused", namespace=kube_namespace, identity="b", duration=3, renew=1,
                      monotonic=lambda: now[0])  # fmt: skip
    assert a.try_acquire() is True
    assert b.try_acquire() is False
    now[0] = 3.0  # a paused: b has seen its record unchanged for the lease duration
    assert not a.is_leader()
    assert b.try_acquire() is True
    caplog.clear()
    assert a.try_acquire() is False  # a resumes
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"lost leader lease {kube_namespace}/paused: it is held by b now")
    ]


def test_a_lease_edited_to_last_for_years_is_honoured_for_our_duration_only(kube_api, kube_namespace, caplog):
    """A fault trial: a Lease edited to ``holderIdentity: ghost`` and ``leaseDurationSeconds:
    100000`` held both replicas standing by (nothing admitted, a Job ran 54 s past its demand)
    until both were restarted. Its record is honoured for this replica's own duration at most,
    said with a warning (an earlier trial: the int32's largest duration said in whole seconds)."""
    _held_lease(kube_api, kube_namespace, "forever", "ghost", 2**31 - 1)
    caplog.set_level(logging.INFO, logger="backfill.controller.leader")
    clock = [100.0]
    b = LeaderElector(kube_api, name="forever", namespace=kube_namespace, identity="b", duration=15, renew=5,
                      monotonic=lambda: clock[0])  # fmt: skip
    assert b.try_acquire() is False
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        ("INFO", f"standing by: leader lease {kube_namespace}/forever is held by ghost "
                 "(taken over once its record has stayed unchanged for 15 s)"),
        ("WARNING", f"leader lease {kube_namespace}/forever: ghost's record claims 2,147,483,647 s; this replica honours "
                    "at most its own lease duration, 15 s (BACKFILL_LEASE_DURATION_SECONDS: set the same on every replica)"),
    ]  # fmt: skip
    clock[0] = 114.9
    assert b.try_acquire() is False
    clock[0] = 115.0  # the record unchanged for our 15 s
    assert b.try_acquire() is True
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("forever", kube_namespace)
    assert (lease.spec.holder_identity, lease.spec.lease_duration_seconds) == ("b", 15)


def test_a_record_shorter_than_our_duration_is_honoured_for_its_own(kube_api, kube_namespace):
    _held_lease(kube_api, kube_namespace, "short", "other", 4)
    clock = [0.0]
    b = LeaderElector(kube_api, name="short", namespace=kube_namespace, identity="b", duration=15, renew=5,
                      monotonic=lambda: clock[0])  # fmt: skip
    assert b.try_acquire() is False
    clock[0] = 3.9
    assert b.try_acquire() is False
    clock[0] = 4.0
    assert b.try_acquire() is True


def test_failures_that_differ_only_in_numbers_are_logged_once(kube_api, kube_namespace, caplog):
    """A trial with the API server paused: each round's read timed out with another remaining
    time (``read timeout=0.4998``, ``=0.4991``, ...), and each was logged as a new failure, a
    warning a second. A failure of another kind is logged again."""
    caplog.set_level(logging.WARNING, logger="backfill.controller.leader")
    a = _elector(kube_api, kube_namespace, "a")
    pool = "HTTPSConnectionPool(host='127.0.0.1', port={}): Read timed out. (read timeout={})"
    for port, left in ((6443, 0.4998), (6443, 0.4991), (6444, 0.5)):
        a.report_failure(TimeoutError(pool.format(port, left)))
    a.report_failure(ConnectionRefusedError("[Errno 111] Connection refused"))
    a.report_failure(TimeoutError(pool.format(6443, 0.4)))
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "leader election: TimeoutError: " + pool.format(6443, 0.4998),
        "leader election: ConnectionRefusedError: [Errno 111] Connection refused",
        "leader election: TimeoutError: " + pool.format(6443, 0.4),
    ]


def test_a_failure_without_an_answer_is_said_as_the_watchers_say_it():
    """A new user's trial: the Lease's read timing out was logged as ``MaxRetryError:
    HTTPSConnectionPool(...): Max retries exceeded with url: ... (Caused by ReadTimeoutError(...))``,
    where the watchers said ``ReadTimeoutError: ...: Read timed out. (read timeout=2.0)``."""
    import urllib3

    from backfill.controller.leader import describe_failure

    pool = urllib3.HTTPSConnectionPool("127.0.0.1", 6443)
    cause = urllib3.exceptions.ReadTimeoutError(pool, "/apis", "Read timed out. (read timeout=2.5)")
    wrapped = urllib3.exceptions.MaxRetryError(pool, "/apis/coordination.k8s.io/v1/x", cause)
    assert describe_failure(wrapped, "ns") == (
        "ReadTimeoutError: HTTPSConnectionPool(host='127.0.0.1', port=6443): Read timed out. (read timeout=2.5)"
    )
    refused = urllib3.exceptions.MaxRetryError(pool, "/x", ConnectionRefusedError(111, "Connection refused"))
    assert describe_failure(refused, "ns") == "ConnectionRefusedError: [Errno 111] Connection refused"


def test_a_leader_whose_create_of_a_deleted_lease_loses_the_race_stops_leading(kube_api, kube_namespace):
    """A fault trial deleted the Lease by hand: the leader read 404, the standby created the
    Lease first, the leader's create answered 409, and it still acted as leader until its old
    deadline (4.5 s of two leaders). A lost create now ends its leadership at once."""
    a, b = _elector(kube_api, kube_namespace, "a"), _elector(kube_api, kube_namespace, "b")
    assert a.try_acquire() is True and a.is_leader()
    client.CoordinationV1Api(kube_api).delete_namespaced_lease("mbf-leader", kube_namespace)
    real_read = a.coord.read_namespaced_lease

    class Racing:  # a's read answers 404; b creates the Lease before a's create goes out
        def __getattr__(self, name):
            return getattr(inner, name)

        def read_namespaced_lease(self, *args, **kw):
            try:
                return real_read(*args, **kw)
            except client.ApiException as exc:
                assert exc.status == 404
                assert b.try_acquire() is True
                raise

    inner = a.coord
    a.coord = Racing()
    assert a.try_acquire() is False
    assert not a.is_leader(), "still leading after losing the Lease's create to another replica"
    assert b.is_leader()


def test_a_standby_honours_a_deleted_leases_last_holder_until_its_record_would_lapse(kube_api, kube_namespace):
    """A second trial: the Lease deleted by hand, the standby created it at once and both led
    until the old leader's next renew (up to 5 s; the old one admitted a backfill meanwhile).
    The standby now waits as if the record it last read still stood; the holder, renewing,
    creates the Lease again and keeps leading. A holder that is gone is replaced once its
    record would have lapsed."""
    now = [1000.0]
    a = _elector(kube_api, kube_namespace, "a")
    b = LeaderElector(kube_api, name="mbf-leader", namespace=kube_namespace, identity="b", duration=15, renew=5, monotonic=lambda: now[0])
    coord = client.CoordinationV1Api(kube_api)
    assert a.try_acquire() is True
    assert b.try_acquire() is False  # b reads a's record
    coord.delete_namespaced_lease("mbf-leader", kube_namespace)
    now[0] += 1
    assert b.try_acquire() is False and not b.is_leader()
    assert _absent(coord, kube_namespace), "the standby created the deleted Lease while its holder's record stood"
    assert a.try_acquire() is True and a.is_leader()  # the holder's renew creates it again
    assert coord.read_namespaced_lease("mbf-leader", kube_namespace).spec.holder_identity == "a"
    # the holder gone for good: once the record b last read would have lapsed, b takes over
    a.stop(release=False)
    coord.delete_namespaced_lease("mbf-leader", kube_namespace)
    assert b.try_acquire() is False  # b reads nothing new: a's record still stands for it
    now[0] += 16
    assert b.try_acquire() is True and b.is_leader()


def _absent(coord, ns: str) -> bool:
    try:
        coord.read_namespaced_lease("mbf-leader", ns)
    except client.ApiException as exc:
        return exc.status == 404
    return False


def test_replicas_on_separate_stores_are_told_apart_by_the_log_id_in_the_lease(kube_api, kube_namespace, caplog):
    """An operator's trial: a replica on another store (its own embedded server) took the Lease
    over with no word, deleted the running Job as unexplained and would have run finished
    one-shot declarations again. The leader writes its log's id into the Lease; a standby with
    another id says so once (an error) and is not ready (``foreign_log``); a takeable Lease
    naming another log is left to that log's replicas for a few retry periods, then taken with
    an error line (after the write: a re-trial read it before a write that lost the race);
    replicas on the same log say nothing."""
    from backfill.controller import _ready
    from backfill.controller.leader import LOG_ANNOTATION

    caplog.set_level(logging.INFO, logger="backfill.controller.leader")
    clock = [1000.0]

    def elector(identity: str, log_id: str) -> LeaderElector:
        return LeaderElector(kube_api, name="logs", namespace=kube_namespace, identity=identity, duration=15, renew=5,
                             log_identity=log_id, monotonic=lambda: clock[0])  # fmt: skip

    def errors() -> list[str]:
        out = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        caplog.clear()
        return out

    a, same, other = elector("a", "log-1"), elector("same", "log-1"), elector("other", "log-2")
    assert a.try_acquire() is True
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("logs", kube_namespace)
    assert lease.metadata.annotations[LOG_ANNOTATION] == "log-1"
    assert same.try_acquire() is False and same.foreign_log is None
    assert other.try_acquire() is False and other.try_acquire() is False
    assert other.foreign_log == ("a", "log-1")

    class Ready:
        def readiness(self):
            return True, []

    other.healthy = same.healthy = True
    assert _ready(Ready(), other) == (False, ["leader election: the leader a writes to another event log (log-1): replicas must share one store"])
    assert _ready(Ready(), same) == (True, [])
    assert errors() == [
        "the leader Lease is held by a, which writes to another event log (id log-1; this replica's: log-2): every replica "
        "must use the same database and schema (BACKFILL_DATABASE_URL, or one BACKFILL_DATA_DIR for the embedded server); "
        "a replica on another store knows none of the other's runs"
    ]
    # a is gone (its record unchanged for a lease duration): left to a's log for 3 retry periods
    clock[0] += 16
    assert other.try_acquire() is False and errors() == []
    assert other.foreign_log == ("a", "log-1")  # still a's log's: not ready meanwhile (a re-trial read 200)
    clock[0] += 3
    assert other.try_acquire() is True and other.foreign_log is None
    assert [e.split(",")[0] for e in errors()] == ["took the leader Lease over from a"]
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("logs", kube_namespace)
    assert lease.spec.holder_identity == "other" and lease.metadata.annotations[LOG_ANNOTATION] == "log-2"

    # released (a SIGTERM'd leader releases it): the replica of that log wins the race
    other.stop(release=True)
    assert a.try_acquire() is False  # a (log-1) defers to log-2's replicas ...
    assert other.try_acquire() is True  # ... and other, back, takes it at once
    other.stop(release=True)
    assert a.try_acquire() is False and a.foreign_log == ("the replica that released it", "log-2")
    clock[0] += 3
    assert a.try_acquire() is True  # no replica of log-2 came: taken, and said
    assert [e.split(",")[0] for e in errors()] == ["took the leader Lease over from the replica that released it"]


def test_a_replica_restarted_on_another_store_under_the_same_identity_is_another_replica(kube_api, kube_namespace, caplog):
    """A re-trial: the Deployment's identity is the pod's name, so a container restarted on
    another store (its database URL changed) found the Lease under its own identity, took it at
    once with no word and deleted the running Job as unexplained."""
    from backfill.controller.leader import LOG_ANNOTATION

    caplog.set_level(logging.INFO, logger="backfill.controller.leader")
    clock = [1000.0]

    def elector(log_id: str) -> LeaderElector:
        return LeaderElector(kube_api, name="again", namespace=kube_namespace, identity="pod-0", duration=15, renew=5,
                             log_identity=log_id, monotonic=lambda: clock[0])  # fmt: skip

    assert elector("log-1").try_acquire() is True  # then SIGKILLed
    restarted = elector("log-2")
    assert restarted.try_acquire() is False and restarted.foreign_log == ("pod-0", "log-1")
    clock[0] += 16
    assert restarted.try_acquire() is False  # left to log-1's replicas for 3 retry periods
    clock[0] += 3
    assert restarted.try_acquire() is True
    said = [r.getMessage().split(",")[0] for r in caplog.records if r.levelname == "ERROR"]
    assert said == ["the leader Lease is held by this identity's previous process", "took the leader Lease over from this identity's previous process"]
    again = elector("log-2")
    assert again.try_acquire() is True  # restarted again on the same store: at once
    # the leader's own record with its annotation edited by hand: renewed, and written back
    coord = client.CoordinationV1Api(kube_api)
    coord.patch_namespaced_lease("again", kube_namespace, {"metadata": {"annotations": {LOG_ANNOTATION: "garbage"}}})
    assert again.try_acquire() is True and again.is_leader() and again.foreign_log is None
    assert coord.read_namespaced_lease("again", kube_namespace).metadata.annotations[LOG_ANNOTATION] == "log-2"
