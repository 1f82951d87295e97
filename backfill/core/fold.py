"""The fold: ``fold(world, event, position) -> world``, one handler per event type.

Pure and deterministic (no I/O, no clock): the same events always give the same
:class:`~backfill.core.state.World`. The live controller, ``backfill replay`` and ``backfill
simulate`` all fold with this module. A new event type is a class in
:mod:`backfill.core.events` plus one handler in :data:`_FOLD` (the assertion at the end of the
table refuses a type without one); if it can change a decision, say which conditions it wakes in
:mod:`backfill.core.conditions`. A handler reads the event's fields only and keeps values, never
the event: start-up and catch-up hand it the event's compiled form
(:data:`backfill.core.events.COMPILED`), so a type test is ``type(e) in`` a
:func:`~backfill.core.events.with_compiled` set, not ``isinstance``
(``tests/core/test_compiled_events.py`` folds every event type both ways).

Every handler takes ``(world, event, position)`` and returns a new world sharing what did not
change (``immutables.Map`` underneath: O(log32 n) per event, nothing copied wholesale, issue 10).
The hottest handler (``ForegroundRequest``) builds its tuples positionally; :func:`fold_all`, the
batch fold, folds runs of them into a transient map at a cost per event that does not grow with n.
"""

from __future__ import annotations

from datetime import datetime
from collections.abc import Mapping
from typing import Any, Callable, Iterable

from . import conditions
from . import events as ev
from . import indexes
from .jobtemplate import attempt_of_job_name, gpu_requests, template_problem
from .spec import INVALID_SPEC, SpecProblem, parse_spec
from .state import (
    LIVE,
    CANCELLING,
    IDLE,
    RUNNING,
    STARTING,
    SUSPENDED,
    SUSPENDING,
    Attempt,
    BackfillState,
    CreateRejection,
    Gate,
    GateEnd,
    Key,
    orphan_key,
    ModelState,
    SeenSuspension,
    Template,
    World,
    replace,
)
from .timefmt import plus_seconds
from .verdict import FOREGROUND_DEMAND, GPU_REQUEST_FORBIDDEN, INVALID_TEMPLATE, JOB_DELETED, JOB_REJECTED, JOB_SUSPENDED, cancel_result

#: Back-off of a Job create the API server refused transiently (``JobCreateRejected``), seconds:
#: 10, 20, 40, ... at most 300, and never sooner than the server's ``Retry-After``.
CREATE_BACKOFF_INITIAL = 10.0
CREATE_BACKOFF_MAX = 300.0

_NO_MODEL = ModelState()


def fold(world: World, event: Any, position: int = 0) -> World:
    """Fold one event into the world and return the new world (the input is not changed).

    Args:
        world: the state after every earlier event (``World()`` at the start of the log).
        event: a member of :data:`backfill.core.events.Event`.
        position: the event's log position (0 when it has none, e.g. in a unit test); decisions
            remember positions to name their causes.

    Returns:
        The new :class:`World`, with ``position`` set to ``position``.

    Raises:
        KeyError: an object that is not an event (programming error, never bad input).
    """
    return _FOLD[type(event)](world, event, position)


def fold_all(world: World, events: Iterable[tuple[int, Any]]) -> World:
    """Fold ``(position, event)`` pairs in order; returns the final world, equal to folding them
    one by one with :func:`fold` (``tests/core/test_fold_all.py``); ``world`` is not changed.

    The batch fold of start-up, catch-up and replay, where no caller looks at the worlds in
    between. A run of consecutive ``ForegroundRequest`` events (the log's commonest, issue 10)
    is folded into one transient of the models map (``immutables.Map.mutate()``: its nodes are
    copied once per run, then changed in place) and one World is built at the run's end, so an
    event of the run costs about the same whatever the number of objects; every other event goes
    through its handler as in :func:`fold`.

    An event may be its compiled form (:data:`backfill.core.events.COMPILED`, as
    ``decode_rows(..., lean=True)`` gives it): it folds exactly as the event.

    Raises:
        KeyError: an object that is not an event (as :func:`fold`).
    """
    table = _FOLD
    foreground = ev.ForegroundRequest
    compiled = ev.ForegroundRequestRow
    run = None  # the models transient of the current run of foreground requests
    last = 0
    for position, event in events:
        t = type(event)
        if t is foreground or t is compiled:
            if run is None:
                run = world[1].mutate()
            key = (event.namespace, event.model)
            run[key] = _foreground_model(run.get(key, _NO_MODEL), event, position)
            last = position
            continue
        if run is not None:
            world = _tuple_new(World, (last, run.finish()) + world[2:])
            run = None
        world = table[t](world, event, position)
    if run is not None:
        world = _tuple_new(World, (last, run.finish()) + world[2:])
    return world


_tuple_new = tuple.__new__


assert World._fields[:2] == ("position", "models"), "_at/_fold_foreground build World positionally"


def _at(w: World, pos: int) -> World:
    """``w`` with only its position moved (the common no-op fold; 5x cheaper than World._replace)."""
    return _tuple_new(World, (pos,) + w[1:])


def _set(mapping: Any, key, value) -> Any:
    """``mapping`` (an ``immutables.Map``) with ``key`` set: O(log n), the rest shared."""
    return mapping.set(key, value)


def _drop(mapping: Any, key) -> Any:
    """``mapping`` without ``key`` (unchanged when absent)."""
    return mapping.delete(key) if key in mapping else mapping


def _index_add(index: Any, name: Any, key: Key) -> Any:
    keys = index.get(name, ())
    if key in keys:
        return index
    return index.set(name, (key,) if not keys else tuple(sorted((*keys, key))))


def _index_remove(index: Any, name: Any, key: Key) -> Any:
    keys = index.get(name, ())
    if key not in keys:
        return index
    if len(keys) == 1:
        return index.delete(name)
    return index.set(name, tuple(k for k in keys if k != key))


def _live_changes(world: World, key: Key, a: Attempt | None) -> dict[str, Any]:
    """:func:`_live_triple` as ``World._replace`` keywords (for handlers that change more)."""
    live, live_models, live_nodes = _live_triple(world, key, a)
    return {"live": live, "live_models": live_models, "live_nodes": live_nodes}


