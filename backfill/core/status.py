"""The ModelBackfill ``status`` derived from the projection at a time.

Fields (cluster-contract "ModelBackfill" status): ``phase``, ``observedGeneration``,
``nodeName``, ``jobName``, ``idleSince``, ``startedAt``, ``completionTime``, ``nextRunTime``,
``attempts``, ``reason``, ``message``, ``conditions`` (a ``Ready`` condition that is True only
while Running or after Succeeded). Timestamps are RFC 3339 UTC strings; absent values are None
(the actor writes them as JSON null so a merge patch clears them).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .commands import Admit
from .state import FINISHED, BackfillState, World
from .verdict import Verdict
from .timefmt import rfc3339


#: Longest ``status.message`` written (characters). The CRD caps a condition's message at 32768
#: (metav1.Condition); a message built from a hostile template (dozens of long resource names)
#: can exceed it, and the apiserver would refuse the whole status write (422) at every resync.
MAX_MESSAGE = 4096


def bounded_message(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` cut to at most ``limit`` characters, saying how much was cut."""
    if len(message) <= limit:
        return message
    keep = max(0, limit - 48)  # room for the note below
    return f"{message[:keep]} ... ({len(message) - keep} more characters)"[:limit]


def status_from_verdict(world: World, b: BackfillState, verdict: Verdict) -> dict[str, Any]:
    """Build the status dict for ``b`` from a :class:`~backfill.core.verdict.Verdict`.

    ``lastTransitionTime`` of the Ready condition is left to the writer (it needs the previous
    condition, which the projection does not keep).
    """
    a = b.attempt
    m = world.models.get((b.namespace, b.model_ref))
    # a deleted Model names no node (a new user's trial: Blocked ModelNotFound beside its old node)
    node = a.node if a is not None and a.live else (m.node if m is not None and m.exists else "")
    job = ""
    started = None
    if a is not None and (a.live or a.suspended or a.result in FINISHED):
        # the Job still exists (a suspended one too, a finished one until observed gone)
        job = a.job_name if not a.job_gone else ""
        started = a.started_at or a.created_at  # cleared with a cancelled attempt, as jobName
    attempts = b.attempts
    admit = next((c for c in verdict.commands if type(c) is Admit), None)
    if admit is not None:
        # The attempt being admitted, not the last one: its number and Job name (trials read
        # Starting with the previous count and no jobName, once for 10 s: the leader died
        # between recording the admission and creating the Job).
        attempts, job, started = admit.attempt, admit.job_name, None
        node = admit.node or node
    completion = b.succeeded_at if verdict.phase == "Succeeded" else None
    ready = verdict.phase in ("Running", "Succeeded")
    message = verdict.message
    if verdict.phase == "WaitingForIdle" and verdict.reason in ("IdleWindow", "RepeatDue") and verdict.wake_at is not None:
        message = f"{message}; admission at {rfc3339(verdict.wake_at)} if the model stays idle"
    message = bounded_message(message)
    return {
        "phase": verdict.phase,
        "observedGeneration": b.generation,
        "nodeName": node or None,
        "jobName": job or None,
        "idleSince": rfc3339(verdict.idle_since),
        "startedAt": rfc3339(started),
        "completionTime": rfc3339(completion),
        "nextRunTime": rfc3339(verdict.next_run),
        "attempts": attempts,
        "reason": verdict.reason,
        "message": message,
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": verdict.reason,
                "message": message,
                "observedGeneration": b.generation,
            }
        ],
    }
