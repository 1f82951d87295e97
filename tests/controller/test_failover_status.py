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
        time.sleep(0.5)
    finally:
        down.clear()
        recorder.stop()
    after = recorder.statuses[[p for p, _ in recorder.statuses].index("WaitingForIdle") :]
    assert ("Running", job) not in after, recorder.statuses  # never back to Running over the gone Job
    assert any(p == "Running" and name not in (None, job) for p, name in after), recorder.statuses  # the next Job's
