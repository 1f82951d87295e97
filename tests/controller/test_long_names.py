"""A ModelBackfill name as long as the CRD accepts (253 characters) runs (issue 13 item 1).

Every label value and name the controller writes stays valid (label values <= 63 characters,
Job name <= 63), and the controller still finds its Job: the Job watcher selects on the label
key and maps a Job back to its ModelBackfill by the controller ownerReference.
"""

from __future__ import annotations

import re

import pytest
from kubernetes import client

from backfill.core.jobtemplate import BACKFILL_LABEL, UID_LABEL

from .conftest import now_s, ts, wait_for

pytestmark = pytest.mark.kube

# A DNS subdomain of exactly 253 characters, with dots (the Job name is cut at one of them).
LONG = ".".join(["model-eval-" + "x" * 49] * 4) + "-" + "y" * 9
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def test_a_253_character_name_gets_its_job_and_is_cancelled(kube, start_controller):
    assert len(LONG) == 253
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-a")
    start_controller()
    uid = kube.backfill(LONG)["metadata"]["uid"]

    job = wait_for(kube.jobs, timeout=10, what="the Job of the long-named backfill")[0]
    assert len(job.metadata.name) <= 63
    for key, value in job.metadata.labels.items():
        assert len(value) <= 63 and LABEL_VALUE.fullmatch(value), (key, value)
    assert job.metadata.labels[UID_LABEL] == uid
    assert job.metadata.labels[BACKFILL_LABEL] != LONG  # hashed, not the full name
    owner = job.metadata.owner_references[0]
    assert (owner.name, owner.uid, owner.controller) == (LONG, uid, True)

    # The controller maps the Job back to the backfill: its status follows the Job.
    kube.run_job(job.metadata.name)
    st = wait_for(lambda: kube.status(LONG).get("phase") == "Running" and kube.status(LONG), what="phase Running")
    assert st["jobName"] == job.metadata.name

    kube.set_status("models", "gemma", {"lastActiveTime": ts(now_s())})
    wait_for(lambda: kube.job(job.metadata.name) is None, timeout=5, what="Job deleted on foreground demand")
    wait_for(lambda: kube.status(LONG).get("phase") == "WaitingForIdle", what="phase WaitingForIdle")

    def reasons():  # the Kubernetes Events on the ModelBackfill (sent from a side thread)
        items = client.CoreV1Api(kube.api).list_namespaced_event(kube.ns).items
        return {e.reason for e in items if e.involved_object.name == LONG}

    wait_for(lambda: {"Admitted", "ForegroundDemand"} <= reasons(), what="Events recorded for the long name")


def _indexed_cronjob(kube, name: str, completions: int) -> None:
    """A suspended CronJob whose Jobs are Indexed (what ``spec.preemption: Suspend`` needs)."""
    pod = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}
    kube.batch.create_namespaced_cron_job(kube.ns, {
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name},
        "spec": {"schedule": "0 0 1 1 *", "suspend": True, "jobTemplate": {"spec": {
            "completionMode": "Indexed", "completions": completions, "parallelism": 1, "backoffLimit": 0,
            "template": {"spec": pod},
        }}},
    })


@pytest.mark.parametrize("name", [LONG, "model.eval.gemma"], ids=["253-characters", "dotted"])
def test_an_indexed_job_is_created_for_any_name(kube, start_controller, name):
    # The API server requires "<job name>-<completions-1>" to be a DNS label (the pods' hostname):
    # at most 63 characters and no dots. A Job name that is only a DNS subdomain is refused (422).
    _indexed_cronjob(kube, "model-eval-gauntlet", completions=100000)
    kube.model("gemma", node="node-a")
    start_controller()
    kube.backfill(name)
    (job,) = wait_for(kube.jobs, timeout=10, what="the Indexed Job")
    assert kube.status(name).get("reason") != "JobRejected"
    hostname = f"{job.metadata.name}-99999"
    assert len(hostname) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", hostname), hostname
