"""Start-up and catch-up fold events in their compiled forms (``decode_rows(lean=True)``, issue
10): for every event type, what the controller derives from a compiled form must be what it
derives from the pydantic event: the folded world, the backfills it wakes (``affected``) and the
run rows it changes (``run_rows``), as the controller's catch-up asks them one event at a time,
and the batch fold of a replay.

The reference is the pydantic event decoded from the same row (``decode_rows`` without
``lean``), folded by the same code; the logs are a simulation's (admissions, Job facts, cancels,
requests) and random mixtures of every event type over a few names, so that Job facts about
current, ended, unexplained and deleted declarations' Jobs all occur.
"""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from backfill.core import events as ev
from backfill.core import verdict as v
from backfill.core.conditions import affected
from backfill.core.projector import fold, fold_all, only_position_moved
from backfill.core.runs import run_rows
from backfill.core.state import World
from backfill.sim.cluster import SimParams, simulate
from backfill.sim.traces import synthetic

from .builders import NS, TEMPLATE, t

_JOB_CLASSES = tuple(c for c in ev.EVENT_TYPES.values() if issubclass(c, ev._JobEvent))
_SPECS = (
    {"modelRef": "m1", "templateRef": "cj", "idleFor": "1m"},
    {"modelRef": "m2", "templateRef": "cj", "idleFor": "1m", "preemption": "Suspend"},
    {"modelRef": "m1", "templateRef": "cj", "idleFor": "1m", "suspend": True},
    {"modelRef": "m2", "templateRef": "nope", "idleFor": "bad"},
)
_REASONS = (v.FOREGROUND_DEMAND, v.GAMING_INTENT, v.MODEL_NOT_READY, v.SPEC_CHANGED, v.DELETED, "DeadlineExceeded", "")


def _field(cls: type, name: str, annotation: str) -> st.SearchStrategy[Any]:
    """Values of one field over a few names, so that events meet the same objects."""
    seconds = st.integers(min_value=0, max_value=600)
    if name == "namespace":
        return st.just(NS)
    if name == "name":
        if cls in _JOB_CLASSES:
            return st.sampled_from(["b1-j1", "b1-j2", "b2-j1"])
        if cls in (ev.CronJobSeen, ev.CronJobMissing):
            return st.sampled_from(["cj", "cj2"])
        return st.sampled_from(["b1", "b2"])
    if name == "job_name":
        return st.sampled_from(["b1-j1", "b1-j2", "b2-j1"])
    if name == "spec":
        return st.sampled_from(_SPECS)
    if name == "job_template":
        return st.just(TEMPLATE)
    if name == "reason":
        return st.sampled_from(_REASONS)
    if name in ("backfill",):
        return st.sampled_from(["b1", "b2"])
    if name == "model":
        return st.sampled_from(["m1", "m2"])
    if name in ("node", "shared", "group"):
        return st.sampled_from(["", "n1", "n2"])
    if name == "uid":
        return st.sampled_from(["", "u1", "u2"])
    if name == "completed_indexes":
        return st.sampled_from(["", "0", "0-2", "1,3"])
    if "atetime" in annotation:
        at = seconds.map(t)
        return st.one_of(st.none(), at) if "None" in annotation else at
    if annotation.endswith("bool'>"):
        return st.booleans()
    if "float" in annotation:
        return st.one_of(st.none(), st.floats(min_value=0, max_value=60))
    if "int" in annotation:
        small = st.integers(min_value=1, max_value=3)
        return st.one_of(st.none(), small) if "None" in annotation else small
    return st.sampled_from(["", "x", "Loading"])


@st.composite
def _event(draw: Any) -> Any:
    cls = draw(st.sampled_from(list(ev.EVENT_TYPES.values())))
    values = {name: draw(_field(cls, name, str(info.annotation))) for name, info in cls.model_fields.items() if name != "type"}
    try:
        return cls(**values)
    except ValidationError:
        values = {k: (2 if k == "segment" else x) for k, x in values.items()}  # the one bound above 1
        return cls(**values)


