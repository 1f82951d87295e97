"""A cancel decided while its attempt's create is in flight (a chaos soak, seed 303, with no fault
active): the cancel's read of the Job, made because the deciding state did not know its uid,
answered 404 before the create landed (201 a few ms earlier on the admission's thread); the log
then held the admission, ``JobCreated`` with uid X, the cancel and the read's ``JobDeleted``
without a uid. That absence ended the attempt; the Job X ran on, and every later event of it
matched the ended attempt's uid, so nothing listed it as unexplained and nothing deleted it (it
ran through a suspend, foreground demand, a spec change and a node change; its run row read
``cancelled`` while it succeeded).

An absence without a uid ends nothing once the log knows the Job's uid: the cancel's delete is
re-issued under the uid, and the Job is gone only when observed gone under it."""

from __future__ import annotations

from backfill.core import events as ev
from backfill.core.commands import Admit, Cancel, DeleteJob

from .builders import NS, Log, run_rows_of, t

KEY = (NS, "b")
IDLE = 600.0  # the builders' declaration: idleFor 10m


def _cancelled_with_a_uidless_absence() -> tuple[Log, str]:
    log = Log().ready(0).cronjob(0).apply(0)
    admit = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(admit, IDLE)
    log.add(ev.JobCreated(at=t(IDLE + 0.01), namespace=NS, backfill="b", name=admit.job_name, uid="X"))
    log.request(IDLE + 0.02)
    cancel = next(c for c in log.decide(IDLE + 0.03) if isinstance(c, Cancel))
    log.cancel(cancel, IDLE + 0.03)
    log.add(ev.JobDeleted(at=t(IDLE + 0.04), namespace=NS, backfill="b", name=admit.job_name))  # the GET's 404, no uid
    return log, admit.job_name


def test_an_absence_without_a_uid_does_not_end_an_attempt_whose_job_uid_the_log_knows():
    log, job = _cancelled_with_a_uidless_absence()
    a = log.world.backfills[KEY].attempt
    assert (a.lifecycle, a.result, a.job_uid) == ("Cancelling", None, "X")
    log.add(ev.JobRunning(at=t(IDLE + 1), namespace=NS, backfill="b", name=job, uid="X"))  # the Job runs
    assert [c for c in log.decide(IDLE + 2) if isinstance(c, DeleteJob)] == [DeleteJob(KEY, job)]  # re-issued


def test_the_attempt_ends_when_its_job_is_observed_gone_under_its_uid():
    log, job = _cancelled_with_a_uidless_absence()
    log.add(ev.JobDeleted(at=t(IDLE + 3), namespace=NS, backfill="b", name=job, uid="X"))
    a = log.world.backfills[KEY].attempt
    assert (a.lifecycle, a.result, a.ended_at) == ("Idle", "preempted", t(IDLE + 3))
    (row,) = run_rows_of(log)
    assert (row.result, row.ended_at) == ("preempted", t(IDLE + 3))
    assert not [c for c in log.decide(IDLE + 4) if isinstance(c, DeleteJob)]


def test_an_absence_without_a_uid_still_ends_an_attempt_whose_job_was_never_seen():
    """The create's answer lost and the Job never there: the read's absence is all the log gets."""
    log = Log().ready(0).cronjob(0).apply(0)
    admit = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(admit, IDLE)
    log.request(IDLE + 0.02)
    cancel = next(c for c in log.decide(IDLE + 0.03) if isinstance(c, Cancel))
    log.cancel(cancel, IDLE + 0.03)
    log.add(ev.JobDeleted(at=t(IDLE + 0.04), namespace=NS, backfill="b", name=admit.job_name))
    a = log.world.backfills[KEY].attempt
    assert (a.lifecycle, a.result, a.job_uid) == ("Idle", "preempted", "")
