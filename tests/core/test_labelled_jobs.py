"""Jobs with the ModelBackfill's name label but no controller ownerReference to it
(``owned=False`` events). A hostile-input trial labelled a foreign Job so: the controller
deleted it as unexplained and held the declaration's admissions while a finalizer held it. The
ownerReference alone then decided, and that left a Job of ours whose ownerReference someone
removed (``kubectl patch``) outside the cancel path. Now such a Job is the attempt's only under
the uid the log knows for it: ours, still cancelled; anybody else's, left alone."""

from __future__ import annotations

from backfill.core import events as ev
from backfill.core.commands import Cancel, DeleteJob

from .builders import NS, running, t

KEY = (NS, "b")
IDLE = 600.0  # the builders' declaration: idleFor 10m


def test_a_foreign_job_with_only_the_label_is_neither_unexplained_nor_the_attempts():
    log, admit = running(IDLE)
    job, uid = admit.job_name, f"uid-{admit.job_name}"
    before = log.world.backfills[KEY]
    log.add(ev.JobCreated(at=t(IDLE + 2), namespace=NS, backfill="b", name="labelled-foreign", uid="F", owned=False))
    log.add(ev.JobSucceeded(at=t(IDLE + 3), namespace=NS, backfill="b", name=job, uid="F", owned=False))  # our Job's name, another uid
    after = log.world.backfills[KEY]
    assert after.unexplained == () and after.attempt == before.attempt  # nothing listed, the attempt still running
    assert not [c for c in log.decide(IDLE + 4) if isinstance(c, DeleteJob)]
    # the same foreign Job with a controller ownerReference to the declaration is unexplained
    log.add(ev.JobCreated(at=t(IDLE + 5), namespace=NS, backfill="b", name="restored-7", uid="R"))
    assert log.world.backfills[KEY].unexplained == (("restored-7", "R"),)


def test_our_job_with_its_owner_reference_removed_is_still_cancelled_and_followed():
    log, admit = running(IDLE)
    job, uid = admit.job_name, f"uid-{admit.job_name}"
    log.add(ev.JobRunning(at=t(IDLE + 1), namespace=NS, backfill="b", name=job, uid=uid, owned=False))  # the patch
    log.request(IDLE + 30)
    (cancel,) = [c for c in log.decide(IDLE + 30.1) if isinstance(c, Cancel)]
    assert (cancel.job_name, cancel.reason) == (job, "ForegroundDemand")
    log.cancel(cancel, IDLE + 30.1)
    log.add(ev.JobDeleted(at=t(IDLE + 31), namespace=NS, backfill="b", name=job, uid=uid, owned=False))
    a = log.world.backfills[KEY].attempt
    assert (a.result, a.end_reason) == ("preempted", "ForegroundDemand")
