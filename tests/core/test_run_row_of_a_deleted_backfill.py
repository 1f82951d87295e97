"""A ModelBackfill gone with an attempt live (its finalizer removed by hand while the controller
was paused; an adversarial trial): the run row ends at the deletion instead of staying open."""

from __future__ import annotations

from backfill.core import events as ev
from backfill.core.commands import Admit

from .builders import NS, Log, run_rows_of as _rows, t


def test_the_row_of_a_live_attempt_ends_when_its_backfill_is_gone():
    log = Log().ready(0).cronjob(0).apply(0)  # idleFor 10m: admitted at 600
    (admit,) = [c for c in log.decide(600) if isinstance(c, Admit)]
    log.admit(admit, 600).job("JobCreated", admit.job_name, 601).job("JobRunning", admit.job_name, 602)
    uid = log.world.backfills[(NS, "b")].uid
    log.add(ev.BackfillDeleted(at=t(900), namespace=NS, name="b", uid=uid))
    (row,) = _rows(log)
    assert (row.result, row.reason, row.ended_at, row.deciding_position) == ("cancelled", "Deleted", t(900), len(log.events))
    assert row.running_seconds == 298.0  # from the Job's start at 602


def test_a_deleted_backfill_with_no_live_attempt_adds_no_row():
    log = Log().ready(0).cronjob(0).apply(0)
    uid = log.world.backfills[(NS, "b")].uid
    log.add(ev.BackfillDeleted(at=t(900), namespace=NS, name="b", uid=uid))
    assert _rows(log) == []


def test_a_run_counts_from_its_admission_when_the_jobs_whole_second_times_come_before_it():
    """A new user's trial: the Job's creationTimestamp and startTime are whole seconds, cut
    (18:55:37Z for a Job admitted at 18:55:37.947929), so the row started before its admission
    and counted up to 1 s the Job never ran. A run starts at its admission at the earliest."""
    log = Log().ready(0).cronjob(0).apply(0.4)  # idleFor 10m: admitted at 600.4
    (admit,) = [c for c in log.decide(600.4) if isinstance(c, Admit)]
    log.admit(admit, 600.4).job("JobCreated", admit.job_name, 600).job("JobRunning", admit.job_name, 600)
    log.job("JobSucceeded", admit.job_name, 607)
    (row,) = _rows(log)
    assert (row.result, row.admitted_at, row.started_at, row.ended_at) == ("succeeded", t(600.4), t(600.4), t(607))
    assert row.running_seconds == 6.6
