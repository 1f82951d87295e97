"""An observation re-delivered unchanged folds to a position move only (issue 8 latency).

The watch re-delivers an object on every write to it: our own status PUT on a ModelBackfill, the
CronJob controller's status update, a GamingSession or GPULease status change. Folding such a copy
into a *new* state made ``affected`` wake every live backfill (a declaration's scope) or every
backfill (a gate's), and the preemptor decided 1,000 backfills per status write of ours (found
with ``py-spy record --gil`` during ``bench/bench_latency.py``: the preempt thread held the
interpreter 74 % of the time, in ``decide``).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from backfill.core import events as ev
from backfill.core.conditions import affected
from backfill.core.projector import fold, only_position_moved
from backfill.core.state import World

from .builders import NS, TEMPLATE, t

SPEC = {"modelRef": "m", "templateRef": "cj", "idleFor": "1m"}

COPIES = {
    "ModelBackfill status write": ev.BackfillApplied(at=t(5), namespace=NS, name="b", uid="u", generation=1, spec=dict(SPEC)),
    "CronJob status update": ev.CronJobSeen(at=t(5), namespace=NS, name="cj", job_template=TEMPLATE),
    "GamingSession update": ev.GamingIntentStarted(at=t(5), namespace=NS, session="g", node="n1", expires_at=t(90)),
    "GPULease update": ev.GPULeaseActive(at=t(5), namespace=NS, lease="l", node="n2", group="grp", expires_at=t(90)),
}


def _world() -> World:
    w = World()
    for pos, e in enumerate(
        [
            ev.CronJobSeen(at=t(0), namespace=NS, name="cj", job_template=TEMPLATE),
            ev.ModelReady(at=t(0), namespace=NS, model="m", node="n1"),
            ev.BackfillApplied(at=t(0), namespace=NS, name="b", uid="u", generation=1, spec=dict(SPEC)),
            ev.GamingIntentStarted(at=t(1), namespace=NS, session="g", node="n1", expires_at=t(90)),
            ev.GPULeaseActive(at=t(1), namespace=NS, lease="l", node="n2", group="grp", expires_at=t(90)),
        ],
        start=1,
    ):
        w = fold(w, e, pos)
    return w


@pytest.mark.parametrize("what", sorted(COPIES))
def test_an_unchanged_copy_moves_only_the_position(what):
    before = _world()
    after = fold(before, COPIES[what], before.position + 1)
    assert after.position == before.position + 1
    assert only_position_moved(before, after), f"a {what} re-delivered unchanged built a new state"


@pytest.mark.parametrize(
    "changed",
    [
        ev.BackfillApplied(at=t(5), namespace=NS, name="b", uid="u", generation=2, spec={**SPEC, "idleFor": "2m"}),
        ev.CronJobSeen(at=t(5), namespace=NS, name="cj", job_template={**TEMPLATE, "spec": {}}),
        ev.GamingIntentStarted(at=t(5), namespace=NS, session="g", node="n1", expires_at=t(90) + timedelta(seconds=60)),
        ev.GPULeaseActive(at=t(5), namespace=NS, lease="l", node="n3", group="grp", expires_at=t(90)),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_real_change_still_changes_the_state_and_wakes(changed):
    before = _world()
    after = fold(before, changed, before.position + 1)
    assert not only_position_moved(before, after)
    assert (NS, "b") in affected(after, changed)


def test_a_gate_re_delivered_keeps_the_position_it_began_at():
    w = _world()
    began = w.gaming[(NS, "g")].pos
    w = fold(w, COPIES["GamingSession update"], w.position + 1)
    assert w.gaming[(NS, "g")].pos == began == 4
