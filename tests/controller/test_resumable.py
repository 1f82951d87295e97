"""Resumable Indexed Jobs (issue 11) on a real kube-apiserver: ``spec.preemption: Suspend``.

The test plays the Job controller (no controller-manager runs): it writes ``startTime``,
``active``, ``completedIndexes`` and the ``Suspended``/``Complete`` conditions, and when the
controller sets ``spec.suspend`` it removes the active work (``active: 0``, condition
``Suspended=True``) as the Job controller does after terminating the pods. Expected seconds are
computed from the timestamps the test itself wrote.
"""

from __future__ import annotations

import logging

from datetime import datetime, timedelta, timezone

import pytest
from kubernetes.client.exceptions import ApiException

from backfill.core import events as ev
from backfill.core.events import decode_many

from .conftest import now_s, ts, wait_for

pytestmark = pytest.mark.kube

TEMPLATE = "indexed-gauntlet"
SHARDS = 4
LABELS = lambda kube, name: {"backfill": name, "namespace": kube.ns, "model": "gemma"}  # noqa: E731


def _indexed_cronjob(kube, name: str = TEMPLATE, indexed: bool = True) -> None:
    spec: dict = {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}
    if indexed:
        spec.update(completionMode="Indexed", completions=SHARDS, parallelism=1)
    kube.batch.create_namespaced_cron_job(
        kube.ns,
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": name},
            "spec": {"schedule": "0 0 1 1 *", "suspend": True, "jobTemplate": {"spec": spec}},
        },
    )


class IndexedJobPlayer:
    """Plays the Job controller for one Indexed Job (whole-second timestamps, as the API's)."""

    def __init__(self, kube, name: str) -> None:
        self.kube, self.name = kube, name

    def _write(self, change) -> None:
        for _ in range(5):
            job = self.kube.batch.read_namespaced_job(self.name, self.kube.ns)
            body = self.kube.api.sanitize_for_serialization(job)
            status = dict(body.get("status") or {})
            change(status)
            body["status"] = status
            try:
                self.kube.batch.replace_namespaced_job_status(self.name, self.kube.ns, body)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        raise AssertionError("Job status: too many conflicts")

    def start(self, at: datetime) -> None:
        self._write(lambda s: s.update(startTime=ts(at), active=1))

    def complete_indexes(self, value: str) -> None:
        self._write(lambda s: s.update(completedIndexes=value, succeeded=_count(value)))

    def _condition(self, s: dict, type_: str, status: str, reason: str, at: datetime) -> None:
        conds = [c for c in s.get("conditions") or [] if c.get("type") != type_]
        conds.append({"type": type_, "status": status, "reason": reason, "lastTransitionTime": ts(at)})
        s["conditions"] = conds

    def suspended(self, at: datetime) -> None:
        """The pods are gone: active 0, Suspended=True; startTime cleared (reset on resume)."""

        def change(s: dict) -> None:
            s["active"] = 0
            s.pop("startTime", None)
            self._condition(s, "Suspended", "True", "JobSuspended", at)

        self._write(change)

    def resumed(self, at: datetime) -> None:
        def change(s: dict) -> None:
            s["active"] = 1
            s["startTime"] = ts(at)
            self._condition(s, "Suspended", "False", "JobResumed", at)

        self._write(change)

    def succeed(self, at: datetime) -> None:
        def change(s: dict) -> None:
            s.update(active=0, completedIndexes=f"0-{SHARDS - 1}", succeeded=SHARDS, completionTime=ts(at))
            self._condition(s, "SuccessCriteriaMet", "True", "CompletionsReached", at)
            self._condition(s, "Complete", "True", "CompletionsReached", at)

        self._write(change)

    def spec_suspend(self):
        job = self.kube.job(self.name)
        return None if job is None else bool(job.spec.suspend)


def _count(value: str) -> int:
    n = 0
    for part in value.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def _decisions(controller, cls) -> list:
    rows = list(controller.events.read(0))
    return [e for e in decode_many([(r.type, r.version, r.data) for r in rows]) if isinstance(e, cls)]


