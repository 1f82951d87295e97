"""Resumable Indexed Jobs (issue 11): fold and decide rules of ``spec.preemption: Suspend``.

Every expected value is computed here from the times and indexes the test itself folds.
"""

from __future__ import annotations

import pytest

from backfill.core import events as ev
from backfill.core import indexes
from backfill.core.audit import Auditor
from backfill.core.commands import Admit, Block, Cancel, DeleteJob, Resume, ResumeJob, SuspendJob, WakeAt
from backfill.core.projector import decide, status_of
from backfill.core.runs import previous_row, run_rows
from backfill.core.spec import SpecProblem, parse_spec
from backfill.core.state import CANCELLING, RUNNING, STARTING, SUSPENDED, SUSPENDING

from .builders import NS, TEMPLATE, Log, run_rows_of, t

INDEXED = {"spec": {"completionMode": "Indexed", "completions": 5, "parallelism": 1, **TEMPLATE["spec"]}}
KEY = (NS, "b")
IDLE = 600.0  # the builders' idleFor 10m


def _one(cmds, cls):
    found = [c for c in cmds if isinstance(c, cls)]
    assert len(found) == 1, cmds
    return found[0]


def _attempt(log: Log):
    return log.world.backfills[KEY].attempt


_rows = run_rows_of  # the run rows the log's events produce, last version of each


def suspended_log(preemption="Suspend"):
    """Admitted at 600, Job created 601 and running 602, indexes 0-1 done at 700, demand at 800,
    suspend decided at 800.5, the Job observed suspended at 803 with 0-1 kept."""
    log = Log().ready(0).cronjob(0, template=INDEXED).apply(0, preemption=preemption)
    admit = _one(log.decide(IDLE), Admit)
    log.admit(admit, IDLE)
    job = admit.job_name
    log.job("JobCreated", job, 601).job("JobRunning", job, 602)
    log.job("JobProgress", job, 700, completed_indexes="0-1", active=1)
    log.request(800)
    cancel = _one(log.decide(800.5), Cancel)
    return log, admit, cancel


def test_preemption_field_parsing():
    base = {"modelRef": "m", "templateRef": "cj"}
    assert parse_spec(base).preemption == "Delete" and not parse_spec(base).resumable
    assert parse_spec({**base, "preemption": None}).preemption == "Delete"
    assert parse_spec({**base, "preemption": "Suspend"}).resumable
    for bad in ("suspend", "", 1, True, ["Suspend"]):
        problem = parse_spec({**base, "preemption": bad})
        assert isinstance(problem, SpecProblem) and problem.reason == "InvalidSpec", bad


def test_interval_syntax():
    assert indexes.parse("0-2,5") == ((0, 2), (5, 5))
    assert indexes.parse("5,0-2,3") == ((0, 3), (5, 5))  # normalised
    assert indexes.parse("") == () and indexes.parse(None) == ()
    for bad in ("a", "2-1", "1,,2", "-1", "1-", 5):
        assert indexes.parse(bad) is None, bad
    assert indexes.count_text("0-2,5") == 4
    assert indexes.minus_text("0-9", "2-3,7") == "0-1,4-6,8-9"
    assert indexes.format_ranges(indexes.union(((0, 1),), ((2, 4),))) == "0-4"
    assert indexes.grew("0-2", "0-1") and not indexes.grew("0-1", "0-2")


