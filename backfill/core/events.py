"""Typed, versioned events of the log: a discriminated union on ``type``, and their codec.

Where a new event type goes: add a class here (frozen pydantic model with ``type: Literal[...]``,
a ``stream`` and, when it has a natural identity, a ``natural_key`` that reads its fields only:
:func:`key_of` calls it on the event's compiled form too), add it to :data:`Event`,
and give it a handler in ``fold._FOLD`` (backfill/core/fold.py) (and ``runs`` if it touches run history).

Three families:

- **Observations** appended by watchers (or the simulator, or the ingest endpoint): foreground
  requests, gaming intent, GPU leases, Model readiness, ModelBackfill specs, CronJob templates and
  owned Job states.
- **Decisions** appended by the actor before it acts: admit, cancel (with reason and the position
  of the event that caused it; a delete, or a suspend of an Indexed Job), resume, block/unblock,
  finalizer released.

Every event carries ``at``: when the fact happened (timezone-aware UTC). The log adds a global
``position`` and ``recorded_at``. Payloads are versioned: a record with an older ``version`` is
upcast by :data:`UPCASTERS` before validation.
"""

from __future__ import annotations

import types
from datetime import datetime
from typing import Annotated, Any, Callable, ClassVar, Iterable, Literal, Optional, Union, get_args, get_origin

import annotated_types
import msgspec
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter

from .records import EventRecord
from .storable import JSON_NUL, MAX_INDEXED_CHARS, NUL, bounded, storable_json, without_nul


#: A timezone-aware timestamp; naive datetimes are rejected. Producers (watchers, ingest,
#: simulator) give UTC; the stored JSON is UTC (``...Z``). No per-field normalising validator:
#: it would cost ~30% of the decode time on the replay hot path, and aware datetimes compare
#: correctly whatever their offset.
UTCDateTime = AwareDatetime


def job_key(namespace: str, name: str, type_name: str, uid: str) -> str:
    """The idempotency key of a Job observation (``JobCreated``, ``JobSucceeded`` ...): one per
    Job object (``uid``) and type. The Job's uid is part of it: a Job deleted and created again
    under the same name (by someone else, or a create that landed after its cancel's delete) is
    another Job, and its facts must reach the log (``fold._unexplained``). No uid: the name alone.
    The one rule of :meth:`_JobEvent.natural_key` and of the simulator, which keys the compiled
    forms it builds with it."""
    base = f"job/{namespace}/{name}/{type_name}"
    return f"{base}/{uid}" if uid else base


def attempt_key(namespace: str, backfill: str, uid: str, verb: str, attempt: int) -> str:
    """The idempotency key of an attempt's decision: one ``verb`` (``admit``, ``cancel``,
    ``resume``) per attempt of a ModelBackfill object (``uid``); the base of
    :meth:`_AttemptDecision.natural_key`, so of the keys
    :func:`backfill.core.decisions.decision_record` gives (through :func:`key_of`)."""
    return f"decision/{namespace}/{backfill}/{uid}/{verb}/{attempt}"


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    version: ClassVar[int] = 1
    at: UTCDateTime

    @property
    def stream(self) -> str:  # pragma: no cover - overridden
        """The entity the event is about, e.g. ``model/ns/name`` (for filtering; order is global)."""
        raise NotImplementedError

    def natural_key(self) -> str | None:
        """The idempotency key implied by the event itself, or None if the producer must give one."""
        return None


# --------------------------------------------------------------------------- observations


class _ModelEvent(_Event):
    namespace: str
    model: str

    @property
    def stream(self) -> str:
        return f"model/{self.namespace}/{self.model}"


class _GamingEvent(_Event):
    namespace: str
    session: str

    @property
    def stream(self) -> str:
        return f"gamingsession/{self.namespace}/{self.session}"


class _LeaseEvent(_Event):
    namespace: str
    lease: str

    @property
    def stream(self) -> str:
        return f"gpulease/{self.namespace}/{self.lease}"


class _BackfillEvent(_Event):
    namespace: str
    name: str
    uid: str

    @property
    def stream(self) -> str:
        return f"backfill/{self.namespace}/{self.name}"


class _CronJobEvent(_Event):
    namespace: str
    name: str

    @property
    def stream(self) -> str:
        return f"cronjob/{self.namespace}/{self.name}"


