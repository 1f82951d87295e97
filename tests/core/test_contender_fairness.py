"""Two ModelBackfills on one Model due at the same instant take turns (a new user's trial: the
one first by name won every time both were due together, and the other could starve)."""

from __future__ import annotations

from backfill.core.commands import Admit, Cancel
from backfill.core.projector import status_of
from backfill.core.verdict import CONCURRENT_BACKFILL

from .builders import NS, Log, t

IDLE = 600.0  # the builders' idleFor 10m


def _admitted(cmds) -> list[str]:
    return [c.key[1] for c in cmds if isinstance(c, Admit)]


def test_declarations_due_together_on_one_model_take_turns():
    log = Log().ready(0).cronjob(0).apply(0, name="a", uid="ua").apply(0, name="b", uid="ub")
    now = IDLE
    winners = []
    for _ in range(4):
        cmds = log.decide(now)
        (won,) = _admitted(cmds)
        winners.append(won)
        loser = "b" if won == "a" else "a"
        admit = next(c for c in cmds if isinstance(c, Admit))
        log.admit(admit, now).job("JobCreated", admit.job_name, now + 1, backfill=won)
        assert status_of(log.world, (NS, loser), t(now + 1))["reason"] == CONCURRENT_BACKFILL
        # foreground demand preempts it; both idle windows restart at the same request
        log.request(now + 2)
        cancel = next(c for c in log.decide(now + 2) if isinstance(c, Cancel))
        log.cancel(cancel, now + 2).job("JobDeleted", admit.job_name, now + 3, backfill=won)
        now = now + 2 + IDLE + 1  # both due again at once
    assert winners == ["a", "b", "a", "b"]