def test_preemption_suspends_and_keeps_completed_indexes():
    log, admit, cancel = suspended_log()
    assert cancel.suspend and cancel.segment == 1 and cancel.reason == "ForegroundDemand"
    log.cancel(cancel, 800.5)
    a = _attempt(log)
    assert a.lifecycle == SUSPENDING and a.live  # holds its model and node until the pods stop
    assert _one(log.decide(801), SuspendJob).job_name == admit.job_name  # re-issued until observed
    assert not [c for c in log.decide(801) if isinstance(c, (Cancel, DeleteJob))]
    log.job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    a = _attempt(log)
    assert a.lifecycle == SUSPENDED and not a.live and a.completed_indexes == "0-1"
    st = status_of(log.world, KEY, t(900))
    assert st["phase"] == "WaitingForIdle" and st["jobName"] == admit.job_name
    # the segment's row: 602 -> 803, useful up to the last completion (700), wasted after it
    (row,) = _rows(log)
    assert (row.segment, row.result, row.reason, row.completed_indexes) == (1, "preempted", "ForegroundDemand", "0-1")
    assert row.running_seconds == pytest.approx((t(803) - t(602)).total_seconds())
    assert row.useful_seconds == pytest.approx((t(700) - t(602)).total_seconds())
    assert row.wasted_seconds == pytest.approx((t(803) - t(700)).total_seconds())


def test_resume_needs_a_fresh_full_window_and_resumes_the_same_job():
    log, admit, cancel = suspended_log()
    log.cancel(cancel, 800.5).job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    demand_pos = log.world.models[(NS, "m")].busy_pos
    # the window restarts at the preemption's decision (800.5), not the request (800)
    assert not [c for c in log.decide(800.5 + IDLE - 0.1) if isinstance(c, (Admit, Resume))]
    resume = _one(log.decide(800.5 + IDLE), Resume)
    assert (resume.attempt, resume.segment, resume.job_name, resume.cause) == (1, 2, admit.job_name, demand_pos)
    assert not [c for c in log.decide(800.5 + IDLE) if isinstance(c, Admit)]  # never a second Job
    log.admit(resume, 800.5 + IDLE)
    assert _attempt(log).lifecycle == STARTING
    assert _one(log.decide(1401), ResumeJob).job_name == admit.job_name
    log.job("JobResumed", admit.job_name, 1402, episode="t1")
    assert _attempt(log).lifecycle == RUNNING
    log.job("JobProgress", admit.job_name, 1500, completed_indexes="0-3", active=1)
    log.job("JobSucceeded", admit.job_name, 1600, completed_indexes="0-4")
    assert status_of(log.world, KEY, t(1601))["phase"] == "Succeeded"
    r1, r2 = _rows(log)
    assert (r2.segment, r2.attempt, r2.job_name, r2.result, r2.completed_indexes) == (2, 1, admit.job_name, "succeeded", "2-4")
    assert r2.started_at == t(1402) and r2.ended_at == t(1600) and r2.admitted_at == t(800.5 + IDLE)
    assert r2.useful_seconds == pytest.approx(198.0) and r2.wasted_seconds == 0
    assert indexes.count_text(r1.completed_indexes) + indexes.count_text(r2.completed_indexes) == 5
    auditor = Auditor()
    for pos, e in log.events:
        auditor.feed(pos, e)
    assert auditor.divergences == [] and auditor.checked == 3
    assert [x.decision for x in auditor.trail] == ["admit", "suspend", "resume"]


def test_resume_waits_for_every_gate():
    log, admit, cancel = suspended_log()
    log.cancel(cancel, 800.5).job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    log.add(ev.GamingIntentStarted(at=t(900), namespace=NS, session="g", node="n1"))
    assert not [c for c in log.decide(800 + IDLE + 10) if isinstance(c, Resume)]
    log.add(ev.GamingIntentEnded(at=t(1000), namespace=NS, session="g"))
    assert not [c for c in log.decide(1000 + IDLE - 1) if isinstance(c, Resume)]
    assert _one(log.decide(1000 + IDLE), Resume).segment == 2


def test_field_absent_deletes_as_before():
    log, admit, cancel = suspended_log(preemption=None)
    assert not cancel.suspend
    log.cancel(cancel, 800.5)
    assert _attempt(log).lifecycle == CANCELLING
    assert _one(log.decide(801), DeleteJob)


