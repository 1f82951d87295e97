"""The projected world: what the log says about models, nodes, leases, templates and backfills.

Every class here is immutable: the per-object records are frozen ``msgspec`` Structs
(:class:`Record`: built and copied in C), the rest ``NamedTuple`` (:class:`World` is built
positionally by the fold's hot paths); the fold runs hundreds of thousands of times a second;
:func:`backfill.core.projector.fold` never mutates a state, it returns a new one that shares what
did not change (so keeping an old state is cheap: ``replay`` checks decisions against the state
they were made on, and the controller's preemptor folds in memory on top of the durable one).

The maps of a :class:`World` are persistent hash maps (``immutables.Map``, a C HAMT): setting one
key returns a new map in O(log n) that shares the rest, so an event costs the same with 100 or
10,000 objects. Measured on the development machine (set one key): a dict copy costs 0.35 us at
100 entries, 4 us at 1,000 and 48 us at 10,000; ``immutables.Map.set`` 0.23, 0.28 and 0.39 us;
``pyrsistent.pmap.set`` 1.5-1.8 us. Reads (``get``, ``in``, iteration) are those of a Mapping.

Keys are ``(namespace, name)`` tuples. Times are timezone-aware UTC datetimes; positions are log
positions (0 = before the log / unknown).
"""

from __future__ import annotations

from datetime import datetime
from types import MappingProxyType
from collections.abc import Mapping
from typing import Any, NamedTuple

import immutables
import msgspec

from .spec import Spec, SpecProblem

Key = tuple[str, str]

#: Bump when the fold's *meaning* changes without a change of shape (a handler computes a field
#: differently): snapshots of another version are never read, start-up refolds from the log.
#: Shape changes (fields, event types, event versions) change the fingerprint by themselves
#: (:func:`backfill.store.projection.code_version`).
STATE_VERSION = 13  # 2: run segments of resumable (Indexed) attempts, issue 11; 3: unchanged re-deliveries
#: (CronJob, gaming, lease) keep their first position; 4: a Job deleted before its cancel was
#: recorded ends for the cancel condition that held (any, not only foreground demand), and a
#: cancel recorded after the deletion it caused re-attributes the end; a request that does not
#: extend the known busy time is not new demand, and a ForegroundDemand cancel restarts the idle
#: window at its decision; the GPU guard refuses dynamic resource claims; a ref over the CRD maxLength is InvalidSpec;
#: 5: a Job deleted while foreground demand held (no cancel recorded yet) restarts the idle window at its deletion;
#: 6: a resumable attempt's Job observed suspended is Suspended: for the condition that held and suspends it (its
#: decision not recorded yet), else unexplained (JobSuspended) until a suspending decision recorded later names it;
#: 7: the GPU guard: a volume that is not a hostPath is no device mount; CDI annotations under a subdomain of
#: cdi.k8s.io, AMD_VISIBLE_DEVICES, mounts at the NVIDIA runtime's device list, any hostPath, hostPID/hostIPC,
#: capabilities beyond baseline, GPU vendors' and DRA extended resources, CRI-O's devices annotation are refused; a Job event
#: with owned=False (no controller ownerReference) is only the attempt's Job under the uid the log knows;
#: 8: a deleted declaration's live Job stays a rival on its Model and node until its end (orphan_key); a
#: terminating Job the log explained is not unexplained; a finished attempt's Job observed deleted (job_gone)
#: 9: a spec change of spec.suspend alone keeps a success's cooldown and a failure (succeeded/failed_generation carried);
#: a non-resumable attempt's Job observed suspended (by someone else) is Cancelling (JobSuspended) and deleted;
#: 10: a Model observed under another uid (deleted and created again, perhaps unseen) became Ready anew, and
#: a live attempt admitted before that is cancelled (ModelState.uid, replaced_pos); a ModelNotFound block is
#: caused by the Model's deletion (ModelState.gone_pos);
#: 11: the per-object records are msgspec Structs (state.Record): a pickle of the NamedTuples before is not read
#: 12: Attempt.seen_suspended keeps a SeenSuspension, never the event (a compiled form did not pickle)
#: 13: a Job seen under the name of an attempt this log never admitted numbers the next attempt past it (names_taken);
#: Attempt.suspend_round counts its entries into Suspending