class ForegroundRequest(_ModelEvent):
    """Foreground demand on a model: ``count`` requests arrived at ``at``.

    ``busy_until`` (UTC, >= at) is when the model is idle again if known (a trace's service
    time); ``None`` means an instantaneous request (``Model.status.lastActiveTime``).
    ``source``: ``"lastActiveTime"``, ``"ingest"``, ``"trace"`` or ``"synthetic"``; a
    ``lastActiveTime`` write that is no activity time: ``"lastActiveTime-unreadable"`` (cannot be
    read or believed) or ``"lastActiveTime-moved-back"`` (dated at the write, see
    :mod:`backfill.controller.translate`).
    """

    type: Literal["ForegroundRequest"] = "ForegroundRequest"
    source: str = "lastActiveTime"
    count: int = Field(default=1, ge=1)
    busy_until: UTCDateTime | None = None


class GamingIntentStarted(_GamingEvent):
    """A GamingSession in mode ``gaming`` targets ``node`` (intent until ``expires_at``, if set)."""

    type: Literal["GamingIntentStarted"] = "GamingIntentStarted"
    node: str
    expires_at: UTCDateTime | None = None


class GamingIntentEnded(_GamingEvent):
    """The GamingSession is gone, left mode ``gaming``, or was changed to another node."""

    type: Literal["GamingIntentEnded"] = "GamingIntentEnded"


class GPULeaseActive(_LeaseEvent):
    """A GPULease on ``node`` and/or shared group ``group`` (active until ``expires_at``, if set)."""

    type: Literal["GPULeaseActive"] = "GPULeaseActive"
    node: str = ""
    group: str = ""
    expires_at: UTCDateTime | None = None


class GPULeaseEnded(_LeaseEvent):
    """The GPULease is gone."""

    type: Literal["GPULeaseEnded"] = "GPULeaseEnded"


class ModelReady(_ModelEvent):
    """The Model's ``status.phase`` is ``Ready`` on ``node`` (shared-GPU group ``shared``)."""

    type: Literal["ModelReady"] = "ModelReady"
    node: str = ""
    shared: str = ""
    #: The Model object's ``metadata.uid`` ("" in rows written before it was recorded: absent
    #: when empty, rows as before). Another uid under the same name is another object: the
    #: Model was deleted and created again, perhaps while no watch saw it (a fault trial).
    uid: str = Field(default="", exclude_if=lambda v: not v)


class ModelNotReady(_ModelEvent):
    """The Model exists but is not Ready (``phase`` is what it reports instead)."""

    type: Literal["ModelNotReady"] = "ModelNotReady"
    phase: str = ""
    node: str = ""
    shared: str = ""
    uid: str = Field(default="", exclude_if=lambda v: not v)  # as ModelReady.uid


class ModelDeleted(_ModelEvent):
    """The Model object is gone."""

    type: Literal["ModelDeleted"] = "ModelDeleted"


class BackfillApplied(_BackfillEvent):
    """A ModelBackfill's spec at ``generation`` (raw, as stored in the API; validated in the core)."""

    type: Literal["BackfillApplied"] = "BackfillApplied"
    generation: int
    spec: dict[str, Any]
    #: Why ``spec`` is not the object's as stored (a NUL character, which the log cannot hold,
    #: replaced: :mod:`backfill.core.storable`); the declaration is then InvalidSpec with it.
    unstorable: str = Field(default="", exclude_if=lambda v: not v)  # absent when empty: rows as before


class BackfillDeleting(_BackfillEvent):
    """The ModelBackfill has a deletionTimestamp; our finalizer holds it until its Job is gone."""

    type: Literal["BackfillDeleting"] = "BackfillDeleting"


class BackfillDeleted(_BackfillEvent):
    """The ModelBackfill object is gone."""

    type: Literal["BackfillDeleted"] = "BackfillDeleted"


class CronJobSeen(_CronJobEvent):
    """A CronJob exists; ``job_template`` is its ``spec.jobTemplate`` (API JSON, camelCase)."""

    type: Literal["CronJobSeen"] = "CronJobSeen"
    job_template: dict[str, Any]
    #: Why ``job_template`` is not the object's as stored (as ``BackfillApplied.unstorable``);
    #: the template is then InvalidTemplate with it.
    unstorable: str = Field(default="", exclude_if=lambda v: not v)  # absent when empty: rows as before


class CronJobMissing(_CronJobEvent):
    """The CronJob does not exist (deleted, or absent at the initial list)."""

    type: Literal["CronJobMissing"] = "CronJobMissing"


class _JobEvent(_Event):
    """A fact about a Job of ModelBackfill ``backfill``. ``owned``: the Job has a controller
    ownerReference to it; False: only its name label says so (:func:`backfill.core.fold._job_attempt`
    takes such a Job only as the attempt's Job of the same uid: ours with its ownerReference
    removed, still cancelled; a foreign Job carrying the label is never adopted or deleted)."""

    namespace: str
    backfill: str
    name: str
    uid: str = ""
    owned: bool = True

    @property
    def stream(self) -> str:
        return f"backfill/{self.namespace}/{self.backfill}"

    def natural_key(self) -> str | None:
        return job_key(self.namespace, self.name, self.type, self.uid)  # type: ignore[attr-defined]