def test_non_indexed_template_is_blocked():
    log = Log().ready(0).cronjob(0).apply(0, preemption="Suspend")
    block = _one(log.decide(IDLE), Block)
    assert block.reason == "PreemptionNotResumable" and "completionMode" in block.message
    assert not [c for c in log.decide(IDLE) if isinstance(c, Admit)]


def test_non_preemption_cancels_delete_a_running_resumable_attempt():
    log = Log().ready(0).cronjob(0, template=INDEXED).apply(0, preemption="Suspend")
    admit = _one(log.decide(IDLE), Admit)
    log.admit(admit, IDLE).job("JobCreated", admit.job_name, 601)
    log.not_ready(700)
    cancel = _one(log.decide(700), Cancel)
    assert cancel.reason == "ModelNotReady" and not cancel.suspend


def test_spec_change_while_suspended_deletes():
    log, admit, cancel = suspended_log()
    log.cancel(cancel, 800.5).job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    log.apply(900, gen=2, preemption="Suspend", idleFor="20m")
    c = _one(log.decide(901), Cancel)
    assert (c.reason, c.suspend) == ("SpecChanged", False)
    log.cancel(c, 901)
    assert _attempt(log).lifecycle == CANCELLING and _one(log.decide(902), DeleteJob)
    log.job("JobDeleted", admit.job_name, 903)
    (row,) = _rows(log)  # no segment ran after the suspension: its row stays preempted
    assert (row.result, row.ended_at) == ("preempted", t(803))
    assert _attempt(log).result == "cancelled"


@pytest.mark.parametrize("what", ["deleting", "suspend", "model-deleted"])
def test_other_hard_conditions_delete_a_suspended_job(what):
    log, admit, cancel = suspended_log()
    log.cancel(cancel, 800.5).job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    if what == "deleting":
        log.add(ev.BackfillDeleting(at=t(900), namespace=NS, name="b", uid="u1"))
        reason = "Deleted"
    elif what == "suspend":
        log.apply(900, gen=2, preemption="Suspend", suspend=True)
        reason = "Suspended"
    else:
        log.add(ev.ModelDeleted(at=t(900), namespace=NS, model="m"))
        reason = "ModelNotFound"
    c = _one(log.decide(901), Cancel)
    assert (c.reason, c.suspend) == (reason, False)


def test_model_not_ready_while_suspended_only_holds_the_resume():
    log, admit, cancel = suspended_log()
    log.cancel(cancel, 800.5).job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    log.not_ready(900)
    cmds = log.decide(901 + IDLE)
    assert not [c for c in cmds if isinstance(c, (Cancel, Resume, Admit))]


def test_suspended_job_deleted_by_someone_else_gives_a_new_attempt():
    log, admit, cancel = suspended_log()
    log.cancel(cancel, 800.5).job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    log.job("JobDeleted", admit.job_name, 900)
    a = _attempt(log)
    assert (a.result, a.end_reason) == ("cancelled", "JobDeleted")
    new = _one(log.decide(800.5 + IDLE), Admit)  # a fresh window from the preemption's decision
    assert new.attempt == 2 and new.job_name != admit.job_name
    (row,) = _rows(log)
    assert row.result == "preempted" and row.segment == 1


def test_suspended_job_resumed_by_someone_else_is_suspended_again():
    log, admit, cancel = suspended_log()
    log.cancel(cancel, 800.5).job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    log.job("JobResumed", admit.job_name, 850, episode="t-human")
    assert _attempt(log).lifecycle == SUSPENDING
    assert _one(log.decide(851), SuspendJob)
    log.job("JobSuspended", admit.job_name, 852, completed_indexes="0-1", episode="rv2")
    assert _attempt(log).lifecycle == SUSPENDED
    (row,) = _rows(log)
    assert row.ended_at == t(803)  # the foreign run is no segment: the row keeps its end


