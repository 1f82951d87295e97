"""A cancelled Job that will not go away (held Terminating by a finalizer): the delete is
idempotent and retried with back-off (counted in the audit log), the status and an Event say the
Job is still terminating, and nothing new is admitted on that model until it is gone."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from .harness import JobPlayer, Kube, assert_replay_clean, demand, log_events, of_type, wait_for
from .workload import cluster_invariants, declare, log_invariants, settled_log_invariants, start_running, wait_job

pytestmark = pytest.mark.kube

#: How long the finalizer holds the Job (several idle windows of 2 s).
HOLD_SECONDS = 12.0
#: At least this many DELETE calls while held (retried), at most MAX (not a tight loop).
MIN_DELETES, MAX_DELETES = 2, 12


def _deletes(cluster, ns: str, job: str, user: str = "replica-a") -> list[datetime]:
    return [
        datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00"))
        for e in cluster.audit_events(user=user, verb="delete", resource="jobs", namespace=ns)
        if (e.get("objectRef") or {}).get("name") == job
    ]


def test_job_held_terminating_by_a_finalizer(fault_cluster, kube: Kube, player: JobPlayer, controllers):
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf", "gemma")])
    proc = controllers().start()
    proc.wait_ready()
    job = start_running(kube, player, "bf")
    player.add_finalizer(job)
    demand(kube, "gemma")
    wait_for(lambda: kube.job(job) is not None and kube.job(job).metadata.deletion_timestamp is not None,
             timeout=5, what=f"{job} Terminating")  # fmt: skip
    t0 = time.monotonic()
    messages = set()
    while time.monotonic() - t0 < HOLD_SECONDS:
        others = [j.metadata.name for j in kube.jobs() if j.metadata.name != job]
        assert others == [], f"admitted on the model while {job} is still terminating: {others}"
        messages.add(kube.status("bf").get("message", ""))
        time.sleep(0.25)
    deletes = _deletes(fault_cluster, kube.ns, job)
    gaps = [round((b - a).total_seconds(), 2) for a, b in zip(deletes, deletes[1:])]
    print(f"Job held Terminating {HOLD_SECONDS:.0f} s: {len(deletes)} DELETE calls, gaps {gaps} s")
    assert any("terminat" in m.lower() for m in messages), f"status never says the Job is terminating: {messages}"
    reasons = {(e.reason or "", e.message or "") for e in kube.core.list_namespaced_event(kube.ns).items
               if e.involved_object.kind == "ModelBackfill"}  # fmt: skip
    assert any("terminat" in (r + m).lower() for r, m in reasons), f"no Event says the Job is terminating: {reasons}"
    assert MIN_DELETES <= len(deletes) <= MAX_DELETES, f"{len(deletes)} DELETE calls in {HOLD_SECONDS:.0f} s (gaps {gaps})"
    assert all(b >= a * 0.9 for a, b in zip(gaps, gaps[1:])), f"retries not backing off: gaps {gaps}"

    player.remove_finalizers(job)
    wait_for(lambda: kube.job(job) is None, timeout=5, what=f"{job} gone after its finalizer is removed")
    second = wait_job(kube, "bf", attempt=2, timeout=15)
    events = log_events(pg.url, schema)
    (deleted_pos, _), = [(p, e) for p, e in of_type(events, "JobDeleted") if e.name == job]
    (admit_pos, _), = [(p, e) for p, e in of_type(events, "AttemptAdmitted") if e.attempt == 2]
    assert admit_pos > deleted_pos, "attempt 2 was admitted before attempt 1's Job was gone"
    assert second.metadata.creation_timestamp is not None
    assert cluster_invariants(kube) == []
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []
    assert_replay_clean(pg.url, schema)
