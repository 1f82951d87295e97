"""Jobs a ModelBackfill owns that the log does not explain, on the real apiserver (a new user's
trial: a second controller on another schema created Jobs the leader never cancelled; two Jobs
ran on one model through foreground demand).

A Job the test creates by hand with the ModelBackfill as its controller owner (as another
controller, or one on a database restored from an older backup, would) is deleted at once,
whatever the declaration is doing; the declaration's own Job is left alone; a Warning Event
says why. The fixture's teardown replays the log with the auditor (no divergence).
"""

from __future__ import annotations

import pytest
from kubernetes import client

from backfill.core import events as ev
from backfill.core.events import decode_many

from .conftest import now_s, ts, wait_for

pytestmark = pytest.mark.kube


def _foreign_job(kube, backfill: str, name: str, owned: bool = True) -> None:
    """A Job owned by ``backfill`` (controller ownerReference, our labels) that no attempt made;
    with ``owned=False`` only our labels (no ownerReference): somebody else's Job."""
    mbf = kube.get("modelbackfills", backfill)
    uid = mbf["metadata"]["uid"]
    metadata = {"name": name, "labels": {"modelbackfill.ai.flexinfer/name": backfill, "modelbackfill.ai.flexinfer/uid": uid}}
    if owned:
        metadata["ownerReferences"] = [{
            "apiVersion": "ai.flexinfer/v1alpha2", "kind": "ModelBackfill", "name": backfill, "uid": uid,
            "controller": True, "blockOwnerDeletion": True,
        }]  # fmt: skip
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}},
    }
    kube.batch.create_namespaced_job(kube.ns, body)


def _running(kube, start_controller, node: str):
    """The declaration ``mbf`` (idleFor 2s) on a Ready Model on ``node``, its own Job admitted and
    running; returns ``(controller, job name)``."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node=node)
    kube.backfill("mbf", idleFor="2s")
    controller = start_controller()
    own = wait_for(lambda: next(iter(kube.jobs()), None), timeout=20, what="the declaration's own Job")
    kube.run_job(own.metadata.name)
    wait_for(lambda: kube.status("mbf").get("phase") == "Running", timeout=10, what="Running")
    return controller, own.metadata.name


def _events_of(controller, cls) -> list:
    rows = list(controller.events.read(0))
    return [e for e in decode_many([(r.type, r.version, r.data) for r in rows]) if isinstance(e, cls)]


def test_a_job_the_log_does_not_explain_is_deleted_and_its_own_job_is_not(kube, start_controller):
    controller, own_name = _running(kube, start_controller, "node-unexplained")

    _foreign_job(kube, "mbf", "mbf-restored-7")
    wait_for(lambda: kube.job("mbf-restored-7") is None, timeout=10, what="the unexplained Job deleted")
    assert kube.job(own_name) is not None, "the declaration's own Job was deleted too"
    assert kube.status("mbf").get("phase") == "Running"

    core = client.CoreV1Api(kube.api)
    warned = wait_for(
        lambda: [e for e in core.list_namespaced_event(kube.ns).items if e.reason == "UnexplainedJob"],
        timeout=10, what="an UnexplainedJob Event",
    )  # fmt: skip
    assert "mbf-restored-7" in warned[0].message and warned[0].type == "Warning"
    # the log holds both (the deletion's record follows the watch: waited for)
    deleted = wait_for(lambda: [e.name for e in _events_of(controller, ev.JobDeleted)], timeout=10, what="JobDeleted recorded")
    created = [e.name for e in _events_of(controller, ev.JobCreated)]
    assert "mbf-restored-7" in created and "mbf-restored-7" in deleted
    assert not [e for e in _events_of(controller, ev.AttemptCancelled)], "its own attempt was cancelled"


def test_nothing_is_admitted_while_an_unexplained_job_exists(kube, start_controller):
    """The Job is held by a finalizer, so it stays (Terminating) after the controller's delete:
    the idle window passes, yet nothing is admitted until it is gone."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-unexplained-2")
    kube.backfill("mbf", idleFor="2s")
    _foreign_job(kube, "mbf", "mbf-restored-8")
    kube.hold_job("mbf-restored-8")
    controller = start_controller()
    wait_for(lambda: (kube.job("mbf-restored-8").metadata.deletion_timestamp is not None), timeout=10, what="the delete sent")
    wait_for(lambda: kube.status("mbf").get("reason") == "UnexplainedJob", timeout=10, what="status reason UnexplainedJob")
    import time

    time.sleep(3)  # past the 2 s idle window
    assert [j.metadata.name for j in kube.jobs()] == ["mbf-restored-8"], "admitted beside an unexplained Job"
    assert not _events_of(controller, ev.AttemptAdmitted)
    kube.release_job("mbf-restored-8")
    wait_for(lambda: [j.metadata.name for j in kube.jobs() if j.metadata.name != "mbf-restored-8"], timeout=20,
             what="the declaration's own Job once the unexplained one is gone")  # fmt: skip