def test_completed_while_suspended_succeeds_with_a_zero_second_row():
    log, admit, cancel = suspended_log()
    log.cancel(cancel, 800.5).job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    log.job("JobSucceeded", admit.job_name, 804, completed_indexes="0-4")
    assert status_of(log.world, KEY, t(805))["phase"] == "Succeeded"
    r1, r2 = _rows(log)
    assert (r1.result, r2.result, r2.segment, r2.running_seconds, r2.completed_indexes) == ("preempted", "succeeded", 2, 0.0, "2-4")


def test_metrics_rule_counts_each_segment_once():
    """What the loop counts (a start per admitted/resumed row, an end when a row's result is
    first set) matches the rows: 2 starts, 1 preemption, 1 success."""
    from backfill.core.projector import fold
    from backfill.core.state import World

    log, admit, cancel = suspended_log()
    log.cancel(cancel, 800.5).job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    resume = _one(log.decide(800.5 + IDLE), Resume)
    log.admit(resume, 800.5 + IDLE).job("JobResumed", admit.job_name, 1402, episode="t1")
    log.job("JobSucceeded", admit.job_name, 1600, completed_indexes="0-4")
    world, starts, ends = World(), 0, []
    for pos, e in log.events:
        before, world = world, fold(world, e, pos)
        for r in run_rows(before, world, e):
            if isinstance(e, (ev.AttemptAdmitted, ev.AttemptResumed)) and r.result is None:
                starts += 1
            elif r.result is not None:
                prev = previous_row(before, r)
                if prev is None or prev.result is None:
                    ends.append(r.result)
    assert starts == 2 and ends == ["preempted", "succeeded"]


def test_a_demand_before_the_job_exists_deletes():
    """Nothing to keep before the Job was created: a preemption then deletes as before."""
    log = Log().ready(0).cronjob(0, template=INDEXED).apply(0, preemption="Suspend")
    admit = _one(log.decide(IDLE), Admit)
    log.admit(admit, IDLE).request(601)
    assert not _one(log.decide(601), Cancel).suspend



def _audit(log: Log):
    auditor = Auditor()
    for pos, e in log.events:
        auditor.feed(pos, e)
    return auditor


@pytest.mark.parametrize("decider_saw", ["request", "everything before it"])
def test_a_suspension_observed_before_its_decision_is_ours_and_resumes(decider_saw):
    """PostgreSQL away: the preemptor PATCHes ``suspend: true`` from memory and spools its
    decision; the Job's observed suspension reaches the log first (request 147, JobSuspended 148,
    suspend decision 149). The segment ends for the condition that held, and the attempt resumes
    after a full window, never stuck Suspending waiting for an observation that already came."""
    log, admit, cancel = suspended_log()
    request_pos = log.world.position  # the request at 800 is the last event folded
    log.job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    suspended_pos = log.world.position
    a = _attempt(log)
    assert (a.lifecycle, a.live, a.completed_indexes) == (SUSPENDED, False, "0-1")
    assert status_of(log.world, KEY, t(804))["phase"] == "WaitingForIdle"
    log.cancel(cancel, 800.5, basis=request_pos if decider_saw == "request" else None)
    assert _attempt(log).lifecycle == SUSPENDED  # the late decision names the end, nothing more
    assert not [c for c in log.decide(804) if isinstance(c, (SuspendJob, DeleteJob, Cancel))]
    # the window restarts at the observed suspension (803, its cause), the latest the decision can have been
    assert not [c for c in log.decide(803 + IDLE - 0.1) if isinstance(c, (Admit, Resume))]
    resume = _one(log.decide(803 + IDLE), Resume)
    assert (resume.attempt, resume.segment, resume.job_name, resume.cause) == (1, 2, admit.job_name, suspended_pos)
    (row,) = _rows(log)
    assert (row.segment, row.result, row.reason, row.deciding_position) == (1, "preempted", "ForegroundDemand", request_pos)
    assert row.ended_at == t(803) and row.completed_indexes == "0-1"
    log.admit(resume, 803 + IDLE)
    auditor = _audit(log)
    assert auditor.divergences == [] and [x.decision for x in auditor.trail] == ["admit", "suspend", "resume"]


