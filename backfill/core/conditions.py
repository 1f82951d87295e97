"""The conditions: each gate and cancel rule written once, in one table, and what wakes it.

A :class:`Condition` is one entry of :data:`CONDITIONS`: its reason, when it holds (``holds``),
whether it ends a live attempt (``cancels``; a preemption when the reason is in
:data:`~backfill.core.verdict.PREEMPTION_REASONS`), whether it keeps a waiting backfill from
admission (``gates``), and which event types wake it and for which backfills (``wakes``).
:mod:`backfill.core.decide` asks the table in order (the seed's cancel order: deletion, suspend,
spec change, model not Ready, node change, gaming intent, GPU lease, foreground demand, a
concurrent backfill admitted earlier); :func:`affected` derives from the same table, so a
condition cannot fire only at the periodic resync (Kueue keeps its admission checks the same
way: one registry, each check declaring what it watches).

**Adding a condition** is one entry: write ``holds(world, subject, now) -> Hit | None`` (pure;
``now`` is aware UTC), set ``cancels``/``gates``, name the event types that can make it start or
stop holding with the :class:`Scope` of backfills to re-check, and add the reason constant to
:mod:`backfill.core.verdict` (to ``PREEMPTION_REASONS`` if it is foreground pressure).

The declaration's own problems (:func:`block_reason`: an invalid spec or template, a missing
CronJob or Model, a refused create) are here too: they decide ``Blocked`` before any gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from collections.abc import Mapping
from typing import Any, Callable, Iterable, NamedTuple

from . import events as ev
from .state import Attempt, BackfillState, CreateRejection, Gate, Key, ModelState, World, orphan_owner
from .timefmt import plus_seconds
from .verdict import (
    CONCURRENT_BACKFILL,
    DELETED,
    FOREGROUND_DEMAND,
    GAMING_INTENT,
    GPU_LEASE_ACTIVE,
    GPU_REQUEST_FORBIDDEN,
    JOB_REJECTED,
    MODEL_NOT_FOUND,
    MODEL_NODE_UNKNOWN,
    MODEL_NOT_READY,
    NODE_CHANGED,
    PREEMPTION_NOT_RESUMABLE,
    SPEC_CHANGED,
    SUSPEND_REASONS,
    SUSPENDED,
    TEMPLATE_NOT_FOUND,
)

_NO_MODEL = ModelState()


class Subject(NamedTuple):
    """The backfill a condition is asked about.

    Attributes:
        backfill: its folded state.
        model: the Model it runs on (the live attempt's) or would run on (``spec.modelRef``).
        state: that Model as folded (an empty :class:`ModelState` when never seen).
        attempt: the live attempt (the cancel side), or None (the admission side).
        reserved: admission side only: slot (``(namespace, model)`` or node) -> the backfill
            admitted earlier in the same ``decide`` call, so two backfills due at once never
            both pass the contender gate; None outside ``decide``.
    """

    backfill: BackfillState
    model: str
    state: ModelState
    attempt: Attempt | None = None
    reserved: Mapping[Any, Key] | None = None


class Hit(NamedTuple):
    """A condition that holds: ``reason``, a one-line ``message``, the log ``cause`` position of
    the event that makes it hold (a decision's ``cause``), and ``until`` (aware UTC) when it stops
    holding by time alone (a gate's expiry), else None."""

    reason: str
    message: str
    cause: int
    until: datetime | None = None


Scope = Callable[[World, Any], Iterable[Key]]
"""``(world after the fold, event) -> keys`` of the backfills an event may change."""


@dataclass(frozen=True)
class Condition:
    """One gate/cancel rule (see the module docstring).

    Attributes:
        reason: the status/decision reason (a :mod:`backfill.core.verdict` constant).
        holds: ``(world, subject, now) -> Hit | None``; pure.
        cancels: asked for a live attempt (a Hit ends it: ``AttemptCancelled``).
        gates: asked for a waiting backfill (a Hit keeps it waiting with this reason).
        ends_suspended: asked for a suspended attempt (``spec.preemption: Suspend``, issue 11):
            a Hit deletes its Job. The others (availability: readiness, gates, demand,
            contenders) only hold its resume back, like any admission.
        wakes: event type -> :data:`Scope` of the backfills to re-check when it is folded.
        of_state: its Hit's cause is the state's own position (``world.position``: a spec,
            readiness or deletion, no event of its own), which a decision records as its basis;
            the others name the event that makes them hold (:func:`cause_is_state`).
    """

    reason: str
    holds: Callable[[World, Subject, datetime], Hit | None]
    cancels: bool
    gates: bool
    wakes: Mapping[type, Scope]
    ends_suspended: bool = False
    of_state: bool = False


# ----------------------------------------------------------------------------- scopes


def own(world: World, event: Any) -> tuple[Key, ...]:
    """The backfill the event is about (``backfill`` or, for a declaration's events, ``name``)."""
    key = (event.namespace, getattr(event, "backfill", None) or event.name)
    return (key,) if key in world.backfills else ()


def of_model(world: World, event: Any) -> tuple[Key, ...]:
    """The backfills whose modelRef is the event's model."""
    return world.backfills_of_model(event.namespace, event.model)


def of_model_and_node(world: World, event: Any) -> tuple[Key, ...]:
    """The backfills of the event's model and of every model on its node (a node-wide change)."""
    keys = world.backfills_of_model(event.namespace, event.model)
    m = world.models.get((event.namespace, event.model))
    if m is not None and m.node:
        keys = keys + world.backfills_on_node(m.node)
    return keys


def of_slot(world: World, event: Any) -> tuple[Key, ...]:
    """The event's backfill and every backfill on its attempt's model or node (an attempt began
    or ended: the contender gate of the others may open or close)."""
    key = (event.namespace, event.backfill)
    b = world.backfills.get(key)
    if b is None:
        return ()
    a = b.attempt
    if a is None:
        return (key,)
    keys = (key,) + world.backfills_of_model(event.namespace, a.model)
    return keys + world.backfills_on_node(a.node) if a.node else keys


def live_and_own(world: World, event: Any) -> tuple[Key, ...]:
    """The declaration's backfill and every live attempt's (a changed or deleted declaration may
    free a model or node another one waits for)."""
    return own(world, event) + tuple(world.live)


def everyone(world: World, event: Any) -> Iterable[Key]:
    """Every backfill (gates: rare; their node/group reach is not indexed)."""
    return world.backfills


def of_template(world: World, event: Any) -> tuple[Key, ...]:
    """The backfills whose templateRef is the CronJob the event is about."""
    return tuple(k for k, b in world.backfills.items() if b.namespace == event.namespace and template_ref(b) == event.name)


# ----------------------------------------------------------------------------- gate helpers


def _gate_message(reason: str, g: Gate) -> str:
    """The one wording of a holding gate, for a waiting status and for a cancel alike."""
    what = "gaming intent" if reason == GAMING_INTENT else "an active GPU lease"
    where = [f"node {g.node}"] * bool(g.node) + [f"shared group {g.group}"] * bool(g.group)
    return f"{what} on {' / '.join(where) or 'an unnamed node'}"  # (a group alone said "node ? / group g14")


def _gaming(world: World, s: Subject, now: datetime) -> Hit | None:
    node = s.state.node
    gaming = world.gaming
    if node and gaming:  # (an empty map: no iterator to make)
        for g in gaming.values():
            if g.node == node and g.active(now):
                return Hit(GAMING_INTENT, _gate_message(GAMING_INTENT, g), g.pos, g.expires_at)
    return None


def _lease(world: World, s: Subject, now: datetime) -> Hit | None:
    leases = world.leases
    if not leases:  # the common case: no iterator to make
        return None
    node, group = s.state.node, s.state.shared
    for g in leases.values():
        if ((node and g.node == node) or (group and g.group == group)) and g.active(now):
            return Hit(GPU_LEASE_ACTIVE, _gate_message(GPU_LEASE_ACTIVE, g), g.pos, g.expires_at)
    return None


# ----------------------------------------------------------------------------- the rules


def _deleted(world: World, s: Subject, now: datetime) -> Hit | None:
    if s.backfill.deleting:
        return Hit(DELETED, "the ModelBackfill is being deleted", world.position)
    return None


def _suspended(world: World, s: Subject, now: datetime) -> Hit | None:
    spec = s.backfill.spec
    if spec is not None and spec.suspend:
        return Hit(SUSPENDED, "spec.suspend is true", world.position)
    return None


def _spec_changed(world: World, s: Subject, now: datetime) -> Hit | None:
    a, b = s.attempt, s.backfill
    if a is not None and b.generation != a.generation:
        return Hit(SPEC_CHANGED, f"spec changed (generation {a.generation} -> {b.generation})", world.position)
    return None


def _gpu_template(world: World, s: Subject, now: datetime) -> Hit | None:
    """A live or suspended attempt whose CronJob's template the GPU guard refuses now: a release
    with a stricter guard (a trial upgrading found the Jobs the older one admitted under such
    templates running on), or the template changed to one. Its Job may reach the node's GPUs:
    stopping is fail-safe, so it is cancelled (admission is already Blocked by the template)."""
    spec = s.backfill.spec
    if s.attempt is None or spec is None:
        return None
    t = world.templates.get((s.backfill.namespace, spec.template_ref))
    if t is not None and t.problem is not None and t.problem[0] == GPU_REQUEST_FORBIDDEN:
        return Hit(GPU_REQUEST_FORBIDDEN, t.problem[1], t.pos)
    return None


def _model_gone(world: World, s: Subject, now: datetime) -> Hit | None:
    if not s.state.exists:
        return Hit(MODEL_NOT_FOUND, f"Model {s.backfill.namespace}/{s.model} not found", world.position)
    return None


def _model_not_ready(world: World, s: Subject, now: datetime) -> Hit | None:
    if not s.state.ready:
        # (a deleted Model of a running attempt too: its cancel says so, beside the status's
        # ModelNotFound; a new user's trial read "is not Ready" of a Model that was gone)
        gone = "" if s.state.exists else " (deleted)"
        return Hit(MODEL_NOT_READY, f"Model {s.model} is not Ready{gone}", world.position)
    if s.attempt is not None and s.state.replaced_pos > s.attempt.basis:
        # Ready, but another object than the admission saw: the Model was deleted and created
        # again, and no watch saw it go (a fault trial: the Job kept running on the new Model).
        return Hit(MODEL_NOT_READY, f"Model {s.model} was deleted and created again after the Job was admitted", world.position)
    return None


def _node_unknown(world: World, s: Subject, now: datetime) -> Hit | None:
    """Admission only: a Model whose node is unknown (cluster-contract: ``status.gpu.node``, else
    ``spec.nodeSelector["kubernetes.io/hostname"]``) cannot have the seed's node rules applied
    (a GamingSession targeting the model's node cancels the Job; a GPULease blocks it), so
    nothing starts on it until its node is known (fail-closed: a signal that cannot be read)."""
    if not s.state.node:
        return Hit(
            MODEL_NODE_UNKNOWN,
            f"Model {s.model} names no node (status.gpu.node or spec.nodeSelector kubernetes.io/hostname): "
            "gaming intent and GPU leases on its node could not be applied",
            s.state.ready_pos or world.position,
        )
    return None


def _node_changed(world: World, s: Subject, now: datetime) -> Hit | None:
    a, m = s.attempt, s.state
    if a is not None and m.node != a.node:
        if not a.node:  # admitted while the Model's node was unknown: the node gates could not apply
            message = f"Model {s.model}'s node became known ({m.node}) after the Job was admitted without one"
        elif not m.node:
            message = f"Model {s.model}'s node is no longer known (it was {a.node})"
        else:
            message = f"Model {s.model} moved from node {a.node} to {m.node}"
        return Hit(NODE_CHANGED, message, world.position)
    return None


def _foreground_demand(world: World, s: Subject, now: datetime) -> Hit | None:
    a = s.attempt
    if a is not None and s.state.request_pos > a.basis:  # a request the admitting decision did not see
        return Hit(FOREGROUND_DEMAND, f"foreground request for Model {s.model}", s.state.request_pos)
    return None


#: Seconds between re-checks of a declaration held by a deleted declaration's Job that still runs.
ORPHAN_RECHECK_SECONDS = 5.0


def _concurrent(world: World, s: Subject, now: datetime) -> Hit | None:
    """One active backfill Job per model and per node (seed). A live attempt yields only to one
    admitted before it; a waiting backfill to any live attempt, or to one admitted earlier in the
    same ``decide`` call."""
    b, a = s.backfill, s.attempt
    node = a.node if a is not None else s.state.node
    rivals = world.live_models.get((b.namespace, s.model), ())
    if node:
        on_node = world.live_nodes.get(node)
        if on_node:
            rivals = rivals + on_node
    key = (b.namespace, b.name) if rivals else None  # b.key, only when there is a rival to tell from it
    for k in rivals:
        other = world.live[k]
        if k != key and (a is None or other.admitted_pos < a.admitted_pos):
            owner = orphan_owner(k)
            if owner is not None:  # a deleted declaration's Job still going
                # Re-checked every ORPHAN_RECHECK_SECONDS as well: its end is observed under its
                # declaration's name, which no longer names its Model (the wake-ups cannot find
                # the declarations waiting there).
                return Hit(
                    CONCURRENT_BACKFILL, f"Job {other.job_name} of deleted ModelBackfill {owner} still runs on the same model or node",
                    other.admitted_pos, plus_seconds(now, ORPHAN_RECHECK_SECONDS),
                )
            return Hit(CONCURRENT_BACKFILL, f"ModelBackfill {k[1]} runs on the same model or node", other.admitted_pos)
    if s.reserved:
        k = s.reserved.get((b.namespace, s.model)) or (s.reserved.get(node) if node else None)
        if k is not None:
            return Hit(CONCURRENT_BACKFILL, f"ModelBackfill {k[1]} is admitted on the same model or node", world.position)
    return None


_MODEL_EVENTS = {ev.ModelReady: of_model_and_node, ev.ModelNotReady: of_model_and_node, ev.ModelDeleted: of_model_and_node}
_SLOT_EVENTS: dict[type, Scope] = {
    t: of_slot
    for t in (
        ev.AttemptAdmitted, ev.JobSucceeded, ev.JobFailed, ev.JobDeleted, ev.JobCreateRejected,
        # a suspended attempt holds no slot; a delete of one takes it again while its Job goes
        ev.JobSuspended, ev.JobResumed, ev.AttemptResumed, ev.AttemptCancelled,
    )
}
_DECLARATION_EVENTS: dict[type, Scope] = {t: live_and_own for t in (ev.BackfillApplied, ev.BackfillDeleting, ev.BackfillDeleted)}

CONDITIONS: tuple[Condition, ...] = (
    Condition(DELETED, _deleted, cancels=True, gates=False, wakes={ev.BackfillDeleting: own}, ends_suspended=True, of_state=True),
    Condition(SUSPENDED, _suspended, cancels=True, gates=False, wakes={ev.BackfillApplied: own}, ends_suspended=True, of_state=True),
    Condition(SPEC_CHANGED, _spec_changed, cancels=True, gates=False, wakes={ev.BackfillApplied: own}, ends_suspended=True, of_state=True),
    Condition(GPU_REQUEST_FORBIDDEN, _gpu_template, cancels=True, gates=False, wakes={ev.CronJobSeen: of_template}, ends_suspended=True),
    # A running attempt's Model that is deleted is not Ready (below); a suspended one's is gone.
    Condition(MODEL_NOT_FOUND, _model_gone, cancels=False, gates=False, wakes=_MODEL_EVENTS, ends_suspended=True, of_state=True),
    Condition(MODEL_NOT_READY, _model_not_ready, cancels=True, gates=True, wakes=_MODEL_EVENTS, of_state=True),
    Condition(NODE_CHANGED, _node_changed, cancels=True, gates=False, wakes=_MODEL_EVENTS, of_state=True),
    Condition(GAMING_INTENT, _gaming, cancels=True, gates=True, wakes={ev.GamingIntentStarted: everyone, ev.GamingIntentEnded: everyone}),
    Condition(GPU_LEASE_ACTIVE, _lease, cancels=True, gates=True, wakes={ev.GPULeaseActive: everyone, ev.GPULeaseEnded: everyone}),
    Condition(FOREGROUND_DEMAND, _foreground_demand, cancels=True, gates=False, wakes={ev.ForegroundRequest: of_model}),
    Condition(CONCURRENT_BACKFILL, _concurrent, cancels=True, gates=True, wakes={**_SLOT_EVENTS, **_DECLARATION_EVENTS}),
    Condition(MODEL_NODE_UNKNOWN, _node_unknown, cancels=False, gates=True, wakes=_MODEL_EVENTS),
)
"""Every gate/cancel condition, in the order they are asked (the first that holds wins)."""

#: ``holds`` of the conditions asked for a live attempt / a waiting backfill, in table order.
CANCEL_CHECKS: tuple[Callable[[World, Subject, datetime], Hit | None], ...] = tuple(c.holds for c in CONDITIONS if c.cancels)
GATE_CHECKS: tuple[Callable[[World, Subject, datetime], Hit | None], ...] = tuple(c.holds for c in CONDITIONS if c.gates)
#: ``holds`` of the conditions that delete a suspended attempt's Job (issue 11), in table order.
SUSPENDED_CHECKS: tuple[Callable[[World, Subject, datetime], Hit | None], ...] = tuple(
    c.holds for c in CONDITIONS if c.ends_suspended
)

_OF_STATE = frozenset(c.reason for c in CONDITIONS if c.of_state)


def cause_is_state(reason: str) -> bool:
    """Whether a decision for ``reason`` names the state as its cause (:attr:`Condition.of_state`):
    its recorded cause is its basis. Else its cause is an event's position, which the preemptor
    resolves exactly, a duplicate to the earlier stored copy (a second trial: a demand another
    replica stored first was recorded with the highest position of the batch as its cause)."""
    return reason in _OF_STATE


def suspends(b: BackfillState, a: Attempt, reason: str) -> bool:
    """Whether a cancel for ``reason`` suspends ``a``'s Job instead of deleting it: a preemption
    (:data:`~backfill.core.verdict.SUSPEND_REASONS`) of an attempt admitted under
    ``spec.preemption: Suspend`` whose Job exists, its spec unchanged. ``decide`` asks it of a
    cancel; the fold asks it of a suspension observed before its decision reached the log."""
    return (
        reason in SUSPEND_REASONS
        and a.resumable
        and b.spec is not None
        and b.spec.resumable
        and a.created_at is not None
        and a.generation == b.generation
    )


def first_hit(checks: Iterable[Callable[[World, Subject, datetime], Hit | None]], world: World, s: Subject, now: datetime) -> Hit | None:
    """The :class:`Hit` of the first of ``checks`` (one of the tables above, in order) that
    holds for ``s`` in ``world`` at ``now`` (aware UTC), or None."""
    for holds in checks:
        hit = holds(world, s, now)
        if hit is not None:
            return hit
    return None


#: What wakes the rest of a verdict (not a gate or cancel condition): the backfill an event is
#: about (its Job, attempt, declaration, block or finalizer facts), the idle window (a foreground
#: request or a gate's end moves ``idleSince``: covered by the conditions' scopes above), and
#: the backfills of a CronJob (its template may block or unblock them).
VERDICT_WAKES: dict[type, Scope] = {
    **{t: own for t in ev.EVENT_TYPES.values() if "backfill" in t.model_fields},
    ev.BackfillApplied: own,
    ev.BackfillDeleting: own,
    ev.BackfillDeleted: own,
    ev.CronJobSeen: of_template,
    ev.CronJobMissing: of_template,
}


def _wake_table() -> dict[type, tuple[Scope, ...]]:
    table: dict[type, list[Scope]] = {}
    for t, scope in VERDICT_WAKES.items():
        table.setdefault(t, []).append(scope)
    for c in CONDITIONS:
        for t, scope in c.wakes.items():
            if scope not in table.setdefault(t, []):
                table[t].append(scope)
    return {t: tuple(dict.fromkeys(scopes)) for t, scopes in table.items()}


_WAKES = _wake_table()
assert set(_WAKES) == set(ev.EVENT_TYPES.values()), "every event type must wake something (or say why not)"
_WAKES.update({row: _WAKES[cls] for row, cls in ev.COMPILED.items()})  # an event's compiled form wakes as the event


def affected(world: World, event: Any) -> tuple[Key, ...]:
    """Keys of the backfills whose decision may change because of ``event`` (sorted, unique).

    Fold the event first, then pass the new world. Derived from :data:`CONDITIONS` and
    :data:`VERDICT_WAKES`; used to keep ``decide`` incremental (the live loop, the preemptor).
    """
    scopes = _WAKES[type(event)]
    if len(scopes) == 1:
        keys = scopes[0](world, event)
        return keys if isinstance(keys, tuple) and len(keys) <= 1 else tuple(sorted(set(keys)))
    out: set[Key] = set()
    for scope in scopes:
        out.update(scope(world, event))
    return tuple(sorted(out))


# ----------------------------------------------------------------------------- the declaration


def template_ref(b: BackfillState) -> str:
    """The declaration's templateRef (the raw value when the spec is invalid; "" if absent)."""
    if b.spec is not None:
        return b.spec.template_ref
    ref = b.raw_spec.get("templateRef")
    return ref if isinstance(ref, str) else ""


def block_reason(world: World, b: BackfillState) -> tuple[str, str] | None:
    """Why ``b`` is Blocked, as (reason, message), or None. Order: spec, template, GPU, a
    ``spec.preemption: Suspend`` on a template that is not Indexed (issue 11), model, a permanent
    create refusal (seed: an invalid spec is Blocked with a reason and message)."""
    if b.problem is not None:
        return (b.problem.reason, b.problem.message)
    spec = b.spec
    assert spec is not None
    t = world.templates.get((b.namespace, spec.template_ref))
    if t is None or t.job_template is None:
        return (TEMPLATE_NOT_FOUND, f"CronJob {b.namespace}/{spec.template_ref} not found")
    if t.problem is not None:
        return t.problem
    if spec.resumable:
        mode = completion_mode(t.job_template)
        if mode != "Indexed":
            return (
                PREEMPTION_NOT_RESUMABLE,
                f"spec.preemption Suspend needs an Indexed Job: CronJob {b.namespace}/{spec.template_ref} has "
                f"spec.jobTemplate.spec.completionMode {mode or 'NonIndexed (absent)'}; set completionMode: Indexed or "
                "remove spec.preemption",
            )
    m = world.models.get((b.namespace, spec.model_ref))
    if m is None or not m.exists:
        return (MODEL_NOT_FOUND, f"Model {b.namespace}/{spec.model_ref} not found")
    rej = permanent_rejection(b, t.job_template) if b.rejection is not None else None  # (no call without a refusal)
    if rej is not None:
        return (JOB_REJECTED, f"the API server refused the Job ({rej.summary}); change the spec or the CronJob to try again")
    return None


def completion_mode(job_template: Mapping[str, Any] | None) -> str:
    """A CronJob template's ``spec.completionMode`` ("" when absent or malformed)."""
    spec = job_template.get("spec") if isinstance(job_template, Mapping) else None
    mode = spec.get("completionMode") if isinstance(spec, Mapping) else None
    return mode if isinstance(mode, str) else ""


def permanent_rejection(b: BackfillState, job_template: Mapping[str, Any] | None) -> CreateRejection | None:
    """The permanent create refusal that still applies: same spec generation, same template."""
    rej = b.rejection
    if rej is None or not rej.permanent or rej.generation != b.generation:
        return None
    return rej if job_template is rej.job_template or job_template == rej.job_template else None


def block_cause(world: World, b: BackfillState, reason: str) -> int:
    """The log position that explains ``b``'s block for ``reason``: the Model's deletion for
    ``ModelNotFound`` (when it was seen deleted), the refusal's, else the template's. A block's
    idempotency key holds it, so a block after an unblock is recorded as a decision of its own."""
    spec = b.spec
    if spec is None:
        return world.position
    if reason == MODEL_NOT_FOUND:
        gone = world.models.get((b.namespace, spec.model_ref), _NO_MODEL).gone_pos
        if gone:
            return gone
    t = world.templates.get((b.namespace, spec.template_ref))
    if t is not None and b.rejection is not None and permanent_rejection(b, t.job_template) is not None:
        return b.rejection.pos
    return t.pos if t is not None else world.position


def subject(world: World, b: BackfillState, a: Attempt | None, reserved: Mapping[Any, Key] | None = None) -> Subject:
    """The :class:`Subject` for ``b``: its live attempt's model (cancel side) or its spec's."""
    if a is not None:
        model = a.model
    else:
        spec = b.spec
        model = spec.model_ref if spec is not None else b.model_ref
    # positional, without Subject's generated __new__ (a Python call): every decide builds one
    return _tuple_new(Subject, (b, model, world.models.get((b.namespace, model), _NO_MODEL), a, reserved))


_tuple_new = tuple.__new__
assert Subject._fields == ("backfill", "model", "state", "attempt", "reserved"), "subject builds Subject positionally"
