"""A resumable Job's suspension is as fail-safe as a delete (issue 11): with PostgreSQL away,
demand still sets the Job's ``spec.suspend: true`` within the cancel bound, nothing is admitted
or resumed while the log cannot record it, and once the store is back the log explains it and
the same Job is resumed after a full idle window. The Job is observed suspended while the store
is away, so that observation can reach the log before the suspend decision (found by a trial:
the attempt then stayed ``Cancelling`` for ever, waiting for an observation it had folded).

The controller runs as a real subprocess; the test plays the Job controller.
"""

from __future__ import annotations

import time

import pytest

from tests.controller.conftest import now_s
from tests.controller.test_resumable import TEMPLATE, IndexedJobPlayer, _indexed_cronjob

from .harness import JobPlayer, Kube, assert_replay_clean, demand, log_events, of_type, timed, wait_for
from .test_store_faults import OUTAGE_AFTER_DEMAND_SECONDS, store_fault
from .workload import CANCEL_BOUND_SECONDS, cluster_invariants, start_running

pytestmark = pytest.mark.kube


def _running_resumable(kube: Kube, player: JobPlayer, controllers):
    """``bf`` (``preemption: Suspend``, idleFor 2s) on Model ``gemma``, its Indexed Job admitted
    by a started controller and running: ``(controller process, Job name)``."""
    _indexed_cronjob(kube)
    kube.model("gemma", node="node-0")
    kube.backfill("bf", model="gemma", template=TEMPLATE, idleFor="2s", preemption="Suspend")
    proc = controllers().start()
    proc.wait_ready()
    return proc, start_running(kube, player, "bf")


@pytest.mark.parametrize("fault", ["stop", "lock"])
def test_demand_while_the_store_is_away_suspends_at_once(kube: Kube, player: JobPlayer, controllers, fault):
    pg, schema = controllers.pg, controllers.schema
    proc, job = _running_resumable(kube, player, controllers)
    uid = kube.job(job).metadata.uid

    def suspended() -> bool:
        j = kube.job(job)
        return j is not None and j.spec.suspend is True

    with store_fault(pg, schema, fault):
        last_active = demand(kube, "gemma")
        t0 = time.monotonic()
        try:
            seconds = timed(suspended, timeout=CANCEL_BOUND_SECONDS, what=f"Job {job} suspended with the store {fault}")
        finally:
            print(f"store {fault}: demand -> Job {job} spec.suspend true: {time.monotonic() - t0:.2f} s (bound {CANCEL_BOUND_SECONDS} s)")
        print(f"store {fault}: suspend took {seconds:.2f} s")
        IndexedJobPlayer(kube, job).suspended(now_s())  # the pods are gone: observed while the store is away
        deadline = t0 + OUTAGE_AFTER_DEMAND_SECONDS
        while time.monotonic() < deadline:  # kept, not deleted, not resumed, nothing new
            jobs = kube.jobs()
            assert [(j.metadata.uid, j.spec.suspend, j.metadata.deletion_timestamp) for j in jobs] == [(uid, True, None)]
            time.sleep(0.2)
        assert proc.alive, proc.tail()
    back = time.monotonic()

    def logged() -> bool:
        events = log_events(pg.url, schema)
        return any(e.suspend for _, e in of_type(events, "AttemptCancelled"))

    wait_for(logged, timeout=20, what="the suspend decision in the log")
    # idleFor 2s from the preemption (at the latest the observed suspension): the same Job resumes
    resumed = timed(lambda: IndexedJobPlayer(kube, job).spec_suspend() is False, timeout=20, what=f"Job {job} resumed")
    print(f"store {fault}: Job {job} resumed {time.monotonic() - back:.2f} s after the store came back ({resumed:.2f} s waited)")
    assert [j.metadata.uid for j in kube.jobs()] == [uid]
    events = log_events(pg.url, schema)
    order = [type(e).__name__ for _, e in events if type(e).__name__ in ("JobSuspended", "AttemptCancelled")]
    print(f"store {fault}: log order {order}")
    fg = [(p, e) for p, e in of_type(events, "ForegroundRequest") if e.model == "gemma"]
    assert fg[-1][1].at.strftime("%Y-%m-%dT%H:%M:%SZ") == last_active
    (_, cancel), = of_type(events, "AttemptCancelled")
    assert (cancel.reason, cancel.suspend, cancel.segment, cancel.cause) == ("ForegroundDemand", True, 1, fg[-1][0])
    (_, resume), = of_type(events, "AttemptResumed")
    assert (resume.attempt, resume.segment, resume.job_name) == (1, 2, job)
    assert cluster_invariants(kube) == []
    assert_replay_clean(pg.url, schema)


def test_a_job_someone_else_resumes_while_the_store_is_away_is_suspended_again_at_once(kube: Kube, player: JobPlayer, controllers):
    """An adversarial trial: with PostgreSQL stopped, a suspended Job that someone else resumed
    (``spec.suspend: false``, the Job controller's ``JobResumed``) ran 82 s, until the store
    came back: only the reconcile loop, which waits for the store, re-issued the suspend."""
    pg, schema = controllers.pg, controllers.schema
    proc, job = _running_resumable(kube, player, controllers)  # no resume of ours while the store is stopped (fail-closed)
    indexed = IndexedJobPlayer(kube, job)
    with store_fault(pg, schema, "stop"):
        demand(kube, "gemma")
        timed(lambda: indexed.spec_suspend() is True, timeout=CANCEL_BOUND_SECONDS, what=f"Job {job} suspended")
        indexed.suspended(now_s())
        time.sleep(1.5)  # observed suspended (in memory)
        kube.batch.patch_namespaced_job(job, kube.ns, {"spec": {"suspend": False}})  # someone else resumes it
        indexed.resumed(now_s())
        t0 = time.monotonic()
        seconds = timed(lambda: indexed.spec_suspend() is True, timeout=CANCEL_BOUND_SECONDS,
                        what=f"Job {job} suspended again with the store stopped")  # fmt: skip
        print(f"store stopped: a resume by someone else -> Job {job} spec.suspend true again: {time.monotonic() - t0:.2f} s ({seconds:.2f} s)")
        assert proc.alive, proc.tail()
    assert cluster_invariants(kube) == []


def test_a_suspend_cleared_before_any_suspended_status_is_asserted_again_while_the_store_is_away(kube: Kube, player: JobPlayer, controllers):
    """Re-trials: with PostgreSQL stopped, ``spec.suspend`` cleared right after the preemptor's
    suspend, before the Job controller wrote any ``Suspended`` status (no event reports it),
    left the Job running 65 s and 33 s (the cancel itself still spooled), until the store came
    back."""
    pg, schema = controllers.pg, controllers.schema
    proc, job = _running_resumable(kube, player, controllers)
    indexed = IndexedJobPlayer(kube, job)
    with store_fault(pg, schema, "stop"):
        demand(kube, "gemma")
        timed(lambda: indexed.spec_suspend() is True, timeout=CANCEL_BOUND_SECONDS, what=f"Job {job} suspended")
        kube.batch.patch_namespaced_job(job, kube.ns, {"spec": {"suspend": False}})  # cleared, no status
        t0 = time.monotonic()
        timed(lambda: indexed.spec_suspend() is True, timeout=CANCEL_BOUND_SECONDS, what=f"Job {job} suspended again with the store stopped")
        print(f"store stopped: spec.suspend cleared -> true again: {time.monotonic() - t0:.2f} s")
        assert proc.alive, proc.tail()
    assert cluster_invariants(kube) == []