def _running_resumable():
    """Admitted at 600, Job created 601 and running 602, indexes 0-1 done at 700: (log, job)."""
    log = Log().ready(0).cronjob(0, template=INDEXED).apply(0, preemption="Suspend")
    admit = _one(log.decide(IDLE), Admit)
    job = admit.job_name
    log.admit(admit, IDLE).job("JobCreated", job, 601).job("JobRunning", job, 602)
    log.job("JobProgress", job, 700, completed_indexes="0-1", active=1)
    return log, job


def test_an_unexplained_suspension_ends_the_segment_and_the_job_is_resumed_when_due():
    """A trial: the leader suspended the Job for an ingest report and was killed with both
    records spooled; the log held only ``JobSuspended``, and the new leader said ``Running`` /
    ``JobActive`` for ever over a suspended Job. Like an unexplained deletion, the observation
    ends the segment (``cancelled``, ``JobSuspended``) and the same Job is resumed when admission
    is due (the controller owns its Jobs' ``spec.suspend``), as an unexplained deletion's next
    attempt is admitted: after a fresh full idle window from the observation (its cause may be
    lost foreground demand; fail-closed), not at once although the last known demand is long
    past."""
    log, job = _running_resumable()
    log.job("JobSuspended", job, 800, completed_indexes="0-1", episode="rv1")
    suspended_pos = log.world.position
    a = _attempt(log)
    assert (a.lifecycle, a.segment_reason, a.completed_indexes) == (SUSPENDED, "JobSuspended", "0-1")
    st = status_of(log.world, KEY, t(801))
    assert (st["phase"], st["reason"], st["jobName"]) == ("WaitingForIdle", "IdleWindow", job)  # not Running/JobActive
    (row,) = _rows(log)
    assert (row.result, row.reason, row.ended_at, row.deciding_position) == ("cancelled", "JobSuspended", t(800), suspended_pos)
    assert log.decide(801) == [WakeAt(KEY, t(800 + IDLE))]  # the builders' idleFor 10m from 800
    resume = _one(log.decide(800 + IDLE), Resume)
    assert (resume.attempt, resume.segment, resume.job_name) == (1, 2, job)


def test_the_fresh_window_of_an_unexplained_suspension_outlives_its_jobs_deletion():
    """A review: the suspended Job deleted by someone 10 s after the unexplained suspension ended
    the attempt, and attempt 2 was admitted at once; the doubt (a preemption whose cause was
    lost) is the same, so the wait runs a full idleFor from the suspension: 800 + 10m."""
    log, job = _running_resumable()
    log.job("JobSuspended", job, 800, completed_indexes="0-1", episode="rv1")
    log.job("JobDeleted", job, 810)
    assert _attempt(log).lifecycle == "Idle"
    assert log.decide(811) == [WakeAt(KEY, t(800 + IDLE))]
    assert _one(log.decide(800 + IDLE), Admit).attempt == 2


def test_a_suspension_observed_while_a_delete_condition_holds_is_not_a_segment_end():
    """Only a condition ``decide`` *suspends* for explains an observed suspension: for a Delete
    declaration the same demand deletes, so the observation changes nothing."""
    log, admit, cancel = suspended_log(preemption="Delete")
    assert not cancel.suspend
    log.job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    assert _attempt(log).lifecycle == RUNNING
    assert _one(log.decide(804), Cancel).reason == "ForegroundDemand"