def _seed() -> list[Any]:
    return [
        ev.CronJobSeen(at=t(0), namespace=NS, name="cj", job_template=TEMPLATE),
        ev.ModelReady(at=t(0), namespace=NS, model="m1", node="n1"),
        ev.ModelReady(at=t(0), namespace=NS, model="m2", node="n2"),
        ev.BackfillApplied(at=t(0), namespace=NS, name="b1", uid="u1", generation=1, spec=_SPECS[0]),
        ev.BackfillApplied(at=t(0), namespace=NS, name="b2", uid="u2", generation=1, spec=_SPECS[1]),
        ev.AttemptAdmitted(at=t(1), namespace=NS, backfill="b1", uid="u1", attempt=1, generation=1, job_name="b1-j1", model="m1", node="n1"),
        ev.AttemptAdmitted(at=t(1), namespace=NS, backfill="b2", uid="u2", attempt=1, generation=1, job_name="b2-j1", model="m2", node="n2"),
    ]


def _rows(events: list[Any]) -> list[tuple[int, str, int, str]]:
    return [(i, r.type, r.version, r.data) for i, r in enumerate((ev.encode(e, f"k{i}") for i, e in enumerate(events)), 1)]


def _catch_up(pairs: list[tuple[int, Any]]) -> list[tuple[Any, ...]]:
    """What the controller's catch-up derives, event by event: the world, whether only the
    position moved, the backfills woken and the run rows changed."""
    out = []
    w = World()
    for position, e in pairs:
        before = w
        w = fold(w, e, position)
        out.append((w, only_position_moved(before, w), affected(w, e), run_rows(before, w, e)))
    return out


def _check(events: list[Any]) -> int:
    """Asserts the compiled forms derive what the events derive; returns how many were compiled."""
    rows = _rows(events)
    lean, full = ev.decode_rows(rows, lean=True), ev.decode_rows(rows)
    assert [e for _, e in full] == events  # the reference is the event itself
    steps = _catch_up(lean)
    assert steps == _catch_up(full)
    world = fold_all(World(), lean)
    assert world == fold_all(World(), full) == steps[-1][0]
    assert pickle.loads(pickle.dumps(world)) == world  # snapshots pickle the world: values only, never an event
    return sum(type(e) in ev.COMPILED for _, e in lean)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_event(), min_size=1, max_size=40))
def test_every_event_type_compiled_derives_what_the_event_derives(events):
    events = _seed() + events
    assert _check(events) == len(events)  # every class has a compiled form today


def test_a_simulations_log_compiled_derives_what_its_events_derive():
    result = simulate(synthetic(seed=3, models=3, days=0.5), SimParams(idle_for=300, max_run=900, repeat_after=60, job=300))
    events = [e for _, e, _ in result.events]
    kinds = {type(e) for e in events}
    # the mix of start-up's log: admissions with their Job facts, cancels, requests
    assert {ev.AttemptAdmitted, ev.JobCreated, ev.JobSucceeded, ev.AttemptCancelled, ev.JobDeleted, ev.ForegroundRequest} <= kinds
    assert _check(events) == len(events)


def test_job_facts_of_unexplained_and_orphaned_jobs_fold_alike():
    # the handlers' type tests (a Job's end, a terminating Job) must hold for compiled forms:
    # an unexplained Job listed then ended, and a deleted declaration's live Job ended
    at = t(100)
    events = _seed() + [
        ev.JobCreated(at=at, namespace=NS, backfill="b1", name="b1-j2", uid="x1"),  # not attempt 1's: unexplained
        ev.JobTerminating(at=at, namespace=NS, backfill="b1", name="b1-j2", uid="x1"),
        ev.JobSucceeded(at=at + timedelta(seconds=1), namespace=NS, backfill="b1", name="b1-j2", uid="x1"),
        ev.JobCreated(at=at, namespace=NS, backfill="b2", name="b2-j1", uid="j2"),
        ev.BackfillDeleting(at=at, namespace=NS, name="b2", uid="u2"),
        ev.BackfillDeleted(at=at, namespace=NS, name="b2", uid="u2"),  # its Job still live: an orphan
        ev.JobDeleted(at=at + timedelta(seconds=2), namespace=NS, backfill="b2", name="b2-j1", uid="j2"),
    ]
    full = _catch_up(list(enumerate(events, 1)))
    assert (NS, "b1") in {k for k, b in full[8][0].backfills.items() if b.unexplained}  # listed after JobCreated
    assert not full[10][0].backfills[(NS, "b1")].unexplained  # and gone with its end
    assert any("/" in k[1] for k in full[12][0].live) and not any("/" in k[1] for k in full[13][0].live)
    assert _check(events) == len(events)


