"""The verdict: what the projector concludes about one ModelBackfill, and the names it uses.

A leaf module (it imports nothing of the projector): the projector builds a :class:`Verdict`,
:mod:`backfill.core.status` formats one into the ModelBackfill's status. Reasons are the
cluster contract's ("Waiting/cancel reasons", "Blocked reasons"); phases are the seed's.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from .commands import Command

# Reasons (cluster-contract "Waiting/cancel reasons" and "Blocked reasons").
IDLE_WINDOW = "IdleWindow"
MODEL_NOT_READY = "ModelNotReady"
FOREGROUND_DEMAND = "ForegroundDemand"
GAMING_INTENT = "GamingIntent"
GPU_LEASE_ACTIVE = "GPULeaseActive"
CONCURRENT_BACKFILL = "ConcurrentBackfill"
SPEC_CHANGED = "SpecChanged"
SUSPENDED = "Suspended"
NODE_CHANGED = "NodeChanged"
#: Waiting: the Model names no node (neither ``status.gpu.node`` nor a hostname nodeSelector), so
#: gaming intent and GPU leases on its node could not cancel a Job (a trial; fail-closed).
MODEL_NODE_UNKNOWN = "ModelNodeUnknown"
REPEAT_SCHEDULED = "RepeatScheduled"
REPEAT_DUE = "RepeatDue"
DELETED = "Deleted"
TEMPLATE_NOT_FOUND = "TemplateNotFound"
GPU_REQUEST_FORBIDDEN = "GPURequestForbidden"
MODEL_NOT_FOUND = "ModelNotFound"
INVALID_TEMPLATE = "InvalidTemplate"
#: A run's end reason when its Job was deleted and no cancel condition explains it (someone else).
JOB_DELETED = "JobDeleted"
#: A run segment's end reason when its resumable Job was observed suspended and nothing in the
#: log explains it (our preemption whose records come later or were lost, or someone else).
JOB_SUSPENDED = "JobSuspended"
JOB_REJECTED = "JobRejected"  # Blocked: the API server refused the Job permanently (e.g. 422)
CREATE_RETRYING = "CreateRetrying"  # Starting: the create was refused transiently; retried with back-off
#: Blocked: ``spec.preemption: Suspend`` on a template that is not ``completionMode: Indexed``
#: (a suspended NonIndexed Job keeps nothing worth resuming; issue 11).
PREEMPTION_NOT_RESUMABLE = "PreemptionNotResumable"
#: Starting: a resume of the suspended Job was decided; ``spec.suspend: false`` is being written.
RESUMING = "Resuming"
#: Waiting: a Job this ModelBackfill owns exists that its logged attempts do not explain (another
#: controller on another log, a database restored from an older backup); it is deleted, and
#: nothing is admitted until it is gone (fail-closed).
UNEXPLAINED_JOB = "UnexplainedJob"
#: Waiting: an admission is due but a watched kind cannot be read (its CRD removed, its list or
#: watch failing or stale): a signal that cannot be read holds starts (fail-closed).
SIGNAL_UNREADABLE = "SignalUnreadable"
#: A due admission held because an observation it may depend on could not be stored (fail-closed).
UNSTORABLE_EVENT = "UnstorableEvent"

IDLE_WINDOW_MESSAGE = "waiting for a continuous idle window"
#: The cooldown (``repeatAfter``) has passed; the idle window has not (reason ``RepeatDue``).
REPEAT_DUE_MESSAGE = "the repeat is due after the cooldown; waiting for a continuous idle window"

#: Cancel reasons that count as a preemption (seed: "cancelled for foreground or gaming
#: priority"); other cancels end the attempt as ``cancelled``.
PREEMPTION_REASONS = frozenset({FOREGROUND_DEMAND, GAMING_INTENT, GPU_LEASE_ACTIVE, CONCURRENT_BACKFILL})


def cancel_result(reason: str | None) -> str:
    """The result of an attempt (or segment) a cancel for ``reason`` ended: ``preempted`` for
    :data:`PREEMPTION_REASONS`, else ``cancelled`` (seed: completions_total{result}). The one
    place this rule is written (the fold, and the run rows)."""
    return "preempted" if reason in PREEMPTION_REASONS else "cancelled"


#: Cancel reasons that *suspend* the Job of a declaration with ``spec.preemption: Suspend``
#: (issue 11): exactly the preemptions. They are temporary priorities of someone else on the
#: model or node, after which the same work may go on. Every other cancel (deletion,
#: ``spec.suspend``, spec change, Model not Ready or moved) deletes the Job as before: the work
#: it kept is no longer wanted, or belongs to a spec that no longer holds.
SUSPEND_REASONS = PREEMPTION_REASONS

WAITING = "WaitingForIdle"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED_PHASE = "Suspended"
BLOCKED = "Blocked"
PHASES = ("WaitingForIdle", "Starting", "Running", "Cancelling", "Succeeded", "Failed", "Suspended", "Blocked")


class Hold(msgspec.Struct, frozen=True, gc=False):
    """Why an admission or resume that falls due is not made (``decide(hold=...)``): its status
    says ``WaitingForIdle`` with ``reason`` (None: why the last attempt ended, else
    ``IdleWindow``) and ``message``."""

    reason: str | None
    message: str


#: The preemptor's projection from memory: only the loop admits, once the event log answers.
HOLD_FOR_THE_LOG = Hold(None, "the next admission is due and waits for the event log (not answering: nothing starts until it does)")


def hold_for_signals(kinds: list[str]) -> Hold:
    """The hold of a due admission while the watched ``kinds`` (their short names, e.g.
    ``gpulease``) cannot be read (:data:`SIGNAL_UNREADABLE`; a new user's trial: the status kept
    "admission at T if the model stays idle" long after T, the reason only in the log)."""
    return Hold(SIGNAL_UNREADABLE, f"the next admission is due and held: cannot read {', '.join(kinds)} (a signal that cannot be read holds starts)")


def hold_for_refused(what: list[str]) -> Hold:
    """The hold of a due admission that an observation the event log refused may affect
    (:data:`UNSTORABLE_EVENT`; ``what``: e.g. ``GamingIntentStarted of gamingsession/ns/s``): the
    durable log lacks it for good, so admitting would ignore it (fail-closed,
    :meth:`backfill.controller.spool.Spool.doubts`)."""
    return Hold(
        UNSTORABLE_EVENT,
        f"the next admission is due and held: the event log refused {', '.join(what)} (set aside: see the controller's log); "
        "it waits until a later observation of the same object is stored (change the object, or restart once it is fixed)",
    )


class Verdict(msgspec.Struct, frozen=True, gc=False):
    """What the projector concludes about one backfill at ``now``.

    ``phase``/``reason``/``message`` feed the status; ``commands`` are the actions (an
    ``Unblock`` comes before the action it allows);
    ``wake_at`` is when the verdict can change without a new event; ``idle_since`` and
    ``next_run`` (UTC) feed ``status.idleSince`` / ``status.nextRunTime``.
    """

    phase: str
    reason: str
    message: str
    commands: tuple[Command, ...] = ()
    wake_at: datetime | None = None
    idle_since: datetime | None = None
    next_run: datetime | None = None
