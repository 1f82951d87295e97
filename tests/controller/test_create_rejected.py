"""A refused Job create on the real API server (issue 13 item 2).

A ValidatingAdmissionPolicy (in-process CEL admission: no webhook server needed) refuses the
Job, answering 422 Invalid (permanent: Blocked ``JobRejected`` with its message, until the
CronJob changes) or 403 Forbidden (transient, like an exceeded ResourceQuota: Starting
``CreateRetrying`` with back-off, then created once the policy is gone). Neither is ``Failed``.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from backfill.core import events as ev
from backfill.core.events import decode_many

from .conftest import AdmissionPolicy, wait_for

pytestmark = pytest.mark.kube


class JobPolicy(AdmissionPolicy):
    """An :class:`AdmissionPolicy` that refuses Job creates in the test's namespace unless ``expression`` holds."""

    def __init__(self, kube, expression: str, message: str, reason: str) -> None:
        super().__init__(kube.api, kube.ns, f"refuse-jobs-{kube.ns}", "batch", "v1", "jobs", ["CREATE"], expression, message, reason)
        self.kube = kube

    def active(self, image: str) -> bool:
        """True once a dry-run create of a Job with ``image`` is refused (the policy is loaded)."""
        body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"generateName": "probe-"},
                "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": image}]}}}}
        try:
            self.kube.batch.create_namespaced_job(self.kube.ns, body, dry_run="All")
            return False
        except ApiException as exc:
            return exc.status in (403, 422)


@pytest.fixture
def policies():
    made: list[JobPolicy] = []
    yield made
    for p in made:
        p.remove()


def _events(controller, cls) -> list:
    rows = list(controller.events.read(0))
    return [e for e in decode_many([(r.type, r.version, r.data) for r in rows]) if isinstance(e, cls)]


def _pod(image: str) -> dict:
    return {"restartPolicy": "Never", "containers": [{"name": "main", "image": image}]}


def _retrying(kube, start_controller, name: str, timeout: float = 15, **spec):
    """A backfill on a fresh CronJob and Model, started until it shows CreateRetrying: (controller, status)."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    c = start_controller()
    kube.backfill(name, **spec)
    st = wait_for(lambda: (s := kube.status(name)).get("reason") == "CreateRetrying" and s, timeout=timeout, what="CreateRetrying")
    assert st["phase"] == "Starting" and kube.jobs() == []
    return c, st


def _refusal_levels(caplog, kind: str) -> set[str]:
    """The log levels of the actor's "Job ... refused (<kind>)" lines."""
    return {r.levelname for r in caplog.records if r.name == "backfill.controller.actor" and f"refused ({kind})" in r.getMessage()}


def test_a_permanent_refusal_blocks_until_the_cronjob_changes(kube, start_controller, policies, caplog):
    policy = JobPolicy(kube, "object.spec.template.spec.containers.all(c, c.image != 'forbidden-image')",
                       "image forbidden-image is not allowed here", "Invalid")
    policies.append(policy)
    wait_for(lambda: policy.active("forbidden-image"), timeout=10, what="the admission policy is active")
    kube.cronjob("model-eval-gauntlet", pod=_pod("forbidden-image"))
    kube.model("gemma")
    c = start_controller()
    kube.backfill("refused")

    st = wait_for(lambda: (s := kube.status("refused")).get("phase") == "Blocked" and s, timeout=15, what="Blocked")
    assert st["reason"] == "JobRejected"
    assert "HTTP 422 Invalid" in st["message"] and "image forbidden-image is not allowed here" in st["message"]
    assert kube.jobs() == []
    assert _events(c, ev.JobFailed) == []  # no Job existed, so no Job failed
    (rejected,) = _events(c, ev.JobCreateRejected)
    assert (rejected.code, rejected.permanent, rejected.attempt) == (422, True, 1)
    time.sleep(2)
    assert kube.status("refused")["phase"] == "Blocked" and len(_events(c, ev.AttemptAdmitted)) == 1  # no retry loop
    assert _refusal_levels(caplog, "permanent") == {"ERROR"}

    cj = kube.batch.read_namespaced_cron_job("model-eval-gauntlet", kube.ns)
    cj.spec.job_template.spec.template.spec.containers[0].image = "busybox"
    kube.batch.replace_namespaced_cron_job("model-eval-gauntlet", kube.ns, cj)
    job = wait_for(kube.jobs, timeout=15, what="a Job once the CronJob is fixed")[0]
    assert job.metadata.name.endswith("-2")
    rows = wait_for(lambda: [r for r in c.runs.query(namespace=kube.ns) if r.result], what="the refused attempt's run row")
    assert [(r.attempt, r.result, r.reason) for r in rows] == [(1, "cancelled", "JobRejected")]


