"""Two replicas: the standby records the Job's deletion before the leader's cancel decision.

A cancel DELETEs first and is recorded after it (fail-safe), and a standby's watchers append what
they see too, so the log can hold ``JobDeleted`` before the ``AttemptCancelled`` that caused it
(found by trying two replicas by hand: the run row read ``cancelled``/``JobDeleted``, "deleted by
someone else", and ``preemptions_total`` missed the preemption). The leader's decision is made
late here on purpose (its store holds every append with a cancel decision for 1.5 s); the run
row and the leader's metrics must still say the gaming intent preempted it.
Two controllers on the real API server and one PostgreSQL schema; leadership is a switch.
"""

from __future__ import annotations

import time
from typing import Callable

from backfill.core import events as ev

from .conftest import LeaderSwitch, log_of, now_s, wait_for

HOLD_SECONDS = 1.5


class _LateDecisions:
    """The controller's EventStore, except that an append holding a cancel decision (or one of
    ``also``) waits :data:`HOLD_SECONDS` first (a leader whose spool commits slowly)."""

    def __init__(self, store, also: tuple[str, ...] = ()) -> None:
        self._store, self._held = store, ("AttemptCancelled", *also)

    def append(self, records):
        if any(r.type in self._held for r in records):
            time.sleep(HOLD_SECONDS)
        return self._store.append(records)

    def __getattr__(self, name):
        return getattr(self._store, name)


def _running_on_two_replicas(kube, start_controller, wrap_leader, resumable: bool = False) -> tuple:
    """A leader (its store wrapped by ``wrap_leader``) and a standby on one log, ModelBackfill
    ``busy`` Running on Model ``gemma`` (node-a) and folded by both: (leader, Job name).
    ``resumable``: an Indexed template and ``preemption: Suspend`` (issue 11)."""
    from .test_resumable import TEMPLATE, _indexed_cronjob

    if resumable:
        _indexed_cronjob(kube)
    else:
        kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-a")
    leader = start_controller(leader=LeaderSwitch(True), wrap_events=wrap_leader)
    standby = start_controller(leader=LeaderSwitch(False))
    if resumable:
        kube.backfill("busy", template=TEMPLATE, preemption="Suspend")
    else:
        kube.backfill("busy")
    job = wait_for(kube.jobs, what="Job created by the leader")[0].metadata.name
    kube.run_job(job)
    wait_for(lambda: kube.status("busy").get("phase") == "Running", what="phase Running")
    wait_for(lambda: standby.world.backfills.get((kube.ns, "busy")) is not None
             and standby.world.backfills[(kube.ns, "busy")].live_attempt is not None, what="the standby folded the attempt")
    return leader, job


def _preempted_once(kube, leader, job: str, reason: str, cause: int) -> tuple:
    """Wait until Job ``job``'s run row reads ``preempted`` for ``reason`` (a row first ended
    ``cancelled``/``JobDeleted`` is re-attributed by the late cancel) with ``cause`` as its
    deciding position, and until the leader counted one preemption for ``reason``:
    (the registry's ``get_sample_value``, the labels of ``busy``)."""

    def row():
        rows = [r for r in leader.runs.query(namespace=kube.ns, backfill="busy") if r.job_name == job]
        return rows[0] if rows and rows[0].reason not in ("", "JobDeleted") else None

    r = wait_for(row, timeout=10, what="the run row ended for its cancel")
    assert (r.result, r.reason, r.deciding_position) == ("preempted", reason, cause)
    labels = {"backfill": "busy", "namespace": kube.ns, "model": "gemma"}
    get = leader.metrics.registry.get_sample_value
    wait_for(lambda: get("flexinfer_model_backfill_preemptions_total", {**labels, "reason": reason}) == 1,
             timeout=10, what="the leader counted the preemption")
    return get, labels


def _gaming_decided_after(kube, leader, done: Callable[[], bool], observed: type) -> tuple:
    """A GamingSession on node-a; wait for ``done()`` (the leader's call took effect), then for
    the leader's cancel decision, which must reach the log after the ``observed`` event a
    replica recorded (the race these tests are about) and name the session's event as its
    cause: (the session's position, the decision)."""
    kube.create("gamingsessions", "GamingSession", "play", {"nodeName": "node-a", "mode": "gaming"})
    wait_for(done, timeout=5, what="the leader's cancel call in effect")
    cancels = wait_for(lambda: [(p, e) for p, e in log_of(leader) if isinstance(e, ev.AttemptCancelled)], timeout=15,
                       what="the leader's cancel recorded")
    log = log_of(leader)
    (gaming_pos,) = [p for p, e in log if isinstance(e, ev.GamingIntentStarted)]
    (observed_pos,) = [p for p, e in log if isinstance(e, observed)]
    (cancel_pos, cancel), = cancels
    # the race under test: the observation before the decision. Under load the other replica may
    # record it even before the session's event (the DELETE goes out before that is durable; a
    # CI run saw JobDeleted at 7, GamingIntentStarted at 8): the fold takes that too (_late_cancel)
    assert observed_pos < cancel_pos and gaming_pos < cancel_pos, log[-6:]
    assert (cancel.reason, cancel.cause) == ("GamingIntent", gaming_pos)
    return gaming_pos, cancel