def _live_triple(world: World, key: Key, a: Attempt | None) -> tuple[Any, Any, Any]:
    """``(live, live_models, live_nodes)`` of ``world`` after ``key``'s attempt became ``a``
    (None or an ended attempt: no longer live); the same objects where nothing changes."""
    live = world[9]
    old = live.get(key)
    new = a if a is not None and a.lifecycle in _LIVE else None
    if old is new:
        return world[9:12]
    live_models, live_nodes = world[10], world[11]
    if old is not None:
        if new is not None:
            if old.model == new.model and old.node == new.node:
                return live.set(key, new), live_models, live_nodes  # the commonest change: same Model and node
            live = live.set(key, new)
        else:
            live = live.delete(key)  # old is not new: old is in ``live``
        live_models = _index_remove(live_models, (key[0], old.model), key)
        if old.node:
            live_nodes = _index_remove(live_nodes, old.node, key)
        if new is None:
            return live, live_models, live_nodes
    else:
        live = live.set(key, new)
    # ``new`` is live, on another Model or node than ``old`` (or ``old`` is None)
    live_models = _index_add(live_models, (key[0], new.model), key)
    if new.node:
        live_nodes = _index_add(live_nodes, new.node, key)
    return live, live_models, live_nodes


_LIVE = frozenset(LIVE)  # Attempt.live's lifecycles, as a set (tested inline on the hot paths)
_LIVE_OR_SUSPENDED = _LIVE | {SUSPENDED}


assert World._fields[3] == "backfills" and World._fields[9:] == ("live", "live_models", "live_nodes", "node_models")


def _put_backfill(world: World, b: BackfillState, position: int) -> World:
    """Store ``b`` and keep the live-attempt indexes in step (World built positionally: the
    backfills' commonest change, about a third of a replay's fold)."""
    key = (b.namespace, b.name)
    live, live_models, live_nodes = _live_triple(world, key, b.attempt)
    return _tuple_new(
        World,
        (position, world[1], world[2], world[3].set(key, b), world[4], world[5], world[6], world[7], world[8], live, live_models, live_nodes, world[12]),
    )


def _put_attempt(world: World, b: BackfillState, a: Attempt | None, position: int) -> World:
    """:func:`_put_backfill` of ``b`` with its current attempt ``a`` (the commonest change of a
    backfill)."""
    return _put_backfill(world, replace(b, attempt=a), position)


def _foreground_model(m: ModelState, e: ev.ForegroundRequest, pos: int) -> ModelState:
    """Model ``m`` after foreground request ``e`` at ``pos`` (the one rule of :func:`fold` and
    :func:`fold_all`): busy until ``e.busy_until`` (at least ``e.at``) when that extends the
    known busy time, and ``last_active`` moved by a ``lastActiveTime`` report: the hottest path
    of the fold."""
    at = e.at
    end = e.busy_until
    if end is None or end <= at:
        end = at
    last_active = m.last_active
    if e.source == "lastActiveTime" and (last_active is None or at > last_active):
        last_active = at
    busy_until = m.busy_until
    if busy_until is None or end > busy_until:
        return replace(m, busy_until=end, busy_pos=pos, request_pos=pos, last_active=last_active)
    # Busy until ``end`` is known already (a re-sent report, a late one inside a known busy
    # span): not new demand. An attempt admitted after that span began its idle window after
    # it, so nothing it says was unseen by the admission.
    return replace(m, last_active=last_active)


def _fold_foreground(w: World, e: ev.ForegroundRequest, pos: int) -> World:
    key = (e.namespace, e.model)
    models = w[1]
    return _tuple_new(World, (pos, models.set(key, _foreground_model(models.get(key, _NO_MODEL), e, pos))) + w[2:])


def _replaced(m: ModelState, e: ev.ModelReady | ev.ModelNotReady) -> bool:
    """Whether readiness observation ``e`` is of another Model object than ``m`` was (both uids
    known and different: deleted and created again under the same name). A uid not known before
    (rows written before it was recorded) is taken as the same object."""
    return bool(e.uid) and bool(m.uid) and e.uid != m.uid


def _fold_model_ready(w: World, e: ev.ModelReady, pos: int) -> World:
    key = (e.namespace, e.model)
    m = w.models.get(key, _NO_MODEL)
    replaced = _replaced(m, e)
    uid = e.uid or m.uid
    if m.exists and m.ready and m.node == e.node and m.shared == e.shared and uid == m.uid:
        return _at(w, pos)
    # A Model created again (another uid) is Ready from this observation, also when no watch saw
    # the old object go (the controller down, or a watch gap and a relist): no window carries over.
    fresh = not m.ready or (m.node != e.node) or replaced
    since, since_pos = (e.at, pos) if fresh else (m.ready_since, m.ready_pos)
    new = replace(m,
        exists=True, ready=True, node=e.node, shared=e.shared, uid=uid,
        replaced_pos=pos if replaced else m.replaced_pos, ready_since=since, ready_pos=since_pos,
    )  # fmt: skip
    return _put_model(w, key, m, new, pos)


def _fold_model_not_ready(w: World, e: ev.ModelNotReady, pos: int) -> World:
    key = (e.namespace, e.model)
    m = w.models.get(key, _NO_MODEL)
    replaced_pos = pos if _replaced(m, e) else m.replaced_pos
    new = replace(m, exists=True, ready=False, node=e.node or m.node, shared=e.shared, uid=e.uid or m.uid, replaced_pos=replaced_pos)
    return _put_model(w, key, m, new, pos)


def _fold_model_deleted(w: World, e: ev.ModelDeleted, pos: int) -> World:
    key = (e.namespace, e.model)
    m = w.models.get(key, _NO_MODEL)
    m = replace(m, exists=False, ready=False, gone_pos=pos)
    return w._replace(position=pos, models=_set(w.models, key, m))


def _gate_end(ends: Mapping[str, GateEnd], name: str, at: datetime, pos: int) -> Mapping[str, GateEnd]:
    if not name:
        return ends
    old = ends.get(name)
    if old is not None and old.at >= at:
        return ends
    return _set(ends, name, GateEnd(at, pos))


def _ended_at(gate: Gate, at: datetime) -> datetime:
    """A gate ends when its end is observed, or earlier at its expiry."""
    return gate.expires_at if gate.expires_at is not None and gate.expires_at < at else at


def _fold_gaming_started(w: World, e: ev.GamingIntentStarted, pos: int) -> World:
    key = (e.namespace, e.session)
    old = w.gaming.get(key)
    node_ends = w.node_gate_ends
    if old is not None and old.node != e.node:
        node_ends = _gate_end(node_ends, old.node, _ended_at(old, e.at), pos)
    if old is not None and old.node == e.node and old.expires_at == e.expires_at:
        return _at(w, pos)  # re-delivered unchanged: the gate keeps the position it began at
    since = old.since if old is not None and old.node == e.node else e.at
    gate = Gate(node=e.node, group="", expires_at=e.expires_at, since=since, pos=pos)
    return w._replace(position=pos, gaming=_set(w.gaming, key, gate), node_gate_ends=node_ends)


def _fold_gaming_ended(w: World, e: ev.GamingIntentEnded, pos: int) -> World:
    key = (e.namespace, e.session)
    old = w.gaming.get(key)
    if old is None:
        return _at(w, pos)
    ends = _gate_end(w.node_gate_ends, old.node, _ended_at(old, e.at), pos)
    return w._replace(position=pos, gaming=_drop(w.gaming, key), node_gate_ends=ends)


