"""The end of an attempt wakes every backfill waiting on the same model or node (issue 13 item 3).

The controller decides incrementally: after folding an event it decides only the keys
:func:`affected` names. So a backfill held by ``ConcurrentBackfill`` must be among them when the
other attempt ends, or it waits for the periodic full re-check with a stale reason.
"""

from __future__ import annotations

import pytest

from backfill.core import events as ev
from backfill.core.commands import Admit
from backfill.core.projector import affected, decide
from backfill.core.projector import status_of

from .builders import NS, Log, t

B1, B2 = (NS, "b"), (NS, "a")  # B2 sorts first: when the slot frees it wins, whoever else is due


def _two_on_one_model():
    log = Log().ready(0).cronjob(0).apply(0)
    (admit,) = [c for c in log.decide(600) if isinstance(c, Admit)]
    assert admit.key == B1
    log.admit(admit, 600).job("JobCreated", admit.job_name, 600).apply(601, name="a", uid="u2")
    assert status_of(log.world, B2, t(601))["reason"] == "ConcurrentBackfill"
    return log, admit


def _two_on_one_node():
    log = Log().ready(0, model="m", node="n1").ready(0, model="m2", node="n1").cronjob(0)
    log.apply(0, name="b", model="m")
    (admit,) = [c for c in log.decide(600) if isinstance(c, Admit)]
    log.admit(admit, 600).job("JobCreated", admit.job_name, 600).apply(601, name="a", model="m2", uid="u2")
    assert status_of(log.world, B2, t(601))["reason"] == "ConcurrentBackfill"
    return log, admit


@pytest.mark.parametrize("setup", [_two_on_one_model, _two_on_one_node])
@pytest.mark.parametrize(
    "ending", [("JobSucceeded", {}), ("JobFailed", {"reason": "BackoffLimitExceeded"}), ("JobDeleted", {})]
)
def test_the_end_of_an_attempt_admits_the_waiting_contender(setup, ending):
    log, admit = setup()
    kind, extra = ending
    log.job(kind, admit.job_name, 900, **extra)
    end_event = log.events[-1][1]
    keys = affected(log.world, end_event)
    assert B2 in keys
    admits = [c for c in decide(log.world, t(900), keys) if isinstance(c, Admit)]
    if kind == "JobDeleted" and setup is _two_on_one_model:
        # A deletion nothing in the log explains casts doubt on the Model's demand: every
        # declaration on it waits a fresh idleFor (10m) from it (decide._unexplained_stop_on_model)
        assert admits == []
        admits = [c for c in decide(log.world, t(900 + 600), keys) if isinstance(c, Admit)]
    assert [c.key for c in admits] == [B2]


def test_an_admission_refreshes_the_contenders_status():
    log = Log().ready(0).cronjob(0).apply(0).apply(0, name="c", uid="u2")
    (admit,) = [c for c in log.decide(600) if isinstance(c, Admit)]
    log.admit(admit, 600)
    assert (NS, "c") in affected(log.world, log.events[-1][1])


def test_an_unrelated_backfill_is_not_woken():
    log, admit = _two_on_one_model()
    log.ready(0, model="far", node="n9").apply(0, name="far", model="far", uid="u3")
    log.job("JobSucceeded", admit.job_name, 900)
    assert (NS, "far") not in affected(log.world, log.events[-1][1])
