"""The decide -> record race (issue 8): a foreground request folded between the state an
admission was decided on (its basis) and the admission record itself must cancel the attempt.

Sequence from the issue: Model Ready; decide at +600.4 s (basis 3); ``lastActiveTime`` = +600 s
appended at position 4; ``AttemptAdmitted`` at position 5. The attempt must be cancelled for
``ForegroundDemand`` with the request (position 4) as its cause.
"""

from __future__ import annotations

from backfill.core.audit import Auditor
from backfill.core.commands import Admit, Cancel
from backfill.core.projector import FOREGROUND_DEMAND

from .builders import Log, NS


def _admitted_with_racing_request() -> tuple[Log, Admit]:
    log = Log().ready(0).cronjob(0).apply(0, idleFor="10m")  # positions 1, 2, 3
    (admit,) = [c for c in log.decide(600.4) if isinstance(c, Admit)]
    basis = log.world.position
    assert basis == 3
    log.request(600)  # position 4: arrived while the decision was being recorded
    log.admit(admit, 600.4, basis=basis)  # position 5
    return log, admit


def test_request_between_basis_and_admission_cancels():
    log, admit = _admitted_with_racing_request()
    cancels = [c for c in log.decide(600.5) if isinstance(c, Cancel)]
    assert [(c.key, c.attempt, c.reason, c.cause) for c in cancels] == [((NS, "b"), admit.attempt, FOREGROUND_DEMAND, 4)]


def test_request_before_basis_does_not_cancel():
    log = Log().ready(0).cronjob(0).apply(0, idleFor="10m").request(1)  # the request is in the basis
    (admit,) = [c for c in log.decide(601.5) if isinstance(c, Admit)]
    log.admit(admit, 601.5)
    assert [c for c in log.decide(602) if isinstance(c, Cancel)] == []


def test_auditor_accepts_the_cancel_of_the_race():
    log, admit = _admitted_with_racing_request()
    (cancel,) = [c for c in log.decide(600.5) if isinstance(c, Cancel)]
    log.cancel(cancel, 600.5)
    auditor = Auditor()
    for pos, e in log.events:
        auditor.feed(pos, e)
    assert auditor.divergences == []
    assert auditor.checked == 2


def test_a_job_gone_while_unseen_demand_is_pending_was_preempted_by_it():
    """The deletion reaches the log before any cancel decision (the leader that decided it was
    paused before its decision was written): the run history still says why the Job went."""
    from backfill.core.runs import row_of

    log, admit = _admitted_with_racing_request()
    log.job("JobCreated", admit.job_name, 600.5)
    log.job("JobDeleted", admit.job_name, 601)
    b = log.world.backfills[(NS, "b")]
    row = row_of(b, b.attempt)
    assert (row.result, row.reason) == ("preempted", FOREGROUND_DEMAND)


def test_a_job_gone_without_demand_is_cancelled_job_deleted():
    log = Log().ready(0).cronjob(0).apply(0, idleFor="10m")
    (admit,) = [c for c in log.decide(600.4) if isinstance(c, Admit)]
    log.admit(admit, 600.4)
    log.job("JobCreated", admit.job_name, 600.5)
    log.job("JobDeleted", admit.job_name, 601)
    a = log.world.backfills[(NS, "b")].attempt
    assert (a.result, a.end_reason) == ("cancelled", "JobDeleted")
