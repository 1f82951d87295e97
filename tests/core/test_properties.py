"""Property tests: determinism of fold/decide, and no admission before idleSince + idleFor."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from backfill.core import events as ev
from backfill.core.commands import Admit, Cancel
from backfill.core.projector import decide, fold
from backfill.core.state import World

from .builders import NS, TEMPLATE, t

IDLE_FOR = 60.0
MODELS = ("m1", "m2")


def _step(kind: str, at: float, arg: int):
    m = MODELS[arg % 2]
    if kind == "request":
        return ev.ForegroundRequest(at=t(at), namespace=NS, model=m, busy_until=t(at + arg % 7))
    if kind == "ready":
        return ev.ModelReady(at=t(at), namespace=NS, model=m, node=f"n{arg % 3}")
    if kind == "notready":
        return ev.ModelNotReady(at=t(at), namespace=NS, model=m)
    if kind == "gaming":
        return ev.GamingIntentStarted(at=t(at), namespace=NS, session="g", node=f"n{arg % 3}", expires_at=t(at + 30) if arg % 2 else None)
    if kind == "gaming_end":
        return ev.GamingIntentEnded(at=t(at), namespace=NS, session="g")
    if kind == "suspend":
        return ev.BackfillApplied(
            at=t(at), namespace=NS, name=f"b-{m}", uid=f"u-{m}", generation=2 + arg,
            spec={"modelRef": m, "templateRef": "cj", "idleFor": "1m", "suspend": bool(arg % 2)},
        )
    raise AssertionError(kind)


steps = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=120, allow_nan=False),
        st.sampled_from(["request", "request", "ready", "notready", "gaming", "gaming_end", "suspend", "tick", "tick", "job_done"]),
        st.integers(min_value=0, max_value=20),
    ),
    max_size=60,
)


def run(script):
    """Drive the projector like a controller would, returning (events, decisions, world)."""
    world = World()
    log: list = []

    def add(e):
        nonlocal world
        log.append(e)
        world = fold(world, e, len(log))

    add(ev.CronJobSeen(at=t(0), namespace=NS, name="cj", job_template=TEMPLATE))
    for m in MODELS:
        add(ev.ModelReady(at=t(0), namespace=NS, model=m, node="n0"))
        add(ev.BackfillApplied(at=t(0), namespace=NS, name=f"b-{m}", uid=f"u-{m}", generation=1,
                               spec={"modelRef": m, "templateRef": "cj", "idleFor": "1m"}))
    now = 0.0
    decisions = []
    for dt, kind, arg in script:
        now += dt
        if kind == "job_done":
            for b in world.backfills.values():
                a = b.attempt
                if a is not None and a.live:
                    add(ev.JobDeleted(at=t(now), namespace=NS, backfill=b.name, name=a.job_name) if a.lifecycle == "Cancelling"
                        else ev.JobSucceeded(at=t(now), namespace=NS, backfill=b.name, name=a.job_name))
        elif kind != "tick":
            add(_step(kind, now, arg))
        for c in decide(world, t(now)):
            decisions.append((now, c, world))
            if isinstance(c, Admit):
                add(ev.AttemptAdmitted(at=t(now), namespace=NS, backfill=c.key[1], uid=c.uid, attempt=c.attempt,
                                       generation=c.generation, job_name=c.job_name, model=c.model, node=c.node, cause=c.cause))
                add(ev.JobCreated(at=t(now), namespace=NS, backfill=c.key[1], name=c.job_name))
            elif isinstance(c, Cancel):
                add(ev.AttemptCancelled(at=t(now), namespace=NS, backfill=c.key[1], uid=c.uid, attempt=c.attempt,
                                        job_name=c.job_name, reason=c.reason, cause=c.cause))
    return log, decisions, world


@settings(max_examples=150, deadline=None)
@given(steps)
def test_replaying_twice_gives_identical_states_and_decisions(script):
    log, decisions, world = run(script)
    replayed = World()
    for i, e in enumerate(log, 1):
        replayed = fold(replayed, e, i)
    assert replayed == world
    again = World()
    for i, e in enumerate(log, 1):
        again = fold(again, e, i)
    assert again == replayed
    for now, _c, w in decisions[-5:]:
        assert decide(w, t(now)) == decide(w, t(now))
    # the contender indexes are exactly what the live attempts say
    by_model: dict = {}
    by_node: dict = {}
    for key, a in world.live.items():
        by_model.setdefault((key[0], a.model), set()).add(key)
        if a.node:
            by_node.setdefault(a.node, set()).add(key)
    assert {k: set(v) for k, v in world.live_models.items()} == by_model
    assert {k: set(v) for k, v in world.live_nodes.items()} == by_node
    assert dict(world.live) == {k: b.attempt for k, b in world.backfills.items() if b.attempt is not None and b.attempt.live}


@settings(max_examples=150, deadline=None)
@given(steps)
def test_no_admission_before_idle_since_plus_idle_for(script):
    log, decisions, _ = run(script)
    admits = [(now, c) for now, c, _w in decisions if isinstance(c, Admit)]
    for now, c in admits:
        # independently: the latest foreground busy end and Ready transition for the model, from the raw log
        idx = next(i for i, e in enumerate(log) if isinstance(e, ev.AttemptAdmitted) and e.job_name == c.job_name)
        before = log[:idx]
        busy_end = max(
            ((e.busy_until or e.at) for e in before if isinstance(e, ev.ForegroundRequest) and e.model == c.model),
            default=None,
        )
        ready_at = None
        was_ready = False
        for e in before:
            if isinstance(e, (ev.ModelReady, ev.ModelNotReady)) and e.model == c.model:
                if isinstance(e, ev.ModelReady) and not was_ready:
                    ready_at = e.at
                was_ready = isinstance(e, ev.ModelReady)
        assert was_ready
        assert t(now) >= ready_at + (t(IDLE_FOR) - t(0))
        if busy_end is not None:
            assert t(now) >= busy_end + (t(IDLE_FOR) - t(0))