def test_a_job_with_only_our_labels_is_not_ours(kube, start_controller):
    """A hostile-input trial: a foreign Job carrying the ModelBackfill's labels but no controller
    ownerReference to it was deleted as unexplained, and while a finalizer held it the
    declaration's admission waited (``UnexplainedJob``). It is somebody else's: left alone, and
    the declaration is admitted when its idle window has passed."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-unexplained-3")
    kube.backfill("mbf", idleFor="2s")
    _foreign_job(kube, "mbf", "labelled-foreign", owned=False)
    kube.hold_job("labelled-foreign")
    controller = start_controller()
    own = wait_for(lambda: [j for j in kube.jobs() if j.metadata.name != "labelled-foreign"], timeout=20, what="the declaration's own Job")
    foreign = kube.job("labelled-foreign")
    assert foreign is not None and foreign.metadata.deletion_timestamp is None, "somebody else's Job was deleted"
    assert own[0].metadata.owner_references[0].name == "mbf"
    assert [e.owned for e in _events_of(controller, ev.JobCreated) if e.name == "labelled-foreign"] in ([], [False])
    kube.release_job("labelled-foreign")


def test_our_job_with_its_owner_reference_removed_is_still_cancelled(kube, start_controller):
    """Found while mending the test above: with the ownerReference alone deciding, a Job of ours
    whose ownerReference someone removed (``kubectl patch``) left the cancel path, and
    foreground demand would not have stopped it: a restarted replica's list did not find it and
    took it for gone (the attempt ended, its Job running). Its label and the uid the log knows
    keep it the attempt's Job: after the restart a lastActiveTime bump deletes it."""
    first, name = _running(kube, start_controller, "node-unexplained-4")
    kube.batch.patch_namespaced_job(name, kube.ns, [{"op": "remove", "path": "/metadata/ownerReferences"}])
    assert not kube.job(name).metadata.owner_references
    first.stop()
    second = start_controller()  # lists every kind again
    import time

    time.sleep(1.5)
    assert not [e for e in _events_of(second, ev.JobDeleted) if e.name == name], "the list took the orphaned Job for gone"
    kube.set_status("models", "gemma", {"lastActiveTime": ts(now_s())})
    wait_for(lambda: kube.job_going(name), timeout=10, what="the orphaned Job deleted")
    assert [j.metadata.name for j in kube.jobs() if not j.metadata.deletion_timestamp] == []  # nothing admitted beside it


def test_our_job_with_its_name_label_removed_is_still_followed_and_cancelled(kube, start_controller):
    """An adversarial trial: ``kubectl label job <ours> modelbackfill.ai.flexinfer/name-``. The Job
    watch selected on that label, so the API server reported the Job deleted: the attempt ended
    with its Job running, a second attempt was admitted on the same model, and foreground demand
    cancelled only that one. Jobs are watched unselected (the ownerReference decides); a list
    finds a Job the log knows by its uid. Demand deletes it, through a restart too."""
    first, name = _running(kube, start_controller, "node-unexplained-5")
    kube.batch.patch_namespaced_job(name, kube.ns, {"metadata": {"labels": {"modelbackfill.ai.flexinfer/name": None}}})
    import time

    time.sleep(3)  # past the 2 s idle window: a wrongly ended attempt would have a successor by now
    assert kube.status("mbf").get("phase") == "Running"
    first.stop()
    second = start_controller()  # lists every kind again
    time.sleep(1.5)
    assert not [e for e in _events_of(second, ev.JobDeleted) if e.name == name], "taken for gone"
    all_jobs = kube.batch.list_namespaced_job(kube.ns).items
    assert [j.metadata.name for j in all_jobs] == [name], "a second Job beside the relabelled one"
    kube.set_status("models", "gemma", {"lastActiveTime": ts(now_s())})
    wait_for(lambda: kube.job_going(name), timeout=10, what="the Job deleted")


def test_a_finished_job_another_log_left_under_an_attempts_name_is_stepped_over(kube, start_controller):
    """A new user's trial: a controller on a fresh schema beside the finished Job that an earlier
    schema's attempt 2 left. Its own attempt 2 got the same name, the create met that Job
    (AlreadyExists), whose JobCreated was in the log already: ``Starting`` for ever, no retry,
    and a later cancel deleted the old finished Job. Now the attempt after the taken name is
    created, and the finished Job stays."""
    from backfill.core.jobtemplate import job_name

    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-names-taken")
    kube.backfill("mbf", idleFor="2s")
    uid = kube.get("modelbackfills", "mbf")["metadata"]["uid"]
    old = job_name("mbf", uid, 1)
    _foreign_job(kube, "mbf", old)
    done = now_s()
    kube.job_status(old, {"startTime": ts(done), "completionTime": ts(done), "succeeded": 1, "conditions": [
        {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": ts(done)},
        {"type": "Complete", "status": "True", "lastTransitionTime": ts(done)}]})  # fmt: skip
    controller = start_controller()
    new = job_name("mbf", uid, 2)
    wait_for(lambda: kube.job(new) is not None, timeout=20, what="attempt 2's Job created")
    st = wait_for(lambda: (s := kube.status("mbf")).get("jobName") == new and s.get("phase") == "Running" and s, timeout=10,
                  what="Running with attempt 2's Job")  # fmt: skip
    assert st["attempts"] == 2
    assert kube.job(old) is not None, "the earlier log's finished Job was deleted"
    assert [e.attempt for e in _events_of(controller, ev.AttemptAdmitted)] == [2]
