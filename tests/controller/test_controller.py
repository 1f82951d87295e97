"""The controller on a real kube-apiserver (tests/envtest): the seed's contract, end to end.

No controller-manager runs: the tests play the Job controller (they write Job status) and a Job
deleted with propagationPolicy Background disappears at once.
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from backfill.core import events as ev
from backfill.core.events import decode_many

from .conftest import HOLD, PhaseRecorder, now_s, ts, wait_for

pytestmark = pytest.mark.kube


def _decisions(controller, cls) -> list:
    rows = list(controller.events.read(0))
    return [e for e in decode_many([(r.type, r.version, r.data) for r in rows]) if isinstance(e, cls)]


def _env(container) -> dict:
    return {e.name: (e.value, e.value_from) for e in container.env or []}


def test_seed_example_end_to_end(kube, start_controller):
    kube.cronjob(
        "model-eval-gauntlet",
        env=[
            {"name": "MODELS", "valueFrom": {"configMapKeyRef": {"name": "models", "key": "list"}}},
            {"name": "KEEP", "value": "literal"},
        ],
        init=True,
    )
    kube.model("gemma", node="node-a")
    c = start_controller(foreground_signal_granularity_seconds=3)  # lastActiveTime may lag by up to 3 s
    mbf = kube.backfill("model-eval-gemma", env={"MODELS": "gemma=vllm", "GAUNTLET_API": "chat"})
    uid = mbf["metadata"]["uid"]

    jobs = wait_for(kube.jobs, timeout=10, what="first Job created")
    assert len(jobs) == 1
    job = jobs[0]
    assert re.fullmatch(r"model-eval-gemma-[0-9a-f]{6}-1", job.metadata.name)
    # the Job's creationTimestamp, whichever of the actor and the watcher records it first (a new
    # user's trial: status.startedAt had whole seconds or microseconds, depending on which did)
    logged = wait_for(lambda: [e for e in _decisions(c, ev.JobCreated) if e.name == job.metadata.name], what="JobCreated logged")
    assert [e.at for e in logged] == [job.metadata.creation_timestamp]
    owners = job.metadata.owner_references
    assert [(o.kind, o.name, o.uid, o.controller) for o in owners] == [("ModelBackfill", "model-eval-gemma", uid, True)]
    assert job.spec.active_deadline_seconds == 900
    assert job.metadata.labels["app"] == "gauntlet"
    containers = job.spec.template.spec.containers
    main = _env(containers[0])
    assert main["MODELS"] == ("gemma=vllm", None)  # valueFrom removed
    assert main["KEEP"] == ("literal", None)
    assert main["GAUNTLET_API"] == ("chat", None)
    assert main["FLEXINFER_WORKLOAD_CLASS"] == ("background", None)
    side = _env(containers[1])
    assert side["MODELS"] == ("gemma=vllm", None) and side["FLEXINFER_WORKLOAD_CLASS"] == ("background", None)
    assert _env(job.spec.template.spec.init_containers[0])["FLEXINFER_WORKLOAD_CLASS"] == ("background", None)
    kube.run_job(job.metadata.name)
    wait_for(lambda: kube.status("model-eval-gemma").get("phase") == "Running", what="phase Running")
    st = kube.status("model-eval-gemma")
    assert st["jobName"] == job.metadata.name and st["attempts"] == 1 and st["nodeName"] == "node-a"
    assert [c_["status"] for c_ in st["conditions"] if c_["type"] == "Ready"] == ["True"]

    recorder = PhaseRecorder(kube.api, kube.ns, "model-eval-gemma")
    try:
        wait_for(lambda: recorder.phases == ["Running"], what="recorder sees Running")
        kube.hold_job(job.metadata.name)  # the Job stays terminating: Cancelling must show
        last_active = now_s()
        kube.set_status("models", "gemma", {"lastActiveTime": ts(last_active)})
        wait_for(lambda: kube.job(job.metadata.name).metadata.deletion_timestamp, timeout=5, what="Job deleted")
        cancelling = wait_for(lambda: (s := kube.status("model-eval-gemma")).get("phase") == "Cancelling" and s, what="Cancelling")
        assert (cancelling["reason"], cancelling["jobName"]) == ("ForegroundDemand", job.metadata.name)
        kube.release_job(job.metadata.name)
        wait_for(lambda: kube.job(job.metadata.name) is None, timeout=5, what="Job gone")
        wait_for(lambda: "WaitingForIdle" in recorder.phases, what="phase WaitingForIdle")
    finally:
        recorder.stop()
    assert recorder.phases[:3] == ["Running", "Cancelling", "WaitingForIdle"]
    # A cancel DELETEs first and is recorded after (fail-safe): the Job can be gone before the record.
    cancels = wait_for(lambda: _decisions(c, ev.AttemptCancelled), timeout=5, what="the cancel recorded")
    assert [(x.attempt, x.reason) for x in cancels] == [(1, "ForegroundDemand")]

    rows = wait_for(lambda: [r for r in c.runs.query(namespace=kube.ns) if r.result], what="run row ended")
    assert [(r.attempt, r.result, r.reason) for r in rows] == [(1, "preempted", "ForegroundDemand")]
    labels = {"backfill": "model-eval-gemma", "namespace": kube.ns, "model": "gemma"}
    reg = c.metrics.registry
    assert reg.get_sample_value("flexinfer_model_backfill_preemptions_total", {**labels, "reason": "ForegroundDemand"}) == 1
    assert reg.get_sample_value("flexinfer_model_backfill_completions_total", {**labels, "result": "preempted"}) == 1

    second = wait_for(
        lambda: [j for j in kube.jobs() if j.metadata.name.endswith("-2")], timeout=15, what="second Job (attempt 2)"
    )[0]
    # a fresh idleFor (2 s) counted from lastActiveTime + its granularity (3 s)
    assert (second.metadata.creation_timestamp - last_active).total_seconds() >= 5
    wait_for(lambda: reg.get_sample_value("flexinfer_model_backfill_starts_total", labels) == 2, what="starts_total 2")


def test_blocked_reasons(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.cronjob("gpu-template", resources={"limits": {"nvidia.com/gpu": "1"}})
    kube.model("gemma")
    start_controller()
    cases = {
        "no-template": ({"template": "missing"}, "TemplateNotFound"),
        "gpu": ({"template": "gpu-template"}, "GPURequestForbidden"),
        # InvalidEnvironment / InvalidRepeatAfter: the CRD now rejects them at admission (422,
        # tests/ship/test_crd_admission.py); the controller's own checks are in tests/core.
        "no-model": ({"model": "ghost"}, "ModelNotFound"),
    }
    for name, (spec, _) in cases.items():
        kube.backfill(name, **spec)
    for name, (_, reason) in cases.items():
        st = wait_for(lambda: kube.status(name).get("phase") == "Blocked" and kube.status(name), what=f"{name} Blocked")
        assert st["reason"] == reason, name
    def event_reasons():  # Events are sent from a side thread: wait for them
        events = client.CoreV1Api(kube.api).list_namespaced_event(kube.ns).items
        return {e.reason for e in events if e.involved_object.kind == "ModelBackfill"}

    wanted = {r for _, r in cases.values()}
    wait_for(lambda: event_reasons() >= wanted, what="an Event for every Blocked reason")
    assert kube.jobs() == []


def _running(kube, name: str):
    job = wait_for(kube.jobs, what="Job created")[0]
    kube.run_job(job.metadata.name)
    wait_for(lambda: kube.status(name).get("phase") == "Running", what="phase Running")
    return job


def test_gaming_intent_and_suspend_cancel(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-a")
    kube.model("llama", node="node-b")
    c = start_controller()
    kube.backfill("gaming", model="gemma")
    kube.backfill("susp", model="llama")
    jobs = wait_for(lambda: len(kube.jobs()) == 2 and kube.jobs(), what="two Jobs")
    for j in jobs:
        kube.run_job(j.metadata.name)
    session = kube.create("gamingsessions", "GamingSession", "play", {"nodeName": "node-a", "mode": "gaming"})
    session["metadata"]["finalizers"] = [HOLD]
    kube.custom.replace_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube.ns, "gamingsessions", "play", session)
    kube.patch("modelbackfills", "susp", {"spec": {"suspend": True}})
    wait_for(lambda: kube.jobs() == [], what="both Jobs deleted")
    wait_for(lambda: kube.status("susp").get("phase") == "Suspended", what="susp Suspended")
    st = wait_for(lambda: kube.status("gaming").get("reason") == "GamingIntent" and kube.status("gaming"), what="gaming waits")
    assert st["phase"] == "WaitingForIdle"
    cancels = wait_for(lambda: len(found := _decisions(c, ev.AttemptCancelled)) >= 2 and found,
                       timeout=5, what="both cancels recorded (after their DELETEs)")  # fmt: skip
    reasons = {(x.backfill, x.reason) for x in cancels}
    assert reasons == {("gaming", "GamingIntent"), ("susp", "Suspended")}

    # A session being deleted (its finalizer still held) is still gaming intent.
    kube.custom.delete_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube.ns, "gamingsessions", "play")
    assert kube.get("gamingsessions", "play")["metadata"]["deletionTimestamp"]
    with pytest.raises(AssertionError):
        wait_for(kube.jobs, timeout=3, what="no Job while the session is terminating")
    assert kube.status("gaming")["reason"] == "GamingIntent"
    gone = kube.get("gamingsessions", "play")
    gone["metadata"]["finalizers"] = []
    kube.custom.replace_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube.ns, "gamingsessions", "play", gone)
    job = wait_for(kube.jobs, timeout=10, what="new attempt once the session is gone")[0]
    assert job.metadata.name.endswith("-2") and job.metadata.labels["modelbackfill.ai.flexinfer/name"] == "gaming"


class _Switch:
    def __init__(self) -> None:
        self.leading = False

    def is_leader(self) -> bool:
        return self.leading


def test_only_the_leader_acts(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    switch = _Switch()
    c = start_controller(leader=switch)
    kube.backfill("led")
    with pytest.raises(AssertionError):
        wait_for(kube.jobs, timeout=3, what="no Job from a standby")
    assert _decisions(c, ev.AttemptAdmitted) == [] and kube.status("led") == {}
    switch.leading = True
    wait_for(kube.jobs, timeout=5, what="Job once leading")
    wait_for(lambda: kube.status("led").get("phase") in ("Starting", "Running"), what="status written by the leader")


def test_deletion_cancels_then_releases_finalizer(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    c = start_controller()
    kube.backfill("doomed")
    wait_for(lambda: "modelbackfill.ai.flexinfer/finalizer" in (kube.get("modelbackfills", "doomed")["metadata"].get("finalizers") or []), what="finalizer added")
    job = _running(kube, "doomed")
    kube.custom.delete_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube.ns, "modelbackfills", "doomed")
    wait_for(lambda: kube.get("modelbackfills", "doomed") is None, what="ModelBackfill gone")
    assert kube.job(job.metadata.name) is None
    cancels = wait_for(lambda: _decisions(c, ev.AttemptCancelled), timeout=5, what="the cancel recorded (after its DELETE)")
    assert [x.reason for x in cancels] == ["Deleted"]
    # recorded right after the finalizer's removal (which lets the object go): wait for the log
    wait_for(lambda: len(_decisions(c, ev.FinalizerReleased)) == 1, timeout=5, what="FinalizerReleased in the log")


def test_success_with_repeat_after_and_failure_is_terminal(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-a")
    kube.model("llama", node="node-b")
    start_controller()
    kube.backfill("ok", model="gemma", repeatAfter="1m")
    kube.backfill("bad", model="llama")
    jobs = wait_for(lambda: len(kube.jobs()) == 2 and kube.jobs(), what="two Jobs")
    by = {j.metadata.labels["modelbackfill.ai.flexinfer/name"]: j for j in jobs}
    done = now_s()
    kube.job_status(by["ok"].metadata.name, {
        "startTime": ts(done - timedelta(seconds=1)), "completionTime": ts(done), "succeeded": 1,
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": ts(done)},
            {"type": "Complete", "status": "True", "lastTransitionTime": ts(done)},
        ],
    })
    kube.job_status(by["bad"].metadata.name, {
        "startTime": ts(done - timedelta(seconds=1)), "failed": 1,
        "conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "DeadlineExceeded", "lastTransitionTime": ts(done)},
            {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "lastTransitionTime": ts(done)},
        ],
    })
    st = wait_for(lambda: kube.status("ok").get("phase") == "Succeeded" and kube.status("ok"), what="ok Succeeded")
    assert st["completionTime"] == ts(done)
    assert st["nextRunTime"] == ts(done + timedelta(minutes=1))
    assert st["reason"] == "RepeatScheduled"
    bad = wait_for(lambda: kube.status("bad").get("phase") == "Failed" and kube.status("bad"), what="bad Failed")
    assert bad["reason"] == "DeadlineExceeded"
    assert [c_["status"] for c_ in bad["conditions"] if c_["type"] == "Ready"] == ["False"]
    # Terminal: no second Job for the failed one (well past its idle window).
    with pytest.raises(AssertionError):
        wait_for(lambda: len(kube.jobs()) > 2, timeout=3, what="no more Jobs")
    assert kube.status("bad")["attempts"] == 1


def test_two_controllers_race_create_one_job(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    a = start_controller()
    b = start_controller()
    kube.backfill("race")
    wait_for(kube.jobs, what="Job created")
    wait_for(lambda: a.position == b.position == a.events.head(), what="both folded")
    with pytest.raises(AssertionError):
        wait_for(lambda: len(kube.jobs()) > 1, timeout=2, what="a second Job")
    assert len(kube.jobs()) == 1
    assert len(_decisions(a, ev.AttemptAdmitted)) == 1


def test_status_conflict_is_retried_without_losing_fields(kube, start_controller, monkeypatch):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    kube.backfill("conflict", idleFor="1h")
    c = start_controller()
    calls = []
    real = c.actor.custom.replace_namespaced_custom_object_status

    def racing(group, version, ns, plural, name, body, **kw):
        calls.append(body["status"].get("phase"))
        if len(calls) == 1:  # another writer gets in between our read and our write
            for _ in range(10):  # (its own write may race with an earlier one of ours: retry it)
                other = kube.get("modelbackfills", name)
                other.setdefault("status", {})["conditions"] = [
                    {"type": "Audited", "status": "True", "reason": "Checked", "message": "by someone else", "lastTransitionTime": ts(now_s())}
                ]
                try:
                    real(group, version, ns, plural, name, other)
                    break
                except ApiException as exc:
                    if exc.status != 409:
                        raise
        return real(group, version, ns, plural, name, body, **kw)

    monkeypatch.setattr(c.actor.custom, "replace_namespaced_custom_object_status", racing)
    c.actor.forget((kube.ns, "conflict"))
    kube.patch("modelbackfills", "conflict", {"spec": {"idleFor": "2h"}})
    st = wait_for(lambda: kube.status("conflict").get("observedGeneration") == 2 and kube.status("conflict"), what="status of generation 2")
    assert len(calls) >= 2
    types = {c_["type"]: c_ for c_ in st["conditions"]}
    assert set(types) == {"Ready", "Audited"}
    assert types["Audited"]["message"] == "by someone else"
    assert st["phase"] == "WaitingForIdle" and st["reason"] == "IdleWindow" and st["idleSince"]


def test_restart_refolds_the_log_and_relist_sees_what_vanished(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    kube.backfill("restart", idleFor="1h")
    first = start_controller()
    wait_for(lambda: kube.status("restart").get("reason") == "IdleWindow", what="waiting for idle")
    first.stop()
    kube.batch.delete_namespaced_cron_job("model-eval-gauntlet", kube.ns, propagation_policy="Background")
    second = start_controller()
    assert second.position >= first.position  # refolded the whole log before watching
    assert (kube.ns, "restart") in second.world.backfills
    st = wait_for(lambda: kube.status("restart").get("phase") == "Blocked" and kube.status("restart"), what="Blocked after restart")
    assert st["reason"] == "TemplateNotFound"
    missing = _decisions(second, ev.CronJobMissing)
    assert [m.name for m in missing] == ["model-eval-gauntlet"]


def test_the_admission_log_line_names_its_decision_s_position(kube, start_controller, caplog):
    """A new user's trial: ``admitted attempt 1`` said ``"position": 4`` (the world it was decided
    on) while its AttemptAdmitted was at 5, where a cancel's line names its event's own position."""
    caplog.set_level(logging.INFO, logger="backfill.controller.actor")
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-a")
    c = start_controller()
    kube.backfill("model-eval-gemma")
    wait_for(kube.jobs, timeout=10, what="first Job created")
    (line,) = [r for r in caplog.records if r.getMessage().startswith("admitted attempt 1:")]
    (admitted,) = [r.position for r in c.events.read(0) if r.type == "AttemptAdmitted"]
    assert line.position == admitted
