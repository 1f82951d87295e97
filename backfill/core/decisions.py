"""Decision records: the one place a decision command becomes the event that records it.

The actor (live controller), the simulator and the tests all append what
:func:`decision_record` returns, so a decision has one shape and one idempotency key wherever it
is made (eventsourcing: "the domain builds its own records"). ``basis`` is the log position the
deciding state was folded up to and ``at`` the time ``decide`` was called with: ``backfill
replay`` re-derives the decision from exactly that state at exactly that time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from . import events as ev
from .commands import Admit, Block, Cancel, ReleaseFinalizer, Resume, Unblock

#: The command types that are decisions (recorded in the log); the others are re-issues or hints.
DECISION_COMMANDS = (Admit, Cancel, Resume, Block, Unblock, ReleaseFinalizer)


def validated(cls: type, /, **values: Any) -> Any:
    """``cls(**values)``: an event built through pydantic's validation (the counterpart of
    :func:`backfill.core.events.construct`)."""
    return cls(**values)


def decision_record(
    cmd: Any, *, at: datetime, basis: int, cause: int | None = None, validate: bool = True, compiled: bool = False
) -> tuple[Any, str]:
    """The decision event for ``cmd`` and its idempotency key.

    Args:
        cmd: an :data:`DECISION_COMMANDS` instance from ``decide``.
        at: the decision time (the ``now`` given to ``decide``), timezone-aware UTC.
        basis: the log position the deciding state was folded up to.
        cause: overrides ``cmd.cause`` (the controller resolves a cause that was not yet durable
            when it decided); None keeps the command's.
        validate: build the event through pydantic (the default); False builds it with
            :func:`backfill.core.events.construct` (the same event, about 4x cheaper) for a caller
            whose commands come straight from ``decide`` with nothing of its own in them
            (``tests/sim/test_fast_path.py`` compares both).
        compiled: build the event's compiled form (:func:`backfill.core.events.build`, about
            10x cheaper than ``construct``; it folds as the event, and
            :func:`~backfill.core.events.materialize` gives the event) for a caller that folds
            it (``simulate``'s fast path); ``validate`` is then ignored.

    Returns:
        ``(event, idempotency_key)``. Keys: one admit and one cancel per attempt of an object
        (uid), one suspend per attempt and segment, one resume per attempt and segment; one block per reason, cause and generation; one unblock per cause; one finalizer
        release per object.

    Raises:
        TypeError: ``cmd`` is not a decision.
    """
    ns, name = cmd.key
    t = type(cmd)
    make = ev.build if compiled else validated if validate else ev.construct
    if t is Admit:
        e: Any = make(ev.AttemptAdmitted,
            at=at, namespace=ns, backfill=name, cause=cmd.cause if cause is None else cause, basis=basis,
            uid=cmd.uid, attempt=cmd.attempt, generation=cmd.generation, job_name=cmd.job_name,
            model=cmd.model, node=cmd.node,
        )
        return e, ev.key_of(e)
    if t is Cancel:
        e = make(ev.AttemptCancelled,
            at=at, namespace=ns, backfill=name, cause=cmd.cause if cause is None else cause, basis=basis,
            uid=cmd.uid, attempt=cmd.attempt, job_name=cmd.job_name, reason=cmd.reason, message=cmd.message,
            suspend=cmd.suspend, segment=cmd.segment,
        )
        return e, ev.key_of(e)
    if t is Resume:
        e = make(ev.AttemptResumed,
            at=at, namespace=ns, backfill=name, cause=cmd.cause if cause is None else cause, basis=basis,
            uid=cmd.uid, attempt=cmd.attempt, segment=cmd.segment, generation=cmd.generation, job_name=cmd.job_name,
            model=cmd.model, node=cmd.node,
        )
        return e, ev.key_of(e)
    if t is Block:
        c = cmd.cause if cause is None else cause
        e = make(ev.BackfillBlocked, at=at, namespace=ns, backfill=name, cause=c, basis=basis, reason=cmd.reason, message=cmd.message)
        return e, f"decision/{ns}/{name}/{cmd.uid}/block/{cmd.reason}/{c}/{cmd.generation}"
    if t is Unblock:
        c = cmd.cause if cause is None else cause
        e = make(ev.BackfillUnblocked, at=at, namespace=ns, backfill=name, cause=c, basis=basis)
        return e, f"decision/{ns}/{name}/{cmd.uid}/unblock/{c}"
    if t is ReleaseFinalizer:
        e = make(ev.FinalizerReleased, at=at, namespace=ns, backfill=name, uid=cmd.uid, cause=basis, basis=basis)
        return e, ev.key_of(e)
    raise TypeError(f"{t.__name__} is not a decision command")