def _setup(kube, start_controller, name: str, idle_for: str = "2s"):
    _indexed_cronjob(kube)
    kube.model("gemma", node="node-a")
    c = start_controller(foreground_signal_granularity_seconds=1)
    kube.backfill(name, template=TEMPLATE, preemption="Suspend", idleFor=idle_for)
    job = wait_for(kube.jobs, timeout=10, what="first Job created")[0]
    assert job.spec.completion_mode == "Indexed"
    return c, IndexedJobPlayer(kube, job.metadata.name), job


def _preempt(kube, player: IndexedJobPlayer) -> datetime:
    """Foreground demand; wait for the controller's ``spec.suspend: true``; play the pods'
    termination. Returns the demand's lastActiveTime."""
    last_active = now_s()
    kube.set_status("models", "gemma", {"lastActiveTime": ts(last_active)})
    wait_for(lambda: player.spec_suspend() is True, timeout=5, what="Job spec.suspend true")
    return last_active


def _preempt_by_gaming(kube, player: IndexedJobPlayer) -> None:
    """Gaming intent on the model's node (kept: nothing can resume while it holds)."""
    kube.create("gamingsessions", "GamingSession", "play", {"nodeName": "node-a", "mode": "gaming"})
    wait_for(lambda: player.spec_suspend() is True, timeout=5, what="Job spec.suspend true")


