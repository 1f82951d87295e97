"""The batch fold (``fold_all``) gives the world of folding one event at a time (issue 10).

``fold_all`` folds runs of foreground requests into a transient of the models map; these tests
compare it with the reference, :func:`fold` applied event by event, on logs with runs of every
length, on worlds large enough for the map to be several levels deep, and check that the world
passed in is left as it was (the transient must never write into a map someone else holds).
"""

from __future__ import annotations

import pickle
import random
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from backfill.core import events as ev
from backfill.core.projector import fold, fold_all
from backfill.core.state import World

from .builders import NS, TEMPLATE, t
from .test_properties import run, steps


def _one_by_one(world: World, pairs) -> World:
    for position, event in pairs:
        world = fold(world, event, position)
    return world


@settings(max_examples=150, deadline=None)
@given(steps)
def test_fold_all_equals_folding_one_event_at_a_time(script):
    log, _decisions, world = run(script)
    pairs = list(enumerate(log, 1))
    assert fold_all(World(), pairs) == world
    # from every prefix's world too: a run of requests may start on a world built either way
    for cut in range(0, len(pairs), 7):
        start = _one_by_one(World(), pairs[:cut])
        frozen = pickle.dumps(start)
        assert fold_all(start, pairs[cut:]) == world
        assert pickle.dumps(start) == frozen  # the input world is unchanged


def _requests_world(n_models: int):
    """A world of ``n_models`` Ready models, each with a ModelBackfill, and its next position."""
    w = World()
    pos = 0
    w = fold(w, ev.CronJobSeen(at=t(0), namespace=NS, name="cj", job_template=TEMPLATE), pos := pos + 1)
    for i in range(n_models):
        w = fold(w, ev.ModelReady(at=t(0), namespace=NS, model=f"m{i}", node=f"n{i % 50}"), pos := pos + 1)
        spec = {"modelRef": f"m{i}", "templateRef": "cj", "idleFor": "1m"}
        w = fold(w, ev.BackfillApplied(at=t(0), namespace=NS, name=f"b{i}", uid=f"u{i}", generation=1, spec=spec), pos := pos + 1)
    return w, pos + 1


def test_fold_all_on_a_deep_map_with_long_runs_and_interruptions():
    # 2,000 models: the models map is a HAMT several levels deep, so a run of requests copies
    # and then changes nodes in place. Requests come in runs of 1..300, broken by Model
    # re-observations and spec changes that must see every request folded before them.
    base, pos = _requests_world(2000)
    rnd = random.Random(7)
    pairs = []
    for i in range(20_000):
        at = t(3600 + i)
        m = f"m{rnd.randrange(2000)}" if rnd.random() < 0.9 else "m1"  # some models often, one very often
        k = rnd.random()
        if k < 0.985:
            busy = at + timedelta(seconds=rnd.choice([0, 5, 60])) if rnd.random() < 0.8 else None
            src = rnd.choice(["trace", "lastActiveTime", "ingest"])
            e = ev.ForegroundRequest(at=at - timedelta(seconds=rnd.choice([0, 0, 30])), namespace=NS, model=m, source=src, busy_until=busy)
        elif k < 0.993:
            e = ev.ModelReady(at=at, namespace=NS, model=m, node=f"n{rnd.randrange(60)}")
        elif k < 0.997:
            e = ev.ModelNotReady(at=at, namespace=NS, model=m)
        else:
            j = rnd.randrange(2000)
            e = ev.BackfillApplied(
                at=at, namespace=NS, name=f"b{j}", uid=f"u{j}", generation=2 + i,
                spec={"modelRef": f"m{rnd.randrange(2000)}", "templateRef": "cj", "idleFor": "2m"},
            )
        pairs.append((pos + i, e))
    frozen = pickle.dumps(base)
    expected = _one_by_one(base, pairs)
    got = fold_all(base, pairs)
    assert got == expected
    assert got.position == pairs[-1][0]
    assert pickle.dumps(base) == frozen
    # the busy time of the model requested most often is the latest request's end (computed
    # here from the events, not by the fold): the last run's writes reached the result
    ends = [max(e.at, e.busy_until or e.at) for _, e in pairs if type(e) is ev.ForegroundRequest and e.model == "m1"]
    assert got.models[(NS, "m1")].busy_until == max(ends)


def test_fold_all_of_nothing_and_of_requests_only():
    base, pos = _requests_world(3)
    assert fold_all(base, []) is base
    reqs = [(pos + i, ev.ForegroundRequest(at=t(100 + i), namespace=NS, model="m0", busy_until=t(100 + i + 10))) for i in range(5)]
    got = fold_all(base, reqs)
    assert got == _one_by_one(base, reqs)
    assert got.models[(NS, "m0")].busy_until == t(114) and got.models[(NS, "m0")].busy_pos == pos + 4
    assert got.models[(NS, "m1")] is base.models[(NS, "m1")]  # untouched models are shared
    assert got.backfills is base.backfills


@settings(max_examples=100, deadline=None)
@given(steps)
def test_compiled_foreground_requests_fold_and_wake_as_the_events(script):
    # start-up folds foreground requests in their compiled form (decode_rows(lean=True)): the
    # worlds, and the backfills each request wakes, must be those of the pydantic events
    from backfill.core.conditions import affected

    log, _decisions, world = run(script)
    recs = [ev.encode(e, f"k{i}") for i, e in enumerate(log)]
    rows = [(i, r.type, r.version, r.data) for i, r in enumerate(recs, 1)]
    lean = ev.decode_rows(rows, lean=True)
    requests = sum(type(e) is ev.ForegroundRequest for e in log)
    assert sum(type(e) is ev.ForegroundRequestRow for _, e in lean) == requests
    assert fold_all(World(), lean) == world
    w = World()
    for (position, compiled), event in zip(lean, log):
        before = w
        w = fold(w, compiled, position)
        assert w == fold(before, event, position)
        assert affected(w, compiled) == affected(w, event)
    assert w == world
