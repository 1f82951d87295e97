"""The run-history projection: one row per run segment of a Job attempt.

Pure: :func:`run_rows` turns one event into the rows it creates or changes. The store upserts
those rows and the projection's checkpoint in one transaction.

A **segment** is one run of an attempt's Job: from its admission (segment 1) or a resume
(segments 2, 3, ... of a ``spec.preemption: Suspend`` declaration, issue 11) to its end: a
suspension (result ``preempted``, the preemption's reason), or the attempt's end (succeeded,
failed, deadline_exceeded, preempted or cancelled by a delete). A declaration without
``spec.preemption: Suspend`` has one segment per attempt, exactly the rows of before.

Useful and wasted seconds of a row (wall-clock seconds of the segment, ``running_seconds`` =
``useful_seconds + wasted_seconds``):

- a ``succeeded`` segment: all of it is useful;
- a segment of a resumable attempt that ended otherwise: useful from its start to the moment the
  last index completed in it was observed (``JobProgress``; its completed shards are kept, the
  Job's ``status.completedIndexes``), wasted after it (the interrupted shard(s)); with no index
  completed in it, all wasted;
- any other segment (a NonIndexed or ``Delete`` declaration): all wasted, as before.

With ``parallelism: 1`` (shards one after another, the simulator's model) this is exactly "the
finished shards' seconds are useful, the running shard's are wasted"; with more parallel pods it
is the wall-clock span up to the last completion, not pod-seconds.

A suspended attempt that is then deleted (a spec change, the ModelBackfill deleted, someone else
deleting its Job) adds no row: no segment ran; its last row stays ``preempted``. A Job that
ends by itself while suspended (Complete, or Failed) adds a zero-second row with that result
(segment n + 1, begun by no admission or resume), so the attempt's end is counted once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from . import events as ev
from . import indexes
from .verdict import DELETED, cancel_result

#: ``BackfillDeleted`` and its compiled form (the catch-up's run rows are asked of either).
_DELETED_EVENT = ev.with_compiled(ev.BackfillDeleted)

#: Bounded results of an ended attempt (seed: completions_total{result}).
RESULTS = ("succeeded", "failed", "preempted", "deadline_exceeded", "cancelled")


class RunRow(msgspec.Struct, frozen=True, gc=False):
    """One attempt of one ModelBackfill; the ``runs`` table's row.

    Identity: ``(backfill_uid, attempt, segment)``. ``ended_at``/``result`` stay ``None`` while the
    attempt is live. Times are timezone-aware UTC; ``running_seconds`` is seconds (float) from
    ``started_at`` to ``ended_at``.

    Attributes:
        namespace, backfill, backfill_uid: the ModelBackfill.
        model, node: the model it served and that model's node at admission ("" if unknown).
        job_name, job_uid: the owned Job (uid "" until the Job is observed).
        attempt: 1-based attempt number over the ModelBackfill's lifetime.
        generation: the spec generation the attempt ran for.
        admitted_at: when the controller admitted the attempt.
        started_at: when the segment's work started: segment 1, the Job's ``startTime``, else
            its creation (a Job created but never observed running counts from its creation);
            a later segment, the observed resume, else the resume decision; never before
            ``admitted_at`` (the Job's times are whole seconds). None while no Job was created
            (and for a refused create).
        ended_at: when the attempt ended (Job gone or terminal).
        result: one of :data:`RESULTS`, or None while live.
        reason: the cancel reason (``ForegroundDemand``...) or Job failure reason.
        running_seconds: seconds the background work ran.
        deciding_position: log position of the event that ended the attempt (for a cancel, the
            event that caused it); the admission's position while live.
        segment: the run segment (1 = the admission; each resume of a suspended Job adds one).
        completed_indexes: the Job's indexes completed in this segment (interval syntax, "" for
            a NonIndexed Job).
        kept_seconds: of a segment that did not succeed, the seconds from its start to the
            last index completed in it (resumable declarations only; else 0): the useful part.
            :attr:`useful_seconds` / :attr:`wasted_seconds` split ``running_seconds`` by it.
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
    segment: int = 1
    completed_indexes: str = ""
    kept_seconds: float = 0.0

    @property
    def useful_seconds(self) -> float:
        """Seconds of useful work (module docstring): all of a succeeded segment, the kept part
        of another ended one, 0 while live."""
        if self.result == "succeeded":
            return self.running_seconds
        if self.result is None:
            return 0.0
        return min(self.kept_seconds, self.running_seconds)

    @property
    def wasted_seconds(self) -> float:
        """The rest of an ended segment's running seconds (0 while live)."""
        return self.running_seconds - self.useful_seconds if self.result is not None else 0.0

    @property
    def identity(self) -> tuple[str, int, int]:
        """``(backfill_uid, attempt, segment)``: the row's primary key."""
        return (self.backfill_uid, self.attempt, self.segment)