_EMPTY: Mapping[Any, Any] = immutables.Map()  # shared, immutable default of every World map
_NO_SPEC: Mapping[str, Any] = MappingProxyType({})

# Lifecycle of the current attempt (the phase machine's job-owning part).
IDLE = "Idle"  # no live attempt
STARTING = "Starting"
RUNNING = "Running"
CANCELLING = "Cancelling"
#: A preemption suspended the Job (issue 11): ``spec.suspend: true`` is sent, the Job is not yet
#: observed stopped. Live: it holds its model and node like a Job being deleted.
SUSPENDING = "Suspending"
#: The Job is observed suspended with no active pods. Not live (it runs nothing); the attempt
#: is resumed by the next admission, or ended by a deleting cancel or by the Job's end.
SUSPENDED = "Suspended"
LIVE = (STARTING, RUNNING, CANCELLING, SUSPENDING)



#: ``msgspec.structs.replace``: a copy of a :class:`Record` with some fields changed (C, about
#: 0.15 us for an :class:`Attempt` against 0.7 us for a NamedTuple's ``_replace``).
replace = msgspec.structs.replace


class Record(msgspec.Struct, frozen=True, gc=False):
    """Base of the fold's per-object records (:class:`ModelState`, :class:`Attempt`,
    :class:`CreateRejection`, :class:`BackfillState`): frozen ``msgspec`` Structs, built and
    copied in C (issue 10: constructing an :class:`Attempt` costs about 0.25 us against 1.0 us
    as a NamedTuple, changing two of its fields 0.16 us against 0.7 us). Not tracked by the
    cyclic garbage collector (``gc=False``): a record holds only values, maps and other records,
    never a cycle. Equal when of the same class with equal fields; pickled by snapshots."""


class SeenSuspension(Record):
    """What :attr:`Attempt.seen_suspended` keeps of a ``JobSuspended`` observation: ``at`` (UTC),
    ``completed_indexes`` (interval syntax), all a later suspending decision folds of it, and
    ``observed_at`` (UTC, or None) from which ``decide`` holds the resume a fresh idle window.
    Never the event itself: a world holds values only (compared, and pickled by snapshots; an
    adversarial trial: the compiled form of a caught-up event was kept and no snapshot could be
    written)."""

    at: datetime
    completed_indexes: str = ""
    observed_at: datetime | None = None


class ModelState(Record):
    """A Model as observed.

    Attributes:
        exists: False after ModelDeleted or when only foreground requests were seen.
        ready: ``status.phase == "Ready"``.
        node: the hosting node ("" if unknown); shared: ``spec.gpu.shared`` ("" if absent).
        uid: the Model object's ``metadata.uid`` as last observed ("" when unknown: only
            foreground requests seen, or readiness rows written before the uid was recorded).
        replaced_pos: the position of the readiness observation that showed another uid than
            ``uid`` (the object deleted and created again, perhaps while no watch saw it: a
            fault trial), 0 if never. It became Ready anew then, and a live attempt admitted
            before it is cancelled (``conditions._model_not_ready``).
        gone_pos: the position of the last ``ModelDeleted`` folded (0 if none): the cause of a
            ``ModelNotFound`` block, so each time the Model goes is its own decision (a trial:
            the second deletion's block shared the first one's idempotency key and was never
            recorded).
        ready_since / ready_pos: when (and at which position) it last became Ready.
        busy_until / busy_pos: end of the latest foreground busy span, and the position of the
            request that set it (the idle window starts here).
        request_pos: position of the latest foreground request that extended ``busy_until``
            (demand detection: one that does not, a re-sent or late report, is not new demand).
        last_active: the latest ``status.lastActiveTime`` folded (source ``lastActiveTime``): a
            re-observation of it (a relist after a restart) is not new demand.
    """

    exists: bool = False
    ready: bool = False
    node: str = ""
    shared: str = ""
    uid: str = ""
    replaced_pos: int = 0
    gone_pos: int = 0
    ready_since: datetime | None = None
    ready_pos: int = 0
    busy_until: datetime | None = None
    busy_pos: int = 0
    request_pos: int = 0
    last_active: datetime | None = None


