"""The run-history projection: one row per Job attempt.

Pure: :func:`RunsProjection.apply` turns one event into the rows it creates or changes. The store
upserts those rows and the projection's checkpoint in one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: Bounded results of an ended attempt (seed: completions_total{result}).
RESULTS = ("succeeded", "failed", "preempted", "deadline_exceeded", "cancelled")


@dataclass(frozen=True, slots=True)
class RunRow:
    """One attempt of one ModelBackfill; the ``runs`` table's row.

    Identity: ``(backfill_uid, attempt)``. ``ended_at``/``result`` stay ``None`` while the
    attempt is live. Times are timezone-aware UTC; ``running_seconds`` is seconds (float) from
    ``started_at`` (Job running, else admission) to ``ended_at``.

    Attributes:
        namespace, backfill, backfill_uid: the ModelBackfill.
        model, node: the model it served and that model's node at admission ("" if unknown).
        job_name, job_uid: the owned Job (uid "" until the Job is observed).
        attempt: 1-based attempt number over the ModelBackfill's lifetime.
        generation: the spec generation the attempt ran for.
        admitted_at: when the controller admitted the attempt.
        started_at: when the Job was observed running (None if it never ran).
        ended_at: when the attempt ended (Job gone or terminal).
        result: one of :data:`RESULTS`, or None while live.
        reason: the cancel reason (``ForegroundDemand``...) or Job failure reason.
        running_seconds: seconds the background work ran.
        deciding_position: log position of the event that ended the attempt (for a cancel, the
            event that caused it); the admission's position while live.
    """

    namespace: str
    backfill: str
    backfill_uid: str
    model: str
    node: str
    job_name: str
    job_uid: str
    attempt: int
    generation: int
    admitted_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    result: str | None
    reason: str
    running_seconds: float
    deciding_position: int


def row_of(b: Any, a: Any) -> RunRow:
    """The run row of attempt ``a`` (a :class:`backfill.core.state.Attempt`) of backfill ``b``.

    ``running_seconds`` counts from the Job's start (or creation) to the end (0 if the Job never
    existed). ``deciding_position``: the cancel's cause for cancelled/preempted attempts, the
    ending event for other ended attempts, the admission while live.
    """
    start = a.started_at or a.created_at
    running = max(0.0, (a.ended_at - start).total_seconds()) if (a.ended_at and start) else 0.0
    if a.result in ("preempted", "cancelled") and a.cancel_pos:
        deciding = a.cancel_pos
    elif a.result is not None:
        deciding = a.end_pos
    else:
        deciding = a.admitted_pos
    return RunRow(
        namespace=b.namespace,
        backfill=b.name,
        backfill_uid=b.uid,
        model=a.model,
        node=a.node,
        job_name=a.job_name,
        job_uid=a.job_uid,
        attempt=a.number,
        generation=a.generation,
        admitted_at=a.admitted_at,
        started_at=start,
        ended_at=a.ended_at,
        result=a.result,
        reason=a.end_reason or a.cancel_reason,
        running_seconds=running,
        deciding_position=deciding,
    )


def run_rows(before: Any, after: Any, event: Any) -> list[RunRow]:
    """Rows that ``event`` created or changed, given the worlds before and after folding it.

    Pure and cheap: only the event's own backfill is compared (attempts change only through
    decision and Job events, which name their backfill).

    Args:
        before, after: :class:`backfill.core.state.World` around the fold.
        event: the folded event.

    Returns:
        Zero or one :class:`RunRow` (the attempt's full row, for an upsert).
    """
    ns, name = getattr(event, "namespace", None), getattr(event, "backfill", None)
    if name is None:
        return []
    b1 = after.backfills.get((ns, name))
    if b1 is None or b1.attempt is None:
        return []
    b0 = before.backfills.get((ns, name))
    if b0 is not None and b0.attempt is b1.attempt:
        return []
    return [row_of(b1, b1.attempt)]
