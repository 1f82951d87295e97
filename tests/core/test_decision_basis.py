"""The decide -> record race (issue 8): a foreground request folded between the state an
admission was decided on (its basis) and the admission record itself must cancel the attempt.

Sequence from the issue: Model Ready; decide at +600.4 s (basis 3); ``lastActiveTime`` = +600 s
appended at position 4; ``AttemptAdmitted`` at position 5. The attempt must be cancelled for
``ForegroundDemand`` with the request (position 4) as its cause.
"""

from __future__ import annotations

from backfill.core import events as ev
from backfill.core.audit import Auditor
from backfill.core.commands import Admit, Cancel, WakeAt
from backfill.core.projector import FOREGROUND_DEMAND
from backfill.core.verdict import DELETED, GAMING_INTENT

from .builders import Log, NS, t


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


# --------------------------------------------------------------------------- deletion before the cancel
# A cancel DELETEs first and is recorded after (fail-safe), so another replica's record of the
# deletion can reach the log before the decision that caused it (seen with two replicas).


def _running() -> tuple[Log, Admit]:
    log = Log().ready(0).cronjob(0).apply(0, idleFor="10m")  # positions 1, 2, 3
    (admit,) = [c for c in log.decide(600.4) if isinstance(c, Admit)]
    log.admit(admit, 600.4)  # 4
    log.job("JobCreated", admit.job_name, 600.5)  # 5
    return log, admit


def _row(log: Log):
    from backfill.core.runs import row_of

    b = log.world.backfills[(NS, "b")]
    return row_of(b, b.attempt)


def test_a_job_gone_during_gaming_intent_on_its_node_was_preempted_by_it():
    log, admit = _running()
    log.add(ev.GamingIntentStarted(at=t(700), namespace=NS, session="s", node="n1"))  # 6: the cause
    (cancel,) = [c for c in log.decide(700.1) if isinstance(c, Cancel)]
    assert (cancel.reason, cancel.cause) == (GAMING_INTENT, 6)  # what the leader decides
    log.job("JobDeleted", admit.job_name, 700.2)  # 7: recorded before the leader's decision
    log.cancel(cancel, 700.1, basis=6)  # 8: the decision, late
    row = _row(log)
    assert (row.result, row.reason, row.deciding_position, row.ended_at) == ("preempted", GAMING_INTENT, 6, t(700.2))


def test_a_job_gone_while_its_modelbackfill_is_being_deleted_is_cancelled_for_it():
    log, admit = _running()
    log.add(ev.BackfillDeleting(at=t(700), namespace=NS, name="b", uid="u1"))  # 6
    log.job("JobDeleted", admit.job_name, 700.2)  # 7 (the leader's cancel Deleted not recorded yet)
    row = _row(log)
    assert (row.result, row.reason, row.deciding_position) == ("cancelled", DELETED, 6)


def test_a_cancel_recorded_after_the_deletion_it_caused_reattributes_the_run():
    """The cause itself is not in the log before the deletion (demand the leader's preemptor
    acted on from memory): the row first reads cancelled/JobDeleted, the late decision (decided
    on a state before the deletion) makes it preempted by that demand."""
    log, admit = _running()
    log.job("JobDeleted", admit.job_name, 700.2)  # 6
    assert (_row(log).result, _row(log).reason) == ("cancelled", "JobDeleted")
    log.request(700)  # 7: the demand, spooled by the leader after the other replica's deletion
    late = ev.AttemptCancelled(
        at=t(700.1), namespace=NS, backfill="b", uid="u1", attempt=admit.attempt, job_name=admit.job_name,
        reason=FOREGROUND_DEMAND, message="foreground request for Model m", cause=7, basis=5,
    )
    log.add(late)  # 8
    row = _row(log)
    assert (row.result, row.reason, row.deciding_position, row.ended_at) == ("preempted", FOREGROUND_DEMAND, 7, t(700.2))
    assert log.world.backfills[(NS, "b")].live_attempt is None  # still over: nothing to delete again