def _stops_when_suspended(player) -> Callable[[], bool]:
    """A predicate for ``wait_for``: True once the controller set the Job's ``spec.suspend``,
    after playing the pods' termination (both replicas then observe the Job suspended)."""

    def suspended() -> bool:
        if player.spec_suspend() is not True:
            return False
        player.suspended(now_s())
        return True

    return suspended


def test_a_deletion_recorded_before_the_leaders_cancel_keeps_the_cancels_reason(kube, start_controller):
    leader, job = _running_on_two_replicas(kube, start_controller, _LateDecisions)

    gaming_pos, cancel = _gaming_decided_after(kube, leader, lambda: kube.job(job) is None, ev.JobDeleted)
    assert not cancel.suspend
    get, labels = _preempted_once(kube, leader, job, "GamingIntent", gaming_pos)
    assert get("flexinfer_model_backfill_completions_total", {**labels, "result": "preempted"}) == 1
    assert get("flexinfer_model_backfill_completions_total", {**labels, "result": "cancelled"}) is None


def test_a_suspension_recorded_before_the_leaders_decision_is_resumed_later(kube, start_controller):
    """``preemption: Suspend``: the standby records the Job's observed suspension before the
    leader's suspend decision (a trial with PostgreSQL away saw this order: the attempt then
    stayed ``Cancelling`` for ever, waiting for an observation it had already folded). The
    segment ends for the gaming intent, and once the session is gone the same Job is resumed."""
    from .test_resumable import IndexedJobPlayer

    leader, job = _running_on_two_replicas(kube, start_controller, _LateDecisions, resumable=True)
    player = IndexedJobPlayer(kube, job)

    suspended = _stops_when_suspended(player)

    gaming_pos, cancel = _gaming_decided_after(kube, leader, suspended, ev.JobSuspended)
    assert cancel.suspend
    _preempted_once(kube, leader, job, "GamingIntent", gaming_pos)
    wait_for(lambda: kube.status("busy").get("phase") == "WaitingForIdle", timeout=5, what="phase WaitingForIdle")
    kube.custom.delete_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube.ns, "gamingsessions", "play")
    wait_for(lambda: player.spec_suspend() is False, timeout=15, what="the same Job resumed")
    assert [j.metadata.name for j in kube.jobs()] == [job]
    log = log_of(leader)
    (resume,) = [e for _, e in log if isinstance(e, ev.AttemptResumed)]
    assert (resume.attempt, resume.segment, resume.job_name) == (1, 2, job)
    assert _audited(log) == ["admit", "suspend", "resume"]


def _report_to_the_leader(kube, leader, done: Callable[[], bool]) -> None:
    """POST one foreground report for Model gemma to the leader's ingest endpoint (only the
    leader spools it); wait for ``done()`` (the leader's call took effect) and for its cancel
    decision in the log."""
    import json
    from datetime import datetime, timezone

    from .test_ingest_standby import _post, _serve

    server, _ = _serve(leader)
    try:
        report = {"namespace": kube.ns, "model": "gemma", "time": datetime.now(timezone.utc).isoformat(), "id": "r/1"}
        status, _, payload = _post(server, json.dumps({"reports": [report]}).encode())
        assert status in (200, 202), payload
        wait_for(done, timeout=5, what="the leader's cancel call in effect")
        wait_for(lambda: [e for _, e in log_of(leader) if isinstance(e, ev.AttemptCancelled)], timeout=15, what="the cancel recorded")
    finally:
        server.shutdown()
        server.server_close()


def _audited(log) -> list[str]:
    """The replay auditor's trail of ``log`` (decision kinds), after asserting it finds no
    divergence and nothing unverifiable."""
    from backfill.core.audit import Auditor

    auditor = Auditor()
    for position, e in log:
        auditor.feed(position, e)
    assert auditor.divergences == [] and auditor.unverifiable == []
    return [x.decision for x in auditor.trail]


