"""``backfill replay`` on a log written by two replicas during a store outage (a chaos soak, and
reproduced on the real apiserver): PostgreSQL stopped; a router's report to the standby (503
``not_leader``, spooled there), its retry, with a later time, to the leader (202: the leader
cancels from memory); the Job held by a finalizer, released while the store was still away.
The log: 7 the standby's report, 8 ``JobTerminating``, 9 ``JobDeleted`` (ended for the
demand the log knew: 7), 10 the leader's report, 11 the leader's cancel (cause 10, basis 10).
The replay reported a divergence at 11 ("the projector derives nothing"): the attempt had ended
at 9. The cancel is the decision behind that deletion, recorded late; its decider saw report 10
and not 7, so no prefix of the log is its state. It agrees with the log (the same attempt,
ended for the same reason, with no decision of its own), and is checked as such."""

from __future__ import annotations

from msgspec.structs import replace

from backfill.core.audit import Auditor
from backfill.core.commands import Admit, Cancel

from .builders import NS, Log

KEY = (NS, "b")
IDLE = 600.0  # the builders' declaration: idleFor 10m


def _log(reason_of_late_cancel: str = "ForegroundDemand") -> Log:
    log = Log().ready(0).cronjob(0).apply(0)
    admit = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(admit, IDLE)
    log.job("JobCreated", admit.job_name, IDLE).job("JobRunning", admit.job_name, IDLE)
    log.request(IDLE + 10.0)  # 7: the standby's report
    log.job("JobTerminating", admit.job_name, IDLE + 10.5)
    log.job("JobDeleted", admit.job_name, IDLE + 13.5)  # 9: ended for the demand at 7
    log.request(IDLE + 11.0)  # 10: the leader's report, behind the deletion in the log
    cancel = Cancel(KEY, "u1", admit.attempt, admit.job_name, reason_of_late_cancel, "foreground demand", 10, False, 1)
    log.cancel(cancel, IDLE + 11.01, basis=10)
    return log


def test_a_late_cancel_of_an_attempt_the_log_ended_for_the_same_reason_is_no_divergence():
    log = _log()
    a = log.world.backfills[KEY].attempt
    assert (a.result, a.end_reason, a.cancel_pos) == ("preempted", "ForegroundDemand", 7)  # the log's own conclusion
    auditor = Auditor()
    auditor.feed_many(log.events)
    assert auditor.divergences == [] and auditor.unverifiable == [] and auditor.checked == 2  # the admission and the cancel


def test_a_late_cancel_for_another_reason_is_still_a_divergence():
    auditor = Auditor()
    auditor.feed_many(_log("GamingIntent").events)
    assert [d.position for d in auditor.divergences] == [11]



# A second order from the same soak (seed 303, "divergence at position 474: recorded cancel
# attempt 2 for ForegroundDemand (cause 473); the projector derives ... (cause 465)"): PostgreSQL
# stopped; a report to the leader, which cancels from memory and spools the report and its
# cancel; the leader cut off from the apiserver, the standby takes the Lease over and sees a
# later lastActiveTime bump of the same Model; the standby's spool reaches the log first. The
# fold's cause of the demand stays the bump (7): the report (8) is older than the activity it
# already knows.


def _reordered_log(second) -> Log:
    """7 a bump at IDLE + 16; 8 ``second(log)``; 9 the leader's cancel citing 8 (basis 8)."""
    log = Log().ready(0).cronjob(0).apply(0)
    admit = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(admit, IDLE)
    log.job("JobCreated", admit.job_name, IDLE).job("JobRunning", admit.job_name, IDLE)
    log.request(IDLE + 16.0)  # 7: the standby's observation, flushed first
    second(log)  # 8
    derived = [c for c in log.decide(IDLE + 17.0) if isinstance(c, Cancel)]
    assert [(c.attempt, c.reason, c.cause) for c in derived] == [(admit.attempt, "ForegroundDemand", 7)]
    log.cancel(replace(derived[0], cause=8), IDLE + 10.01, basis=8)  # the leader's record: its report's cause
    return log


def test_a_cancel_whose_cause_happened_first_but_reached_the_log_second_is_no_divergence():
    auditor = Auditor()
    auditor.feed_many(_reordered_log(lambda log: log.request(IDLE + 10.0)).events)
    assert auditor.divergences == [] and auditor.checked == 2


def test_a_cancel_citing_an_event_of_another_kind_is_still_a_divergence():
    """Only the same kind of observation, made no later, is the same demand seen first."""
    auditor = Auditor()
    auditor.feed_many(_reordered_log(lambda log: log.cronjob(IDLE + 10.0)).events)
    assert [d.position for d in auditor.divergences] == [9]
