"""A run's start is never before its admission: a Job's creationTimestamp and startTime have
whole seconds, so the observation of a Job created 0.8 s after a whole second reads up to 0.8 s
before the admission that created it (a new user's trial: 9.898 s of running counted for an
attempt that lasted 9.066 s from admission to end)."""

from __future__ import annotations

from datetime import timedelta

from backfill.core import events as ev
from backfill.core.commands import Admit

from .builders import NS, Log, run_rows_of as _rows, t


def _admitted_at(log: Log, seconds: float) -> tuple[Log, Admit]:
    (admit,) = [c for c in log.decide(seconds) if isinstance(c, Admit)]
    return log.admit(admit, seconds), admit


def test_a_job_timestamp_truncated_to_the_second_before_the_admission_counts_from_the_admission():
    log, admit = _admitted_at(Log().ready(0).cronjob(0).apply(0), 600.832754)  # idleFor 10m
    log.job("JobCreated", admit.job_name, 600).job("JobRunning", admit.job_name, 600)  # whole seconds, truncated
    uid = log.world.backfills[(NS, "b")].uid
    log.add(ev.BackfillDeleted(at=t(609.898416), namespace=NS, name="b", uid=uid))
    (row,) = _rows(log)
    assert row.admitted_at == t(600.832754) and row.started_at == t(600.832754)
    assert row.running_seconds == (t(609.898416) - t(600.832754)).total_seconds()  # 9.065662, not 9.898416


def test_a_job_started_after_its_admission_counts_from_its_start():
    log, admit = _admitted_at(Log().ready(0).cronjob(0).apply(0), 600.5)
    log.job("JobCreated", admit.job_name, 601).job("JobRunning", admit.job_name, 603)
    uid = log.world.backfills[(NS, "b")].uid
    log.add(ev.BackfillDeleted(at=t(613), namespace=NS, name="b", uid=uid))
    (row,) = _rows(log)
    assert row.started_at == t(603) and row.running_seconds == 10.0
    assert t(603) - row.admitted_at == timedelta(seconds=2.5)