def test_an_ingest_report_whose_deletion_is_recorded_first_is_still_its_preemption(kube, start_controller):
    """The report goes to the leader only (ingest), so the log gets it from the leader's spool,
    after the standby's JobDeleted (a new user's trial: 8 of 10 such cancels read
    ``cancelled``/``JobDeleted`` and ``backfill replay`` diverged). The run is preempted by the
    report and the replay auditor finds no divergence."""
    leader, job = _running_on_two_replicas(kube, start_controller, lambda s: _LateDecisions(s, also=("ForegroundRequest",)))
    _report_to_the_leader(kube, leader, lambda: kube.job(job) is None)
    log = log_of(leader)
    (request_pos,) = [p for p, e in log if isinstance(e, ev.ForegroundRequest)]
    (deleted_pos,) = [p for p, e in log if isinstance(e, ev.JobDeleted)]
    assert deleted_pos < request_pos, log[-6:]  # the order this test is about
    _preempted_once(kube, leader, job, "ForegroundDemand", request_pos)
    _audited(log)


def test_an_ingest_report_whose_suspension_is_recorded_first_is_still_resumed(kube, start_controller):
    """``preemption: Suspend`` and a report only the leader spools: the standby's
    ``JobSuspended`` reaches the log before the report *and* the decision (a trial with the store
    away: the attempt stayed Suspending for ever, its Job re-PATCHed every 30 s). The decision
    takes that observation; the same Job is resumed after the window."""
    from .test_resumable import IndexedJobPlayer

    leader, job = _running_on_two_replicas(
        kube, start_controller, lambda s: _LateDecisions(s, also=("ForegroundRequest",)), resumable=True
    )
    player = IndexedJobPlayer(kube, job)

    suspended = _stops_when_suspended(player)

    _report_to_the_leader(kube, leader, suspended)
    log = log_of(leader)
    (request_pos,) = [p for p, e in log if isinstance(e, ev.ForegroundRequest)]
    (suspended_pos,) = [p for p, e in log if isinstance(e, ev.JobSuspended)]
    (cancel_pos,) = [p for p, e in log if isinstance(e, ev.AttemptCancelled)]
    assert suspended_pos < request_pos < cancel_pos, log[-6:]  # the order this test is about
    _preempted_once(kube, leader, job, "ForegroundDemand", request_pos)
    wait_for(lambda: player.spec_suspend() is False, timeout=15, what="the same Job resumed")
    assert [j.metadata.name for j in kube.jobs()] == [job]
    assert _audited(log_of(leader)) == ["admit", "suspend", "resume"]


def test_a_run_that_ends_while_no_replica_leads_is_counted_by_the_next_leader(kube, start_controller):
    # A new user's trial: the leader was SIGKILLed, the Job completed meanwhile, and the replica
    # that took over had folded the end as a standby: completions_total and the useful seconds
    # were counted by no replica (the sum over replicas said 1 start, 0 completions).
    from datetime import timedelta

    from .conftest import LeaderSwitch as Switch, ts

    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-a")
    a_lease, b_lease = Switch(True), Switch(False)
    a = start_controller(leader=a_lease)
    b = start_controller(leader=b_lease)
    kube.backfill("busy")
    job = wait_for(kube.jobs, what="Job created by the leader")[0].metadata.name
    a_lease.leading = False  # the leader is gone (its lease lapses); nobody acts
    began = now_s() + timedelta(seconds=1)  # after its admission (a run counts from neither before)
    done = began + timedelta(seconds=7)
    kube.job_status(job, {
        "startTime": ts(began), "completionTime": ts(done), "succeeded": 1,
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": ts(done)},
            {"type": "Complete", "status": "True", "lastTransitionTime": ts(done)},
        ],
    })  # fmt: skip

    def row():
        rows = [r for r in b.runs.query(namespace=kube.ns, backfill="busy") if r.job_name == job and r.result]
        return rows[0] if rows else None

    r = wait_for(row, timeout=10, what="the run row ended")
    assert r.result == "succeeded"
    ended = [p for p, e in log_of(b) if type(e) is ev.JobSucceeded]
    wait_for(lambda: a.position >= ended[0] and b.position >= ended[0], what="both replicas folded the end")
    labels = {"backfill": "busy", "namespace": kube.ns, "model": "gemma"}

    def total(name: str, extra: dict | None = None) -> float:
        return sum(c.metrics.registry.get_sample_value(name, {**labels, **(extra or {})}) or 0.0 for c in (a, b))

    assert total("flexinfer_model_backfill_completions_total", {"result": "succeeded"}) == 0  # nobody acted yet
    b_lease.leading = True  # the standby takes over
    kube.model("other", node="node-b")  # any new event: the next batch it folds
    wait_for(lambda: total("flexinfer_model_backfill_completions_total", {"result": "succeeded"}) == 1,
             timeout=10, what="the new leader counted the completion")  # fmt: skip
    get_b = b.metrics.registry.get_sample_value
    assert get_b("flexinfer_model_backfill_completions_total", {**labels, "result": "succeeded"}) == 1
    assert total("flexinfer_model_backfill_starts_total") == 1  # the start: counted once, by the old leader
    assert abs(total("flexinfer_model_backfill_useful_running_seconds_total") - r.running_seconds) < 1e-6
    assert r.running_seconds == 7.0
