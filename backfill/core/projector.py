"""The projector: ``fold(state, event) -> state`` and ``decide(state, now) -> commands``.

Both are pure and deterministic: no I/O, no clock (``now`` is an argument, timezone-aware UTC),
no randomness; the same events and ``now`` always give the same state and commands. The live
controller, ``backfill replay`` and ``backfill simulate`` all run this code. This module is the
projector's one public face; the code lives along its seams:

- :mod:`backfill.core.fold`: one fold handler per event type (a new event type goes there);
- :mod:`backfill.core.conditions`: the gate/cancel conditions, one table, and what wakes each
  (a new cancel condition is one entry there; :func:`affected` derives from it);
- :mod:`backfill.core.decide`: the phase machine below and the idle window;
- :mod:`backfill.core.verdict` (reasons, phases) and :mod:`backfill.core.status` (the status
  written from a verdict).

The phase machine (seed 000 "Expected phases"):

- **WaitingForIdle**: the model is not Ready, a gate holds (gaming intent on the model's node,
  an unexpired GPU lease on its node or shared group, another backfill active on the same model
  or node, the Model naming no node) or the continuous idle window is incomplete. ``idleSince`` is the latest of: the end
  of the model's last foreground busy span, the time it became Ready, the end of a gate on its
  node or group. Any foreground request moves it, so a retry after a preemption needs a fresh
  full idle window. Admission happens at ``idleSince + idleFor``, never earlier.
- **Starting**: admitted (decision ``AttemptAdmitted``), the Job is being created.
- **Running**: the owned Job exists.
- **Cancelling**: a cancel condition won (decision ``AttemptCancelled``); the Job is being
  deleted. Conditions, in order: deletion, suspend, spec change, model not Ready, node change,
  gaming intent, GPU lease, foreground demand (any request folded after the admission), a
  concurrent backfill admitted earlier on the same model or node.
- Resumable attempts (``spec.preemption: Suspend``, issue 11): a preemption (the
  :data:`~backfill.core.verdict.SUSPEND_REASONS`) of an attempt whose Job exists suspends the
  Job instead (``AttemptCancelled`` with ``suspend``; lifecycle Suspending until the Job is
  observed stopped, then Suspended: not live, phase WaitingForIdle). The next admission, decided
  exactly like one (fresh full idle window, every gate), resumes the same Job
  (``AttemptResumed``, a new run segment). A suspended attempt whose declaration is deleted,
  suspended or changed, or whose Model is deleted, is cancelled by deleting its Job (the
  conditions marked ``ends_suspended``); a Job deleted by someone else ends the attempt (the
  next admission creates a new one); a Job resumed by someone else is suspended again (only an
  admission resumes); a Job that completes (or fails) while suspended ends the attempt so.
- **Succeeded**: the Job completed; with ``repeatAfter`` it re-enters idle admission at
  ``nextRunTime = completion + repeatAfter``.
- **Failed**: the Job failed (or hit its deadline): terminal until the spec generation changes.
- **Suspended**: ``spec.suspend``; **Blocked**: the spec, template or reference violates the
  contract.
"""

from .conditions import CONDITIONS, Condition, affected, block_reason
from .decide import CONFIRM_RECHECK_SECONDS, RETRY_SECONDS, decide, evaluate, status_of
from .fold import CREATE_BACKOFF_INITIAL, CREATE_BACKOFF_MAX, create_backoff, fold, fold_all, only_position_moved
from .verdict import (
    BLOCKED,
    CONCURRENT_BACKFILL,
    CREATE_RETRYING,
    DELETED,
    FAILED,
    FOREGROUND_DEMAND,
    GAMING_INTENT,
    GPU_LEASE_ACTIVE,
    GPU_REQUEST_FORBIDDEN,
    IDLE_WINDOW,
    IDLE_WINDOW_MESSAGE,
    INVALID_TEMPLATE,
    JOB_REJECTED,
    MODEL_NODE_UNKNOWN,
    MODEL_NOT_FOUND,
    MODEL_NOT_READY,
    NODE_CHANGED,
    PHASES,
    PREEMPTION_REASONS,
    REPEAT_DUE,
    REPEAT_SCHEDULED,
    SPEC_CHANGED,
    SUCCEEDED,
    SUSPENDED,
    SUSPENDED_PHASE,
    TEMPLATE_NOT_FOUND,
    WAITING,
    Verdict,
)

__all__ = [
    "CONDITIONS", "Condition", "affected", "block_reason", "CONFIRM_RECHECK_SECONDS", "RETRY_SECONDS", "decide",
    "evaluate", "status_of", "CREATE_BACKOFF_INITIAL", "CREATE_BACKOFF_MAX", "create_backoff", "fold", "fold_all",
    "only_position_moved", "BLOCKED", "CONCURRENT_BACKFILL", "CREATE_RETRYING", "DELETED", "FAILED",
    "FOREGROUND_DEMAND", "GAMING_INTENT", "GPU_LEASE_ACTIVE", "GPU_REQUEST_FORBIDDEN", "IDLE_WINDOW",
    "IDLE_WINDOW_MESSAGE", "INVALID_TEMPLATE", "JOB_REJECTED", "MODEL_NODE_UNKNOWN", "MODEL_NOT_FOUND", "MODEL_NOT_READY",
    "NODE_CHANGED",
    "PHASES", "PREEMPTION_REASONS", "REPEAT_DUE", "REPEAT_SCHEDULED", "SPEC_CHANGED", "SUCCEEDED", "SUSPENDED",
    "SUSPENDED_PHASE", "TEMPLATE_NOT_FOUND", "WAITING", "Verdict",
]  # fmt: skip
