"""A Model that goes twice in one spec generation is blocked twice (a trial: the second
``ModelNotFound`` block had the first one's idempotency key, its cause being the CronJob
template's position; the store took it for a duplicate, so no decision, log line or Event said
it, and ``decide`` offered it again at every pass)."""

from __future__ import annotations

from backfill.core import events as ev
from backfill.core.commands import Block, Unblock
from backfill.core.decisions import decision_record

from .builders import NS, Log, t


def _one(log: Log, at: float, cls):
    (cmd,) = [c for c in log.decide(at) if isinstance(c, cls)]
    return cmd


def test_each_deletion_of_the_model_is_its_own_block():
    log = Log().ready(0).cronjob(0).apply(0)
    keys = []
    for i, start in enumerate((10, 30)):
        log.add(ev.ModelDeleted(at=t(start), namespace=NS, model="m"))
        deleted_at = log.world.position
        block = _one(log, start + 1, Block)
        assert (block.reason, block.cause) == ("ModelNotFound", deleted_at)
        record, key = decision_record(block, at=t(start + 1), basis=log.world.position)
        keys.append(key)
        log.add(record)
        assert not [c for c in log.decide(start + 2) if isinstance(c, Block)]  # recorded: not offered again
        log.ready(start + 5)
        unblock = _one(log, start + 6, Unblock)
        record, _ = decision_record(unblock, at=t(start + 6), basis=log.world.position)
        log.add(record)
    assert keys[0] != keys[1]


def test_a_model_never_seen_is_blocked_on_the_templates_position():
    log = Log().cronjob(0).apply(0)  # the Model was never observed
    block = _one(log, 1, Block)
    assert (block.reason, block.cause) == ("ModelNotFound", 1)  # the CronJob's position, as before
