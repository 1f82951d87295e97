"""``spec.suspend`` alone is a pause, not new work (a new user's trial: suspending then
un-suspending a recurring declaration, repeatAfter 24h, ran it again at once). A success's
cooldown and a failure outlive the toggle; any other spec change still runs again (seed: "To
rerun a one-shot or failed declaration, change its spec intentionally")."""

from __future__ import annotations

from backfill.core.commands import Admit
from backfill.core.projector import status_of
from backfill.core.timefmt import rfc3339

from .builders import NS, Log, t

KEY = (NS, "b")
DAY = 86400.0


def _ended(result: str, **spec) -> Log:
    """The builders' declaration (idleFor 10m) admitted at 600 s, its Job ended at 900 s."""
    log = Log().ready(0).cronjob(0).apply(0, **spec)
    admit = next(c for c in log.decide(600) if isinstance(c, Admit))
    log.admit(admit, 600).job("JobCreated", admit.job_name, 600).job("JobRunning", admit.job_name, 601)
    return log.job(result, admit.job_name, 900)


def _suspend_and_resume(log: Log, at: float, **spec) -> Log:
    log.apply(at, gen=2, suspend=True, **spec)
    assert status_of(log.world, KEY, t(at + 1))["phase"] == "Suspended"
    return log.apply(at + 2, gen=3, **spec)


def _admits(log: Log, at: float) -> bool:
    return any(isinstance(c, Admit) for c in log.decide(at))


def test_a_recurring_success_keeps_its_cooldown_across_suspend_and_resume():
    log = _ended("JobSucceeded", repeatAfter="24h")
    _suspend_and_resume(log, 2000, repeatAfter="24h")
    st = status_of(log.world, KEY, t(2010))
    assert (st["phase"], st["reason"], st["nextRunTime"]) == ("Succeeded", "RepeatScheduled", rfc3339(t(900 + DAY))), st
    assert not _admits(log, 2002 + 600 + 1)  # not after a mere idle window (it ran at once before)
    assert _admits(log, 900 + DAY + 1)  # after the cooldown, as before the pause


def test_a_one_shot_success_and_a_failure_stay_after_suspend_and_resume_and_a_real_change_runs_again():
    for result, phase in (("JobSucceeded", "Succeeded"), ("JobFailed", "Failed")):
        log = _ended(result)
        _suspend_and_resume(log, 2000)
        assert status_of(log.world, KEY, t(2010))["phase"] == phase, result
        assert not _admits(log, 2002 + 3 * 600), result
        log.apply(3000, gen=4, env={"RUN": "2"})  # an intentional change: it runs again
        assert _admits(log, 3000 + 600 + 1), result
