"""Two replicas with leader election, each with its own apiserver identity (audit log):
a standby never acts; a leader paused past its lease duration is replaced, and after it resumes
it makes no Job create/delete, status write or Event; the attempt counters are not doubled.

Lease duration 3 s, renew 1 s (``FAST_SETTINGS``).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from .harness import FAST_SETTINGS, JobPlayer, Kube, assert_replay_clean, demand, log_events, of_type, run_rows, timed, wait_for
from .workload import CANCEL_BOUND_SECONDS, cluster_invariants, declare, settled_log_invariants, start_running, wait_job

pytestmark = pytest.mark.kube

LEASE = float(FAST_SETTINGS["BACKFILL_LEASE_DURATION_SECONDS"])
#: The leader stays stopped this long: past its lease plus time for the other to act.
PAUSE_SECONDS = LEASE * 2 + 4
#: After it resumes, the old leader is watched this long for any action.
AFTER_RESUME_SECONDS = LEASE + 3


#: A request the apiserver received this long after SIGSTOP was sent after SIGCONT (a stopped
#: process sends nothing); earlier ones may have been on the wire already. Likewise a request that
#: had passed the controller's fence (its last leadership check, in the HTTP client) when the
#: process was stopped goes out in the first moments after SIGCONT: no in-process check can recall
#: it (docs/reliability.md), so requests received within IN_FLIGHT after SIGCONT are not counted.
#: Anything later was decided after the resume and must have been refused by the fence. A healed
#: partition is a resume too: the proxy holds what was sent meanwhile and delivers it at the heal.
#: 500 ms: on a loaded 2-core machine the resumed process may need a few scheduling rounds (and
#: the GIL) before such a request reaches the apiserver; a decision made after the resume is
#: refused by the fence at once (its lease deadline passed while it was stopped).
IN_FLIGHT = timedelta(milliseconds=500)


def _when(e: dict) -> datetime:
    return datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00"))


def actions(cluster, user: str, ns: str, since: datetime | None = None, resumed: datetime | None = None) -> list[str]:
    """The mutations ``user`` made in ``ns`` that only a leader may make (audit log): Job
    create/delete, ModelBackfill status writes, Events -- not Lease updates -- received at or
    after ``since``, except those received within :data:`IN_FLIGHT` after ``resumed``."""
    out = []
    for e in cluster.audit_events(user=user, namespace=ns, subresource=None):
        ref = e.get("objectRef") or {}
        what = (e["verb"], ref.get("resource"), ref.get("subresource") or "")
        if since is not None and _when(e) < since:
            continue
        if resumed is not None and resumed <= _when(e) < resumed + IN_FLIGHT:
            continue
        if what[:2] in (("create", "jobs"), ("delete", "jobs")) or (what[1] == "modelbackfills" and what[2] == "status") or (
            what[1] == "events" and what[0] in ("create", "patch", "update")
        ):
            out.append(f"{e['requestReceivedTimestamp']} {e['verb']} {ref.get('resource')}/{ref.get('subresource') or ''} {ref.get('name') or ''}")
    return out


def holder(kube: Kube, name: str = "mbf-faults") -> str | None:
    from kubernetes import client

    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(name, kube.ns)
    return lease.spec.holder_identity


def leader_and_standby(kube: Kube, controllers, a_server: str | None = None, **env: str):
    """Start replica-a, wait until it holds the Lease, then start replica-b (both ready);
    ``env`` for both, ``a_server``: replica-a's apiserver address (e.g. a proxy)."""
    a = controllers("replica-a", server=a_server, **env).start()
    a.wait_ready()
    wait_for(lambda: holder(kube) == "replica-a", timeout=10, what="replica-a holds the Lease")
    b = controllers("replica-b", **env).start()
    b.wait_ready()
    return a, b