def _seconds(start: datetime | None, end: datetime | None) -> float:
    return max(0.0, (end - start).total_seconds()) if (start is not None and end is not None) else 0.0


def row_of(b: Any, a: Any) -> RunRow:
    """The run row of the current segment of attempt ``a`` (a :class:`backfill.core.state.Attempt`)
    of backfill ``b`` (see the module docstring for segments, useful and wasted seconds).

    ``running_seconds`` counts from the segment's start (the Job's start or creation; a resume's
    observation, else the resume decision) to its end (0 if the Job never existed).
    ``deciding_position``: the cancel's cause for cancelled/preempted segments, the ending event
    for other ended ones, the admission (or resume) while live.
    """
    if a.segment_ended_at is not None:
        # the segment ended suspended; a delete that ended the attempt later ran nothing
        ended, reason, deciding = a.segment_ended_at, a.segment_reason, a.segment_pos
        result = cancel_result(reason)  # unexplained: JobSuspended
    else:
        ended, result, reason = a.ended_at, a.result, a.end_reason or a.cancel_reason
        if result in ("preempted", "cancelled") and a.cancel_pos:
            deciding = a.cancel_pos
        elif result is not None:
            deciding = a.end_pos
        else:
            deciding = a.admitted_pos
    start = (a.started_at or a.created_at) if a.segment == 1 else (a.segment_started_at or a.admitted_at)
    if start is not None and start < a.admitted_at:
        # the Job's times are whole seconds (cut, not rounded): within the admission's second
        # they come before it (a new user's trial: started_at before admitted_at, running
        # seconds up to 1 s more than the Job lived); no work starts before its admission
        start = a.admitted_at
    if start is not None and ended is not None and start > ended:
        start = ended
    running = _seconds(start, ended) if ended is not None else 0.0
    done = indexes.minus_text(a.completed_indexes, a.base_indexes)
    kept = min(running, _seconds(start, a.progress_at)) if (a.resumable and done and a.progress_at is not None) else 0.0
    # positional, in field order (asserted below): 6x cheaper than 19 keywords (issue 10)
    return RunRow(
        b.namespace, b.name, b.uid, a.model, a.node, a.job_name, a.job_uid, a.number, a.generation, a.admitted_at,
        start, ended, result, reason, running, deciding, a.segment, done, kept,
    )


assert RunRow.__struct_fields__ == (
    "namespace", "backfill", "backfill_uid", "model", "node", "job_name", "job_uid", "attempt", "generation", "admitted_at",
    "started_at", "ended_at", "result", "reason", "running_seconds", "deciding_position", "segment", "completed_indexes", "kept_seconds",
), "row_of builds RunRow positionally"


def run_rows(before: Any, after: Any, event: Any) -> list[RunRow]:
    """Rows that ``event`` created or changed, given the worlds before and after folding it.

    Pure and cheap: only the event's own backfill is compared (attempts change only through
    decision and Job events, which name their backfill).

    Args:
        before, after: :class:`backfill.core.state.World` around the fold.
        event: the folded event.

    Returns:
        Zero or one :class:`RunRow` (the current segment's full row, for an upsert); none when
        the row did not change (an ended segment's row is final).
    """
    ns, name = getattr(event, "namespace", None), getattr(event, "backfill", None)
    if name is None:
        return _deleted_row(before, after, event) if type(event) in _DELETED_EVENT else []
    b1 = after.backfills.get((ns, name))
    if b1 is None or b1.attempt is None:
        return []
    b0 = before.backfills.get((ns, name))
    if b0 is not None and b0.attempt is b1.attempt:
        return []
    row = row_of(b1, b1.attempt)
    if previous_row(before, row) == row:
        return []
    return [row]


def _deleted_row(before: Any, after: Any, event: ev.BackfillDeleted) -> list[RunRow]:
    """The ModelBackfill is gone (its finalizer removed by hand while the controller did not act)
    with an attempt still live: the fold drops the backfill, and the garbage collector takes its
    Job, so the attempt's row ends here (``cancelled``, ``Deleted``; or for the cancel already
    decided, its reason), at the deletion's position (an adversarial trial: the row stayed open
    for ever). A suspended attempt's row had ended already: nothing."""
    b0 = before.backfills.get((event.namespace, event.name))
    a = b0.attempt if b0 is not None and b0.uid == event.uid else None
    if a is None or not a.live:
        return []
    reason = a.cancel_reason or DELETED
    return [row_of(b0, a.ended(event.at, cancel_result(reason), reason, after.position))]


def previous_row(before: Any, row: RunRow) -> RunRow | None:
    """The same segment's row in the world ``before`` (None if it did not exist there): the
    metrics count a start when a row appears and an end when its ``result`` is first set."""
    b0 = before.backfills.get((row.namespace, row.backfill))
    a0 = b0.attempt if b0 is not None else None
    if a0 is None or b0.uid != row.backfill_uid or a0.number != row.attempt or a0.segment != row.segment:
        return None
    return row_of(b0, a0)
