"""Jobs a ModelBackfill owns that its logged attempts do not explain (a new user's trial: a second
controller on another log; the fault breaker: a create that landed after its cancel's delete).

Such a Job is deleted whatever the verdict, nothing is admitted for that ModelBackfill while it
exists, and its end or deletion clears it. Every expected value is computed here from what the
test folds.
"""

from __future__ import annotations

from backfill.core import events as ev
from backfill.core.commands import Admit, Cancel, CreateJob, DeleteJob
from backfill.core.projector import decide, status_of
from backfill.core.timefmt import rfc3339
from backfill.core.verdict import UNEXPLAINED_JOB
from backfill.controller.kinds import KINDS

from .builders import NS, Log, t

KEY = (NS, "b")
IDLE = 600.0  # the builders' idleFor 10m


def _unexplained(log: Log):
    return log.world.backfills[KEY].unexplained


def _deletes(cmds):
    return [(c.job_name, c.unexplained) for c in cmds if isinstance(c, DeleteJob)]


def _base() -> Log:
    return Log().ready(0).cronjob(0).apply(0)


def test_a_job_no_attempt_explains_is_deleted_and_holds_the_admission():
    log = _base()
    log.add(ev.JobCreated(at=t(5), namespace=NS, backfill="b", name="b-zzz-7", uid="foreign"))
    assert _unexplained(log) == (("b-zzz-7", "foreign"),)
    cmds = log.decide(IDLE + 1)  # the idle window is over: it would be admitted
    assert [c for c in cmds if isinstance(c, Admit)] == [], "admitted beside a Job the log cannot explain"
    assert _deletes(cmds) == [("b-zzz-7", True)]
    assert status_of(log.world, KEY, t(IDLE + 1))["reason"] == UNEXPLAINED_JOB
    # its deletion clears it; the admission follows
    log.add(ev.JobDeleted(at=t(IDLE + 2), namespace=NS, backfill="b", name="b-zzz-7", uid="foreign"))
    assert _unexplained(log) == ()
    assert [type(c) for c in log.decide(IDLE + 3) if isinstance(c, (Admit, DeleteJob))] == [Admit]


def test_beside_a_running_attempt_it_is_deleted_and_the_attempt_keeps_running():
    log = _base()
    admit = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(admit, IDLE).job("JobCreated", admit.job_name, IDLE + 1).job("JobRunning", admit.job_name, IDLE + 2)
    log.add(ev.JobRunning(at=t(IDLE + 3), namespace=NS, backfill="b", name="b-other-1", uid="u-other"))
    cmds = log.decide(IDLE + 4)
    assert _deletes(cmds) == [("b-other-1", True)]
    assert not [c for c in cmds if isinstance(c, Cancel)], "its own attempt is not cancelled for it"
    # a finished one is not deleted: it runs nothing
    log.add(ev.JobSucceeded(at=t(IDLE + 5), namespace=NS, backfill="b", name="b-other-1", uid="u-other"))
    assert _unexplained(log) == () and _deletes(log.decide(IDLE + 6)) == []


def test_a_job_created_again_under_an_ended_attempts_name_is_unexplained():
    """The breaker's race: cancelled while Starting, the DELETE answered 404 (JobDeleted without
    a uid), then the create landed: the same name, a Job object the attempt never had."""
    log = _base()
    admit = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(admit, IDLE).request(IDLE + 1)
    cancel = next(c for c in log.decide(IDLE + 1.5) if isinstance(c, Cancel))
    log.cancel(cancel, IDLE + 1.5)
    log.add(ev.JobDeleted(at=t(IDLE + 1.6), namespace=NS, backfill="b", name=admit.job_name))  # the 404
    assert log.world.backfills[KEY].attempt.result == "preempted"
    late = ev.JobCreated(at=t(IDLE + 1.7), namespace=NS, backfill="b", name=admit.job_name, uid="late")
    assert late.natural_key() != ev.JobCreated(at=t(IDLE), namespace=NS, backfill="b", name=admit.job_name).natural_key()
    log.add(late)
    assert _unexplained(log) == ((admit.job_name, "late"),)
    cmds = log.decide(IDLE + 2)
    assert _deletes(cmds) == [(admit.job_name, True)] and not [c for c in cmds if isinstance(c, CreateJob)]
    log.add(ev.JobDeleted(at=t(IDLE + 3), namespace=NS, backfill="b", name=admit.job_name, uid="late"))
    assert _unexplained(log) == ()