def test_a_suspension_observed_before_its_cause_and_decision_is_named_by_the_decision():
    """Two replicas, an ingest report only the leader spooled, the store away: the standby's
    ``JobSuspended`` reaches the log before the report that caused it and before the decision
    (a trial: the attempt stayed Suspending for ever, re-PATCHing a Job long suspended). The
    observation ends the segment unexplained; the decision, folded later, names it."""
    log, job = _running_resumable()
    log.job("JobSuspended", job, 801, completed_indexes="0-1", episode="rv1")
    assert (_attempt(log).lifecycle, _attempt(log).segment_reason) == (SUSPENDED, "JobSuspended")
    log.request(800)
    request_pos = log.world.position
    log.add(ev.AttemptCancelled(
        at=t(800.5), namespace=NS, backfill="b", uid="u1", attempt=1, job_name=job, reason="ForegroundDemand",
        message="foreground request for Model m", cause=request_pos, basis=request_pos, suspend=True, segment=1,
    ))  # fmt: skip
    a = _attempt(log)
    assert (a.lifecycle, a.completed_indexes, a.segment_reason) == (SUSPENDED, "0-1", "ForegroundDemand")
    assert not [c for c in log.decide(802) if isinstance(c, (SuspendJob, DeleteJob, Cancel))]
    assert not [c for c in log.decide(800.5 + IDLE - 0.1) if isinstance(c, (Admit, Resume))]
    resume = _one(log.decide(800.5 + IDLE), Resume)  # a fresh window from the decision, as usual
    assert (resume.attempt, resume.segment, resume.job_name) == (1, 2, job)
    (row,) = _rows(log)
    assert (row.result, row.reason, row.ended_at, row.deciding_position) == ("preempted", "ForegroundDemand", t(801), request_pos)
    log.admit(resume, 800.5 + IDLE)
    auditor = _audit(log)
    assert auditor.divergences == [] and [x.decision for x in auditor.trail] == ["admit", "suspend", "resume"]


def test_someone_elses_suspension_and_resume_of_a_running_job_is_suspended_again_until_due():
    """The controller owns its Jobs' ``spec.suspend``: a foreign suspend ends the segment; a
    foreign resume is suspended again (as for any suspended Job); only an admission resumes."""
    log, job = _running_resumable()
    log.job("JobSuspended", job, 700, completed_indexes="0-1", episode="human")
    log.job("JobResumed", job, 710, episode="human-resume")
    assert _attempt(log).lifecycle == SUSPENDING
    assert _one(log.decide(711), SuspendJob).job_name == job
    log.job("JobSuspended", job, 712, completed_indexes="0-1", episode="again")
    assert _attempt(log).lifecycle == SUSPENDED
    # No demand known, but nothing explains the suspension: a fresh full window from its first
    # observation (700 + 10m), then the resume.
    assert log.decide(713) == [WakeAt(KEY, t(700 + IDLE))]
    assert _one(log.decide(700 + IDLE), Resume).job_name == job


def test_a_re_suspension_observed_while_the_resume_is_under_way_is_taken_by_its_decision():
    """A trial (one leader, no outage): a report right after a resume, before the Job controller
    flipped ``Suspended`` back: ``AttemptResumed`` seg 2, our re-suspend observed
    (``JobSuspended``), then the report and the decision. The observation was dropped as stale and
    the attempt stayed Suspending for ever."""
    log, admit, cancel = suspended_log()
    job = admit.job_name
    log.cancel(cancel, 800.5).job("JobSuspended", job, 803, completed_indexes="0-1", episode="rv1")
    resume = _one(log.decide(800.5 + IDLE), Resume)
    log.admit(resume, 800.5 + IDLE)
    log.job("JobSuspended", job, 1402, completed_indexes="0-1", episode="rv2")  # our re-suspend, seen first
    assert _attempt(log).lifecycle == STARTING  # nothing explains it yet: kept for the decision
    log.request(1401)
    again = _one(log.decide(1401.5), Cancel)
    assert again.suspend and again.segment == 2
    log.cancel(again, 1401.5)
    a = _attempt(log)
    assert (a.lifecycle, a.segment, a.segment_reason) == (SUSPENDED, 2, "ForegroundDemand")
    assert not [c for c in log.decide(1403) if isinstance(c, (SuspendJob, DeleteJob, Cancel))]
    assert _one(log.decide(1401.5 + IDLE), Resume).segment == 3
    assert _audit(log).divergences == []


