"""A ``spec.preemption: Delete`` Job suspended by someone else, on a real kube-apiserver (a
fault trial: the ModelBackfill said Running/JobActive for ever and held its Model; a second
trial: once deleted, neither an Event nor a log line said why). The test plays the Job
controller: it writes the ``Suspended`` condition with no active pods."""

from __future__ import annotations

import pytest
from kubernetes import client

from .conftest import now_s, ts, wait_for

pytestmark = pytest.mark.kube


def test_a_delete_mode_job_suspended_by_hand_is_deleted_with_an_event(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-a")
    start_controller()
    kube.backfill("bf", model="gemma", idleFor="1s")
    job = wait_for(kube.jobs, what="Job created")[0].metadata.name
    kube.run_job(job)
    wait_for(lambda: kube.status("bf").get("phase") == "Running", what="Running")
    kube.batch.patch_namespaced_job(job, kube.ns, {"spec": {"suspend": True}})  # a human
    at = ts(now_s())
    kube.job_status(job, {"active": 0, "conditions": [{"type": "Suspended", "status": "True", "reason": "JobSuspended", "lastTransitionTime": at}]})
    wait_for(lambda: kube.job_going(job), what=f"Job {job} deleted once suspended by hand")
    events = wait_for(
        lambda: [e for e in client.CoreV1Api(kube.api).list_namespaced_event(kube.ns).items if e.reason == "JobSuspended"],
        what="a JobSuspended Event",
    )
    assert events[0].type == "Warning" and job in events[0].message and "suspended by someone else" in events[0].message
    # the next attempt: after a fresh idle window from the deletion (idleFor 1s here)
    second = wait_for(lambda: [j.metadata.name for j in kube.jobs() if j.metadata.name != job], what="the next attempt's Job")
    assert second[0].endswith("-2"), second