def test_suspend_on_demand_resume_after_the_window_then_succeed(kube, start_controller, caplog):
    caplog.set_level(logging.INFO, logger="backfill.controller.actor")
    name = "resumable"
    # idleFor 5s: the suspension is observed and its status checked well before the resume is
    # due (with 2 s, a loaded machine folded the suspension after the window and went on to Starting)
    c, player, job = _setup(kube, start_controller, name, idle_for="5s")
    t0 = now_s()
    player.start(t0)
    wait_for(lambda: kube.status(name).get("phase") == "Running", what="phase Running")
    before_progress = datetime.now(timezone.utc)
    player.complete_indexes("0-1")
    wait_for(lambda: any(e.completed_indexes == "0-1" for e in _decisions(c, ev.JobProgress)), what="progress folded")
    after_progress = datetime.now(timezone.utc)

    last_active = _preempt(kube, player)
    kept = kube.job(player.name)
    assert kept is not None and kept.metadata.deletion_timestamp is None and kept.metadata.uid == job.metadata.uid
    assert kept.status.completed_indexes == "0-1"  # the kept shards
    t_suspended = now_s() + timedelta(seconds=1)
    player.suspended(t_suspended)
    wait_for(lambda: kube.status(name).get("phase") == "WaitingForIdle", what="phase WaitingForIdle while suspended")
    assert kube.status(name)["jobName"] == player.name
    (cancel,) = wait_for(lambda: _decisions(c, ev.AttemptCancelled), timeout=5, what="the suspending cancel recorded")
    assert (cancel.attempt, cancel.reason, cancel.suspend, cancel.segment) == (1, "ForegroundDemand", True, 1)

    # resume: the same Job, after a fresh full window (lastActiveTime + 1 s granularity + 5 s)
    wait_for(lambda: player.spec_suspend() is False, timeout=20, what="the same Job resumed")
    (resume,) = _decisions(c, ev.AttemptResumed)
    assert (resume.attempt, resume.segment, resume.job_name) == (1, 2, player.name)
    assert (resume.at - last_active).total_seconds() >= 6
    assert [j.metadata.uid for j in kube.jobs()] == [job.metadata.uid]
    t_resumed = max(now_s(), t_suspended) + timedelta(seconds=1)  # after the resume decision
    player.resumed(t_resumed)
    wait_for(lambda: kube.status(name).get("phase") == "Running", what="phase Running after resume")
    player.complete_indexes("0-3")
    t_done = t_resumed + timedelta(seconds=2)
    player.succeed(t_done)
    wait_for(lambda: kube.status(name).get("phase") == "Succeeded", what="phase Succeeded")
    # the resume's line names its decision's own position (a new user's trial: the basis, one
    # before it, as the admission's line once did), and the end's line says its seconds are the
    # last segment's (a trial read "5.0s of work" for 21 s run in three segments)
    (line,) = [r for r in caplog.records if r.getMessage().startswith("resumed attempt 1 segment 2:")]
    (resumed,) = [r.position for r in c.events.read(0) if r.type == "AttemptResumed"]
    assert line.position == resumed
    (ended,) = wait_for(lambda: [r.getMessage() for r in caplog.records if r.getMessage().startswith("attempt 1 ended: succeeded")],
                        what="the end's line")  # fmt: skip
    assert ended == f"attempt 1 ended: succeeded (Completed), Job {player.name}, 2.0s of work in segment 2, its last (backfill runs lists every segment)"

    rows = wait_for(
        lambda: (lambda rs: rs if len(rs) == 2 and all(r.result for r in rs) else None)(c.runs.query(namespace=kube.ns)),
        what="two ended segment rows",
    )
    r1, r2 = sorted(rows, key=lambda r: r.segment)
    assert (r1.attempt, r1.segment, r1.result, r1.reason, r1.completed_indexes) == (1, 1, "preempted", "ForegroundDemand", "0-1")
    assert (r2.attempt, r2.segment, r2.result, r2.completed_indexes, r2.job_name) == (1, 2, "succeeded", "2-3", player.name)
    start = max(t0, r1.admitted_at)  # the Job's whole-second startTime, never before its admission
    assert r1.started_at == start
    assert r1.running_seconds == pytest.approx((t_suspended - start).total_seconds())
    assert (before_progress - start).total_seconds() - 1e-6 <= r1.useful_seconds <= (after_progress - start).total_seconds() + 1e-6
    assert r1.wasted_seconds == pytest.approx(r1.running_seconds - r1.useful_seconds)
    assert r2.started_at == t_resumed and r2.ended_at == t_done
    assert r2.running_seconds == pytest.approx(2.0) and r2.useful_seconds == pytest.approx(2.0)

    reg, labels = c.metrics.registry, LABELS(kube, name)
    wait_for(lambda: reg.get_sample_value("flexinfer_model_backfill_completions_total", {**labels, "result": "succeeded"}) == 1, what="success counted")
    assert reg.get_sample_value("flexinfer_model_backfill_starts_total", labels) == 2
    assert reg.get_sample_value("flexinfer_model_backfill_completions_total", {**labels, "result": "preempted"}) == 1
    assert reg.get_sample_value("flexinfer_model_backfill_preemptions_total", {**labels, "reason": "ForegroundDemand"}) == 1
    assert reg.get_sample_value("flexinfer_model_backfill_useful_running_seconds_total", labels) == pytest.approx(
        r1.running_seconds + r2.running_seconds
    )
    totals = c.runs.model_totals(namespace=kube.ns)[0]
    assert totals["useful_seconds"] == pytest.approx(r1.useful_seconds + r2.useful_seconds)
    assert totals["wasted_seconds"] == pytest.approx(r1.wasted_seconds)


def _suspended(kube, start_controller, name: str, *, gaming: bool):
    """A running resumable attempt preempted (by demand, or by gaming intent that stays on so
    nothing can resume it) and observed suspended at the returned time. With demand, idleFor is
    5s: the resume is due 6-7 s after it, well after the caller's next step."""
    c, player, job = _setup(kube, start_controller, name, idle_for="2s" if gaming else "5s")
    player.start(now_s())
    wait_for(lambda: kube.status(name).get("phase") == "Running", what="phase Running")
    _preempt_by_gaming(kube, player) if gaming else _preempt(kube, player)
    t_s = now_s()
    player.suspended(t_s)
    wait_for(lambda: kube.status(name).get("phase") == "WaitingForIdle", what="suspended")
    return c, player, job, t_s


