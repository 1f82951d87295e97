"""A Job of a ``spec.preemption: Delete`` declaration suspended by someone else (a fault trial:
``kubectl patch job ... suspend: true`` left the ModelBackfill ``Running``/``JobActive`` for
ever, holding its Model: no deadline runs while a Job is suspended). The controller never
suspends such a Job: it deletes it, the attempt ends ``cancelled``/``JobSuspended``, and the
next one waits a fresh idle window from the deletion."""

from __future__ import annotations

from backfill.core.commands import Admit, DeleteJob
from backfill.core.projector import status_of

from .builders import NS, running, run_rows_of, t

KEY = (NS, "b")


def test_a_delete_mode_job_suspended_by_someone_else_is_deleted_and_the_next_waits_a_window():
    log, admit = running()  # admitted at 600 s, idleFor 10m
    log.job("JobSuspended", admit.job_name, 700)
    st = status_of(log.world, KEY, t(701))
    assert (st["phase"], st["reason"]) == ("Cancelling", "JobSuspended"), st
    assert [c for c in log.decide(701) if isinstance(c, DeleteJob)] == [DeleteJob(KEY, admit.job_name)]
    log.job("JobDeleted", admit.job_name, 702)
    (row,) = run_rows_of(log)
    assert (row.result, row.reason, row.ended_at) == ("cancelled", "JobSuspended", t(702))
    assert not [c for c in log.decide(702 + 599) if isinstance(c, Admit)]  # not before a fresh window
    assert [c for c in log.decide(702 + 600) if isinstance(c, Admit)]
