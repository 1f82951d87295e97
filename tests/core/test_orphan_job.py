"""A ModelBackfill deleted while its Job still runs (its finalizer removed by hand) and created
again under the same name: the old Job holds its Model and node until its end is observed (a
fault trial: the new declaration was admitted on the same Model while the old Job still
terminated with an active pod)."""

from __future__ import annotations

from backfill.controller.kinds import KINDS
from backfill.core import events as ev
from backfill.core.commands import Admit, Cancel, WakeAt
from backfill.core.conditions import ORPHAN_RECHECK_SECONDS
from backfill.core.projector import status_of
from backfill.core.verdict import CONCURRENT_BACKFILL

from .builders import NS, Log, t

IDLE = 600.0  # the builders' idleFor 10m
KEY = (NS, "b")


def _deleted_while_its_job_terminates() -> tuple[Log, str, float]:
    """``b`` (uid u1) running; deleted (its cancel decided, the Job terminating), its finalizer
    removed by hand; then ``b`` applied again (uid u2). Returns the log, the old Job's name and
    the time of the re-apply."""
    log = Log().ready(0).cronjob(0).apply(0)
    admit = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(admit, IDLE).job("JobCreated", admit.job_name, IDLE + 1).job("JobRunning", admit.job_name, IDLE + 2)
    log.add(ev.BackfillDeleting(at=t(IDLE + 10), namespace=NS, name="b", uid="u1"))
    cancel = next(c for c in log.decide(IDLE + 10) if isinstance(c, Cancel))
    log.cancel(cancel, IDLE + 10).job("JobTerminating", admit.job_name, IDLE + 11)
    log.add(ev.BackfillDeleted(at=t(IDLE + 12), namespace=NS, name="b", uid="u1"))  # the finalizer removed by hand
    log.apply(IDLE + 13, uid="u2")
    return log, admit.job_name, IDLE + 13


def test_the_old_job_holds_the_model_until_its_end_is_observed():
    log, old, applied = _deleted_while_its_job_terminates()
    later = applied + IDLE + 60  # the new declaration's window has passed
    cmds = log.decide(later)
    assert [c for c in cmds if isinstance(c, Admit)] == [], "admitted beside the old Job"
    st = status_of(log.world, KEY, t(later))
    assert st["reason"] == CONCURRENT_BACKFILL and f"Job {old} of deleted ModelBackfill b still runs" in st["message"], st
    # re-checked soon (its end is observed under a name that no longer names its Model)
    assert [c.at for c in cmds if isinstance(c, WakeAt)] == [t(later + ORPHAN_RECHECK_SECONDS)]
    # a relist looks for it, under its declaration's name
    job_kind = next(k for k in KINDS if k.name == "job")
    assert (NS, f"b/{old}", f"uid-{old}") in job_kind.known(log.world)
    # gone: the new declaration is admitted
    log.job("JobDeleted", old, later + 1)
    assert [c.key for c in log.decide(later + 2) if isinstance(c, Admit)] == [KEY]
    assert len(log.world.live) == 0


def test_another_declaration_on_the_same_model_waits_too():
    log, old, applied = _deleted_while_its_job_terminates()
    log.apply(applied, name="c", uid="u3")
    later = applied + IDLE + 60
    assert [c for c in log.decide(later) if isinstance(c, Admit)] == []
    log.job("JobSucceeded", old, later + 1)  # its end, however observed
    assert sorted(c.key for c in log.decide(later + 2) if isinstance(c, Admit)) == [KEY]  # one at a time: b first (by key)


def test_an_attempt_whose_job_was_never_observed_holds_nothing_after_its_declaration_is_deleted():
    """Only an observed Job is kept (a relist can tell when it is gone); a create still in flight
    that lands later is the garbage collector's (its owner is gone)."""
    log = Log().ready(0).cronjob(0).apply(0)
    admit = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(admit, IDLE)
    log.add(ev.BackfillDeleted(at=t(IDLE + 1), namespace=NS, name="b", uid="u1"))
    assert len(log.world.live) == 0