def test_the_job_an_ended_attempt_had_is_not_unexplained_when_listed_again():
    """A relist re-delivers a completed attempt's Job (the same uid): nothing to delete."""
    log = _base()
    admit = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(admit, IDLE).job("JobCreated", admit.job_name, IDLE + 1).job("JobSucceeded", admit.job_name, IDLE + 9)
    for kind in ("JobCreated", "JobRunning", "JobSucceeded"):
        log.job(kind, admit.job_name, IDLE + 10)
    assert _unexplained(log) == () and _deletes(log.decide(IDLE + 11)) == []


def test_a_relist_knows_unexplained_jobs_so_their_deletion_while_unwatched_is_seen():
    log = _base()
    log.add(ev.JobCreated(at=t(5), namespace=NS, backfill="b", name="b-zzz-7", uid="foreign"))
    job_kind = next(k for k in KINDS if k.name == "job")
    assert (NS, "b/b-zzz-7", "foreign") in job_kind.known(log.world)


def test_the_decision_for_other_backfills_is_unchanged():
    log = _base().apply(0, name="c", uid="u2", model="m2").ready(0, model="m2", node="n2")
    log.add(ev.JobCreated(at=t(5), namespace=NS, backfill="b", name="b-zzz-7", uid="foreign"))
    admits = [c.key for c in decide(log.world, t(IDLE + 1)) if isinstance(c, Admit)]
    assert admits == [(NS, "c")]


def _finished_then_next(log: Log):
    """Attempt 1 succeeded (its Job kept), then attempt 2 admitted after the cooldown and
    running; returns (attempt 1's Admit, attempt 2's Admit)."""
    first = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(first, IDLE).job("JobCreated", first.job_name, IDLE + 1).job("JobRunning", first.job_name, IDLE + 2)
    log.job("JobSucceeded", first.job_name, IDLE + 60)
    assert log.world.backfills[KEY].attempt.result == "succeeded"
    later = IDLE + 60 + 3600 + 1  # past repeatAfter 1h
    second = next(c for c in log.decide(later) if isinstance(c, Admit))
    assert second.job_name != first.job_name
    log.admit(second, later).job("JobCreated", second.job_name, later + 1).job("JobRunning", second.job_name, later + 2)
    return first, second, later


def test_an_earlier_attempts_finished_job_being_deleted_is_not_unexplained():
    """A new user's trial: deleting attempt 1's succeeded Job (its ``deletionTimestamp``, as
    ``ttlSecondsAfterFinished`` or a hand's delete sets it) while attempt 2 ran was warned of as
    a Job "not in the event log", deleted again, and held the admissions until it was gone."""
    log = Log().ready(0).cronjob(0).apply(0, repeatAfter="1h")
    first, second, later = _finished_then_next(log)
    log.job("JobTerminating", first.job_name, later + 5)
    assert _unexplained(log) == ()
    cmds = log.decide(later + 6)
    assert _deletes(cmds) == [] and not [c for c in cmds if isinstance(c, Cancel)]
    log.job("JobDeleted", first.job_name, later + 7)
    assert _unexplained(log) == () and log.world.backfills[KEY].attempt.job_name == second.job_name
    # a Job listed as unexplained stays listed while it terminates, until it is gone
    log.add(ev.JobCreated(at=t(later + 8), namespace=NS, backfill="b", name="b-zzz-7", uid="foreign"))
    log.add(ev.JobTerminating(at=t(later + 9), namespace=NS, backfill="b", name="b-zzz-7", uid="foreign"))
    assert _unexplained(log) == (("b-zzz-7", "foreign"),)


def test_status_stops_naming_a_finished_job_once_it_is_deleted():
    """A new user's trial: after the Succeeded Job was deleted status.jobName still named it
    (README: it names the attempt's Job while it exists); startedAt still says when the run began."""
    log = Log().ready(0).cronjob(0).apply(0, repeatAfter="1h")
    first = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(first, IDLE).job("JobCreated", first.job_name, IDLE + 1).job("JobRunning", first.job_name, IDLE + 2)
    log.job("JobSucceeded", first.job_name, IDLE + 60)
    before = status_of(log.world, KEY, t(IDLE + 61))
    assert before["phase"] == "Succeeded" and before["jobName"] == first.job_name
    log.job("JobTerminating", first.job_name, IDLE + 62).job("JobDeleted", first.job_name, IDLE + 63)
    after = status_of(log.world, KEY, t(IDLE + 64))
    assert after["phase"] == "Succeeded" and after["jobName"] is None
    assert after["startedAt"] == before["startedAt"] == rfc3339(t(IDLE + 2))
    # a relist looks for the kept Job while status names it, not once it is gone
    job_kind = next(k for k in KINDS if k.name == "job")
    assert all(name != f"b/{first.job_name}" for _, name, _ in job_kind.known(log.world))
