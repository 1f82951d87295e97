"""Replay audit: re-fold a log and check every recorded decision against what ``decide`` derives.

Pure: the caller streams ``(position, event)`` pairs in; :class:`Auditor` keeps the recent states
(cheap: folds share structure) so each decision is checked against the state it was made on
(its ``basis`` position, else the position just before it) at its own time ``at``.
"""

from __future__ import annotations

import bisect
from array import array
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, NamedTuple

from . import events as ev
from .commands import Admit, Block, Cancel, ReleaseFinalizer, Resume, Unblock
from .fold import ended_for_condition, revived
from .projector import decide, fold
from .state import World

#: How many past states the auditor keeps to find a decision's basis.
WINDOW = 4096


class TrailEntry(NamedTuple):
    """One recorded admit, cancel, suspend or resume, with its cause (``decision`` is ``admit``,
    ``cancel``, ``suspend`` or ``resume``; ``attempt`` the attempt it concerns; immutable, a
    NamedTuple: one is built per such decision of a replay).

    ``latency_seconds``: decision time minus the cause event's time (None if the cause is
    unknown or outside the audited range).
    """

    position: int
    at: datetime
    namespace: str
    backfill: str
    decision: str
    reason: str
    cause: int | None
    cause_type: str | None
    cause_at: datetime | None
    attempt: int = 0

    @property
    def latency_seconds(self) -> float | None:
        if self.cause_at is None:
            return None
        return (self.at - self.cause_at).total_seconds()


def trail_entry(position: int, d: Any, cause: Callable[[int | None], tuple[str | None, datetime | None]]) -> TrailEntry | None:
    """The :class:`TrailEntry` of decision ``d`` at ``position`` if it admits, cancels, suspends
    or resumes, else None; ``cause(position)`` gives the cause event's ``(type, time)`` or
    ``(None, None)`` when it is not known."""
    t = type(d)
    if t is not ev.AttemptAdmitted and t is not ev.AttemptCancelled and t is not ev.AttemptResumed:
        return None
    ctype, cat = cause(d.cause)
    reason = d.reason if t is ev.AttemptCancelled else ""
    if t is ev.AttemptResumed:
        kind = "resume"
    elif reason == "":
        kind = "admit"
    else:
        kind = "suspend" if d.suspend else "cancel"
    return TrailEntry(position, d.at, d.namespace, d.backfill, kind, reason, d.cause, ctype, cat, d.attempt)


@dataclass(frozen=True)
class Divergence:
    """A recorded decision the projector does not derive now: what was recorded and what is derived."""

    position: int
    recorded: str
    derived: str


def is_of(key: tuple[str | None, str] | None, namespace: str, name: str) -> bool:
    """Whether ModelBackfill ``namespace/name`` is the one ``key`` names: ``(namespace, name)``,
    ``(None, name)`` for that name in any namespace (as ``backfill runs --backfill NAME``; a new
    user's trial: ``replay`` refused the bare name ``runs`` took), or every one when None."""
    return key is None or (name == key[1] and (key[0] is None or namespace == key[0]))


