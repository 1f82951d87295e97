"""``decide(hold=HOLD_FOR_THE_LOG)``: the preemptor's projection from memory never admits (only the loop
does, once the event log answers); an admission due there is shown waiting for the log."""

from __future__ import annotations

from backfill.core.commands import Admit, Cancel, WriteStatus
from backfill.core.projector import decide
from backfill.core.timefmt import rfc3339
from backfill.core.verdict import HOLD_FOR_THE_LOG, IDLE_WINDOW, SIGNAL_UNREADABLE, WAITING, hold_for_signals

from .builders import NS, Log, t

IDLE = 600.0  # the builders' idleFor 10m


def _status(cmds):
    (s,) = [c.status for c in cmds if isinstance(c, WriteStatus)]
    return s


def test_a_due_admission_is_held_waiting_for_the_log():
    log = Log().ready(0).cronjob(0).apply(0, name="a", uid="ua")
    assert any(isinstance(c, Admit) for c in log.decide(IDLE))  # due
    cmds = decide(log.world, t(IDLE), status=True, hold=HOLD_FOR_THE_LOG)
    assert not [c for c in cmds if isinstance(c, Admit)]
    s = _status(cmds)
    assert (s["phase"], s["reason"], s["jobName"]) == (WAITING, IDLE_WINDOW, None)
    assert "waits for the event log" in s["message"] and s["conditions"][0]["status"] == "False"
    assert s["idleSince"] == rfc3339(t(0))  # idle since the Model became Ready, as unheld


def test_after_a_cancel_the_held_status_says_why_the_last_attempt_ended():
    log = Log().ready(0).cronjob(0).apply(0, name="a", uid="ua")
    admit = next(c for c in log.decide(IDLE) if isinstance(c, Admit))
    log.admit(admit, IDLE).job("JobCreated", admit.job_name, IDLE + 1, backfill="a")
    log.request(IDLE + 2)
    cancel = next(c for c in log.decide(IDLE + 2) if isinstance(c, Cancel))
    log.cancel(cancel, IDLE + 2).job("JobDeleted", admit.job_name, IDLE + 3, backfill="a")
    later = IDLE + 2 + IDLE + 1
    s = _status(decide(log.world, t(later), [(NS, "a")], status=True, hold=HOLD_FOR_THE_LOG))
    assert (s["phase"], s["reason"], s["jobName"]) == (WAITING, cancel.reason, None)
    assert s["message"].startswith(f"attempt 1 ended ({cancel.reason}); ")


def test_a_hold_for_unreadable_signals_names_them():
    log = Log().ready(0).cronjob(0).apply(0, name="a", uid="ua")
    s = _status(decide(log.world, t(IDLE), status=True, hold=hold_for_signals(["gpulease"])))
    assert (s["phase"], s["reason"]) == (WAITING, SIGNAL_UNREADABLE)
    assert s["message"] == "the next admission is due and held: cannot read gpulease (a signal that cannot be read holds starts)"