def test_a_late_cancel_whose_cause_also_came_after_the_deletion_reattributes_and_audits_clean():
    """Two replicas, an ingest report to the leader (a new user's trial, 8 of 10 cancels): the
    standby's JobDeleted (6) lands before the leader's spooled report (7) and cancel (8, basis 7:
    the report's position). The cancel still explains the deletion, and replay accepts it."""
    log, admit = _running()
    log.job("JobDeleted", admit.job_name, 700.2)  # 6
    log.request(700)  # 7
    late = ev.AttemptCancelled(
        at=t(700.1), namespace=NS, backfill="b", uid="u1", attempt=admit.attempt, job_name=admit.job_name,
        reason=FOREGROUND_DEMAND, message="foreground request for Model m", cause=7, basis=7,
    )
    log.add(late)  # 8
    row = _row(log)
    assert (row.result, row.reason, row.deciding_position) == ("preempted", FOREGROUND_DEMAND, 7)
    auditor = Auditor()
    for pos, e in log.events:
        auditor.feed(pos, e)
    assert auditor.divergences == [] and [x.decision for x in auditor.trail] == ["admit", "cancel"]


def test_a_late_cancel_audits_clean_even_when_the_ended_state_would_not_cancel():
    """The report that caused it is old (its time before the admission): the state with the
    attempt ended derives no cancel (only the wait for a fresh idle window from the deletion it
    does not explain, 700.2 + 10m); the auditor still checks the cancel on the state with the
    attempt live."""
    log, admit = _running()
    log.job("JobDeleted", admit.job_name, 700.2)  # 6
    log.request(5)  # 7: a late report, its time long before
    assert log.decide(700.2) == [WakeAt((NS, "b"), t(1300.2))]
    log.add(ev.AttemptCancelled(
        at=t(700.1), namespace=NS, backfill="b", uid="u1", attempt=admit.attempt, job_name=admit.job_name,
        reason=FOREGROUND_DEMAND, cause=7, basis=7,
    ))  # fmt: skip
    auditor = Auditor()
    for pos, e in log.events:
        auditor.feed(pos, e)
    assert auditor.divergences == []
    assert (_row(log).result, _row(log).reason) == ("preempted", FOREGROUND_DEMAND)


def superseded_log() -> Log:
    """Attempt 1 running; its Job deleted with nothing in the log explaining it (6); attempt 2
    admitted (7); then a deposed leader's report (8) and its cancel of attempt 1 (9, basis 8)."""
    log, admit = _running()
    log.job("JobDeleted", admit.job_name, 700.2)  # 6
    (second,) = [c for c in log.decide(700.2 + 600) if isinstance(c, Admit)]
    assert second.attempt == 2
    log.admit(second, 700.2 + 600)  # 7
    log.request(700)  # 8: the old leader's report, spooled while the store was paused
    return log.add(ev.AttemptCancelled(
        at=t(700.1), namespace=NS, backfill="b", uid="u1", attempt=admit.attempt, job_name=admit.job_name,
        reason=FOREGROUND_DEMAND, cause=8, basis=8,
    ))  # 9


def test_a_deposed_leaders_late_cancel_of_an_attempt_followed_by_another_is_superseded_not_divergent():
    """A trial (PostgreSQL paused, the leader SIGSTOPped after cancelling from memory): the new
    leader saw the deletion unexplained (6) and admitted attempt 2 (7); the old leader, resumed,
    appended its report (8) and its cancel of attempt 1 (9, basis 8). On its basis state attempt
    2 is live and the projector derives *its* cancel: ``backfill replay`` said divergence and
    exited 1. The state it was decided on is not in the log: counted superseded, not checked."""
    log = superseded_log()
    auditor = Auditor()
    for pos, e in log.events:
        auditor.feed(pos, e)
    assert auditor.divergences == [] and auditor.superseded == [9] and auditor.checked == 2  # the two admissions
    assert log.world.backfills[(NS, "b")].attempt.number == 2  # the late cancel changed nothing


def test_a_cancel_of_another_attempt_or_after_an_explained_end_changes_nothing():
    log, admit = _running()
    log.add(ev.GamingIntentStarted(at=t(700), namespace=NS, session="s", node="n1"))  # 6
    log.job("JobDeleted", admit.job_name, 700.2)  # 7: explained (GamingIntent)
    before = log.world.backfills[(NS, "b")]
    for attempt, reason in ((admit.attempt, FOREGROUND_DEMAND), (admit.attempt + 1, GAMING_INTENT)):
        log.add(ev.AttemptCancelled(
            at=t(700.3), namespace=NS, backfill="b", uid="u1", attempt=attempt, job_name=admit.job_name,
            reason=reason, cause=6, basis=6,
        ))  # fmt: skip
        assert log.world.backfills[(NS, "b")] is before
    forged = Auditor()
    for pos, e in log.events:
        forged.feed(pos, e)
    assert [d.position for d in forged.divergences] == [8, 9]  # neither is what the projector derives


