"""A ConcurrentBackfill waiter is admitted when the other attempt ends, on the real controller
(issue 13 item 3).

The resync is set far beyond the test's wait, so only the wake-up of the waiting backfill by the
other attempt's end (``affected``: every backfill on the same model or node) can admit it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from .conftest import now_s, ts, wait_for

pytestmark = pytest.mark.kube


def _end(kube, job_name: str, end: str) -> None:
    """Play the Job controller: the Job succeeds, or fails (either ends its backfill: one-shot)."""
    done = now_s()
    if end == "succeeded":
        status = {"completionTime": ts(done), "succeeded": 1, "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": ts(done)},
            {"type": "Complete", "status": "True", "lastTransitionTime": ts(done)},
        ]}
    else:
        status = {"failed": 1, "conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": ts(done)},
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": ts(done)},
        ]}
    kube.job_status(job_name, {"startTime": ts(done - timedelta(seconds=1)), **status})


@pytest.mark.parametrize("end", ["succeeded", "failed"])
def test_the_waiter_is_admitted_when_the_other_attempt_ends_not_at_the_resync(kube, start_controller, end):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-a")
    start_controller(resync_seconds=3600)
    kube.backfill("first")
    (job,) = wait_for(kube.jobs, what="the first backfill's Job")
    kube.backfill("second")
    st = wait_for(lambda: (s := kube.status("second")).get("reason") == "ConcurrentBackfill" and s, what="second waits")
    assert st["phase"] == "WaitingForIdle" and "first" in st["message"]
    assert len(kube.jobs()) == 1

    _end(kube, job.metadata.name, end)
    # Well within the resync (an hour): the end of the first attempt wakes the second.
    second = wait_for(
        lambda: [j for j in kube.jobs() if j.metadata.owner_references[0].name == "second"],
        timeout=15, what="the second backfill's Job",
    )
    assert len(second) == 1
    # its status follows on the status writer's thread (the Job can be seen first)
    wait_for(lambda: kube.status("second").get("reason") != "ConcurrentBackfill", what="second's status moves on")