def test_a_suspension_seen_while_resuming_is_kept_as_a_value_that_pickles():
    # an adversarial trial: a JobSuspended observed while a resume is under way was kept in the
    # world as the event itself; caught up in its compiled form, the world could not be pickled
    # and no snapshot was written again. Then the Job fails: the attempt ends with it kept.
    spec = {"modelRef": "m1", "templateRef": "cj", "idleFor": "1m", "preemption": "Suspend"}
    job = dict(namespace=NS, backfill="b1", name="b1-1", uid="j1")
    events = [
        ev.CronJobSeen(at=t(0), namespace=NS, name="cj", job_template=TEMPLATE),
        ev.ModelReady(at=t(0), namespace=NS, model="m1", node="n1"),
        ev.BackfillApplied(at=t(0), namespace=NS, name="b1", uid="u1", generation=1, spec=spec),
        ev.AttemptAdmitted(at=t(100), namespace=NS, backfill="b1", uid="u1", attempt=1, generation=1, job_name="b1-1", model="m1", node="n1"),
        ev.JobCreated(at=t(101), **job),
        ev.JobRunning(at=t(102), **job),
        ev.AttemptCancelled(at=t(200), namespace=NS, backfill="b1", uid="u1", attempt=1, job_name="b1-1", reason=v.FOREGROUND_DEMAND, suspend=True, segment=1),
        ev.JobSuspended(at=t(201), completed_indexes="0", episode="e1", **job),
        ev.AttemptResumed(at=t(400), namespace=NS, backfill="b1", uid="u1", attempt=1, job_name="b1-1", segment=2, generation=1, model="m1", node="n1"),
        ev.JobSuspended(at=t(401), completed_indexes="0-1", episode="e2", **job),  # while resuming: kept
        ev.JobFailed(at=t(500), reason="BackoffLimitExceeded", **job),
    ]
    kept = _catch_up(list(enumerate(events, 1)))[9][0].backfills[(NS, "b1")].attempt.seen_suspended
    assert (kept.at, kept.completed_indexes) == (t(401), "0-1")
    assert _check(events) == len(events)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_event())
def test_build_materialize_and_key_of_agree_with_the_event(event):
    """``build`` (the simulator's compiled forms) gives the row a stored event decodes to;
    ``materialize`` gives back the event, field for field and byte for byte when stored; and
    ``key_of`` names both forms by the event's own ``natural_key``."""
    cls = type(event)
    values = {name: value for name, value in event.__dict__.items() if name != "type"}
    built = ev.build(cls, **values)
    ((_, decoded),) = ev.decode_rows(_rows([event]), lean=True)
    assert type(built) is type(decoded) and built == decoded  # the row a stored event decodes to
    back = ev.materialize(built)
    assert type(back) is cls and back == event and list(back.__dict__) == list(event.__dict__)
    assert back.model_fields_set == ev.construct(cls, **values).model_fields_set
    assert ev.encode(back, "k") == ev.encode(event, "k")
    assert ev.materialize(event) is event
    assert ev.key_of(built) == ev.key_of(event) == event.natural_key()


def test_build_refuses_what_construct_refuses():
    for bad in ({"nope": 1}, {"type": "JobCreated"}):
        with pytest.raises(TypeError):
            ev.build(ev.JobCreated, at=t(0), namespace=NS, backfill="b1", name="j", **bad)
        with pytest.raises(TypeError):
            ev.construct(ev.JobCreated, at=t(0), namespace=NS, backfill="b1", name="j", **bad)
    with pytest.raises(TypeError):
        ev.build(ev.JobCreated, at=t(0))  # no namespace, backfill, name
