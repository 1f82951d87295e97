"""The condition table (issue 10 "shape"): each gate/cancel rule once, and ``affected`` derived
from it, so no condition can change a verdict that only the periodic resync would notice."""

from __future__ import annotations

from hypothesis import given, settings

from backfill.core import events as ev
from backfill.core import verdict
from backfill.core.conditions import CONDITIONS, affected
from backfill.core.decide import evaluate
from backfill.core.projector import fold
from backfill.core.state import World

from .test_properties import run, steps


def _signature(world: World, key, now):
    """What a resync would act on or show: phase, reason, message and the command kinds."""
    v = evaluate(world, key, now)
    if v is None:
        return None
    return (v.phase, v.reason, v.message, tuple(type(c).__name__ for c in v.commands), v.wake_at)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_every_verdict_an_event_changes_is_among_the_keys_affected_names(script):
    log, _decisions, _world = run(script)
    world = World()
    for pos, e in enumerate(log, 1):
        now = e.at
        before = {k: _signature(world, k, now) for k in world.backfills}
        world = fold(world, e, pos)
        woken = set(affected(world, e))
        changed = {k for k in world.backfills if _signature(world, k, now) != before.get(k)}
        assert changed <= woken, f"{type(e).__name__} at {pos} changed {sorted(changed - woken)} without waking them"


def test_the_table_asks_in_the_seed_cancel_order_and_names_known_reasons():
    cancel_order = [c.reason for c in CONDITIONS if c.cancels]
    assert cancel_order == [
        verdict.DELETED, verdict.SUSPENDED, verdict.SPEC_CHANGED, verdict.GPU_REQUEST_FORBIDDEN, verdict.MODEL_NOT_READY, verdict.NODE_CHANGED,
        verdict.GAMING_INTENT, verdict.GPU_LEASE_ACTIVE, verdict.FOREGROUND_DEMAND, verdict.CONCURRENT_BACKFILL,
    ]  # fmt: skip
    assert [c.reason for c in CONDITIONS if c.gates] == [
        verdict.MODEL_NOT_READY, verdict.GAMING_INTENT, verdict.GPU_LEASE_ACTIVE, verdict.CONCURRENT_BACKFILL,
        verdict.MODEL_NODE_UNKNOWN,
    ]  # fmt: skip
    assert len({c.reason for c in CONDITIONS}) == len(CONDITIONS), "a reason is written once"
    for c in CONDITIONS:
        assert c.wakes, f"{c.reason} is woken by nothing: it could only fire at the resync"
        assert set(c.wakes) <= set(ev.EVENT_TYPES.values())
