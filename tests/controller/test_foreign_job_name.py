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
    # A new user's trial: the Event said "cancelled Job <name>" of the foreign Job, left running.
    said = wait_for(
        lambda: [e.message for e in kube.core.list_namespaced_event(kube.ns).items if e.reason == "ForegroundDemand"],
        timeout=10, what="the cancel's Event",
    )  # fmt: skip
    assert said and all(m.startswith(f"cancelled attempt 1 before its Job {name} was created: ") for m in said), said
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


def _suspend_of(kube, name: str):
    job = kube.job(name)
    return None if job is None else bool(job.spec.suspend)


def test_a_suspend_or_resume_under_a_known_uid_leaves_a_later_job_of_the_same_name(kube, start_controller):
    """A review of the uid-guarded DELETE: the suspending cancel and the resume of a resumable
    declaration (issue 11) PATCHed by name. Our Job went and someone created another under its
    name: a suspend re-issued from a state that still knew ours must not suspend it, a resume
    must not start a Job someone created suspended. The patch tests our uid first; the API
    server refuses it (422) and ours is observed gone (``JobDeleted`` with its uid)."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    kube.backfill("patched", idleFor="2s")
    controller = start_controller()
    ours = wait_for(lambda: next(iter(kube.jobs()), None), timeout=20, what="our Job")
    name, our_uid, key = ours.metadata.name, ours.metadata.uid, (kube.ns, "patched")
    kube.batch.delete_namespaced_job(name, kube.ns, propagation_policy="Background")
    wait_for(lambda: kube.job(name) is None, timeout=10, what="our Job gone")
    foreign_uid = _plain_job(kube, name)

    # What the actor itself observes (the Job watcher records our Job's deletion too, under the
    # same key, so the log alone cannot tell whether the actor said it: CI of c922d08).
    seen: list = []
    observe = controller.actor._observed
    controller.actor._observed = lambda e: (seen.append(e), observe(e))[1]
    controller.actor.suspend_job(key, name, True, our_uid)
    assert _suspend_of(kube, name) is False and kube.job(name).metadata.uid == foreign_uid, "the later Job was suspended"
    assert [(type(e).__name__, e.name, e.uid) for e in seen] == [("JobDeleted", name, our_uid)]
    wait_for(
        lambda: our_uid in [e.uid for _, e in log_of(controller) if isinstance(e, ev.JobDeleted) and e.name == name],
        timeout=5, what="ours gone, in the log under its uid",
    )  # fmt: skip

    kube.batch.patch_namespaced_job(name, kube.ns, {"spec": {"suspend": True}})  # its owner suspends it
    controller.actor.suspend_job(key, name, False, our_uid)
    assert _suspend_of(kube, name) is True, "someone else's suspended Job was resumed"

    # Under the Job's own uid the patch goes through (the test operation passes).
    controller.actor.suspend_job(key, name, False, foreign_uid)
    assert _suspend_of(kube, name) is False


def test_a_suspend_with_no_known_uid_reads_the_owner_first(kube, start_controller):
    """The log never saw our create confirmed (no uid): as for the delete, the Job is read first
    and left alone when this ModelBackfill does not control it; ours is observed absent."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", phase="Pending")
    mbf = kube.backfill("unconfirmed", idleFor="2s")
    name = job_name("unconfirmed", mbf["metadata"]["uid"], 1)
    _plain_job(kube, name)
    controller = start_controller()
    controller.actor.suspend_job((kube.ns, "unconfirmed"), name, True, "", mbf["metadata"]["uid"])
    assert _suspend_of(kube, name) is False, "a Job not ours was suspended"
    wait_for(
        lambda: [e.uid for _, e in log_of(controller) if isinstance(e, ev.JobDeleted) and e.name == name] == [""],
        timeout=5, what="our attempt's Job observed absent",
    )  # fmt: skip
