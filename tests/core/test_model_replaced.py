"""A Model deleted and created again under the same name while no watch saw it (the controller
down, or a watch gap and a relist) is another object: its uid says so (a fault trial: the
controller admitted 1.9 s after the new Model became Ready, on the old object's idle window, and
left a running Job on the new Model)."""

from __future__ import annotations

from backfill.core.commands import Admit, Cancel
from backfill.core.state import STATE_VERSION

from .builders import NS, Log, running, t

IDLE = 600.0  # the builders' idleFor, 10m


def admits(log: Log, at: float) -> list[Admit]:
    return [c for c in log.decide(at) if isinstance(c, Admit)]


def test_a_new_uid_starts_the_ready_window_at_its_observation():
    log = Log().ready(0, uid="old").cronjob(0).apply(0)
    assert admits(log, IDLE)  # the old object's window is complete
    log.ready(IDLE + 5, uid="new")  # the same name, node and group: only the uid differs
    m = log.world.models[(NS, "m")]
    assert (m.uid, m.ready_since, m.replaced_pos) == ("new", t(IDLE + 5), log.world.position)
    assert not admits(log, IDLE + 5)
    assert not admits(log, 2 * IDLE + 4.999)
    (admit,) = admits(log, 2 * IDLE + 5)
    assert admit.key == (NS, "b")


def test_the_same_uid_again_keeps_the_window():
    log = Log().ready(0, uid="one").cronjob(0).apply(0)
    log.ready(IDLE - 1, uid="one")  # a relist of the same object
    assert log.world.models[(NS, "m")].ready_since == t(0)
    assert admits(log, IDLE)


def test_a_uid_first_recorded_is_the_same_object():
    """A log written before the uid was recorded: the first observation with one (the upgraded
    controller's first list) does not restart every window."""
    log = Log().ready(0).cronjob(0).apply(0)
    log.ready(IDLE - 1, uid="first")
    m = log.world.models[(NS, "m")]
    assert (m.uid, m.ready_since, m.replaced_pos) == ("first", t(0), 0)
    assert admits(log, IDLE)


def test_a_new_uid_seen_not_ready_then_ready_also_starts_afresh():
    log = Log().ready(0, uid="old").cronjob(0).apply(0)
    log.not_ready(100, uid="new").ready(200, uid="new")
    assert log.world.models[(NS, "m")].ready_since == t(200)
    assert not admits(log, 200 + IDLE - 1)
    assert admits(log, 200 + IDLE)


def test_a_running_attempts_model_replaced_unseen_is_cancelled():
    log, admit = running()
    # the builders' running() observed the Model with no uid; record it, then the new object
    log.ready(IDLE + 1, uid="old")
    assert not [c for c in log.decide(IDLE + 2) if isinstance(c, Cancel)]
    log.ready(IDLE + 10, uid="new")
    (cancel,) = [c for c in log.decide(IDLE + 11) if isinstance(c, Cancel)]
    assert (cancel.key, cancel.attempt, cancel.reason) == ((NS, "b"), admit.attempt, "ModelNotReady")
    assert cancel.message == "Model m was deleted and created again after the Job was admitted"


def test_a_replacement_the_admission_saw_does_not_cancel_its_attempt():
    log = Log().ready(0, uid="old").cronjob(0).apply(0).ready(10, uid="new")
    (admit,) = admits(log, 10 + IDLE)
    log.admit(admit, 10 + IDLE).job("JobCreated", admit.job_name, 10 + IDLE)
    assert not [c for c in log.decide(20 + IDLE) if isinstance(c, Cancel)]


def test_the_state_version_moved_for_the_new_fields():
    assert STATE_VERSION >= 10