def _fold_lease_active(w: World, e: ev.GPULeaseActive, pos: int) -> World:
    key = (e.namespace, e.lease)
    old = w.leases.get(key)
    node_ends, group_ends = w.node_gate_ends, w.group_gate_ends
    if old is not None:
        if old.node != e.node:
            node_ends = _gate_end(node_ends, old.node, _ended_at(old, e.at), pos)
        if old.group != e.group:
            group_ends = _gate_end(group_ends, old.group, _ended_at(old, e.at), pos)
    same = old is not None and old.node == e.node and old.group == e.group
    if same and old.expires_at == e.expires_at:
        return _at(w, pos)  # re-delivered unchanged: the gate keeps the position it began at
    gate = Gate(node=e.node, group=e.group, expires_at=e.expires_at, since=old.since if same else e.at, pos=pos)
    return w._replace(
        position=pos, leases=_set(w.leases, key, gate), node_gate_ends=node_ends, group_gate_ends=group_ends
    )


def _fold_lease_ended(w: World, e: ev.GPULeaseEnded, pos: int) -> World:
    key = (e.namespace, e.lease)
    old = w.leases.get(key)
    if old is None:
        return _at(w, pos)
    at = _ended_at(old, e.at)
    return w._replace(
        position=pos,
        leases=_drop(w.leases, key),
        node_gate_ends=_gate_end(w.node_gate_ends, old.node, at, pos),
        group_gate_ends=_gate_end(w.group_gate_ends, old.group, at, pos),
    )


def _reindex(index: Any, key: Key, old_model: Key | None, new_model: Key | None) -> Any:
    if old_model == new_model:
        return index
    if old_model is not None:
        index = _index_remove(index, old_model, key)
    if new_model is not None:
        index = _index_add(index, new_model, key)
    return index


def _put_model(w: World, key: Key, old: ModelState, m: ModelState, pos: int) -> World:
    """Store Model ``m`` (was ``old``) and keep the node -> models index in step."""
    if old.node == m.node:
        return w._replace(position=pos, models=_set(w.models, key, m))
    nodes = w.node_models
    if old.node:
        nodes = _index_remove(nodes, old.node, key)
    if m.node:
        nodes = _index_add(nodes, m.node, key)
    return w._replace(position=pos, models=_set(w.models, key, m), node_models=nodes)


def _model_key(b: BackfillState | None) -> Key | None:
    if b is None or b.gone or not b.model_ref:
        return None
    return (b.namespace, b.model_ref)


def _fold_applied(w: World, e: ev.BackfillApplied, pos: int) -> World:
    key = (e.namespace, e.name)
    old = w.backfills.get(key)
    if old is not None and old.uid == e.uid and e.generation < old.generation:
        return _at(w, pos)  # a stale copy of an older generation
    if old is not None and old.uid == e.uid and e.generation == old.generation and old.raw_spec == e.spec:
        return _at(w, pos)  # re-delivered (a status write of ours): nothing to wake
    if old is None or old.uid != e.uid:
        b = BackfillState(namespace=e.namespace, name=e.name, uid=e.uid)
        old_index_model = _model_key(old)
        w = w._replace(**_live_changes(w, key, None))
    else:
        b = old
        old_index_model = _model_key(old)
    parsed = parse_spec(e.spec) if not e.unstorable else SpecProblem(INVALID_SPEC, e.unstorable)
    spec, problem = (parsed, None) if not hasattr(parsed, "reason") else (None, parsed)
    if b is old and _only_suspend_changed(old.raw_spec, e.spec):
        # Pausing is not new work: a success's cooldown (nextRunTime) and a failure outlive
        # ``suspend: true`` then ``false`` (a new user's trial: un-suspending a recurring
        # declaration ran it at once). Another field changed is an intentional change: it runs
        # again (seed).
        b = replace(b,
            succeeded_generation=e.generation if old.succeeded_generation == old.generation else old.succeeded_generation,
            failed_generation=e.generation if old.failed_generation == old.generation else old.failed_generation,
        )
    b = replace(b, generation=e.generation, raw_spec=dict(e.spec), spec=spec, problem=problem)
    index = _reindex(w.model_index, key, old_index_model, _model_key(b))
    return _put_backfill(w, b, pos)._replace(model_index=index)


