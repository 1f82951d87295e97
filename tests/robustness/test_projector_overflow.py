"""Robustness: one ModelBackfill with an extreme duration must not stop ``decide`` for every
other ModelBackfill (the reconcile loop decides all keys in one call).

The CRD pattern ``^([0-9]+(\\.[0-9]+)?(ns|us|µs|μs|ms|s|m|h))+$`` matches ``99999999999h``; the
CRD's CEL rules now reject durations beyond Go's largest at admission, but an object stored
before them still reaches the projector.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from backfill.core import events as ev
from backfill.core.projector import decide, fold
from backfill.core.state import World

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)
NS = "flexinfer-system"
TEMPLATE = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}


def t(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _world(field: str, value: str) -> World:
    events = [
        ev.ModelReady(at=t(0), namespace=NS, model="m", node="n1", shared=""),
        ev.ModelReady(at=t(0), namespace=NS, model="m2", node="n2", shared=""),
        ev.CronJobSeen(at=t(0), namespace=NS, name="cj", job_template=TEMPLATE),
        ev.BackfillApplied(at=t(0), namespace=NS, name="good", uid="u1", generation=1,
                           spec={"modelRef": "m", "templateRef": "cj", "idleFor": "10m"}),
        ev.BackfillApplied(at=t(0), namespace=NS, name="bad", uid="u2", generation=1,
                           spec={"modelRef": "m2", "templateRef": "cj", "idleFor": "10m", field: value}),
    ]
    w = World()
    for i, e in enumerate(events, 1):
        w = fold(w, e, i)
    return w


@pytest.mark.parametrize("field", ["idleFor", "maxRunDuration", "repeatAfter"])
@pytest.mark.parametrize("value", ["99999999999h", "80000000h", "9" * 400 + "h"])
def test_extreme_duration_does_not_break_decide(field, value):
    w = _world(field, value)
    for at in (0, 700, 100_000):
        cmds = decide(w, t(at), None, status=True)  # must not raise
    assert any(getattr(c, "key", None) == (NS, "good") for c in cmds)


@pytest.mark.parametrize("value", ["80000000h", "99999999999h"])
def test_durations_beyond_go_maximum_block_the_declaration(value):
    w = _world("repeatAfter", value)
    blocks = [c for c in decide(w, t(700), None) if type(c).__name__ == "Block" and c.key == (NS, "bad")]
    assert [b.reason for b in blocks] == ["InvalidRepeatAfter"]


@pytest.mark.parametrize("value", ["2562047h", "2562047h47m16s"])
def test_largest_valid_repeat_after_after_a_success_does_not_break_decide(value):
    """After a success the projector computes completion + repeatAfter (status.nextRunTime)."""
    w = _world("repeatAfter", value)
    n = 5
    cmds = decide(w, t(700), None, status=True)
    admit = next(c for c in cmds if type(c).__name__ == "Admit" and c.key == (NS, "bad"))
    follow = [
        ev.AttemptAdmitted(at=t(700), namespace=NS, backfill="bad", cause=admit.cause, uid=admit.uid, attempt=admit.attempt,
                           generation=admit.generation, job_name=admit.job_name, model=admit.model, node=admit.node),
        ev.JobCreated(at=t(701), namespace=NS, backfill="bad", name=admit.job_name, uid="j1"),
        ev.JobRunning(at=t(702), namespace=NS, backfill="bad", name=admit.job_name, uid="j1"),
        ev.JobSucceeded(at=t(800), namespace=NS, backfill="bad", name=admit.job_name, uid="j1"),
    ]
    for e in follow:
        n += 1
        w = fold(w, e, n)
    cmds = decide(w, t(900), None, status=True)  # must not raise
    assert any(getattr(c, "key", None) == (NS, "good") for c in cmds)