@dataclass
class Auditor:
    """Streaming replay. Call :meth:`feed` for every event in log order, then read the results.

    Attributes:
        world: the state folded so far; pass a snapshot's world to start after it (decisions made
            on a state before the snapshot are then unverifiable).
        trail: admits and cancels (filtered by ``backfill`` if given: ``(namespace, name)``, or
            ``(None, name)`` for that name in any namespace, :func:`is_of`).
        divergences: decisions that differ from what the projector derives.
        unverifiable: positions of decisions whose basis state is no longer kept.
        superseded: positions of cancels recorded after the log had ended their attempt and
            admitted a later one, or (a suspend) resumed a later segment of it (a deposed or
            paused replica's record, spooled while the store was away, appended after its
            successor's decisions): the state they were decided on is not in the log, so they are
            not checked (nor divergent).
        uncaused: positions of cancels whose cause the log does not hold (cause 0: the
            observation that caused it was refused by the log and set aside by the spool, its
            record in the controller's log, :mod:`backfill.controller.spool`): what it was decided
            on is not in the log, so it is not checked (nor divergent).
        checked: number of decisions checked.
    """

    backfill: tuple[str | None, str] | None = None
    world: World = field(default_factory=World)
    trail: list[TrailEntry] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    unverifiable: list[int] = field(default_factory=list)
    superseded: list[int] = field(default_factory=list)
    uncaused: list[int] = field(default_factory=list)
    checked: int = 0
    _states: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    _type_ids: dict = field(default_factory=dict)
    _types: list = field(default_factory=list)
    _pos: array = field(default_factory=lambda: array("q"))
    _at: array = field(default_factory=lambda: array("d"))
    _tid: array = field(default_factory=lambda: array("H"))
    _start: World = field(default_factory=World)

    def __post_init__(self) -> None:
        self._start = self.world

    def feed(self, position: int, event: Any) -> None:
        """Fold one event; if it is a decision, check it first against its basis state."""
        self.feed_many(((position, event),))

    def feed_many(self, pairs: Iterable[tuple[int, Any]]) -> None:
        """:meth:`feed` each ``(position, event)`` pair in order (one loop: the replay's hot path;
        an event that is no decision is folded and noted, nothing more).

        Raises:
            KeyError: an object that is not an event (as :func:`backfill.core.projector.fold`);
                the pairs before it are fed.
        """
        decisions = _DECISION_TYPES
        f = fold
        keep = self._states.append
        type_ids = self._type_ids
        note_pos, note_at, note_tid = self._pos.append, self._at.append, self._tid.append
        w = self.world
        try:
            for position, event in pairs:
                t = type(event)
                if t in decisions:
                    self.world = w
                    self._check(position, event)
                w = f(w, event, position)
                keep(w)
                tid = type_ids.get(t)
                if tid is None:
                    tid = type_ids[t] = len(self._types)
                    self._types.append(event.type)
                note_pos(position)
                note_at(event.at.timestamp())
                note_tid(tid)
        finally:
            self.world = w

    def _cause(self, cause: int | None) -> tuple[str | None, datetime | None]:
        if not cause or not self._pos:
            return (None, None)
        i = bisect.bisect_left(self._pos, cause)
        if i >= len(self._pos) or self._pos[i] != cause:
            return (None, None)
        return (self._types[self._tid[i]], datetime.fromtimestamp(self._at[i], timezone.utc))

    def _basis_state(self, position: int, basis: int | None) -> World | None:
        """The state folded up to ``basis`` (else ``position - 1``), or None if no longer kept."""
        target = basis if basis is not None else position - 1
        if self.world.position <= target:
            return self.world
        for world in reversed(self._states):
            if world.position <= target:
                return world
        if len(self._states) < WINDOW and target >= self._start.position:
            return self._start  # before the first event fed: nothing was evicted
        return None

    def _check(self, position: int, d: Any) -> None:
        if not is_of(self.backfill, d.namespace, d.backfill):
            return
        key = (d.namespace, d.backfill)
        t = type(d)
        entry = trail_entry(position, d, self._cause)
        if entry is not None:
            self.trail.append(entry)
        state = self._basis_state(position, d.basis)
        if state is None:
            self.unverifiable.append(position)
            return
        if t is ev.AttemptCancelled and d.cause == 0:  # its cause was refused by the log (positions start at 1)
            self.uncaused.append(position)
            return
        if t is ev.AttemptCancelled:
            b = state.backfills.get(key)
            later = b.attempt if b is not None else None
            if b is not None and (
                b.attempts > d.attempt
                or (d.suspend and later is not None and later.number == d.attempt and later.segment > d.segment)
            ):
                self.superseded.append(position)
                return
        self.checked += 1
        derived = [c for c in decide(state, d.at, (key,)) if type(c) in _DECISION_COMMANDS]
        if t is ev.AttemptCancelled and not any(_matches(d, c) for c in derived):
            # the deletion it caused reached the log first (another replica recorded it): check
            # it on the state with that attempt live, as its decider saw it (on the state with
            # it ended, an admission may even be due)
            live = revived(state, key)
            if live is not None:
                derived = [c for c in decide(live, d.at, (key,)) if type(c) in _DECISION_COMMANDS]
            elif _ended_for_it(state, key, d):
                # the log ended the attempt for this reason at the deletion this cancel caused,
                # recorded first (two replicas' records during a store outage: a chaos soak); its
                # decider saw events no prefix of the log holds, so its cause is not re-derived
                return
        if t is ev.AttemptCancelled and any(self._reordered(d, c) for c in derived):
            return
        if not any(_matches(d, c) for c in derived):
            self.divergences.append(Divergence(position, _describe_event(d), "; ".join(_describe_command(c) for c in derived) or "nothing"))

    def _reordered(self, d: Any, c: Any) -> bool:
        """Whether recorded cancel ``d`` is derived cancel ``c`` with a cause that happened no
        later than ``c``'s but reached the log after it: the same attempt, reason and segment,
        ``c.cause < d.cause``, and ``d.cause`` an event of ``c.cause``'s type whose time (UTC) is
        not after ``c.cause``'s. Two replicas' spools flushed after a store outage put a leader's
        report (cancelled from memory) behind the standby's later observation of the same demand
        (a chaos soak: "divergence at position 474 ... cause 473 ... derives cause 465"). A
        cancel citing an event of another type, or one that happened later, stays divergent."""
        if not isinstance(c, Cancel) or (d.attempt, d.reason, d.suspend, d.segment) != (c.attempt, c.reason, c.suspend, c.segment):
            return False
        if not (d.cause and c.cause and c.cause < d.cause):
            return False
        d_type, d_at = self._cause(d.cause)
        c_type, c_at = self._cause(c.cause)
        return d_type is not None and d_type == c_type and d_at is not None and c_at is not None and d_at <= c_at