class JobCreated(_JobEvent):
    """The owned Job exists (seen by the watcher, or returned by the create call)."""

    type: Literal["JobCreated"] = "JobCreated"


class JobRunning(_JobEvent):
    """The Job reports ``status.startTime`` / active pods; ``at`` is its start time."""

    type: Literal["JobRunning"] = "JobRunning"


class JobSucceeded(_JobEvent):
    """The Job has condition Complete=True; ``at`` is its completion time. ``completed_indexes``:
    an Indexed Job's ``status.completedIndexes`` (interval syntax, "" otherwise)."""

    type: Literal["JobSucceeded"] = "JobSucceeded"
    completed_indexes: str = ""


class JobFailed(_JobEvent):
    """The Job has condition Failed=True (``reason`` e.g. ``DeadlineExceeded``), or could not be created."""

    type: Literal["JobFailed"] = "JobFailed"
    reason: str = ""


class JobDeleted(_JobEvent):
    """The Job is gone (or the delete call found it already gone)."""

    type: Literal["JobDeleted"] = "JobDeleted"


class JobTerminating(_JobEvent):
    """The Job is being deleted but still exists (a finalizer holds it): ``at`` is its
    ``deletionTimestamp``. Until ``JobDeleted`` the attempt stays live (Cancelling), so nothing
    new is admitted on its model or node, and the status says the Job is still terminating."""

    type: Literal["JobTerminating"] = "JobTerminating"


class JobSuspended(_JobEvent):
    """The Job has ``spec.suspend: true``, condition ``Suspended=True`` and no active pods: its
    work has stopped (issue 11). ``at`` is the condition's ``lastTransitionTime``;
    ``completed_indexes`` the Job's ``status.completedIndexes`` then (interval syntax);
    ``episode`` is the Job's resourceVersion: a re-delivery or relist of the same object is
    stored once, a later change (another suspension) is a new fact. ``observed_at``: when the
    watcher saw it (UTC; None in a row written before it was kept): a resume and a re-suspend
    before the Job controller flips the condition leave ``at`` at the earlier suspension's time
    (an adversarial trial: a lost preemption's suspension dated 2 minutes before it)."""

    type: Literal["JobSuspended"] = "JobSuspended"
    completed_indexes: str = ""
    episode: str = ""
    observed_at: UTCDateTime | None = None

    def natural_key(self) -> str | None:
        return f"job/{self.namespace}/{self.name}/{self.type}/{self.episode}"


class JobResumed(_JobEvent):
    """The Job has ``spec.suspend`` false again after a suspension: condition ``Suspended=False``
    (reason ``JobResumed`` from the Job controller). ``at`` is that transition's time;
    ``episode`` is the condition's transition time (one fact per resume). Whoever cleared ``suspend`` (the
    controller's resume, or someone else): the projector tells them apart."""

    type: Literal["JobResumed"] = "JobResumed"
    completed_indexes: str = ""
    episode: str = ""

    def natural_key(self) -> str | None:
        return f"job/{self.namespace}/{self.name}/{self.type}/{self.episode}"


class JobProgress(_JobEvent):
    """An Indexed Job's ``status.completedIndexes`` changed (``at``: when it was observed).
    ``active`` is ``status.active``. Keyed by the value itself: a re-delivery or relist of the
    same progress is stored once. The run history's useful seconds end at the last one."""

    type: Literal["JobProgress"] = "JobProgress"
    completed_indexes: str
    active: int = 0

    def natural_key(self) -> str | None:
        return f"job/{self.namespace}/{self.name}/{self.type}/{self.completed_indexes}"


class JobCreateRejected(_JobEvent):
    """The create of an admitted attempt's Job was refused, so no Job exists (not a Job failure).

    ``code`` is the HTTP status (0: refused before any call, e.g. the template could not be
    built; or no response at all), ``reason``/``message`` the API server's Status (or the
    controller's own words), ``permanent`` the classification of
    :func:`create_rejection_is_permanent`. ``attempt`` is the attempt number, ``rejection``
    counts the refusals of that attempt (1, 2, ...: part of the idempotency key),
    ``template_pos`` the log position of the CronJob template the Job was built from, and
    ``retry_after`` the server's ``Retry-After`` (seconds) if it sent one.

    The projector makes a permanent refusal ``Blocked`` (reason ``JobRejected``) until the spec
    or the template changes; a transient one keeps the attempt Starting and creates again
    after a back-off. Neither is a completion nor starts a ``repeatAfter`` cooldown.
    """

    type: Literal["JobCreateRejected"] = "JobCreateRejected"
    attempt: int
    rejection: int = Field(ge=1)
    code: int = 0
    reason: str = ""
    message: str = ""
    permanent: bool = False
    template_pos: int = 0
    retry_after: float | None = None

    def natural_key(self) -> str | None:
        return f"job/{self.namespace}/{self.name}/{self.type}/{self.rejection}"