class Gate(NamedTuple):
    """A GamingSession in gaming mode or a GPULease: blocks backfill on ``node`` / ``group``.

    Active while ``expires_at`` is None or later than ``now`` (cluster-contract).
    """

    node: str
    group: str
    expires_at: datetime | None
    since: datetime
    pos: int

    def active(self, now: datetime) -> bool:
        """True while the gate holds at ``now`` (UTC)."""
        return self.expires_at is None or self.expires_at > now


class GateEnd(NamedTuple):
    """When a gate on a node or group last ended, for the idle window's restart."""

    at: datetime
    pos: int


class Template(NamedTuple):
    """A CronJob's ``spec.jobTemplate`` (None while the CronJob is missing)."""

    job_template: Mapping[str, Any] | None
    pos: int
    problem: tuple[str, str] | None = None  # (reason, message) if it cannot be copied, computed at fold
    unstorable: str = ""  # CronJobSeen.unstorable: a NUL was replaced (then problem is InvalidTemplate)


#: Attempt results whose Job the controller leaves in place (it ran to its end): see
#: :attr:`Attempt.kept_job`.
FINISHED = frozenset(("succeeded", "failed", "deadline_exceeded"))


class Attempt(Record):
    """One admitted attempt of a backfill.

    ``lifecycle`` is one of Starting, Running, Cancelling, or Idle once it ended; ``result`` is
    set when it ended (``succeeded``, ``failed``, ``preempted``, ``deadline_exceeded``,
    ``cancelled``). ``basis`` is the log position the admitting decision's state was folded up
    to: every foreground request folded after it is demand the decision did not see, even one
    folded before the admission record itself (the decide -> record race).

    Run segments (issue 11, ``spec.preemption: Suspend``): ``segment`` counts the runs of the
    same Job (1 = the admission, each resume adds one; ``admitted_at``/``admitted_pos``/``basis``
    are the current segment's admission or resume). ``segment_started_at`` is when the current
    segment's work started (the Job's start, or the observed resume); ``base_indexes`` the
    Job's completed indexes when it started, ``completed_indexes`` the latest observed and
    ``progress_at`` when they last grew in this segment. ``suspend`` marks a cancel that
    suspends (lifecycle Suspending) rather than deletes; ``segment_ended_at`` is when the
    suspension was observed (lifecycle Suspended) and ``segment_reason`` the preemption that
    ended it (``segment_pos``: its cause's position). ``first_admitted_at`` is the attempt's first admission (the run rows of every
    segment share ``attempt``); ``resumable``: admitted under ``spec.preemption: Suspend``.
    ``seen_suspended``: a ``JobSuspended`` observed while a resume is under way (Starting a later
    segment) that nothing explained yet (its :class:`SeenSuspension`): a stale status from before the resume took effect, or
    our re-suspend whose cause and decision reach the log after it; a suspending decision of that
    segment folded later ends the segment with it. Cleared by the observed resume.
    ``job_gone``: the ended attempt's Job (its uid) was observed deleted afterwards
    (``ttlSecondsAfterFinished``, a hand's delete): status no longer names it (README:
    ``status.jobName`` names the attempt's Job while it exists).
    ``suspend_round``: how many times the attempt entered Suspending (a suspending cancel, a
    suspension nothing explained, a resume by someone else): the actor paces the re-sent suspends
    of one round, and sends a new round's first at once (an adversarial trial: a foreign resume
    re-suspended 26 s late, on the back-off of an earlier round).
    """

    number: int
    job_name: str
    generation: int
    model: str
    node: str
    admitted_at: datetime
    admitted_pos: int
    lifecycle: str = STARTING
    basis: int = 0
    terminating_since: datetime | None = None
    job_uid: str = ""
    created_at: datetime | None = None
    started_at: datetime | None = None
    cancel_reason: str = ""
    cancel_message: str = ""
    cancelled_at: datetime | None = None
    cancel_pos: int = 0
    ended_at: datetime | None = None
    end_pos: int = 0
    result: str | None = None
    end_reason: str = ""
    segment: int = 1
    segment_started_at: datetime | None = None
    base_indexes: str = ""
    completed_indexes: str = ""
    progress_at: datetime | None = None
    suspend: bool = False
    segment_ended_at: datetime | None = None
    segment_reason: str = ""
    segment_pos: int = 0
    first_admitted_at: datetime | None = None
    resumable: bool = False
    seen_suspended: SeenSuspension | None = None
    suspend_round: int = 0
    job_gone: bool = False

    @property
    def live(self) -> bool:
        """True while the attempt owns (or may own) a running Job: Starting, Running, Cancelling
        or Suspending (a Suspended attempt's Job runs nothing)."""
        return self.lifecycle in LIVE

    @property
    def kept_job(self) -> bool:
        """True while the ended attempt's Job is left in place (it succeeded, failed or passed
        its deadline: the controller deletes only what it cancels) and was not observed gone
        since: status names it, a relist looks for it."""
        return self.lifecycle == IDLE and self.result in FINISHED and not self.job_gone

    @property
    def suspended(self) -> bool:
        """True while the Job is observed suspended (resumable by the next admission)."""
        return self.lifecycle == SUSPENDED

    def ended(self, at: datetime, result: str, reason: str, pos: int) -> "Attempt":
        """This attempt ended at ``at`` (UTC) with ``result`` (one of
        :data:`backfill.core.runs.RESULTS`) for ``reason``, by the event at position ``pos``:
        Idle, no longer live. The one place an attempt's end is written (the fold's Job-end
        handlers, and the run row of a ModelBackfill deleted with its attempt live)."""
        return replace(self, lifecycle=IDLE, ended_at=at, result=result, end_reason=reason, end_pos=pos)