def test_a_transient_refusal_is_retried_with_back_off_on_the_same_attempt(kube, start_controller, policies, caplog):
    policy = JobPolicy(kube, "false", "exceeded quota: jobs (test)", "Forbidden")
    policies.append(policy)
    wait_for(lambda: policy.active("busybox"), timeout=10, what="the admission policy is active")
    c, st = _retrying(kube, start_controller, "quota")
    assert "HTTP 403 Forbidden" in st["message"] and "exceeded quota" in st["message"]
    policy.remove()
    job = wait_for(kube.jobs, timeout=30, what="the Job once the refusal is gone")[0]
    assert job.metadata.name.endswith("-1")  # the same attempt: a refusal burns nothing
    kube.run_job(job.metadata.name)
    st = wait_for(lambda: (s := kube.status("quota")).get("phase") == "Running" and s, what="Running")
    assert st["attempts"] == 1
    refusals = _events(c, ev.JobCreateRejected)
    assert refusals and all(r.code == 403 and not r.permanent for r in refusals)
    assert [r.rejection for r in refusals] == list(range(1, len(refusals) + 1))
    assert _refusal_levels(caplog, "transient") == {"WARNING"}  # retried: a warning each time, not an error
    labels = {"backfill": "quota", "namespace": kube.ns, "model": "gemma"}
    for result in ("failed", "cancelled", "succeeded"):
        assert c.metrics.registry.get_sample_value("flexinfer_model_backfill_completions_total", {**labels, "result": result}) is None


def test_a_real_resource_quota_refusal_is_retried_and_burns_nothing(kube, start_controller):
    # A ResourceQuota of zero Jobs. No quota controller runs here, so the test writes the
    # quota's status itself (the quota admission plugin of the API server reads hard/used).
    core = client.CoreV1Api(kube.api)
    core.create_namespaced_resource_quota(kube.ns, {"metadata": {"name": "jobs"}, "spec": {"hard": {"count/jobs.batch": "0"}}})
    core.patch_namespaced_resource_quota_status(
        "jobs", kube.ns, {"status": {"hard": {"count/jobs.batch": "0"}, "used": {"count/jobs.batch": "0"}}}
    )
    c, st = _retrying(kube, start_controller, "quota", repeatAfter="1h")
    assert "HTTP 403 Forbidden" in st["message"] and "exceeded quota: jobs" in st["message"] and "nextRunTime" not in st
    (refusal, *_) = _events(c, ev.JobCreateRejected)
    assert (refusal.code, refusal.permanent, refusal.attempt) == (403, False, 1)

    core.patch_namespaced_resource_quota("jobs", kube.ns, {"spec": {"hard": {"count/jobs.batch": "1"}}})
    core.patch_namespaced_resource_quota_status(
        "jobs", kube.ns, {"status": {"hard": {"count/jobs.batch": "1"}, "used": {"count/jobs.batch": "0"}}}
    )
    (job,) = wait_for(kube.jobs, timeout=30, what="the Job once the quota allows it (first back-off: 10 s)")
    assert job.metadata.name.endswith("-1")  # the same attempt
    kube.run_job(job.metadata.name)
    st = wait_for(lambda: (s := kube.status("quota")).get("phase") == "Running" and s, what="Running")
    assert st["attempts"] == 1 and "nextRunTime" not in st  # no repeatAfter cooldown was started
    assert _events(c, ev.JobFailed) == [] and _events(c, ev.JobSucceeded) == []


def test_an_unreachable_webhook_is_transient(kube, start_controller):
    # failurePolicy Fail and nothing listening: the API server answers 500 InternalError.
    ar = client.AdmissionregistrationV1Api(kube.api)
    name = f"unreachable-{kube.ns}"
    ar.create_validating_webhook_configuration({"metadata": {"name": name}, "webhooks": [{
        "name": "unreachable.example.com", "clientConfig": {"url": "https://127.0.0.1:1/validate"},
        "rules": [{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["jobs"]}],
        "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 2,
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kube.ns}},
    }]})
    try:
        c, st = _retrying(kube, start_controller, "hook", timeout=20)
        assert "HTTP 500 InternalError" in st["message"] and "failed calling webhook" in st["message"]
        (refusal, *_) = _events(c, ev.JobCreateRejected)
        assert (refusal.code, refusal.permanent) == (500, False)
    finally:
        ar.delete_validating_webhook_configuration(name)
    (job,) = wait_for(kube.jobs, timeout=30, what="the Job once the webhook configuration is gone")
    assert job.metadata.name.endswith("-1")
    assert _events(c, ev.JobFailed) == []