def create_rejection_is_permanent(code: int) -> bool:
    """Whether a refused Job create is permanent (the object itself is invalid) or transient.

    Permanent: 422 Unprocessable Entity (the API server's validation: ``Invalid``), 400 Bad
    Request (a malformed object, or an admission webhook that denied this object) and 413
    Request Entity Too Large (the Job is larger than the API server takes); retrying
    the same object cannot succeed, so the declaration is Blocked until its spec or template
    changes. Everything else is transient and retried with back-off: 403 (ResourceQuota
    exceeded, RBAC, a webhook's Forbidden: fixed elsewhere, with no event to say so), 404 (the
    namespace is going away), 409 (a foreign Job holds the name), 429, 5xx (a webhook that is
    unavailable is a 500), and 0 (no response: timeout, connection refused).
    """
    return code in (400, 413, 422)


# --------------------------------------------------------------------------- decisions


class _Decision(_Event):
    namespace: str
    backfill: str
    cause: int | None = None  # log position of the event that caused the decision
    basis: int | None = None  # log position the deciding state was folded up to

    @property
    def stream(self) -> str:
        return f"backfill/{self.namespace}/{self.backfill}"


class _AttemptDecision(_Decision):
    uid: str  # the ModelBackfill's uid
    attempt: int
    job_name: str

    def natural_key(self) -> str | None:
        # fields only (no ClassVar, no super()): :func:`key_of` calls it on the compiled form too
        return attempt_key(self.namespace, self.backfill, self.uid, _VERBS[self.type], self.attempt)  # type: ignore[attr-defined]


class AttemptAdmitted(_AttemptDecision):
    """The controller admitted attempt ``attempt`` and will create Job ``job_name`` (-> Starting)."""

    type: Literal["AttemptAdmitted"] = "AttemptAdmitted"
    generation: int
    model: str
    node: str = ""


class AttemptCancelled(_AttemptDecision):
    """The controller cancels attempt ``attempt`` for ``reason`` and deletes its Job (-> Cancelling).

    With ``suspend`` (a preemption of a ``spec.preemption: Suspend`` declaration, issue 11) it
    sets the Job's ``spec.suspend`` instead and run segment ``segment`` ends (-> Suspending); one
    such decision per segment, and at most one deleting cancel per attempt (also after
    suspensions)."""

    type: Literal["AttemptCancelled"] = "AttemptCancelled"
    reason: str
    message: str = ""
    suspend: bool = False
    segment: int = Field(default=1, ge=1)

    def natural_key(self) -> str | None:
        base = _AttemptDecision.natural_key(self)
        return f"{base}/suspend/{self.segment}" if self.suspend else base


class AttemptResumed(_AttemptDecision):
    """The controller admitted run segment ``segment`` (>= 2) of attempt ``attempt``: it clears
    the suspended Job's ``spec.suspend`` (-> Starting, then Running). Decided like an admission
    (a fresh full idle window and every gate); ``model``/``node`` as then."""

    type: Literal["AttemptResumed"] = "AttemptResumed"
    segment: int = Field(ge=2)
    generation: int
    model: str
    node: str = ""

    def natural_key(self) -> str | None:
        return f"{_AttemptDecision.natural_key(self)}/{self.segment}"


class BackfillBlocked(_Decision):
    """The controller found the reference or template in violation of the contract (-> Blocked)."""

    type: Literal["BackfillBlocked"] = "BackfillBlocked"
    reason: str
    message: str = ""


class BackfillUnblocked(_Decision):
    """The blocking condition is gone; the declaration returns to idle admission."""

    type: Literal["BackfillUnblocked"] = "BackfillUnblocked"


class FinalizerReleased(_Decision):
    """The controller removed its finalizer: no owned Job is live any more."""

    type: Literal["FinalizerReleased"] = "FinalizerReleased"
    uid: str

    def natural_key(self) -> str | None:
        return f"decision/{self.namespace}/{self.backfill}/{self.uid}/finalizer"