class CreateRejection(Record):
    """The latest refused Job create of a backfill (event ``JobCreateRejected``).

    ``permanent``: the declaration is Blocked while its generation is ``generation`` and its
    CronJob's template is still ``job_template`` (the one refused). Transient: attempt
    ``attempt`` stays Starting and is created again at ``retry_at`` (UTC); ``count`` refusals
    so far. ``summary`` is the API server's answer for status (``HTTP 403 Forbidden: ...``).
    """

    attempt: int
    count: int
    permanent: bool
    summary: str
    at: datetime
    retry_at: datetime
    generation: int
    job_template: Mapping[str, Any] | None
    pos: int


class BackfillState(Record):
    """One ModelBackfill's projection.

    Attributes:
        namespace, name, uid, generation: identity and the latest observed spec generation.
        raw_spec: the spec as stored in the API (for status and audit).
        spec / problem: exactly one is set: the parsed spec, or why it is invalid.
        deleting: a deletionTimestamp is set (finalizer pending); gone: the object is deleted.
        attempts: attempts admitted over the object's life (uid); attempt: the latest one.
        succeeded_at / succeeded_generation: the latest success (cooldown start).
        failed_generation: a failed attempt makes this generation terminal.
        blocked: the last recorded (reason, message) of a Blocked decision, or None.
        finalizer_released: the controller let the object go.
        rejection: the latest refused Job create (:class:`CreateRejection`), or None.
        unexplained: ``(job name, job uid)`` of the Jobs this ModelBackfill owns that exist,
            have not ended, and that none of its logged attempts explains (sorted): ``decide``
            deletes them and admits nothing meanwhile (``fold._unexplained``).
        names_taken: the highest attempt number whose Job name (``job_name(name, uid, n)``)
            was observed on a Job this log's attempts did not make (a finished Job another log
            of the same ModelBackfill left: a fresh schema, a restored database); ``decide``
            numbers the next attempt past it and ``attempts``, so its create never meets that
            Job (0: none).
    """

    namespace: str
    name: str
    uid: str = ""
    generation: int = 0
    raw_spec: Mapping[str, Any] = _NO_SPEC
    spec: Spec | None = None
    problem: SpecProblem | None = None
    deleting: bool = False
    gone: bool = False
    attempts: int = 0
    attempt: Attempt | None = None
    succeeded_at: datetime | None = None
    succeeded_generation: int = -1  # -1: never
    failed_generation: int = -1  # -1: never
    blocked: tuple[str, str] | None = None
    finalizer_released: bool = False
    rejection: CreateRejection | None = None
    unexplained: tuple[tuple[str, str], ...] = ()
    names_taken: int = 0

    @property
    def key(self) -> Key:
        """The backfill's ``(namespace, name)``."""
        return (self.namespace, self.name)

    @property
    def model_ref(self) -> str:
        """The spec's modelRef, or the raw value if the spec is invalid ("" if absent)."""
        if self.spec is not None:
            return self.spec.model_ref
        ref = self.raw_spec.get("modelRef") if isinstance(self.raw_spec, Mapping) else None
        return ref if isinstance(ref, str) else ""

    @property
    def live_attempt(self) -> Attempt | None:
        """The attempt that owns a Job right now, if any."""
        a = self.attempt
        return a if a is not None and a.live else None