def test_leader_paused_past_its_lease_is_fenced(fault_cluster, kube: Kube, player: JobPlayer, controllers):
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf-1", "m1"), ("bf-2", "m2")])
    a, b = leader_and_standby(kube, controllers)
    job1 = start_running(kube, player, "bf-1")
    job2 = start_running(kube, player, "bf-2")
    assert actions(fault_cluster, "replica-b", kube.ns) == [], "the standby acted"

    a.pause()
    paused_at = datetime.now(timezone.utc)
    try:
        taken = timed(lambda: holder(kube) == "replica-b", timeout=PAUSE_SECONDS, what="replica-b takes the Lease over")
        print(f"leader paused: replica-b took the Lease after {taken:.2f} s (lease {LEASE:.0f} s)")
        demand(kube, "m1")
        seconds = timed(lambda: kube.job(job1) is None, timeout=CANCEL_BOUND_SECONDS, what=f"replica-b deletes {job1}")
        print(f"new leader: demand -> Job gone {seconds:.2f} s")
        took_over = datetime.now(timezone.utc)
        time.sleep(max(0.0, PAUSE_SECONDS - (datetime.now(timezone.utc) - paused_at).total_seconds()))
    finally:
        resuming_at = datetime.now(timezone.utc)  # just before SIGCONT: the in-flight window starts here
        a.resume()
    resumed_at = datetime.now(timezone.utc)
    time.sleep(AFTER_RESUME_SECONDS)  # give the old leader every chance to misbehave
    late = actions(fault_cluster, "replica-a", kube.ns, since=paused_at + IN_FLIGHT, resumed=resuming_at)
    assert late == [], f"replica-a acted after it lost the Lease (paused {paused_at}, resumed {resumed_at}):\n" + "\n".join(late)
    assert actions(fault_cluster, "replica-b", kube.ns, since=took_over), "replica-b never acted as the leader"
    assert kube.job(job2) is not None, "the untouched Job was deleted"

    # A demand after the handover: the new leader cancels, the old one stands by.
    demand(kube, "m2")
    timed(lambda: kube.job(job2) is None, timeout=CANCEL_BOUND_SECONDS, what=f"{job2} deleted after the handover")
    # The same count as after the resume (a request in flight at SIGSTOP may land just after SIGCONT).
    assert actions(fault_cluster, "replica-a", kube.ns, since=paused_at + IN_FLIGHT, resumed=resuming_at) == []
    assert cluster_invariants(kube) == []
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []
    assert_replay_clean(pg.url, schema)