Event = Annotated[
    Union[
        ForegroundRequest,
        GamingIntentStarted,
        GamingIntentEnded,
        GPULeaseActive,
        GPULeaseEnded,
        ModelReady,
        ModelNotReady,
        ModelDeleted,
        BackfillApplied,
        BackfillDeleting,
        BackfillDeleted,
        CronJobSeen,
        CronJobMissing,
        JobCreated,
        JobRunning,
        JobSucceeded,
        JobFailed,
        JobDeleted,
        JobTerminating,
        JobCreateRejected,
        JobSuspended,
        JobResumed,
        JobProgress,
        AttemptAdmitted,
        AttemptCancelled,
        AttemptResumed,
        BackfillBlocked,
        BackfillUnblocked,
        FinalizerReleased,
    ],
    Field(discriminator="type"),
]

#: decision type -> the verb of its attempt key (:func:`attempt_key`).
_VERBS: dict[str, str] = {"AttemptAdmitted": "admit", "AttemptCancelled": "cancel", "AttemptResumed": "resume"}

DECISIONS: tuple[type, ...] = (
    AttemptAdmitted,
    AttemptCancelled,
    AttemptResumed,
    BackfillBlocked,
    BackfillUnblocked,
    FinalizerReleased,
)

EVENT_TYPES: dict[str, type[_Event]] = {
    cls.model_fields["type"].default: cls for cls in Event.__origin__.__args__  # type: ignore[attr-defined]
}

#: Upcasters: ``(type, stored_version) -> fn(payload dict) -> payload dict of stored_version + 1``.
UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}

_ONE = TypeAdapter(Event)
_MANY = TypeAdapter(list[Event])