def test_suspended_job_deleted_by_someone_else_gets_a_new_attempt(kube, start_controller):
    c, player, job, _ = _suspended(kube, start_controller, "resumable-deleted", gaming=False)
    kube.batch.delete_namespaced_job(player.name, kube.ns, propagation_policy="Background")
    second = wait_for(lambda: [j for j in kube.jobs() if j.metadata.name.endswith("-2")], timeout=20, what="attempt 2's Job")[0]
    assert second.metadata.uid != job.metadata.uid and not second.spec.suspend
    assert _decisions(c, ev.AttemptResumed) == []
    # the run rows follow the log (the loop's catch-up), not the Job create: wait for attempt 2's
    rows = wait_for(lambda: (lambda rs: rs if len(rs) == 2 else None)(c.runs.query(namespace=kube.ns)), timeout=10, what="two run rows")
    assert [(r.attempt, r.segment, r.result) for r in rows] == [(1, 1, "preempted"), (2, 1, None)]


def test_suspended_job_deleted_while_no_controller_watched_is_seen_by_the_relist(kube, start_controller):
    """The relist after a restart knows the suspended Job (not live, yet it exists) and notices it vanished."""
    c, player, job, _ = _suspended(kube, start_controller, "resumable-relist", gaming=True)
    c.stop()
    kube.batch.delete_namespaced_job(player.name, kube.ns, propagation_policy="Background")
    kube.custom.delete_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube.ns, "gamingsessions", "play")
    second = start_controller(foreground_signal_granularity_seconds=1)
    gone = wait_for(lambda: [e for e in _decisions(second, ev.JobDeleted) if e.name == player.name], what="JobDeleted from the relist")
    assert len(gone) == 1
    new = wait_for(lambda: [j for j in kube.jobs() if j.metadata.name.endswith("-2")], timeout=20, what="attempt 2's Job")[0]
    assert new.metadata.uid != job.metadata.uid and _decisions(second, ev.AttemptResumed) == []


def test_suspended_job_resumed_by_someone_else_is_suspended_again(kube, start_controller):
    name = "resumable-edited"
    c, player, job, t_s = _suspended(kube, start_controller, name, gaming=True)  # nothing can resume it
    kube.batch.patch_namespaced_job(player.name, kube.ns, {"spec": {"suspend": False}})  # a human
    player.resumed(t_s + timedelta(seconds=1))
    wait_for(lambda: player.spec_suspend() is True, timeout=10, what="the controller suspends it again")
    assert kube.job(player.name).metadata.deletion_timestamp is None
    assert _decisions(c, ev.AttemptResumed) == []
    player.suspended(t_s + timedelta(seconds=2))
    wait_for(lambda: kube.status(name).get("phase") == "WaitingForIdle", what="suspended again")
    (row,) = c.runs.query(namespace=kube.ns)
    assert (row.segment, row.result, row.ended_at) == (1, "preempted", t_s)  # the foreign run is no segment


def test_spec_change_while_suspended_deletes_the_job(kube, start_controller):
    name = "resumable-changed"
    c, player, job, _ = _suspended(kube, start_controller, name, gaming=True)
    kube.patch("modelbackfills", name, {"spec": {"idleFor": "2h"}})
    wait_for(lambda: kube.job(player.name) is None, timeout=10, what="suspended Job deleted")
    # a cancel DELETEs first and is recorded after it (fail-safe): wait for the record, then
    # check the whole sequence of cancels in the log
    cancels = lambda: [(x.reason, x.suspend) for x in _decisions(c, ev.AttemptCancelled)]
    wait_for(lambda: len(cancels()) >= 2, timeout=10, what="the SpecChanged cancel recorded")
    assert cancels() == [("GamingIntent", True), ("SpecChanged", False)]


def test_non_indexed_template_with_suspend_is_blocked_and_crd_rejects_bad_values(kube, start_controller):
    _indexed_cronjob(kube, "plain", indexed=False)
    kube.model("gemma", node="node-a")
    start_controller()
    kube.backfill("not-resumable", template="plain", preemption="Suspend")
    wait_for(lambda: kube.status("not-resumable").get("reason") == "PreemptionNotResumable", what="Blocked PreemptionNotResumable")
    st = kube.status("not-resumable")
    assert st["phase"] == "Blocked" and "completionMode" in st["message"]
    assert kube.jobs() == []
    with pytest.raises(ApiException) as exc:
        kube.backfill("bad", template="plain", preemption="Sometimes")
    assert exc.value.status == 422
