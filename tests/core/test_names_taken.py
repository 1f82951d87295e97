"""A Job another log of the same ModelBackfill left behind under an attempt's name (a new user's
trial: a controller started on a fresh schema beside the finished Job ``<name>-<hash>-2`` of the
earlier schema; its attempt 2 was named the same, its create met that Job (AlreadyExists), the
Job's JobCreated was in the log already, and the attempt waited in ``Starting`` with no retry
until a cancel deleted the old finished Job)."""

from __future__ import annotations

from backfill.core import events as ev
from backfill.core.commands import Admit
from backfill.core.jobtemplate import attempt_of_job_name, job_name

from .builders import NS, Log, t

KEY = (NS, "b")


def _admit(log: Log, at: float) -> Admit:
    (cmd,) = [c for c in log.decide(at) if isinstance(c, Admit)]
    return cmd


def test_the_next_attempt_is_numbered_past_a_finished_job_of_another_log():
    log = Log().ready(0).cronjob(0).apply(0)  # idleFor 10m
    old = job_name("b", "u1", 2)
    log.job("JobCreated", old, 1).job("JobRunning", old, 1).job("JobSucceeded", old, 2)
    admit = _admit(log, 600)
    assert (admit.attempt, admit.job_name) == (3, job_name("b", "u1", 3))
    log.admit(admit, 600).job("JobCreated", admit.job_name, 600.5)
    b = log.world.backfills[KEY]
    assert b.attempt.lifecycle == "Running" and b.attempts == 3 and b.unexplained == ()


def test_a_name_taken_below_the_attempts_changes_nothing_and_others_jobs_are_not_names_of_ours():
    log = Log().ready(0).cronjob(0).apply(0)
    first = _admit(log, 600)
    log.admit(first, 600).job("JobCreated", first.job_name, 600).job("JobSucceeded", first.job_name, 700)
    log.job("JobDeleted", first.job_name, 800)  # ttlSecondsAfterFinished: attempt 1's own Job
    for name in (job_name("b", "other-uid", 7), "b-bb8203-x9"):  # an older incarnation's name; no attempt's name
        log.job("JobCreated", name, 801).job("JobSucceeded", name, 802)
    assert log.world.backfills[KEY].names_taken == 0
    log.apply(900, gen=2, idleFor="1m")  # a spec change: a new generation runs again
    assert _admit(log, 2000).attempt == 2


def test_a_labelled_job_under_an_attempts_name_takes_it_too():
    """Somebody else's Job (our labels, no ownerReference) under the name attempt 1 would get:
    its create would be refused AlreadyExists (not ours) for ever."""
    log = Log().ready(0).cronjob(0).apply(0)
    log.add(ev.JobCreated(at=t(1), namespace=NS, backfill="b", name=job_name("b", "u1", 1), uid="x", owned=False))
    assert _admit(log, 600).attempt == 2


def test_attempt_of_job_name_reads_only_the_names_job_name_gives():
    for n in (1, 2, 99, 123456789):
        assert attempt_of_job_name(job_name("a.b-c", "uid-1", n), "a.b-c", "uid-1") == n
    long = "x" * 70
    assert attempt_of_job_name(job_name(long, "u", 5), long, "u") == 5
    for name in ("a-b-c-1", job_name("a", "u", 1) + "0x", job_name("a", "u", 1)[:-1] + "٣", "a", "", "-", job_name("a", "u", 0)):
        assert attempt_of_job_name(name, "a", "u") == 0