class EventDecodeError(ValueError):
    """A stored record that no event class (after upcasting) accepts; names type and version (one
    line), and from :func:`decode_rows` its ``position`` (else None), with ``reason`` the message
    without it."""

    def __init__(self, message: str, *, position: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.position = position
        self.reason = reason if reason is not None else message


def encode(event: _Event, key: str | None = None) -> EventRecord:
    """Turn an event into an appendable record.

    Args:
        event: any member of :data:`Event`.
        key: the idempotency key; defaults to ``event.natural_key()``.

    Raises:
        ValueError: no key given and the event has no natural key.
    """
    key = key or event.natural_key()
    if not key:
        raise ValueError(f"{type(event).__name__} needs an explicit idempotency key")
    data = event.model_dump_json()
    stream = event.stream
    if JSON_NUL in data:  # the log stores no NUL (backfill.core.storable): U+FFFD instead
        data = storable_json(data)
    if NUL in stream or NUL in key:
        stream, key = without_nul(stream), without_nul(key)
    if len(key) > MAX_INDEXED_CHARS or len(stream) > MAX_INDEXED_CHARS:  # both are indexed
        stream, key = bounded(stream), bounded(key)
    return EventRecord(
        type=event.type,  # type: ignore[attr-defined]
        version=type(event).version,
        stream=stream,
        idempotency_key=key,
        at=event.at,
        data=data,
    )


def _upcast(type_name: str, version: int, data: str) -> str:
    import json

    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise EventDecodeError(f"unknown event type {type_name!r}")
    payload = json.loads(data)
    while version < cls.version:
        step = UPCASTERS.get((type_name, version))
        if step is None:
            raise EventDecodeError(f"no upcaster for {type_name} v{version}")
        payload = step(payload)
        version += 1
    if version > cls.version:
        raise EventDecodeError(f"{type_name} v{version} is newer than this code (v{cls.version})")
    return json.dumps(payload)


def _pydantic_decode(type_name: str, version: int, data: str) -> Any:
    cls = EVENT_TYPES.get(type_name)
    if cls is None or version != cls.version:
        data = _upcast(type_name, version, data)
    try:
        return _ONE.validate_json(data)
    except ValueError as exc:
        raise EventDecodeError(f"invalid {type_name} v{version}: {_one_line(exc)}") from exc


def _one_line(exc: ValueError) -> str:
    """A pydantic ``ValidationError`` (else any error) in one line: up to three ``field: message``
    parts (a day-2 trial: the error took four lines, a link included, and the controller's log
    line kept only the first, without the field)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return " ".join(str(exc).split())
    found = errors(include_url=False)
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ())) or '(root)'}: {e.get('msg', '')}" for e in found[:3]]
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return "; ".join(parts) + more


# --------------------------------------------------------------------------- the log's fast path
#
# The log's own rows decode through msgspec: for every event class a msgspec Struct with the
# same fields, types, defaults and bounds is derived from the pydantic model at import
# (:func:`_mirror`), and a per-type JSON decoder parses *and type-checks* a row in C (strings,
# ints, tz-aware datetimes, ``ge``/``le`` bounds, no unknown fields, defaults filled). The
# pydantic instance is then assembled from those values the way ``model_construct`` does, without
# running pydantic's validator again. A row msgspec rejects (an older version, a lax value pydantic
# would coerce, a damaged row) goes through pydantic, which validates it or raises
# EventDecodeError; a class whose fields cannot be mirrored always does. One difference remains,
# for rows no writer of the log makes (they carry microseconds): a time with more than six
# fractional digits is rounded by msgspec and truncated by pydantic. Measured on a
# simulation's rows (``bench/bench_store.py``): about 1.0 us per event against 1.6 us for
# pydantic's batch validation.

_AWARE = Annotated[datetime, msgspec.Meta(tz=True)]
_BOUNDS = {annotated_types.Ge: "ge", annotated_types.Gt: "gt", annotated_types.Le: "le", annotated_types.Lt: "lt"}
_PLAIN = (str, int, float, bool)


def _mirror_type(ann: Any) -> Any:
    """The msgspec equivalent of a field annotation; raises TypeError when there is none."""
    if ann is UTCDateTime:
        return _AWARE
    if ann in _PLAIN:
        return ann
    origin, args = get_origin(ann), get_args(ann)
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1 and len(args) == 2:
            return Optional[_mirror_type(members[0])]
    if origin is dict and args[:1] == (str,) and len(args) == 2 and args[1] is Any:
        return dict[str, Any]
    if origin is Literal:
        return ann
    raise TypeError(f"no msgspec mirror for {ann!r}")


def _mirror(cls: type[_Event]) -> msgspec.json.Decoder | None:
    """A JSON decoder of ``cls``'s fields into a msgspec Struct (field order = the model's)."""
    fields: list[tuple[Any, ...]] = []
    try:
        for name, info in cls.model_fields.items():
            t = _mirror_type(info.annotation)
            meta = {}
            for m in info.metadata:
                kind = _BOUNDS.get(type(m))
                if kind is None:
                    raise TypeError(f"no msgspec mirror for {m!r}")
                meta[kind] = getattr(m, kind)
            if meta:
                t = Annotated[t, msgspec.Meta(**meta)]
            # ``type`` required as pydantic's discriminator requires it (a row without it went
            # through the fast path with the default filled, an adversarial trial found)
            fields.append((name, t) if info.is_required() or name == "type" else (name, t, info.default))
    except TypeError:
        return None
    struct = msgspec.defstruct(f"{cls.__name__}Row", fields, kw_only=True, forbid_unknown_fields=True, module=__name__)
    return msgspec.json.Decoder(struct)


#: type name -> (class, version, its JSON decoder, one shared fields-set). The fields-set
#: object is shared by every fast-decoded instance: frozen events never mutate it.
_FAST: dict[str, tuple[type[_Event], int, msgspec.json.Decoder, set[str]]] = {
    name: (cls, cls.version, dec, set(cls.model_fields))
    for name, cls in EVENT_TYPES.items()
    if (dec := _mirror(cls)) is not None
}
#: The compiled forms a fold takes in place of their event: mirror Struct -> event class, for
#: every class with a mirror (issue 10). A caller that only folds events and asks which
#: backfills they wake and which run rows they change (start-up and catch-up in
#: ``backfill.controller.loop``, a replay that folds) gets them from :func:`decode_rows` with
#: ``lean=True``: the checked row is handed on as is, without assembling its pydantic instance
#: (on a simulation's log about 0.8-1.2 us an event instead of 1.8-2.5 us). A compiled form's
#: attributes, ``type`` included, are the event's, and its values are those the pydantic
#: instance would hold (the same checked row builds both). It is not a pydantic model: no
#: ``model_dump``, ``stream`` or ``natural_key``, not an ``isinstance`` of its class. Code that
#: may see one dispatches on ``type(event)`` through a table that registers it beside its class
#: (``fold._FOLD``, ``conditions._WAKES``) or tests membership in :func:`with_compiled`.
COMPILED: dict[type, type[_Event]] = {spec[2].type: spec[0] for spec in _FAST.values()}
_COMPILED_OF: dict[type, type] = {cls: row for row, cls in COMPILED.items()}
# Each compiled class is a module attribute under its name, as pickle looks a class up (a
# simulation's log pickles); set here once, not in ``_mirror`` (a test calls it again).
globals().update({row.__name__: row for row in COMPILED})
_TYPE_NAME: dict[type, str] = {cls: name for name, cls in EVENT_TYPES.items()}
#: The compiled form of ``ForegroundRequest`` (a msgspec Struct; see :data:`COMPILED`).
ForegroundRequestRow: type = _COMPILED_OF[ForegroundRequest]


def with_compiled(*classes: type[_Event]) -> frozenset[type]:
    """``classes`` and their compiled forms (:data:`COMPILED`), for a ``type(event) in ...`` test
    that must hold alike for an event and for its compiled form (``isinstance`` does not see the
    latter). Subclasses are not included: name each class."""
    return frozenset(classes) | {_COMPILED_OF[c] for c in classes if c in _COMPILED_OF}


_new = object.__new__
_set_dict = object.__setattr__
# BaseModel's slot setters (C member descriptors): cheaper than object.__setattr__ by name.
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
_asdict = msgspec.structs.asdict
_DecodeError = msgspec.DecodeError


def _assemble(cls: type[_Event], payload: dict[str, Any], fields_set: set[str]) -> Any:
    """An instance of ``cls`` whose fields are ``payload`` (every field, already checked), the
    way ``model_construct`` builds one, without running the validator."""
    event = _new(cls)
    _set_dict(event, "__dict__", payload)
    _set_fields_set(event, fields_set)
    _set_extra(event, None)
    _set_private(event, None)
    return event


def _fast_decode(type_name: str, version: int, data: str) -> Any:
    """Decode one row the log wrote, or return None when it needs the validating path."""
    spec = _FAST.get(type_name)
    if spec is None:
        return None
    cls, current, decoder, fields_set = spec
    if version != current:
        return None
    try:
        payload = _asdict(decoder.decode(data))
    except _DecodeError:
        return None
    if payload["type"] != type_name:
        return None
    return _assemble(cls, payload, fields_set)


class _Required:
    """Marks a field with no default in :data:`_TEMPLATES` (never a field's value)."""

    __slots__ = ()

    def __repr__(self) -> str:  # pragma: no cover - only in an error message
        return "<required>"


_REQUIRED = _Required()

#: class -> (every field in declaration order with its default or _REQUIRED, the required names,
#: the shared fields-set). ``type`` has its Literal's default.
_TEMPLATES: dict[type, tuple[dict[str, Any], frozenset[str], set[str]]] = {
    cls: (
        {name: (_REQUIRED if info.is_required() else info.get_default(call_default_factory=True)) for name, info in cls.model_fields.items()},
        frozenset(name for name, info in cls.model_fields.items() if info.is_required()),
        set(cls.model_fields),
    )
    for cls in EVENT_TYPES.values()
}


def construct(cls: type[_Event], /, **values: Any) -> Any:
    """An event of ``cls`` built from ``values`` without validation, for events the project's own
    code produces from values it already holds typed: about 4x cheaper than ``cls(**values)``
    (the simulator folds compiled forms instead: :func:`compiled_class`). Foreign input
    (watchers, ingest, an imported export) goes through ``cls(...)``, which validates.

    The instance equals, dumps and encodes exactly as ``cls(**values)`` would when the values
    are valid (the caller's promise: timezone-aware datetimes, the field types of ``cls``);
    defaults are filled (a ``default_factory`` is called). Works for every class of
    :data:`EVENT_TYPES`, with ``model_fields_set`` = every field (as the log's fast decode path).

    Raises:
        TypeError: a name that is not a field of ``cls``, a required field missing, ``type``
            given, or ``cls`` not an event class.
    """
    try:
        template, required, fields_set = _TEMPLATES[cls]
    except KeyError:
        raise TypeError(f"{cls!r} is not an event class") from None
    payload = template.copy()
    payload.update(values)
    if len(payload) != len(template) or "type" in values or not required <= values.keys():
        unknown = sorted(set(values) - set(template) | ({"type"} & set(values)))
        missing = sorted(required - values.keys())
        raise TypeError(f"{cls.__name__}: unknown or fixed fields {unknown}, missing {missing}")
    return _assemble(cls, payload, fields_set)


def build(cls: type[_Event], /, **values: Any) -> Any:
    """The compiled form (:data:`COMPILED`) of an event of ``cls`` built from ``values`` without
    validation, for a caller that folds it (the simulator's rarer observations); it folds exactly
    as the event. The caller's promise is :func:`construct`'s (valid, typed values); defaults are
    filled. :func:`materialize` turns it into the event. About as costly as :func:`construct`
    (1 us: the values pass through a dict); a hot path calls :func:`compiled_class` directly.

    Raises:
        TypeError: a name that is not a field of ``cls``, a required field missing, ``type``
            given, or ``cls`` without a compiled form.
    """
    try:
        row = _COMPILED_OF[cls]
    except KeyError:
        raise TypeError(f"{cls!r} has no compiled form") from None
    return row(type=_TYPE_NAME[cls], **values)


def compiled_class(cls: type[_Event]) -> type:
    """The class of ``cls``'s compiled form (:data:`COMPILED`, a msgspec Struct): called with the
    event's fields as keywords *and* ``type=`` its type name (required, as in a stored row;
    ``cls`` itself takes the same call), it builds the compiled form in C without validation,
    about 0.2 us against 1 us for :func:`build` and :func:`construct`, which pass the values
    on as a dict. For the hot paths of a caller that folds its own events (the simulator).

    Raises:
        TypeError: ``cls`` has no compiled form.
    """
    try:
        return _COMPILED_OF[cls]
    except KeyError:
        raise TypeError(f"{cls!r} has no compiled form") from None


def materialize(event: Any) -> Any:
    """The event (a pydantic instance, as :func:`construct` builds it) of a compiled form; an
    event is returned as is. O(fields), no validation: the compiled form's values are the
    event's (:data:`COMPILED`)."""
    cls = COMPILED.get(type(event))
    if cls is None:
        return event
    return _assemble(cls, _asdict(event), _TEMPLATES[cls][2])


def key_of(event: Any) -> str | None:
    """The natural key (idempotency key implied by the event) of an event or of its compiled
    form: ``natural_key`` of its class, whose body reads the event's fields only so that it
    serves both forms (``tests/core/test_compiled_events.py``)."""
    return COMPILED.get(type(event), type(event)).natural_key(event)


def decode(type_name: str, version: int, data: str, *, validate: bool = False) -> Any:
    """Turn a stored record's (type, version, JSON text) back into a typed event.

    A row of the current version takes the compiled path (msgspec, see above) when it passes
    its checks; others, and every row with ``validate=True`` (foreign input, e.g. an imported
    export), are upcast and validated by pydantic.

    Raises:
        EventDecodeError: unknown type, a version with no upcaster, or an invalid payload.
    """
    if not validate:
        event = _fast_decode(type_name, version, data)
        if event is not None:
            return event
    return _pydantic_decode(type_name, version, data)


def decode_many(rows: list[tuple[str, int, str]], *, validate: bool = False) -> list[Any]:
    """Decode a batch of (type, version, JSON text) rows of the log, in order.

    Each row takes the fast path of :func:`decode` when it can; with ``validate=True`` the whole
    batch is validated by pydantic in one call (and retried row by row to name a culprit).

    Raises:
        EventDecodeError: as :func:`decode`.
    """
    if not validate:
        return [e for _, e in decode_rows([(0, t, v, d) for t, v, d in rows])]
    if all(EVENT_TYPES.get(t) is not None and v == EVENT_TYPES[t].version for t, v, _ in rows):
        try:
            return _MANY.validate_json("[" + ",".join(d for _, _, d in rows) + "]")
        except ValueError:
            pass
    return [_pydantic_decode(t, v, d) for t, v, d in rows]


def decode_rows(rows: Iterable[tuple[int, str, int, str]], *, lean: bool = False) -> list[tuple[int, Any]]:
    """``(position, event)`` pairs of ``(position, type, version, JSON text)`` rows of the log
    (as :meth:`backfill.store.EventStore.read_payloads` returns them), in order.

    The replay hot path: :func:`decode`'s compiled path inlined in one loop (no call per row);
    a row it does not take is upcast and validated by pydantic. With ``lean=True`` (for a
    caller that only folds the events, asks what they wake and which run rows they change) a
    current row the compiled path takes is handed on in its compiled form, checked the same
    way (see :data:`COMPILED`); one it refuses is still a validated pydantic event.

    Raises:
        EventDecodeError: as :func:`decode`, naming the row's position (``.position``; one line).
    """
    fast = _FAST
    asdict = _asdict
    new = _new
    set_dict = _set_dict
    set_fields_set = _set_fields_set
    set_extra = _set_extra
    set_private = _set_private
    decode_error = _DecodeError
    out: list[tuple[int, Any]] = []
    append = out.append
    for position, t, v, d in rows:
        spec = fast.get(t)
        if spec is not None and v == spec[1]:
            try:
                row = spec[2].decode(d)  # the struct's ``type`` is Literal[t]: checked
            except decode_error:
                pass
            else:
                if lean:  # its compiled form
                    append((position, row))
                    continue
                payload = asdict(row)
                event = new(spec[0])  # _assemble, inlined
                set_dict(event, "__dict__", payload)
                set_fields_set(event, spec[3])
                set_extra(event, None)
                set_private(event, None)
                append((position, event))
                continue
        try:
            event = _pydantic_decode(t, v, d)
        except EventDecodeError as exc:
            if not position:  # not a stored row's (decode_many)
                raise
            raise EventDecodeError(f"position {position}: {exc}", position=position, reason=str(exc)) from exc
        append((position, event))
    return out
