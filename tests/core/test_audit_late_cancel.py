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
