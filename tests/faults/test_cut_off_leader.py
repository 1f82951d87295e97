"""A chaos soak's finding (helper-30): stopping must be fail-safe with two faults at once.

PostgreSQL stopped, then the leader cut off from the API server (a partition: its connections
go silent). A router's report reached the leader, which answered ``202 {"spooled": 1}``: its
cancel hung in the partition, the report was durable nowhere, and the router (answered) did not
retry. The standby took the Lease over about a lease later, knew nothing of the report, and the
Job ran until the store came back (31 s; however long the store stays away).

Now the leader answers ``503 cancel_unanswered`` with ``Retry-After`` while its cancel call is
unanswered and the log has not taken the report; the router retries through the Service (here:
alternately to both replicas) until a replica that can act takes it. Asserted on the cluster
(the Job) and the audit log (who deleted it), with PostgreSQL still stopped.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from .harness import FAST_SETTINGS, JobPlayer, Kube
from .test_leader_faults import holder, leader_and_standby
from .workload import CANCEL_BOUND_SECONDS, declare, post_reports, start_running

pytestmark = pytest.mark.kube

LEASE = float(FAST_SETTINGS["BACKFILL_LEASE_DURATION_SECONDS"])
TOKEN = "t0ken"


def _report(proc, ns: str, model: str, at: str, id: str = "router/1") -> tuple[int, dict, str | None]:
    return post_reports(proc, [{"namespace": ns, "model": model, "time": at, "count": 1, "id": id}], TOKEN, timeout=5)


def test_a_report_to_a_leader_cut_off_with_the_store_down_is_retried_until_a_replica_acts(
    fault_cluster, kube: Kube, player: JobPlayer, controllers, proxy, tmp_path
):
    token = tmp_path / "ingest-token"
    token.write_text(TOKEN + "\n")
    pg = controllers.pg
    declare(kube, [("bf", "gemma")])
    a, b = leader_and_standby(kube, controllers, a_server=proxy.url, BACKFILL_INGEST_TOKEN_FILE=str(token))
    job = start_running(kube, player, "bf")
    pg.stop()
    try:
        proxy.partition()
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        t0 = time.monotonic()
        answers: list[tuple[str, int, str]] = []
        gone = None
        replicas = [a, b]
        i = 0
        while time.monotonic() - t0 < LEASE + CANCEL_BOUND_SECONDS + 10:  # a router behind the Service
            status, body, retry_after = _report(replicas[i % 2], kube.ns, "gemma", at)
            answers.append((replicas[i % 2].identity, status, body.get("error", "")))
            if status == 202:
                break
            assert status in (0, 503) and retry_after == "1", (status, body)
            i += 1
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                if gone is None and kube.job(job) is None:
                    gone = time.monotonic() - t0
                time.sleep(0.05)
        # Was 202: nobody retried, nobody acted. cancel_unanswered while replica-a still holds
        # the Lease in its own eyes; not_leader once its renew deadline passed (a CI run under
        # load got there within the report's 1 s wait): either sends the router on.
        assert answers[0][1:] in ((503, "cancel_unanswered"), (503, "not_leader")), answers
        while gone is None and time.monotonic() - t0 < LEASE + CANCEL_BOUND_SECONDS + 10:
            if kube.job(job) is None:
                gone = time.monotonic() - t0
            time.sleep(0.05)
        print(f"answers {answers}; Job gone {gone} s after the first report (lease {LEASE} s); holder {holder(kube)}")
        assert gone is not None and gone <= LEASE + CANCEL_BOUND_SECONDS, (gone, answers)  # PostgreSQL still stopped
    finally:
        proxy.heal()
        pg.start()
    deletes = [
        e["user"]["username"]
        for e in fault_cluster.audit_events(namespace=kube.ns, resource="jobs", subresource=None)
        if e["verb"] == "delete" and (e.get("objectRef") or {}).get("name") == job and e.get("responseStatus", {}).get("code") == 200
    ]
    assert deletes == ["replica-b"], deletes  # the standby that took the Lease over acted on the retried report


def _report_at(proc, ns: str, model: str, at: str) -> tuple[int, dict]:
    """One report of its own (``id`` from its time)."""
    status, body, _ = _report(proc, ns, model, at, id=f"router/{at}")
    return status, body


def test_reports_to_both_replicas_with_the_store_stopped_replay_without_divergence(
    fault_cluster, kube: Kube, player: JobPlayer, controllers, tmp_path
):
    """The same soak: PostgreSQL stopped; a router's report to the standby (503 ``not_leader``,
    spooled there), its retry with a later time to the leader (202, cancel from memory); the Job
    held by a finalizer, released while the store is still away; the store back. The standby's
    report and deletion reached the log before the leader's report and cancel, and ``backfill
    replay`` reported the cancel as divergent (the log had ended the attempt for the same
    demand). Asserted: the Job gone, one cancel for the demand in the log, replay clean."""
    from .harness import log_events, replay

    token = tmp_path / "ingest-token"
    token.write_text(TOKEN + "\n")
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf", "gemma")])
    a, b = leader_and_standby(kube, controllers, BACKFILL_INGEST_TOKEN_FILE=str(token))
    job = start_running(kube, player, "bf")
    player.add_finalizer(job)
    pg.stop()
    try:
        standby = _report_at(b, kube.ns, "gemma", datetime.now(timezone.utc).isoformat())
        assert standby[0] == 503 and standby[1]["error"] == "not_leader", standby
        # the router's retry to the leader, a report with a later time
        leader = _report_at(a, kube.ns, "gemma", datetime.now(timezone.utc).isoformat())
        assert leader[0] == 202 and leader[1]["spooled"] == 1, leader
        deadline = time.monotonic() + CANCEL_BOUND_SECONDS
        while time.monotonic() < deadline and not kube.job_going(job):
            time.sleep(0.1)
        assert kube.job(job).metadata.deletion_timestamp is not None  # deleted, held by the finalizer
        time.sleep(1.5)
        player.remove_finalizers(job)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and kube.job(job) is not None:
            time.sleep(0.1)
        assert kube.job(job) is None
        time.sleep(2.0)  # the replicas observe the deletion, the store still away
    finally:
        pg.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        events = log_events(pg.url, schema)
        if any(type(e).__name__ == "AttemptCancelled" for _, e in events) and any(type(e).__name__ == "JobDeleted" for _, e in events):
            break
        time.sleep(0.2)
    cancels = [e for _, e in events if type(e).__name__ == "AttemptCancelled"]
    assert [(c.attempt, c.reason) for c in cancels] == [(1, "ForegroundDemand")], events
    rc, out = replay(pg.url, schema)
    assert rc == 0 and "divergence" not in out.replace("no divergence", ""), out[-2000:]
