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

#: decision event class -> (itself, its compiled form's class): what ``decision_record`` calls.
_FORMS: dict[type, tuple[type, type]] = {cls: (cls, ev.compiled_class(cls)) for cls in ev.DECISIONS}

#: The command types that are decisions (recorded in the log); the others are re-issues or hints.
DECISION_COMMANDS = (Admit, Cancel, Resume, Block, Unblock, ReleaseFinalizer)


def validated(cls: type, /, **values: Any) -> Any:
    """``cls(**values)``: an event built through pydantic's validation (the counterpart of
    :func:`backfill.core.events.build`)."""
    return cls(**values)


def decision_record(cmd: Any, *, at: datetime, basis: int, cause: int | None = None, compiled: bool = False) -> tuple[Any, str]:
    """The decision event for ``cmd`` and its idempotency key.

    Args:
        cmd: an :data:`DECISION_COMMANDS` instance from ``decide``.
        at: the decision time (the ``now`` given to ``decide``), timezone-aware UTC.
        basis: the log position the deciding state was folded up to.
        cause: overrides ``cmd.cause`` (the controller resolves a cause that was not yet durable
            when it decided); None keeps the command's.
        compiled: build the event's compiled form (:func:`backfill.core.events.compiled_class`,
            no validation: about 5x cheaper; it folds as the event, and
            :func:`~backfill.core.events.materialize` gives the event) for a caller whose
            commands come straight from ``decide`` and that folds the record (``simulate``'s
            fast path; ``tests/sim/test_fast_path.py`` compares both); False (the default)
            validates it with pydantic.

    Returns:
        ``(event, idempotency_key)``. Keys: one admit and one cancel per attempt of an object
        (uid), one suspend per attempt and segment, one resume per attempt and segment; one block per reason, cause and generation; one unblock per cause; one finalizer
        release per object.

    Raises:
        TypeError: ``cmd`` is not a decision.
    """
    ns, name = cmd.key
    t = type(cmd)
    form = 1 if compiled else 0  # each class is called with ``type=``, as its compiled form must be
    if t is Admit:
        e: Any = _FORMS[ev.AttemptAdmitted][form](
            type="AttemptAdmitted", at=at, namespace=ns, backfill=name, cause=cmd.cause if cause is None else cause, basis=basis,
            uid=cmd.uid, attempt=cmd.attempt, generation=cmd.generation, job_name=cmd.job_name,
            model=cmd.model, node=cmd.node,
        )
        return e, ev.attempt_key(ns, name, cmd.uid, "admit", cmd.attempt)  # key_of(e), without its dispatch
    if t is Cancel:
        e = _FORMS[ev.AttemptCancelled][form](
            type="AttemptCancelled", at=at, namespace=ns, backfill=name, cause=cmd.cause if cause is None else cause, basis=basis,
            uid=cmd.uid, attempt=cmd.attempt, job_name=cmd.job_name, reason=cmd.reason, message=cmd.message,
            suspend=cmd.suspend, segment=cmd.segment,
        )
        return e, ev.key_of(e)
    if t is Resume:
        e = _FORMS[ev.AttemptResumed][form](
            type="AttemptResumed", at=at, namespace=ns, backfill=name, cause=cmd.cause if cause is None else cause, basis=basis,
            uid=cmd.uid, attempt=cmd.attempt, segment=cmd.segment, generation=cmd.generation, job_name=cmd.job_name,
            model=cmd.model, node=cmd.node,
        )
        return e, ev.key_of(e)
    if t is Block:
        c = cmd.cause if cause is None else cause
        e = _FORMS[ev.BackfillBlocked][form](
            type="BackfillBlocked", at=at, namespace=ns, backfill=name, cause=c, basis=basis, reason=cmd.reason, message=cmd.message
        )
        return e, f"decision/{ns}/{name}/{cmd.uid}/block/{cmd.reason}/{c}/{cmd.generation}"
    if t is Unblock:
        c = cmd.cause if cause is None else cause
        e = _FORMS[ev.BackfillUnblocked][form](type="BackfillUnblocked", at=at, namespace=ns, backfill=name, cause=c, basis=basis)
        return e, f"decision/{ns}/{name}/{cmd.uid}/unblock/{c}"
    if t is ReleaseFinalizer:
        e = _FORMS[ev.FinalizerReleased][form](type="FinalizerReleased", at=at, namespace=ns, backfill=name, uid=cmd.uid, cause=basis, basis=basis)
        return e, ev.key_of(e)
    raise TypeError(f"{t.__name__} is not a decision command")
