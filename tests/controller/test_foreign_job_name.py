"""A Job of someone else's under the name of one of our attempts is never deleted (an
adversarial trial: a Job created by hand as ``<backfill>-<6 hex of sha256(uid)>-1`` before the
Model became Ready; our create was refused AlreadyExists, not owned, and the cancel for the
foreground demand that followed DELETEd it by name: someone else's workload destroyed).

On the real apiserver: the cancel reads the Job first when the log never saw our create
confirmed (no uid), and DELETEs with a uid precondition when it did; the foreign Job is still
there after the cancel, and our attempt ends all the same.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from backfill.core import events as ev
from backfill.core.jobtemplate import job_name

from .conftest import log_of, now_s, ts, wait_for

pytestmark = pytest.mark.kube


def _plain_job(kube, name: str) -> str:
    """A Job with no owner and none of our labels (someone else's); returns its uid."""
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}},
    }
    return kube.batch.create_namespaced_job(kube.ns, body).metadata.uid


def test_a_foreign_job_under_our_attempts_name_survives_the_cancel(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", phase="Pending")
    mbf = kube.backfill("foreign", idleFor="2s")
    name = job_name("foreign", mbf["metadata"]["uid"], 1)
    foreign_uid = _plain_job(kube, name)
    controller = start_controller(foreground_signal_granularity_seconds=0)
    kube.set_status("models", "gemma", {"phase": "Ready"})
    wait_for(lambda: kube.status("foreign").get("reason") == "CreateRetrying", timeout=20, what="our create refused: not ours")
    assert "not owned by this ModelBackfill" in kube.status("foreign").get("message", "")

    kube.set_status("models", "gemma", {"phase": "Ready", "lastActiveTime": ts(now_s() + timedelta(seconds=1))})

    def ended() -> bool:
        b = controller.world.backfills.get((kube.ns, "foreign"))
        return b is not None and b.attempt is not None and b.attempt.number == 1 and b.attempt.result is not None

    wait_for(ended, timeout=10, what="attempt 1 ended by the cancel")
    job = kube.job(name)
    assert job is not None and job.metadata.uid == foreign_uid, "someone else's Job was deleted"
    log = log_of(controller)
    (cancel,) = [e for _, e in log if isinstance(e, ev.AttemptCancelled)]
    assert (cancel.attempt, cancel.reason) == (1, "ForegroundDemand")
    assert [e.uid for _, e in log if isinstance(e, ev.JobDeleted) and e.name == name] == [""]  # ours never existed
    # The next attempt gets its own name and runs; the foreign Job is still untouched.
    second = job_name("foreign", mbf["metadata"]["uid"], 2)
    wait_for(lambda: kube.job(second), timeout=20, what="attempt 2's own Job")
    assert kube.job(name).metadata.uid == foreign_uid


def test_a_delete_under_a_known_uid_leaves_a_later_job_of_the_same_name(kube, start_controller):
    """Our Job went, someone created another under its name, then a cancel's DELETE went out
    (re-issued from a state that still knew ours): the uid precondition refuses it (409), which
    the delete takes as ours gone (no error raised)."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    kube.backfill("reused", idleFor="2s")
    controller = start_controller()
    ours = wait_for(lambda: next(iter(kube.jobs()), None), timeout=20, what="our Job")
    name, our_uid = ours.metadata.name, ours.metadata.uid
    kube.batch.delete_namespaced_job(name, kube.ns, propagation_policy="Background")
    wait_for(lambda: kube.job(name) is None, timeout=10, what="our Job gone")
    foreign_uid = _plain_job(kube, name)
    controller.actor.delete_job((kube.ns, "reused"), name, our_uid)
    job = kube.job(name)
    assert job is not None and job.metadata.uid == foreign_uid, "the later Job of that name was deleted"
    # Under its own uid the DELETE goes through, in the background: gone at once (no garbage
    # collector runs here; an orphaning delete would leave it held by the orphan finalizer).
    controller.actor.delete_job((kube.ns, "reused"), name, foreign_uid)
    wait_for(lambda: kube.job(name) is None, timeout=5, what="the Job deleted under its own uid")


def test_a_job_of_ours_recreated_under_an_ended_attempts_name_is_deleted(kube, start_controller):
    """A review: attempt 1 succeeded and its Job went; a Job the ModelBackfill owns appears again
    under that name (another controller on another log). It is unexplained and deleted under its
    own uid, not under attempt 1's (whose precondition would fail and be taken for done)."""
    from .test_contender_wakeup import _end
    from .test_unexplained_jobs import _foreign_job

    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    kube.backfill("oneshot", idleFor="2s")  # one-shot: nothing is admitted after the success
    controller = start_controller()
    name = wait_for(lambda: next(iter(kube.jobs()), None), timeout=20, what="attempt 1's Job").metadata.name
    _end(kube, name, "succeeded")
    wait_for(lambda: kube.status("oneshot").get("phase") == "Succeeded", timeout=10, what="Succeeded")
    kube.batch.delete_namespaced_job(name, kube.ns, propagation_policy="Background")  # a TTL controller's cleanup
    wait_for(
        lambda: [e for _, e in log_of(controller) if isinstance(e, ev.JobDeleted) and e.name == name],
        timeout=10, what="the deletion in the log",
    )  # fmt: skip
    _foreign_job(kube, "oneshot", name)
    wait_for(lambda: kube.job(name) is None, timeout=10, what="the unexplained Job under attempt 1's name deleted")
