"""A ModelBackfill whose finalizer an operator removes while its Job still terminates, created
again under the same name (a fault trial: the new one was admitted on the same Model 1 s
later, beside the old Job's active pod): nothing is admitted there until the old Job is gone."""

from __future__ import annotations

import time

import pytest

from .conftest import wait_for

pytestmark = pytest.mark.kube

FINALIZER = "modelbackfill.ai.flexinfer/finalizer"


def test_a_recreated_declaration_waits_for_its_predecessors_terminating_job(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    start_controller()
    kube.backfill("mb2")  # idleFor 2s
    wait_for(lambda: FINALIZER in (kube.get("modelbackfills", "mb2")["metadata"].get("finalizers") or []), what="finalizer added")
    old = wait_for(kube.jobs, what="Job created")[0].metadata.name
    kube.run_job(old)
    kube.hold_job(old)  # its pods still terminating: the Job stays, deletionTimestamp set
    wait_for(lambda: kube.status("mb2").get("phase") == "Running", what="phase Running")
    kube.custom.delete_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube.ns, "modelbackfills", "mb2")
    wait_for(lambda: (kube.job(old).metadata.deletion_timestamp is not None) or None, what="the Job's deletion sent")
    kube.patch("modelbackfills", "mb2", {"metadata": {"finalizers": None}})  # the operator's force
    wait_for(lambda: kube.get("modelbackfills", "mb2") is None, what="ModelBackfill gone")
    kube.backfill("mb2")  # the same name again: a new uid, and its job name differs
    time.sleep(4)  # twice its idle window
    assert [j.metadata.name for j in kube.jobs()] == [old], "admitted beside the old Job"
    st = kube.status("mb2")
    assert st.get("reason") == "ConcurrentBackfill" and f"Job {old} of deleted ModelBackfill mb2" in st.get("message", ""), st
    kube.release_job(old)
    new = wait_for(lambda: [j.metadata.name for j in kube.jobs() if j.metadata.name != old] or None, timeout=15, what="admitted once it is gone")
    assert kube.job(old) is None and len(new) == 1