def _only_suspend_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether specs ``old`` and ``new`` (raw) differ in ``suspend`` alone (absent is false)."""
    return {k: v for k, v in old.items() if k != "suspend"} == {k: v for k, v in new.items() if k != "suspend"}


def _fold_deleting(w: World, e: ev.BackfillDeleting, pos: int) -> World:
    b = w.backfills.get((e.namespace, e.name))
    if b is None or b.uid != e.uid or b.deleting:
        return _at(w, pos)
    return _put_backfill(w, replace(b, deleting=True), pos)


def _fold_deleted(w: World, e: ev.BackfillDeleted, pos: int) -> World:
    key = (e.namespace, e.name)
    b = w.backfills.get(key)
    if b is None or b.uid != e.uid:
        return _at(w, pos)
    index = _reindex(w.model_index, key, _model_key(b), None)
    w = w._replace(position=pos, backfills=_drop(w.backfills, key), model_index=index, **_live_changes(w, key, None))
    a = b.attempt
    if a is not None and a.live and (a.created_at is not None or a.started_at is not None):
        # Deleted with its Job still going (its finalizer removed by hand; a fault trial: the
        # declaration created again under the same name was admitted on the same Model while
        # that Job still terminated): the Job stays a rival on its Model and node, under
        # :func:`orphan_key`, until its end is observed (:func:`_orphan_event`). Only an
        # observed Job: a relist can tell when it is gone.
        w = w._replace(**_live_changes(w, orphan_key(key, a.job_name), a))
    return w


def _orphan_event(w: World, e: ev._JobEvent, pos: int) -> World | None:
    """``w`` after Job event ``e`` if it is about a deleted declaration's live Job
    (:func:`orphan_key`): its end frees its Model and node; anything else about it changes
    nothing (it is not unexplained: the log knows it). None when ``e`` is about no such Job."""
    okey = orphan_key((e.namespace, e.backfill), e.name)
    a = w.live.get(okey)
    if a is None or (e.uid and a.job_uid and e.uid != a.job_uid):
        return None
    if type(e) in _JOB_OVER:
        return w._replace(position=pos, **_live_changes(w, okey, None))
    return _at(w, pos)


def _template_check(name: str, job_template: Mapping[str, Any], unstorable: str = "") -> tuple[str, str] | None:
    problem = unstorable or template_problem(job_template)
    if problem:
        return (INVALID_TEMPLATE, f"CronJob {name}: {problem}")
    gpus = gpu_requests(job_template)
    if gpus:
        return (GPU_REQUEST_FORBIDDEN, f"CronJob {name}'s Job template could reach a GPU: " + "; ".join(gpus))
    return None


def _fold_cronjob_seen(w: World, e: ev.CronJobSeen, pos: int) -> World:
    old = w.templates.get((e.namespace, e.name))
    if old is not None and old.job_template == e.job_template and old.unstorable == e.unstorable:
        return _at(w, pos)  # the same template (a CronJob status update): it keeps its position
    t = Template(e.job_template, pos, _template_check(e.name, e.job_template, e.unstorable), e.unstorable)
    return w._replace(position=pos, templates=_set(w.templates, (e.namespace, e.name), t))


def _fold_cronjob_missing(w: World, e: ev.CronJobMissing, pos: int) -> World:
    return w._replace(position=pos, templates=_set(w.templates, (e.namespace, e.name), Template(None, pos)))


def _job_attempt(w: World, e: ev._JobEvent) -> tuple[BackfillState, Attempt] | None:
    """The backfill and its current attempt when ``e`` is about that attempt's Job, else None
    (the handlers then fold it as a possibly unexplained Job, :func:`_unexplained`). Once the
    attempt has ended, only the Job object it had (its uid) is its Job: another Job under the
    same name (created again after the attempt's was deleted) is not, nor is the end of one. A
    Job with no controller ownerReference (``e.owned`` False) is the attempt's only under the uid
    the log knows for it (ours, its ownerReference removed: still cancelled)."""
    b = w.backfills.get((e.namespace, e.backfill))
    if b is None or b.attempt is None or b.attempt.job_name != e.name:
        return None
    a = b.attempt
    if not e.owned and (not a.job_uid or e.uid != a.job_uid):
        return None  # only labelled: the attempt's Job only if the log knows it by this uid
    if a.lifecycle in _LIVE_OR_SUSPENDED:  # a.live or a.suspended, without two calls (every Job event)
        return b, a
    if type(e) in _JOB_OVER or e.uid != a.job_uid:
        return None
    return b, a


#: Job observations that say the Job no longer runs anything of its own accord (and their
#: compiled forms: tested with ``type(e) in``).
_JOB_OVER = ev.with_compiled(ev.JobSucceeded, ev.JobFailed, ev.JobDeleted)
_TERMINATING = ev.with_compiled(ev.JobTerminating)


def _unexplained(w: World, e: ev._JobEvent, pos: int) -> World:
    """A Job owned by a known ModelBackfill that none of its logged attempts explains (its name
    is not the current attempt's: another controller on another log, a database restored from
    an older backup, an older incarnation's Job): while it exists and has not ended it is
    listed in :attr:`BackfillState.unexplained`, and ``decide`` deletes it and admits nothing
    for that ModelBackfill meanwhile (fail-closed: admit only what the log can explain)."""
    orphan = _orphan_event(w, e, pos)
    if orphan is not None:
        return orphan
    b = w.backfills.get((e.namespace, e.backfill))
    if b is None:
        return _at(w, pos)  # not a known backfill's
    taken = attempt_of_job_name(e.name, b.name, b.uid)
    if taken > b.attempts and taken > b.names_taken:
        # A Job (ours or not, live or finished) under the name of an attempt this log never
        # admitted: another log of this ModelBackfill made it (a fresh schema, a restored
        # database). The next attempt is numbered past it: its create would have found this
        # Job (AlreadyExists), whose JobCreated is in the log already, and waited in Starting
        # for ever (a new user's trial), then its cancel deleted that finished Job.
        b = replace(b, names_taken=taken)
        w = _put_backfill(w, b, pos)
    if not e.owned:
        return _at(w, pos)  # only labelled as the backfill's: somebody else's
    listed = any(name == e.name for name, _ in b.unexplained)
    if type(e) in _TERMINATING and not listed:
        # Being deleted, and not listed: its JobCreated (always translated before it, keyed by
        # the uid) was folded already and explained then: an earlier attempt's finished Job
        # that ``ttlSecondsAfterFinished`` or a hand deletes (a new user's trial: such a
        # deletion was warned of as a Job "not in the event log", deleted again, and held the
        # admissions until it was gone).
        return _at(w, pos)
    if type(e) in _JOB_OVER:
        if not listed:
            return _at(w, pos)
        return _put_backfill(w, replace(b, unexplained=tuple(j for j in b.unexplained if j[0] != e.name)), pos)
    if listed:
        return _at(w, pos)
    return _put_backfill(w, replace(b, unexplained=tuple(sorted((*b.unexplained, (e.name, e.uid))))), pos)


def _end(b: BackfillState, a: Attempt, at: datetime, result: str, reason: str, pos: int) -> BackfillState:
    a = a.ended(at, result, reason, pos)
    if result == "succeeded":
        return replace(b, attempt=a, succeeded_at=at, succeeded_generation=a.generation)
    if result in ("failed", "deadline_exceeded"):
        return replace(b, attempt=a, failed_generation=a.generation)
    return replace(b, attempt=a)


def _fold_job_created(w: World, e: ev.JobCreated, pos: int) -> World:
    found = _job_attempt(w, e)
    if found is None:
        return _unexplained(w, e, pos)
    b, a = found
    if a.created_at is not None or a.lifecycle not in _LIVE:  # not a.live
        return _at(w, pos)
    a = replace(a, created_at=e.at, job_uid=e.uid or a.job_uid, lifecycle=RUNNING if a.lifecycle == STARTING else a.lifecycle)
    return _put_attempt(w, b, a, pos)


def _fold_job_running(w: World, e: ev.JobRunning, pos: int) -> World:
    found = _job_attempt(w, e)
    if found is None:
        return _unexplained(w, e, pos)
    b, a = found
    if a.started_at is not None or not a.live:
        return _at(w, pos)
    a = replace(a,
        started_at=e.at,
        created_at=a.created_at or e.at,
        job_uid=e.uid or a.job_uid,
        lifecycle=RUNNING if a.lifecycle == STARTING else a.lifecycle,
    )
    return _put_attempt(w, b, a, pos)


def _fold_job_succeeded(w: World, e: ev.JobSucceeded, pos: int) -> World:
    found = _job_attempt(w, e)
    if found is None:  # also an ended attempt's (its Job's end is folded once)
        return _unexplained(w, e, pos)
    b, a = found
    at = e.at
    if a.lifecycle == SUSPENDED:  # a.suspended (_ended_while_suspended), without its two calls
        a = _ended_while_suspended(a, at)
    if e.completed_indexes:  # nothing to merge otherwise (_progress)
        a = _progress(a, e.completed_indexes, at)
    return _put_backfill(w, _end(b, a, at, "succeeded", "Completed", pos), pos)


def _fold_job_failed(w: World, e: ev.JobFailed, pos: int) -> World:
    found = _job_attempt(w, e)
    if found is None:  # also an ended attempt's (its Job's end is folded once)
        return _unexplained(w, e, pos)
    b, a = found
    a = _ended_while_suspended(a, e.at)
    result = "deadline_exceeded" if e.reason == "DeadlineExceeded" else "failed"
    return _put_backfill(w, _end(b, a, e.at, result, e.reason or "JobFailed", pos), pos)


def _fold_job_deleted(w: World, e: ev.JobDeleted, pos: int) -> World:
    found = _job_attempt(w, e)
    if found is None:  # also an ended attempt's (its Job's end is folded once)
        b = w.backfills.get((e.namespace, e.backfill))
        a = b.attempt if b is not None else None
        if a is not None and a.kept_job and e.uid and e.uid == a.job_uid and e.name == a.job_name:
            # The ended attempt's own Job deleted afterwards (a new user's trial: status.jobName
            # still named a Job that no longer existed).
            return _put_attempt(w, b, replace(a, job_gone=True), pos)
        return _unexplained(w, e, pos)
    b, a = found
    if not e.uid and a.job_uid:
        # An absence without a uid is the actor's read of a Job whose uid its deciding state did
        # not know (the create not yet confirmed). The log knows it now: the read may have come
        # before the create landed (the admission's create in flight; a chaos soak saw the 404,
        # then the 201, and the attempt ended with its Job running and never deleted). It ends
        # nothing: the re-issued delete goes under the uid, and its 404 is observed with it.
        return _at(w, pos)
    if a.lifecycle == SUSPENDED:
        # Deleted by someone else while suspended: no segment ran (the last row stays preempted);
        # the attempt is over and the next admission creates a new Job.
        return _put_backfill(w, _end(b, a, e.at, "cancelled", JOB_DELETED, pos), pos)
    if a.lifecycle == CANCELLING or a.lifecycle == SUSPENDING:
        return _put_backfill(w, _end(b, a, e.at, cancel_result(a.cancel_reason), a.cancel_reason, pos), pos)
    hit = conditions.first_hit(conditions.CANCEL_CHECKS, w, conditions.subject(w, b, a), e.at)
    if hit is not None:
        # Gone while a cancel condition held (what ``decide`` cancels for, the same table): ended
        # for it, whoever deleted the Job (foreground demand the attempt did not see, gaming
        # intent, a spec change ...). The leader's cancel DELETEs first and is recorded after
        # (fail-safe), so a standby's (or a paused leader's successor's) record of the deletion
        # can reach the log before the cancel decision.
        # A foreground preemption restarts the idle window at the cancel (:func:`_busy_at_least`);
        # its decision may never reach the log (its leader died with it spooled), so at the
        # latest at the deletion.
        result = cancel_result(hit.reason)
        if hit.reason == FOREGROUND_DEMAND:
            w = _busy_at_least(w, (b.namespace, a.model), e.at, pos)
        a = replace(a, cancel_reason=hit.reason, cancel_message=hit.message, cancel_pos=hit.cause)
        return _put_backfill(w, _end(b, a, e.at, result, hit.reason, pos), pos)
    return _put_backfill(w, _end(b, a, e.at, "cancelled", JOB_DELETED, pos), pos)


def unexplained_stop(a: Attempt | None) -> tuple[datetime, int] | None:
    """``(when, position)`` of the observation that stopped attempt ``a``'s Job with nothing in
    the log explaining it: a deletion (:func:`ended_unexplained`) or a suspension
    (``JobSuspended``, no suspending decision folded yet); None otherwise.

    ``decide`` starts the next idle window there (fail-closed: most likely a preemption whose
    report and decision were lost with their leader, else someone's hand), so the next attempt
    or resume waits a fresh full ``idleFor``; a decision recorded later names the stop
    (:func:`_late_cancel`, :func:`_fold_suspend_decided`) and then its own rule applies."""
    if a is None:
        return None
    if ended_unexplained(a):
        return a.ended_at, a.end_pos  # type: ignore[return-value]
    if a.segment_ended_at is not None and a.segment_reason == JOB_SUSPENDED:
        # Suspended for no logged reason: still Suspended, or ended since (its Job deleted, a
        # spec change) with no run after the suspension: the doubt stays the same.
        return a.segment_ended_at, a.segment_pos
    if a.lifecycle == IDLE and a.end_reason == JOB_SUSPENDED and not a.resumable:
        # A Delete-mode Job suspended by someone else, deleted since (_suspension_before_decision)
        return a.ended_at, a.end_pos  # type: ignore[return-value]
    return None


def ended_unexplained(a: Attempt | None) -> bool:
    """True when attempt ``a`` ended by a deletion of its Job that nothing in the log explained
    (``cancelled``/``JobDeleted``, no cancel known, not after a suspension); a cancel recorded
    later re-attributes it (:func:`_late_cancel`)."""
    return (
        a is not None and a.lifecycle == IDLE and a.result == "cancelled" and a.end_reason == JOB_DELETED
        and not a.cancel_pos and a.segment_ended_at is None
    )  # fmt: skip


def ended_for_condition(a: Attempt | None) -> bool:
    """True when attempt ``a`` ended by a deletion of its Job while a cancel condition held and
    no cancel decision of it was in the log (:func:`_fold_job_deleted`: ended for that
    condition, ``cancel_reason`` and ``cancel_pos`` its reason and cause, ``cancelled_at``
    unset: no decision). A cancel of ``a`` for the same reason recorded later is the decision
    behind that deletion, reaching the log after it (the replay auditor checks it so)."""
    return (
        a is not None and a.lifecycle == IDLE and a.ended_at is not None and a.cancelled_at is None
        and bool(a.cancel_pos) and a.segment_ended_at is None
    )  # fmt: skip


def _late_cancel(a: Attempt, e: ev.AttemptCancelled, pos: int) -> Attempt | None:
    """``a`` re-attributed to deleting cancel ``e`` when ``e`` is the decision that deleted its Job
    but reached the log after the deletion (:func:`ended_unexplained`). A cancel is decided only
    while its decider sees the attempt live, so one recorded after an unexplained deletion is that
    deletion's cause, whatever its ``basis`` (the report that caused it may itself reach the log
    after the deletion: another replica recorded the deletion first). None otherwise (``e`` then
    changes nothing, as any stale decision)."""
    if e.suspend or a.number != e.attempt or not ended_unexplained(a):
        return None
    return replace(_cancel_decided(a, e, pos), lifecycle=IDLE, result=cancel_result(e.reason), end_reason=e.reason)


def revived(w: World, key: Key) -> World | None:
    """``w`` with ``key``'s attempt live again (Running) if a deletion nothing explained ended
    it, or a suspension whose decision is not in the log yet suspended it, else None: the state
    a cancel decided before that observation reached the log saw (the replay auditor checks
    such a late cancel on it)."""
    b = w.backfills.get(key)
    a = b.attempt if b is not None else None
    if a is not None and ended_unexplained(a):
        live = replace(a, lifecycle=RUNNING, ended_at=None, end_pos=0, result=None, end_reason="")
    elif _suspended_before_decision(a):
        live = replace(a,
            lifecycle=RUNNING, suspend=False, cancel_reason="", cancel_message="", cancel_pos=0,
            segment_ended_at=None, segment_reason="", segment_pos=0,
        )
    else:
        return None
    return _put_attempt(w, b, live, w.position)


def create_backoff(count: int, retry_after: float | None = None) -> float:
    """Seconds before creating again after the ``count``-th transient refusal (1-based)."""
    backoff = min(CREATE_BACKOFF_MAX, CREATE_BACKOFF_INITIAL * 2 ** min(count - 1, 30))
    return max(backoff, retry_after or 0.0)


def _fold_create_rejected(w: World, e: ev.JobCreateRejected, pos: int) -> World:
    """A refused create: permanent -> the attempt ends (``cancelled``, ``JobRejected``, no Job
    existed) and :func:`block_reason` holds the declaration; transient -> the attempt stays
    Starting, to be created again after :func:`create_backoff`. Never a failure or success."""
    found = _job_attempt(w, e)
    if found is None or found[1].lifecycle != STARTING or found[1].number != e.attempt:
        return _at(w, pos)  # created, cancelled or superseded meanwhile
    b, a = found
    old = b.rejection
    count = old.count + 1 if old is not None and old.attempt == a.number else 1
    if e.rejection < count:
        return _at(w, pos)  # an older refusal delivered late
    spec = b.spec
    t = w.templates.get((b.namespace, spec.template_ref)) if spec is not None else None
    # Permanent only for the template it was built from: if the CronJob changed meanwhile, the
    # next create uses the new one, so the refusal says nothing about it (retry instead).
    permanent = e.permanent and (t.pos if t is not None else 0) == e.template_pos
    summary = f"HTTP {e.code} {e.reason}: {e.message}" if e.code else f"{e.reason}: {e.message}"
    retry_at = e.at if permanent else plus_seconds(e.at, create_backoff(count, e.retry_after))
    rej = CreateRejection(
        attempt=a.number, count=count, permanent=permanent, summary=summary, at=e.at, retry_at=retry_at,
        generation=a.generation, job_template=t.job_template if t is not None else None, pos=pos,
    )
    if permanent:
        return _put_backfill(w, replace(_end(b, a, e.at, "cancelled", JOB_REJECTED, pos), rejection=rej), pos)
    return _put_backfill(w, replace(b, rejection=rej), pos)


def _fold_job_terminating(w: World, e: ev.JobTerminating, pos: int) -> World:
    found = _job_attempt(w, e)
    if found is None:
        return _unexplained(w, e, pos)
    if not found[1].live or found[1].terminating_since is not None:
        return _at(w, pos)
    b, a = found
    return _put_attempt(w, b, replace(a, terminating_since=e.at), pos)


def _fold_admitted(w: World, e: ev.AttemptAdmitted, pos: int) -> World:
    b = w.backfills.get((e.namespace, e.backfill))
    if b is None or b.uid != e.uid or e.attempt <= b.attempts:
        return _at(w, pos)
    a = Attempt(
        number=e.attempt,
        job_name=e.job_name,
        generation=e.generation,
        model=e.model,
        node=e.node,
        admitted_at=e.at,
        admitted_pos=pos,
        basis=_basis(e, pos),
        first_admitted_at=e.at,
        resumable=b.spec is not None and b.spec.resumable,
    )
    return _put_backfill(w, replace(b, attempts=e.attempt, attempt=a), pos)


def _fold_cancelled(w: World, e: ev.AttemptCancelled, pos: int) -> World:
    b = w.backfills.get((e.namespace, e.backfill))
    a = b.attempt if b is not None else None
    if e.reason == FOREGROUND_DEMAND and a is not None and a.number == e.attempt:
        w = _busy_at_least(w, (e.namespace, a.model), e.at, pos)
    if e.suspend:
        return _fold_suspend_decided(w, b, a, e, pos)
    if a is None or a.number != e.attempt or a.lifecycle not in (STARTING, RUNNING, SUSPENDING, SUSPENDED):
        late = _late_cancel(a, e, pos) if a is not None else None
        return _at(w, pos) if late is None else _put_attempt(w, b, late, pos)
    return _put_attempt(w, b, _cancel_decided(a, e, pos), pos)


def _busy_at_least(w: World, key: Key, at: datetime, pos: int) -> World:
    """``w`` with Model ``key`` known busy until at least ``at`` (the idle window's start moves
    there, its cause ``pos``: the cancel decision's own position), ``request_pos`` unchanged. A
    foreground preemption restarts the window at the decision: a retry needs a fresh full window
    even when the report that caused it carried an older time (a router whose clock is behind)."""
    m = w.models.get(key)
    if m is None or (m.busy_until is not None and m.busy_until >= at):
        return w
    return w._replace(models=w.models.set(key, replace(m, busy_until=at, busy_pos=pos)))


def _cancel_decided(a: Attempt, e: ev.AttemptCancelled, pos: int) -> Attempt:
    """``a`` marked by cancel decision ``e`` (at ``pos``): Suspending for a suspending cancel,
    else Cancelling, with the cancel's reason, message, time and cause position."""
    return replace(a,
        lifecycle=SUSPENDING if e.suspend else CANCELLING,
        suspend=e.suspend,
        suspend_round=a.suspend_round + 1 if e.suspend else a.suspend_round,
        cancel_reason=e.reason,
        cancel_message=e.message,
        cancelled_at=e.at,
        cancel_pos=e.cause or pos,
    )


def _basis(e: ev.AttemptAdmitted | ev.AttemptResumed, pos: int) -> int:
    """The position an admitting decision's state was folded up to (issue 8, the basis race):
    its recorded ``basis``, or the position before its record when it has none (older events)."""
    return e.basis if e.basis is not None and e.basis < pos else pos - 1


def _fold_blocked(w: World, e: ev.BackfillBlocked, pos: int) -> World:
    b = w.backfills.get((e.namespace, e.backfill))
    if b is None:
        return _at(w, pos)
    return _put_backfill(w, replace(b, blocked=(e.reason, e.message)), pos)


def _fold_unblocked(w: World, e: ev.BackfillUnblocked, pos: int) -> World:
    b = w.backfills.get((e.namespace, e.backfill))
    if b is None or b.blocked is None:
        return _at(w, pos)
    return _put_backfill(w, replace(b, blocked=None), pos)


def _fold_finalizer(w: World, e: ev.FinalizerReleased, pos: int) -> World:
    b = w.backfills.get((e.namespace, e.backfill))
    if b is None or b.uid != e.uid:
        return _at(w, pos)
    return _put_backfill(w, replace(b, finalizer_released=True), pos)


# ---------------------------------------------------------------- resumable attempts (issue 11)
#
# A ``spec.preemption: Suspend`` declaration's preemption suspends its Indexed Job (lifecycle
# Suspending, then Suspended once the Job is observed stopped); the next admission resumes the
# same Job as a new run segment (see :mod:`backfill.core.projector` and, for segments,
# :mod:`backfill.core.runs`).


def _progress(a: Attempt, completed: str, at: datetime) -> Attempt:
    """``a`` with the Job's completed indexes ``completed`` (interval syntax) observed at ``at``:
    when they grew, the segment's progress time moves (not after the segment ended)."""
    if not completed or not indexes.grew(completed, a.completed_indexes):
        return a
    merged = indexes.format_ranges(indexes.union(indexes.parse(completed) or (), indexes.parse(a.completed_indexes) or ()))
    if a.segment_ended_at is not None:
        return replace(a, completed_indexes=merged)
    return replace(a, completed_indexes=merged, progress_at=at)


def _ended_while_suspended(a: Attempt, at: datetime) -> Attempt:
    """A Job that ends by itself while suspended: a zero-second segment of its own carries the
    end (the suspended segment's row is final)."""
    if not a.suspended:
        return a
    return replace(a,
        segment=a.segment + 1, admitted_at=at, segment_started_at=at, base_indexes=a.completed_indexes,
        progress_at=None, segment_ended_at=None, segment_reason="", segment_pos=0, suspend=False,
    )


def _fold_suspend_decided(w: World, b: BackfillState | None, a: Attempt | None, e: ev.AttemptCancelled, pos: int) -> World:
    """A suspending cancel: the segment's preemption; the Job is being suspended (Suspending).
    One that reaches the log after its suspension was observed (:func:`_suspension_before_decision`)
    names the segment's end: its reason, message and cause replace the condition's."""
    if b is None or a is None or a.number != e.attempt or a.segment != e.segment:
        return _at(w, pos)
    if _suspended_before_decision(a):
        cause = e.cause or pos
        a = replace(a,
            cancel_reason=e.reason, cancel_message=e.message, cancelled_at=e.at, cancel_pos=cause,
            segment_reason=e.reason, segment_pos=cause,
        )
        return _put_attempt(w, b, a, pos)
    if a.lifecycle not in (STARTING, RUNNING):
        return _at(w, pos)
    if a.seen_suspended is not None:  # re-suspended while resuming, observed before this decision
        return _suspension_observed(w, b, _cancel_decided(a, e, pos), a.seen_suspended, pos)
    return _put_attempt(w, b, _cancel_decided(a, e, pos), pos)


def _suspended_before_decision(a: Attempt | None) -> bool:
    """True when ``a`` is Suspended by an observation its suspending decision has not reached
    the log for yet (:func:`_suspension_before_decision`: no ``cancelled_at``)."""
    return a is not None and a.lifecycle == SUSPENDED and a.cancelled_at is None and a.suspend


def _suspension_before_decision(w: World, b: BackfillState, a: Attempt, e: ev.JobSuspended, pos: int) -> World:
    """A resumable attempt's Job observed suspended while the attempt is Running or Starting:
    the segment ends (Suspended), and the attempt is resumed like any. While a resume is under
    way (Starting a later segment) an observation nothing explains is kept instead
    (``seen_suspended``) for a suspending decision folded later.

    If a condition holds that ``decide`` suspends for (:data:`conditions.CANCEL_CHECKS` and
    :func:`conditions.suspends`, the same rules), the suspension is ours and its decision has not
    reached the log yet (the preemptor PATCHes first and records after, fail-safe; another
    replica's observation, or PostgreSQL away): the segment ends for that condition. Else it ends
    ``JobSuspended``, unexplained, as an unexplained deletion ends an attempt: most likely our
    preemption whose cause (an ingest report only the leader spools) reaches the log later, or
    was lost with its leader; a suspending decision folded later names it
    (:func:`_fold_suspend_decided`). For foreground demand the idle window restarts at the
    observation, the latest the preemption can have been (a resume waits a full window after
    it); an unexplained one moves nothing (a report folded after it must still count as demand),
    so with its cause lost the attempt is resumed when due, as an unexplained deletion's next
    attempt is admitted: a fresh full idle window after the observation (:func:`unexplained_stop`).

    The controller owns its Jobs' ``spec.suspend`` (README): a Job someone else suspends is
    resumed when admission is due, as one they resume is suspended again. A non-resumable
    attempt's Job suspended by someone else (only a resumable one is ever suspended by the
    controller) runs nothing and, no deadline running while it is suspended, would hold its
    Model and node for ever (a fault trial: ``Running``/``JobActive`` indefinitely): unless a
    cancel condition holds (whose cancel deletes it), it is deleted, the attempt Cancelling for
    ``JobSuspended`` (``cancelled`` at the deletion), and
    the next waits a fresh idle window, as after an unexplained deletion."""
    if a.lifecycle != RUNNING and a.lifecycle != STARTING:
        return _at(w, pos)
    hit = conditions.first_hit(conditions.CANCEL_CHECKS, w, conditions.subject(w, b, a), e.at)
    if not a.resumable:
        if hit is not None:
            return _at(w, pos)  # decide's cancel for that condition deletes it (and names why)
        message = f"Job {a.job_name} was suspended by someone else; a Job of spec.preemption Delete is not resumed: deleting it"
        return _put_attempt(w, b, replace(a, lifecycle=CANCELLING, cancel_reason=JOB_SUSPENDED, cancel_message=message, cancelled_at=e.at, cancel_pos=pos), pos)
    if hit is not None and conditions.suspends(b, a, hit.reason):
        reason, message, cause = hit.reason, hit.message, hit.cause
    elif a.lifecycle == STARTING and a.segment > 1:
        # Our resume is under way: a stale status from before it took effect, or our re-suspend
        # whose cause and decision come later (a trial: stuck Suspending for ever when dropped).
        # Kept for that decision (:func:`_fold_suspend_decided`); an observed resume clears it.
        return _put_attempt(w, b, replace(a, seen_suspended=SeenSuspension(at=e.at, completed_indexes=e.completed_indexes, observed_at=e.observed_at)), pos)
    else:
        reason, message, cause = JOB_SUSPENDED, f"Job {a.job_name} was observed suspended; nothing in the event log explains it", pos
    if reason == FOREGROUND_DEMAND:  # as a foreground cancel does (_fold_cancelled)
        w = _busy_at_least(w, (b.namespace, a.model), e.at, pos)
        b = w.backfills[(b.namespace, b.name)]
    a = replace(a, lifecycle=SUSPENDING, suspend=True, cancel_reason=reason, cancel_message=message, cancel_pos=cause,
                suspend_round=a.suspend_round + 1)
    return _suspension_observed(w, b, a, e, pos)


def _fold_job_suspended(w: World, e: ev.JobSuspended, pos: int) -> World:
    """The Job is observed suspended with no active pods: our suspension's segment ends
    (Suspended), also when its decision is not in the log yet (:func:`_suspension_before_decision`)."""
    found = _job_attempt(w, e)
    if found is None:
        return _unexplained(w, e, pos)
    b, a = found
    if a.lifecycle != SUSPENDING:
        return _suspension_before_decision(w, b, a, e, pos)
    return _suspension_observed(w, b, a, e, pos)


def _suspension_observed(w: World, b: BackfillState, a: Attempt, e: ev.JobSuspended | SeenSuspension, pos: int) -> World:
    """Suspending attempt ``a`` of ``b`` observed suspended by ``e`` (or by the observation kept
    in ``seen_suspended``): its segment ends (Suspended)."""
    a = _progress(a, e.completed_indexes, e.at)
    if a.segment_ended_at is None:  # a foreign resume and our re-suspend keep the first end
        start = (a.started_at or a.created_at) if a.segment == 1 else (a.segment_started_at or a.admitted_at)
        end = e.at if start is None or e.at >= start else start
        a = replace(a, segment_ended_at=end, segment_reason=a.cancel_reason, segment_pos=a.cancel_pos)
    return _put_attempt(w, b, replace(a, lifecycle=SUSPENDED, seen_suspended=None), pos)


def _fold_job_resumed(w: World, e: ev.JobResumed, pos: int) -> World:
    """``spec.suspend`` is false again: our resume is running (Running); a resume of a suspended
    Job nobody admitted (someone else cleared ``suspend``) is suspended again (Suspending)."""
    found = _job_attempt(w, e)
    if found is None:
        return _unexplained(w, e, pos)
    b, a = found
    if a.lifecycle == STARTING and a.segment > 1 and a.segment_started_at is None:
        at = e.at if e.at >= a.admitted_at else a.admitted_at  # whole-second stamps: not before the decision
        a = _progress(replace(a, lifecycle=RUNNING, segment_started_at=at, seen_suspended=None), e.completed_indexes, e.at)
        return _put_attempt(w, b, a, pos)
    if a.lifecycle == SUSPENDED:
        return _put_attempt(w, b, replace(a, lifecycle=SUSPENDING, suspend_round=a.suspend_round + 1), pos)
    return _at(w, pos)


def _fold_job_progress(w: World, e: ev.JobProgress, pos: int) -> World:
    """More of an Indexed Job's indexes completed."""
    found = _job_attempt(w, e)
    if found is None:
        return _unexplained(w, e, pos)
    if not (found[1].live or found[1].suspended):
        return _at(w, pos)
    b, a = found
    a2 = _progress(a, e.completed_indexes, e.at)
    if a2 is a:
        return _at(w, pos)
    return _put_attempt(w, b, a2, pos)


def _fold_resumed(w: World, e: ev.AttemptResumed, pos: int) -> World:
    """A resume decision: run segment ``e.segment`` of the suspended attempt begins (Starting
    until the Job is observed resumed). Like an admission, it names its basis."""
    b = w.backfills.get((e.namespace, e.backfill))
    a = b.attempt if b is not None else None
    if b is None or a is None or b.uid != e.uid or a.number != e.attempt or not a.suspended or e.segment != a.segment + 1:
        return _at(w, pos)
    a = replace(a,
        lifecycle=STARTING,
        segment=e.segment,
        admitted_at=e.at,
        admitted_pos=pos,
        basis=_basis(e, pos),
        model=e.model,
        node=e.node,
        base_indexes=a.completed_indexes,
        segment_started_at=None,
        progress_at=None,
        segment_ended_at=None,
        segment_reason="",
        segment_pos=0,
        suspend=False,
        cancel_reason="",
        cancel_message="",
        cancelled_at=None,
        cancel_pos=0,
        terminating_since=None,
    )
    return _put_attempt(w, b, a, pos)


_FOLD: dict[type, Callable[[World, Any, int], World]] = {
    ev.ForegroundRequest: _fold_foreground,
    ev.GamingIntentStarted: _fold_gaming_started,
    ev.GamingIntentEnded: _fold_gaming_ended,
    ev.GPULeaseActive: _fold_lease_active,
    ev.GPULeaseEnded: _fold_lease_ended,
    ev.ModelReady: _fold_model_ready,
    ev.ModelNotReady: _fold_model_not_ready,
    ev.ModelDeleted: _fold_model_deleted,
    ev.BackfillApplied: _fold_applied,
    ev.BackfillDeleting: _fold_deleting,
    ev.BackfillDeleted: _fold_deleted,
    ev.CronJobSeen: _fold_cronjob_seen,
    ev.CronJobMissing: _fold_cronjob_missing,
    ev.JobCreated: _fold_job_created,
    ev.JobRunning: _fold_job_running,
    ev.JobSucceeded: _fold_job_succeeded,
    ev.JobFailed: _fold_job_failed,
    ev.JobDeleted: _fold_job_deleted,
    ev.JobTerminating: _fold_job_terminating,
    ev.JobCreateRejected: _fold_create_rejected,
    ev.JobSuspended: _fold_job_suspended,
    ev.JobResumed: _fold_job_resumed,
    ev.JobProgress: _fold_job_progress,
    ev.AttemptAdmitted: _fold_admitted,
    ev.AttemptCancelled: _fold_cancelled,
    ev.AttemptResumed: _fold_resumed,
    ev.BackfillBlocked: _fold_blocked,
    ev.BackfillUnblocked: _fold_unblocked,
    ev.FinalizerReleased: _fold_finalizer,
}
assert set(_FOLD) == set(ev.EVENT_TYPES.values()), "every event type needs a fold handler"
_FOLD.update({row: _FOLD[cls] for row, cls in ev.COMPILED.items()})  # an event's compiled form folds as the event
#: Event type (or its compiled form's) -> the handler :func:`fold` calls: ``HANDLERS[type(e)](world,
#: e, position)`` is ``fold(world, e, position)`` one call less, for a caller folding hundreds of
#: thousands of its own events (``simulate``). Read only.
HANDLERS: Mapping[type, Callable[[World, Any, int], World]] = _FOLD


def only_position_moved(before: World, after: World) -> bool:
    """True when folding an event changed nothing but the position (a re-delivered observation,
    an unchanged Model status): no decision can change, so nothing needs waking. O(fields)."""
    return all(a is b for a, b in zip(before[1:], after[1:]))
