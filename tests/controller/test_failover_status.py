"""A replica that gains leadership while the event log refuses appends, or while they hang,
writes no status older than the cluster (found by new users' trials: after a failover with
PostgreSQL away, the new leader wrote ``Running`` over the Job its predecessor had deleted from
memory, until its spool got through; with PostgreSQL *paused* the appends fail nothing, they
just never answer, and the same happened).

Two controllers on the real API server and one PostgreSQL schema; leadership is a switch, the
outage a store whose appends raise (``refused``) or wait (``hung``) while ``down`` is set (reads
still answer).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from .conftest import LeaderSwitch, PhaseRecorder, RefusingStore, now_s, ts, wait_for


@pytest.mark.parametrize("outage", ["refused", "hung"])
def test_a_new_leader_writes_no_status_from_a_log_that_lacks_what_it_observed(kube, kube_cluster, start_controller, outage):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    down = threading.Event()
    a_leads, b_leads = LeaderSwitch(True), LeaderSwitch(False)
    exact = {"foreground_signal_granularity_seconds": 0}  # busy until lastActiveTime itself
    hang = outage == "hung"
    start_controller(leader=a_leads, wrap_events=lambda s: RefusingStore(s, down, hang), **exact)
    b = start_controller(leader=b_leads, wrap_events=lambda s: RefusingStore(s, down, hang), **exact)
    kube.backfill("busy")
    job = wait_for(kube.jobs, what="Job created by the leader")[0].metadata.name
    kube.run_job(job)
    wait_for(lambda: kube.status("busy").get("phase") == "Running", what="phase Running")
    recorder = PhaseRecorder(kube_cluster.api_client(), kube.ns, "busy")
    try:
        down.set()  # the outage: every append fails (or hangs) from now on
        kube.set_status("models", "gemma", {"lastActiveTime": ts(now_s() + timedelta(seconds=1))})
        wait_for(lambda: kube.job(job) is None, timeout=5, what="Job deleted by the leader from memory")
        wait_for(lambda: kube.status("busy").get("phase") == "WaitingForIdle", timeout=5, what="status from memory")
        if hang:
            wait_for(lambda: b.spool.stalled_for() > 1.5, timeout=5, what="the standby's append hanging too")
        else:
            wait_for(lambda: not b.spool.healthy, timeout=5, what="the standby's appends failing too")
        a_leads.leading, b_leads.leading = False, True  # failover, the store still refusing appends
        b.signal.set()
        time.sleep(3)  # b's loop reads the log (it answers), gains leadership, decides everything
        assert kube.status("busy").get("phase") == "WaitingForIdle", kube.status("busy")
        down.clear()
        wait_for(lambda: b.spool.healthy and b.spool.backlog == 0, timeout=15, what="the new leader's spool drained")
        # The log now explains the cancel; the next attempt is admitted by the new leader.
        wait_for(lambda: [j for j in kube.jobs() if j.metadata.name != job], timeout=15, what="the next attempt's Job")
        wait_for(lambda: any(p == "Running" and name not in (None, job) for p, name in recorder.statuses), timeout=10, what="the next Job's status")
    finally:
        down.clear()
        recorder.stop()
    after = recorder.statuses[[p for p, _ in recorder.statuses].index("WaitingForIdle") :]
    assert ("Running", job) not in after, recorder.statuses  # never back to Running over the gone Job
    assert any(p == "Running" and name not in (None, job) for p, name in after), recorder.statuses  # the next Job's


def test_a_suspension_whose_records_died_with_its_leader_is_resumed_by_the_next(kube, kube_cluster, start_controller):
    """A trial (``preemption: Suspend``): the leader suspended the Job for an ingest report with
    PostgreSQL away and was killed with both records spooled; the log held only the standby's
    ``JobSuspended``, and the new leader said ``Running``/``JobActive`` for ever over a suspended
    Job. The observation ends the segment; the new leader resumes the same Job."""
    import json

    from backfill.core import events as ev

    from .conftest import log_of
    from .test_ingest_standby import _post, _serve
    from .test_resumable import TEMPLATE, IndexedJobPlayer, _indexed_cronjob

    _indexed_cronjob(kube)
    kube.model("gemma", node="node-a")
    down = threading.Event()
    a_leads, b_leads = LeaderSwitch(True), LeaderSwitch(False)
    a = start_controller(leader=a_leads, wrap_events=lambda s: RefusingStore(s, down))
    b = start_controller(leader=b_leads)
    kube.backfill("busy", template=TEMPLATE, preemption="Suspend")
    job = wait_for(kube.jobs, what="Job created by the leader")[0].metadata.name
    player = IndexedJobPlayer(kube, job)
    player.start(now_s())
    wait_for(lambda: kube.status("busy").get("phase") == "Running", what="phase Running")
    recorder = PhaseRecorder(kube_cluster.api_client(), kube.ns, "busy")
    down.set()  # the leader's store is away from now on: its records never reach the log
    server, _ = _serve(a)
    try:
        report = {"namespace": kube.ns, "model": "gemma", "time": ts(now_s()), "id": "r/lost"}
        status, _, payload = _post(server, json.dumps({"reports": [report]}).encode())
        # 503 cancel_unanswered when the suspend call is still in flight after the 1 s wait (a
        # loaded machine): the report was taken and acted on all the same; a client would retry.
        assert status in (200, 202) or (status == 503 and payload.get("error") == "cancel_unanswered"), payload
        wait_for(lambda: player.spec_suspend() is True, timeout=5, what="Job suspended by the leader from memory")
        # its status from memory says so before the pods stop (else the writer may coalesce it away)
        wait_for(lambda: "Cancelling" in recorder.phases, timeout=5, what="Cancelling written from memory")
    finally:
        server.shutdown()
        server.server_close()
    player.suspended(now_s())
    wait_for(lambda: [e for _, e in log_of(b) if isinstance(e, ev.JobSuspended)], timeout=5, what="the standby's JobSuspended")
    a_leads.leading, b_leads.leading = False, True  # the leader is gone with its spool
    b.signal.set()
    try:
        wait_for(lambda: player.spec_suspend() is False, timeout=15, what="the same Job resumed by the new leader")
        wait_for(lambda: recorder.statuses[-1:] == [("Starting", job)], timeout=10, what="the resume's status")
    finally:
        recorder.stop()
    log = log_of(b)
    assert not [e for _, e in log if isinstance(e, (ev.ForegroundRequest, ev.AttemptCancelled))]  # lost with the leader
    (resume,) = [e for _, e in log if isinstance(e, ev.AttemptResumed)]
    assert (resume.attempt, resume.segment, resume.job_name) == (1, 2, job)
    after = recorder.statuses[[p for p, _ in recorder.statuses].index("Cancelling") :]
    assert after[-1] == ("Starting", job) and ("Running", job) not in after, recorder.statuses  # never Running while suspended
    (row,) = [r for r in b.runs.query(namespace=kube.ns, backfill="busy") if r.segment == 1]
    assert (row.result, row.reason) == ("cancelled", "JobSuspended")