def test_a_suspension_nothing_explains_while_the_resume_is_under_way_is_not_resumed_before_a_fresh_window():
    """An adversarial trial: a resume decided (its Job not yet observed resumed), then an ingest
    report while PostgreSQL was stopped: the preemptor suspended the Job, the report and the
    decision were spooled and lost with a SIGKILL. The restarted controller saw only the Job
    suspended again and re-sent the resume at once (7-8 s after the demand)."""
    log, admit, cancel = suspended_log()
    job = admit.job_name
    log.cancel(cancel, 800.5).job("JobSuspended", job, 803, completed_indexes="0-1", episode="rv1")
    resume = _one(log.decide(800.5 + IDLE), Resume)
    log.admit(resume, 800.5 + IDLE)  # 1400.5
    assert any(isinstance(c, ResumeJob) for c in log.decide(1401))  # the resume call, re-sent until observed
    # the lost preemption's, before the Job controller flipped the condition: dated the first
    # suspension's time (803), observed at 1404 (a re-trial: resumed 7 s after the demand)
    log.job("JobSuspended", job, 803, completed_indexes="0-1", episode="rv2", observed_at=t(1404))
    a = _attempt(log)
    assert (a.lifecycle, a.segment) == (STARTING, 2) and a.seen_suspended is not None
    for at in (1405, 1404 + IDLE - 1):
        cmds = log.decide(at)
        assert not [c for c in cmds if isinstance(c, (ResumeJob, Resume, Admit))], at
        assert WakeAt(KEY, t(1404 + IDLE)) in cmds
        assert status_of(log.world, KEY, t(at))["reason"] == "Resuming"
    assert any(isinstance(c, ResumeJob) for c in log.decide(1404 + IDLE))  # a fresh full window after the observation
    # demand meanwhile is a preemption as ever: its decision takes the observation (Suspended)
    log.request(1500)
    again = _one(log.decide(1500.5), Cancel)
    log.cancel(again, 1500.5)
    assert (_attempt(log).lifecycle, _attempt(log).segment_reason) == (SUSPENDED, "ForegroundDemand")
    assert _audit(log).divergences == []


def test_a_stale_suspended_status_while_the_resume_is_under_way_changes_nothing_until_resumed():
    log, admit, cancel = suspended_log()
    job = admit.job_name
    log.cancel(cancel, 800.5).job("JobSuspended", job, 803, completed_indexes="0-1", episode="rv1")
    log.admit(_one(log.decide(800.5 + IDLE), Resume), 800.5 + IDLE)
    log.job("JobSuspended", job, 1401, completed_indexes="0-1", episode="rv2")  # before the resume took effect
    log.job("JobResumed", job, 1402, episode="t1")
    a = _attempt(log)
    assert (a.lifecycle, a.segment, a.seen_suspended) == (RUNNING, 2, None)


def test_a_deposed_leaders_late_suspend_of_an_earlier_segment_is_superseded_not_divergent():
    """A trial: the standby resumed segment 2 after an unexplained suspension; the deposed
    leader's suspend of segment 1 then reached the log, and ``backfill replay`` exited 1."""
    log, admit, cancel = suspended_log()
    job = admit.job_name
    log.job("JobSuspended", job, 803, completed_indexes="0-1", episode="rv1")  # its decision not recorded yet
    resume = _one(log.decide(803 + IDLE), Resume)  # a window after the observed suspension
    log.admit(resume, 803 + IDLE)
    log.cancel(cancel, 800.5)  # the deposed leader's suspend of segment 1, recorded late
    auditor = _audit(log)
    assert auditor.divergences == [] and auditor.superseded == [log.world.position]