def test_the_auditor_accepts_a_cancel_recorded_after_its_deletion():
    log, admit = _running()
    log.add(ev.GamingIntentStarted(at=t(700), namespace=NS, session="s", node="n1"))
    (cancel,) = [c for c in log.decide(700.1) if isinstance(c, Cancel)]
    log.job("JobDeleted", admit.job_name, 700.2)
    log.cancel(cancel, 700.1, basis=6)
    auditor = Auditor()
    for pos, e in log.events:
        auditor.feed(pos, e)
    assert auditor.divergences == []


# --------------------------------------------------------------------------- re-sent and late reports


def test_a_re_sent_report_is_not_new_demand():
    """A router re-sends a report (same time): the preemptor folds it in memory before the log
    drops the duplicate, so the fold itself must not see demand in it."""
    log = Log().ready(0).cronjob(0).apply(0, idleFor="10m").request(10)  # 1-4
    (admit,) = [c for c in log.decide(610) if isinstance(c, Admit)]
    log.admit(admit, 610).job("JobCreated", admit.job_name, 610.5)
    log.request(10)  # the same report again
    assert [c for c in log.decide(611) if isinstance(c, Cancel)] == []
    log.request(5, busy=9)  # a late report inside the known busy time: nothing unseen either
    assert [c for c in log.decide(612) if isinstance(c, Cancel)] == []
    log.request(10.5)  # one later than anything known: demand
    (cancel,) = [c for c in log.decide(613) if isinstance(c, Cancel)]
    assert (cancel.reason, cancel.cause) == (FOREGROUND_DEMAND, log.world.position)


def test_a_preemption_by_a_late_report_needs_a_fresh_window_from_the_decision():
    """A report 300 s old (its router's clock behind) cancels (fail-safe), and the retry waits a
    full idle window from the cancel decision, not from the report's time."""
    log = Log().ready(0).cronjob(0).apply(0, idleFor="10m")  # 1-3
    (admit,) = [c for c in log.decide(600) if isinstance(c, Admit)]
    log.admit(admit, 600).job("JobCreated", admit.job_name, 600.5)  # 4, 5
    log.request(700)  # 6: arrives at 1000 with its time 700
    (cancel,) = [c for c in log.decide(1000) if isinstance(c, Cancel)]
    assert (cancel.reason, cancel.cause) == (FOREGROUND_DEMAND, 6)
    log.cancel(cancel, 1000).job("JobDeleted", admit.job_name, 1000.2)  # 7, 8
    # the window starts at the cancel decision (7): replay shows the retry 600 s after it
    assert log.world.models[(NS, "m")].busy_until == t(1000) and log.world.models[(NS, "m")].busy_pos == 7
    assert [c for c in log.decide(1599.9) if isinstance(c, Admit)] == []  # 700 + 10m has passed; 1000 + 10m not
    (again,) = [c for c in log.decide(1600) if isinstance(c, Admit)]
    assert again.attempt == 2 and again.cause == 7


def test_a_job_deleted_for_demand_no_cancel_explains_restarts_the_window_at_the_deletion():
    """A failover while PostgreSQL was away (a new user's trial): the leader that cancelled from
    memory died with its decision unwritten, so the log holds the report (its time 100 s before
    the deletion: a router whose clock is behind) and the deletion, no cancel. The retry still
    needs a fresh full ``idleFor`` from the deletion (README), not from the report's time: it
    was admitted 5.5 s after the cancel with ``idleFor: 15s``."""
    log, admit = _running()  # idleFor 10m
    log.request(800)  # 6: the report, its time long before the deletion
    log.job("JobDeleted", admit.job_name, 900)  # 7: no cancel decision is ever recorded
    assert (_row(log).result, _row(log).reason, _row(log).deciding_position) == ("preempted", FOREGROUND_DEMAND, 6)
    assert [type(c).__name__ for c in log.decide(900 + 599.9)] == ["WakeAt"]
    assert [c.at for c in log.decide(900 + 599.9)] == [t(1500)]
    (admit2,) = [c for c in log.decide(1500) if isinstance(c, Admit)]
    assert (admit2.attempt, admit2.cause) == (2, 7)  # the window began at the deletion
    auditor = Auditor()
    for pos, e in log.events:
        auditor.feed(pos, e)
    assert auditor.divergences == []