class World(NamedTuple):
    """Everything folded so far. Build an empty one with ``World()``.

    Attributes:
        position: the last position folded (0 = nothing yet).
        models, templates, backfills: keyed by (namespace, name).
        gaming, leases: active GamingSessions / GPULeases keyed by (namespace, name).
        node_gate_ends / group_gate_ends: last end of a gate per node / shared group.
        model_index: (namespace, modelRef) -> keys of backfills referring to it.
        live: backfill key -> its live attempt (Starting/Running/Cancelling), for the
            contender gate (one active backfill Job per model and per node).
        live_models / live_nodes: (namespace, model) / node -> keys with a live attempt there.
        node_models: node -> (namespace, model) keys of the Models on it (for
            :meth:`backfills_on_node` without a scan).
    """

    position: int = 0
    models: Mapping[Key, ModelState] = _EMPTY
    templates: Mapping[Key, Template] = _EMPTY
    backfills: Mapping[Key, BackfillState] = _EMPTY
    gaming: Mapping[Key, Gate] = _EMPTY
    leases: Mapping[Key, Gate] = _EMPTY
    node_gate_ends: Mapping[str, GateEnd] = _EMPTY
    group_gate_ends: Mapping[str, GateEnd] = _EMPTY
    model_index: Mapping[Key, tuple[Key, ...]] = _EMPTY
    live: Mapping[Key, Attempt] = _EMPTY
    live_models: Mapping[Key, tuple[Key, ...]] = _EMPTY
    live_nodes: Mapping[str, tuple[Key, ...]] = _EMPTY
    node_models: Mapping[str, tuple[Key, ...]] = _EMPTY

    def backfills_of_model(self, namespace: str, model: str) -> tuple[Key, ...]:
        """Keys of the backfills whose modelRef is ``model`` in ``namespace`` (sorted)."""
        return self.model_index.get((namespace, model), ())

    def backfills_on_node(self, node: str) -> tuple[Key, ...]:
        """Keys of the backfills whose model is on ``node`` (sorted)."""
        out: set[Key] = set()
        for model in self.node_models.get(node, ()):
            out.update(self.model_index.get(model, ()))
        return tuple(sorted(out))


_NO_MODEL = ModelState()


def orphan_key(key: Key, job_name: str) -> Key:
    """The key in :attr:`World.live` of the live Job ``job_name`` of the deleted ModelBackfill
    ``key`` (kept a rival on its Model and node until its end is observed:
    :func:`backfill.core.fold._fold_deleted`): ``(namespace, "<name>/<job>")``, never a
    ModelBackfill's key (a name has no ``/``)."""
    return (key[0], f"{key[1]}/{job_name}")


def is_orphan_key(key: Key) -> bool:
    """Whether ``key`` (of :attr:`World.live`) is an :func:`orphan_key`."""
    return "/" in key[1]


def orphan_owner(key: Key) -> str | None:
    """The deleted ModelBackfill's name an :func:`orphan_key` names, else None."""
    return key[1].split("/", 1)[0] if is_orphan_key(key) else None


def _fast_replace(cls: type) -> Any:
    """A ``_replace`` for NamedTuple ``cls`` about 2x cheaper than the generated one (same result
    and errors: a name that is not a field raises ValueError)."""
    index = {name: i for i, name in enumerate(cls._fields)}
    new = tuple.__new__

    def _replace(self: Any, /, **changes: Any) -> Any:
        values = list(self)  # one list, one tuple (slicing and concatenating made three tuples)
        try:
            for name, value in changes.items():
                values[index[name]] = value
        except KeyError:
            raise ValueError(f"Got unexpected field names: {list(n for n in changes if n not in index)!r}") from None
        return new(cls, values)

    _replace.__doc__ = f"Return a new {cls.__name__} with the given fields replaced."
    return _replace


for _cls in (Gate, GateEnd, Template, World):
    _cls._replace = _fast_replace(_cls)