def _ended_for_it(state: World, key: tuple[str, str], d: Any) -> bool:
    """Whether ``state`` holds ``d``'s attempt ended for ``d``'s reason by a deletion with no
    decision of its own (:func:`backfill.core.fold.ended_for_condition`)."""
    b = state.backfills.get(key)
    a = b.attempt if b is not None else None
    return not d.suspend and a is not None and a.number == d.attempt and a.cancel_reason == d.reason and ended_for_condition(a)


_DECISION_TYPES = frozenset(ev.DECISIONS)
_DECISION_COMMANDS = frozenset((Admit, Cancel, Resume, Block, Unblock, ReleaseFinalizer))


def _matches(d: Any, c: Any) -> bool:
    if isinstance(d, ev.AttemptAdmitted) and isinstance(c, Admit):
        return (d.attempt, d.job_name, d.model, d.node, d.generation, d.cause) == (
            c.attempt, c.job_name, c.model, c.node, c.generation, c.cause
        )
    if isinstance(d, ev.AttemptCancelled) and isinstance(c, Cancel):
        return (d.attempt, d.reason, d.cause, d.suspend, d.segment) == (c.attempt, c.reason, c.cause, c.suspend, c.segment)
    if isinstance(d, ev.AttemptResumed) and isinstance(c, Resume):
        return (d.attempt, d.segment, d.job_name, d.model, d.node, d.generation, d.cause) == (
            c.attempt, c.segment, c.job_name, c.model, c.node, c.generation, c.cause
        )
    if isinstance(d, ev.BackfillBlocked) and isinstance(c, Block):
        return d.reason == c.reason
    if isinstance(d, ev.BackfillUnblocked) and isinstance(c, Unblock):
        return True
    if isinstance(d, ev.FinalizerReleased) and isinstance(c, ReleaseFinalizer):
        return True
    return False


def _describe_event(d: Any) -> str:
    if isinstance(d, ev.AttemptAdmitted):
        return f"admit attempt {d.attempt} job {d.job_name} (cause {d.cause})"
    if isinstance(d, ev.AttemptCancelled):
        verb = f"suspend attempt {d.attempt} segment {d.segment}" if d.suspend else f"cancel attempt {d.attempt}"
        return f"{verb} for {d.reason} (cause {d.cause})"
    if isinstance(d, ev.AttemptResumed):
        return f"resume attempt {d.attempt} segment {d.segment} (cause {d.cause})"
    if isinstance(d, ev.BackfillBlocked):
        return f"block {d.reason}"
    return d.type


def _describe_command(c: Any) -> str:
    if isinstance(c, Admit):
        return f"admit attempt {c.attempt} job {c.job_name} (cause {c.cause})"
    if isinstance(c, Cancel):
        verb = f"suspend attempt {c.attempt} segment {c.segment}" if c.suspend else f"cancel attempt {c.attempt}"
        return f"{verb} for {c.reason} (cause {c.cause})"
    if isinstance(c, Resume):
        return f"resume attempt {c.attempt} segment {c.segment} (cause {c.cause})"
    if isinstance(c, Block):
        return f"block {c.reason}"
    return type(c).__name__