def test_attempt_counters_are_not_doubled_by_a_standby(kube: Kube, player: JobPlayer, controllers):
    """sum(starts_total) over both replicas' /metrics equals the admissions in the log."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf-1", "m1"), ("bf-2", "m2")])
    a, b = leader_and_standby(kube, controllers)
    for name in ("bf-1", "bf-2"):
        wait_job(kube, name)
    admitted = lambda: len(of_type(log_events(pg.url, schema), "AttemptAdmitted"))  # noqa: E731
    wait_for(lambda: admitted() == 2, timeout=10, what="two admissions in the log")
    metric = "flexinfer_model_backfill_starts_total"
    # Both replicas fold the log; give the standby the time to fold it too.
    wait_for(lambda: b.metric(metric) + a.metric(metric) >= 2, timeout=10, what="the admissions counted")
    time.sleep(2 * float(FAST_SETTINGS["BACKFILL_POLL_FALLBACK_SECONDS"]) + 1)
    total = a.metric(metric) + b.metric(metric)
    print(f"starts_total: replica-a {a.metric(metric)}, replica-b {b.metric(metric)}; admissions in the log {admitted()}")
    assert total == admitted(), f"sum over replicas of {metric} = {total}, admissions in the log = {admitted()}"


def test_graceful_stop_hands_over_well_under_the_lease(kube: Kube, player: JobPlayer, controllers):
    """SIGTERM releases the Lease: the standby leads (and acts) sooner than a lease expiry."""
    declare(kube, [("bf-1", "m1")])
    a, b = leader_and_standby(kube, controllers, BACKFILL_LEASE_DURATION_SECONDS="10", BACKFILL_LEASE_RENEW_SECONDS="2")
    job = start_running(kube, player, "bf-1")
    assert a.terminate() == 0
    t0 = time.monotonic()
    demand(kube, "m1")
    timed(lambda: kube.job(job) is None, timeout=10, what=f"{job} deleted by the standby")
    seconds = time.monotonic() - t0
    print(f"graceful stop: standby cancelled after {seconds:.2f} s (lease 10 s)")
    assert seconds < 5, f"handover took {seconds:.2f} s: the Lease was not released on SIGTERM"


def test_leader_paused_in_a_wave_of_cancels(fault_cluster, kube: Kube, player: JobPlayer, controllers):
    """The leader is stopped a few milliseconds into a wave of demands, when it may hold a
    database transaction or the log's append lock: the new leader's cancels are not held up by
    anything the paused one holds. Every Job is gone within the lease plus the cancel bound."""
    pg, schema = controllers.pg, controllers.schema
    pairs = [(f"bf-{i}", f"m{i}") for i in range(6)]
    declare(kube, pairs)
    a, b = leader_and_standby(kube, controllers)
    jobs = [start_running(kube, player, name) for name, _ in pairs]
    paused_at = datetime.now(timezone.utc)
    for _, model in pairs:
        demand(kube, model)
        if model == pairs[1][1]:
            a.pause()  # two demands in: the leader is busy folding/appending/cancelling
            paused_at = datetime.now(timezone.utc)
    try:
        seconds = timed(
            lambda: all(kube.job(j) is None for j in jobs), timeout=LEASE * 2 + CANCEL_BOUND_SECONDS,
            what="every Job deleted while the old leader is paused",
        )  # fmt: skip
        print(f"leader paused in a wave: all {len(jobs)} Jobs gone {seconds:.2f} s after the pause (lease {LEASE:.0f} s)")
    finally:
        resuming_at = datetime.now(timezone.utc)  # just before SIGCONT: the in-flight window starts here
        a.resume()
    resumed_at = datetime.now(timezone.utc)
    time.sleep(AFTER_RESUME_SECONDS)
    late = actions(fault_cluster, "replica-a", kube.ns, since=paused_at + IN_FLIGHT, resumed=resuming_at)
    assert late == [], f"replica-a acted after it lost the Lease (SIGSTOP {paused_at}, SIGCONT {resumed_at}):\n" + "\n".join(late)
    assert cluster_invariants(kube) == []
    first = lambda: sorted((r.backfill, r.result, r.reason) for r in run_rows(pg.url, schema) if r.attempt == 1)  # noqa: E731
    try:
        wait_for(lambda: [(b, r) for b, r, _ in first()] == [(name, "preempted") for name, _ in pairs],
                 timeout=10, what="every first attempt preempted in the runs table")  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {first()}") from None
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []
    assert_replay_clean(pg.url, schema)



def test_leader_partitioned_from_the_apiserver(fault_cluster, kube: Kube, player: JobPlayer, controllers, proxy):
    """Only the leader loses the apiserver (its connections go silent, the process runs on):
    it must stop acting before the standby may take over, report not ready, and make no Job
    create/delete, status write or Event after the partition heals; the standby cancels."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf-1", "m1")])
    a, b = leader_and_standby(kube, controllers, a_server=proxy.url)
    job = start_running(kube, player, "bf-1")

    proxy.partition()
    cut_at = datetime.now(timezone.utc)
    try:
        taken = timed(lambda: holder(kube) == "replica-b", timeout=PAUSE_SECONDS, what="replica-b takes the Lease over")
        demand(kube, "m1")
        seconds = timed(lambda: kube.job(job) is None, timeout=CANCEL_BOUND_SECONDS, what=f"replica-b deletes {job}")
        print(f"leader partitioned: replica-b took over after {taken:.2f} s, cancelled {seconds:.2f} s after the demand")
        status, body = a.http("/readyz")
        print(f"partitioned leader /readyz: {status} {body.strip()!r}")
    finally:
        # What replica-a sent during the partition is held by the proxy and reaches the apiserver
        # the moment it heals (a request sent before its fence closed, e.g. a status write just
        # after the cut, lands after replica-b took over): the heal counts as a resume.
        healed_at = datetime.now(timezone.utc)
        proxy.heal()
    time.sleep(AFTER_RESUME_SECONDS)
    assert a.alive, a.tail()
    late = actions(fault_cluster, "replica-a", kube.ns, since=cut_at + IN_FLIGHT, resumed=healed_at)
    assert late == [], "replica-a acted after it lost the Lease:\n" + "\n".join(late)
    assert cluster_invariants(kube) == []
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []
    assert_replay_clean(pg.url, schema)
    assert status == 503, f"the partitioned replica said it was ready: {status} {body!r}"


def test_the_standby_cancels_with_the_store_stopped_when_the_leader_dies(kube: Kube, player: JobPlayer, controllers):
    """Fault breaker: the leader SIGKILLed and PostgreSQL stopped; the standby observed the
    demand while it was not leading and dropped it, and cancelled only once the store was back.
    Now leadership gained re-checks everything it observed: the Job is gone within the lease
    plus the cancel bound, with the store still stopped."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf-1", "m1")])
    a, b = leader_and_standby(kube, controllers)
    job = start_running(kube, player, "bf-1")
    pg.stop()
    try:
        a.kill()
        demand(kube, "m1")
        seconds = timed(lambda: kube.job(job) is None, timeout=LEASE * 2 + CANCEL_BOUND_SECONDS,
                        what=f"{job} deleted by the new leader while the store is stopped")  # fmt: skip
        print(f"leader SIGKILLed, store stopped: the standby deleted {job} {seconds:.2f} s after the demand (lease {LEASE:.0f} s)")
        assert holder(kube) == "replica-b"
    finally:
        pg.start()
    wait_for(lambda: [e for _, e in of_type(log_events(pg.url, schema), "AttemptCancelled")], timeout=15,
             what="the cancel in the log once the store is back")  # fmt: skip
    events = log_events(pg.url, schema)
    assert [e.reason for _, e in of_type(events, "AttemptCancelled")] == ["ForegroundDemand"]
    assert cluster_invariants(kube) == []
    assert_replay_clean(pg.url, schema)
