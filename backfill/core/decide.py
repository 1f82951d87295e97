"""Decide: ``evaluate(world, key, now) -> Verdict`` and ``decide(world, now) -> commands``.

Pure and deterministic: no I/O, no clock (``now`` is an argument, timezone-aware UTC), no
randomness; the same world and ``now`` always give the same commands. The rules it applies are
:mod:`backfill.core.conditions` (one table of gate/cancel conditions and the declaration's
problems); this module orders them into the phase machine (see :mod:`backfill.core.projector`)
and computes the idle window.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable

from .commands import (
    Admit,
    Block,
    Cancel,
    Command,
    CreateJob,
    DeleteJob,
    ReleaseFinalizer,
    Resume,
    ResumeJob,
    SuspendJob,
    Unblock,
    WakeAt,
    WriteStatus,
)
from .conditions import CANCEL_CHECKS, GATE_CHECKS, SUSPENDED_CHECKS, Hit, block_cause, block_reason, first_hit, subject, suspends
from .fold import unexplained_stop
from .jobtemplate import job_name
from .state import SUSPENDED as SUSPENDED_LIFECYCLE  # the lifecycle (verdict's SUSPENDED is a reason)
from .state import CANCELLING, LIVE, RUNNING, STARTING, SUSPENDING, Attempt, BackfillState, CreateRejection, Key, ModelState, World
from .status import status_from_verdict
from .timefmt import plus_seconds, rfc3339
from .verdict import (
    BLOCKED,
    CREATE_RETRYING,
    DELETED,
    FAILED,
    IDLE_WINDOW,
    IDLE_WINDOW_MESSAGE,
    REPEAT_DUE_MESSAGE,
    REPEAT_DUE,
    REPEAT_SCHEDULED,
    RESUMING,
    SUCCEEDED,
    SUSPENDED,
    SUSPENDED_PHASE,
    UNEXPLAINED_JOB,
    WAITING,
    Hold,
    Verdict,
)

_LIVE = frozenset(LIVE)  # Attempt.live's lifecycles, as a set

#: Seconds between re-checks of an attempt whose create or delete is not observed yet. The
#: re-issue itself is emitted on every decide; the actor paces it (back-off per Job).
RETRY_SECONDS = 30.0
#: Seconds between re-checks of a call whose effect must be confirmed promptly, not at the
#: resync: a cancelled or unexplained Job not gone yet, a Suspending attempt's Job not observed
#: suspended yet, a finalizer release not in the log yet. The actor paces the re-issued calls.
CONFIRM_RECHECK_SECONDS = 1.0


def _idle_since(world: World, m: ModelState, now: datetime) -> tuple[datetime, int]:
    """The start of the current idle window and the position of the event that set it."""
    since, pos = m.ready_since, m.ready_pos
    if m.busy_until is not None and m.busy_until >= since:  # type: ignore[operator]
        since, pos = m.busy_until, m.busy_pos
    node, group = m.node, m.shared
    end = world.node_gate_ends.get(node) if node else None
    if end is not None and end.at > since:
        since, pos = end.at, end.pos
    end = world.group_gate_ends.get(group) if group else None
    if end is not None and end.at > since:
        since, pos = end.at, end.pos
    # Gates that expired by time but whose objects still exist ended at their expiry.
    gaming, leases = world.gaming, world.leases
    if not gaming and not leases:  # the common case: no gate at all (no tuple to loop over)
        return since, pos  # type: ignore[return-value]
    for gates in (gaming, leases):
        if not gates:
            continue
        for g in gates.values():
            if g.expires_at is None or g.expires_at > now or g.expires_at <= since:
                continue
            if (node and g.node == node) or (group and g.group == group):
                since, pos = g.expires_at, g.pos
    return since, pos  # type: ignore[return-value]


def evaluate(world: World, key: Key, now: datetime, reserved: dict | None = None) -> Verdict | None:
    """The verdict for one backfill at ``now`` (UTC); None if it is unknown or gone.

    Jobs the ModelBackfill owns that its logged attempts do not explain
    (:attr:`~backfill.core.state.BackfillState.unexplained`) are deleted whatever the verdict
    (a ``DeleteJob`` each, re-checked every second until they are observed gone), and an
    admission or resume due meanwhile waits with reason ``UnexplainedJob`` (fail-closed).
    See :func:`_evaluate` for the rest.
    """
    v = _evaluate(world, key, now, reserved)
    if v is None:
        return None
    jobs = world.backfills[key].unexplained
    if not jobs:
        return v
    deletes = tuple(DeleteJob(key, name, True) for name, _ in jobs)
    recheck = plus_seconds(now, CONFIRM_RECHECK_SECONDS)
    wake = recheck if v.wake_at is None or v.wake_at > recheck else v.wake_at
    names = ", ".join(name for name, _ in jobs)
    if any(isinstance(c, (Admit, Resume)) for c in v.commands):
        kept = tuple(c for c in v.commands if not isinstance(c, (Admit, Resume)))
        message = f"Job {names} of this ModelBackfill is not in the event log (another controller, or a restored database?): deleting it before any admission"
        return Verdict(WAITING, UNEXPLAINED_JOB, message, kept + deletes, wake, v.idle_since, v.next_run)
    return Verdict(v.phase, v.reason, v.message, v.commands + deletes, wake, v.idle_since, v.next_run)


def _evaluate(world: World, key: Key, now: datetime, reserved: dict | None = None) -> Verdict | None:
    """The verdict for one backfill at ``now`` (UTC), its unexplained Jobs aside; None if it is
    unknown or gone.

    A live attempt is asked every cancelling condition of
    :data:`~backfill.core.conditions.CONDITIONS` in order (the first that holds cancels it); a
    waiting one, after its declaration's problems, suspension, failure and cooldown, every
    gating condition and then the idle window. ``reserved`` maps the slots (``(namespace,
    model)`` and node) of attempts admitted earlier in the same ``decide`` call to their
    backfill, so two backfills due at once never both pass the contender gate.

    Resumable attempts (issue 11): a preemption of one whose Job exists suspends it (a
    ``Cancel`` with ``suspend``); a Suspending one re-issues ``SuspendJob``; a suspended one is
    deleted by the conditions marked ``ends_suspended``, else waits like any declaration and,
    when admission is due, gets a ``Resume`` of its Job instead of an ``Admit``.
    """
    b = world.backfills.get(key)
    if b is None or b.gone:
        return None
    last = b.attempt
    a = last if last is not None and last.lifecycle in _LIVE else None  # b.live_attempt, without its two calls
    if a is not None:
        if a.lifecycle == CANCELLING:
            # Re-issued on every decide until the Job is observed gone, re-checked every
            # second: the actor paces the calls (back-off per Job), so a restarted controller
            # deletes at once, never after a fixed timer, and a Job held by a finalizer sees
            # its delete retried 1, 2, 4 ... s apart.
            message = a.cancel_message or "cancelling the background Job"
            if a.terminating_since is not None:
                message = (
                    f"{message}; Job {a.job_name} is still terminating (deleted at {rfc3339(a.terminating_since)}, "
                    "held by a finalizer); the delete is retried"
                )
            return Verdict(
                CANCELLING,
                a.cancel_reason,
                message,
                (DeleteJob(key, a.job_name),),
                wake_at=plus_seconds(now, CONFIRM_RECHECK_SECONDS),
            )
        if a.lifecycle == SUSPENDING:
            return _suspending(world, key, b, a, now)
        hit = first_hit(CANCEL_CHECKS, world, subject(world, b, a), now)
        if hit is not None:
            if suspends(b, a, hit.reason):  # issue 11: keep the completed indexes
                message = f"{hit.message}; suspending Job {a.job_name} (completed indexes are kept)"
                cancel = Cancel(key, b.uid, a.number, a.job_name, hit.reason, message, hit.cause, True, a.segment)
                return Verdict(CANCELLING, hit.reason, message, (cancel,))
            cancel = Cancel(key, b.uid, a.number, a.job_name, hit.reason, hit.message, hit.cause, False, a.segment)
            return Verdict(CANCELLING, hit.reason, hit.message, (cancel,))
        if a.lifecycle == STARTING and a.segment > 1:
            seen = a.seen_suspended
            if seen is not None:
                # Observed suspended again after this resume's decision, nothing in the log
                # saying why (a stale status, or a preemption whose report and decision were
                # lost with their leader: an adversarial trial saw the restarted controller
                # resume at once). Fail-closed: no resume call before a fresh full idle window
                # from the later of the observation and the decision; a resume that already
                # took effect is observed (JobResumed) and runs on meanwhile. The observation's
                # own time: the condition's can be the earlier suspension's (a trial: resumed 7 s
                # after the lost demand, the condition dated 2 minutes before).
                start = max(seen.at, a.admitted_at, seen.observed_at or seen.at)
                due = plus_seconds(start, b.spec.idle_for if b.spec is not None else 0.0)
                if now < due:
                    return Verdict(
                        STARTING, RESUMING,
                        f"Job {a.job_name} was observed suspended after its resume and nothing in the event log explains it: "
                        "resuming it after a fresh idle window",
                        (), wake_at=due,
                    )  # fmt: skip
            return Verdict(
                STARTING, RESUMING, f"resuming Job {a.job_name} (segment {a.segment})", (ResumeJob(key, a.job_name),),
                wake_at=plus_seconds(now, RETRY_SECONDS),
            )
        if a.lifecycle == STARTING and b.rejection is not None and b.rejection.attempt == a.number:
            return _create_retrying(key, a, b.rejection, now)  # a transient refusal: back-off
        if a.lifecycle == STARTING:
            return Verdict(
                STARTING,
                "Admitted",
                f"creating Job {a.job_name}",
                (CreateJob(key, a.number, a.job_name),),
                wake_at=plus_seconds(now, RETRY_SECONDS),
            )
        return Verdict(RUNNING, "JobActive", f"background Job {a.job_name} is active")
    if last is not None and last.lifecycle == SUSPENDED_LIFECYCLE:  # last.suspended
        hit = _ends_suspended(world, b, last, now)
        if hit is not None:
            return _delete_suspended(key, b, last, hit)
    if b.deleting:
        if b.finalizer_released:
            return Verdict(WAITING, DELETED, "the ModelBackfill is being deleted", ())
        # Re-issued every second until FinalizerReleased is in the log (the actor paces the
        # calls like a re-issued Job call): an admission policy refusing the update once no
        # longer leaves the object stuck until the resync (an adversarial trial: 60 s).
        return Verdict(
            WAITING, DELETED, "the ModelBackfill is being deleted", (ReleaseFinalizer(key, b.uid),),
            wake_at=plus_seconds(now, CONFIRM_RECHECK_SECONDS),
        )
    blocked = block_reason(world, b)
    if blocked is not None:
        cmds = () if b.blocked == blocked else (Block(key, blocked[0], blocked[1], block_cause(world, b, blocked[0]), b.uid, b.generation),)
        return Verdict(BLOCKED, blocked[0], blocked[1], cmds)
    unblock: tuple[Command, ...] = (Unblock(key, world.position, b.uid),) if b.blocked is not None else ()
    spec = b.spec
    assert spec is not None
    if spec.suspend:
        return Verdict(SUSPENDED_PHASE, SUSPENDED, "spec.suspend is true; no attempt may run", unblock)
    if b.failed_generation == b.generation:
        reason = last.end_reason if last is not None and last.end_reason else "JobFailed"
        return Verdict(FAILED, reason, "the Job failed; change the spec to run again", unblock)
    next_run = None
    # The cooldown follows the latest attempt's success only: once a later attempt was admitted
    # (and preempted or cancelled), the repeat was taken and the wait is a plain idle window.
    if b.succeeded_generation == b.generation and b.succeeded_at is not None and (last is None or last.result == "succeeded"):
        if spec.repeat_after == 0:
            return Verdict(SUCCEEDED, "Completed", "the Job completed (one-shot)", unblock)
        next_run = plus_seconds(b.succeeded_at, spec.repeat_after)
        if now < next_run:
            return Verdict(
                SUCCEEDED, REPEAT_SCHEDULED, "the Job completed; repeats after the cooldown", unblock, next_run, None, next_run
            )
    s = subject(world, b, None, reserved)
    for holds in GATE_CHECKS:
        hit = holds(world, s, now)
        if hit is not None:
            return Verdict(WAITING, hit.reason, hit.message, unblock, hit.until, next_run=next_run)
    m = s.state
    since, cause = _idle_since(world, m, now)
    stop = _unexplained_stop_on_model(world, b, spec.model_ref)
    if stop is not None and stop[0] > since:
        # A Job on this Model was deleted (or suspended) and nothing in the log says why: most
        # likely a preemption whose report and decision were lost with their leader (an ingest
        # report spooled while PostgreSQL was away), else someone's hand. A doubt about the
        # Model's demand, so fail-closed for every declaration on it: a fresh full idle window
        # from that observation.
        since, cause = stop
    due = plus_seconds(since, spec.idle_for)
    if next_run is not None and next_run > due:
        due = next_run
    if now < due:
        repeat = next_run is not None
        return Verdict(
            WAITING,
            REPEAT_DUE if repeat else IDLE_WINDOW,
            REPEAT_DUE_MESSAGE if repeat else IDLE_WINDOW_MESSAGE,  # status adds the admission time (wake_at): no formatting on the hot path
            unblock,
            due,
            since,
            next_run,
        )
    if reserved is not None:
        reserved[(b.namespace, spec.model_ref)] = key
        if m.node:
            reserved[m.node] = key
    if last is not None and last.lifecycle == SUSPENDED_LIFECYCLE:  # issue 11: the admission resumes the same Job
        resume = Resume(key, b.uid, last.number, last.segment + 1, b.generation, last.job_name, spec.model_ref, m.node, cause)
        return Verdict(STARTING, RESUMING, f"resuming attempt {last.number} (segment {resume.segment})", unblock + (resume,), None, since)
    attempt = max(b.attempts, b.names_taken) + 1  # past any Job another log left under an attempt's name
    name = job_name(b.name, b.uid, attempt)
    admit = Admit(key, b.uid, attempt, b.generation, name, spec.model_ref, m.node, cause)
    return Verdict(STARTING, "Admitted", f"admitting attempt {attempt}", unblock + (admit,), None, since)


def _unexplained_stop_on_model(world: World, b: BackfillState, model: str) -> tuple[datetime, int] | None:
    """The latest :func:`~backfill.core.fold.unexplained_stop` ``(when, position)`` of the
    current attempts of the declarations on ``b``'s Model ``model`` (``b``'s own first), or
    None. The doubt is about the Model's demand, not one declaration's: a new user's trial
    deleted one declaration's Job by hand and the other declaration on the Model was admitted
    the same second.

    A loop rather than ``max`` over generators: this runs at every admission's evaluation, and
    the generators cost 2.7-4.7 us against 0.5-0.8 us here (one declaration on the Model)."""
    stop = unexplained_stop(b.attempt)
    key = (b.namespace, b.name)
    for other_key in world.model_index.get((b.namespace, model), ()):  # world.backfills_of_model, without its call
        if other_key == key:
            continue
        other = world.backfills.get(other_key)
        found = unexplained_stop(other.attempt) if other is not None else None
        if found is not None and (stop is None or found > stop):
            stop = found
    return stop


# ---------------------------------------------------------------- resumable attempts (issue 11)


def _ends_suspended(world: World, b: BackfillState, a: Attempt, now: datetime) -> Hit | None:
    """The first condition that deletes a suspended (or suspending) attempt's Job, if any."""
    return first_hit(SUSPENDED_CHECKS, world, subject(world, b, a), now)


def _delete_suspended(key: Key, b: BackfillState, a: Attempt, hit: Hit) -> Verdict:
    cancel = Cancel(key, b.uid, a.number, a.job_name, hit.reason, hit.message, hit.cause, False, a.segment)
    return Verdict(CANCELLING, hit.reason, hit.message, (cancel,))


def _suspending(world: World, key: Key, b: BackfillState, a: Attempt, now: datetime) -> Verdict:
    """A Suspending attempt: delete its Job if a hard condition came up, else re-issue the
    suspend until the Job is observed stopped (paced by the actor like a re-issued delete)."""
    hit = _ends_suspended(world, b, a, now)
    if hit is not None:
        return _delete_suspended(key, b, a, hit)
    return Verdict(
        CANCELLING,
        a.cancel_reason,
        a.cancel_message or f"preempted; suspending Job {a.job_name} (completed indexes are kept)",
        (SuspendJob(key, a.job_name, a.suspend_round),),
        wake_at=plus_seconds(now, CONFIRM_RECHECK_SECONDS),
    )


def _create_retrying(key: Key, a: Attempt, rej: CreateRejection, now: datetime) -> Verdict:
    """Starting after a transient create refusal: create again once the back-off is over."""
    message = f"the API server refused Job {a.job_name} ({rej.summary}); refusal {rej.count}, creating again at {rfc3339(rej.retry_at)}"
    if now < rej.retry_at:
        return Verdict(STARTING, CREATE_RETRYING, message, (), wake_at=rej.retry_at)
    return Verdict(
        STARTING, CREATE_RETRYING, message, (CreateJob(key, a.number, a.job_name),),
        wake_at=plus_seconds(now, RETRY_SECONDS),
    )


def decide(
    world: World, now: datetime, keys: Iterable[Key] | None = None, *, status: bool = False, hold: Hold | None = None
) -> list[Command]:
    """The commands the world calls for at ``now``.

    Args:
        world: the folded state.
        now: the decision time, timezone-aware UTC.
        keys: only these backfills (e.g. from :func:`affected`); None = every backfill.
        status: also emit a :class:`WriteStatus` per backfill considered.
        hold: an admission or resume that falls due is not made but held, its status saying why
            (:func:`held`): the preemptor's projection from memory, where only the log may
            admit; the loop's while a signal cannot be read (fail-closed).

    Returns:
        Commands in a deterministic order: backfills least recently admitted first (never
        admitted first of all), ties by key; per backfill an unblock first, then its action,
        then its status, then a :class:`WakeAt` if the verdict can change by time alone.

    The order decides which of several declarations due at once on one Model or node is
    admitted (the first reserves the slot, :func:`backfill.core.conditions._concurrent`): by key
    alone the same one won every time both were due together (both idle windows restart at
    the same foreground request), and the other could starve (a new user's trial).
    """
    out: list[Command] = []
    reserved: dict = {}
    backfills = world.backfills
    if keys is not None and type(keys) is tuple and len(keys) == 1:
        order: Iterable[Key] = keys  # one backfill (a wake-up, a Job's end): nothing to order
    else:
        order = sorted(world.backfills if keys is None else set(keys), key=lambda k: (_last_admitted(backfills.get(k)), k))
    for key in order:
        v = evaluate(world, key, now, reserved)
        if v is None:
            continue
        if hold is not None and any(isinstance(c, (Admit, Resume)) for c in v.commands):
            v = held(backfills[key], v, hold)
        out.extend(v.commands)
        if status:
            out.append(WriteStatus(key, status_from_verdict(world, world.backfills[key], v)))
        if v.wake_at is not None:
            out.append(WakeAt(key, v.wake_at))
    return out


def held(b: BackfillState, due: Verdict, hold: Hold) -> Verdict:
    """The verdict of ``b`` while its ``due`` admission or resume is held for ``hold``
    (:func:`decide` ``hold``): ``WaitingForIdle``, no command, ``due``'s idle start and next
    run. Without a reason of its own the hold says why the last attempt ended (e.g.
    ``SpecChanged``), else ``IdleWindow`` (a fault trial: a status left ``Cancelling``, naming a
    Job that was gone, for a whole store outage after a spec change whose next admission was
    due at once)."""
    a = b.attempt
    last = (a.end_reason or a.cancel_reason or IDLE_WINDOW) if a is not None else IDLE_WINDOW
    ended = f"attempt {a.number} ended ({last}); " if a is not None and a.ended_at is not None else ""
    reason = hold.reason or last
    return Verdict(WAITING, reason, f"{ended}{hold.message}", idle_since=due.idle_since, next_run=due.next_run)


_NEVER = datetime.min.replace(tzinfo=timezone.utc)


def _last_admitted(b: BackfillState | None) -> datetime:
    """When ``b``'s latest attempt (or segment) was admitted, UTC; the earliest time when it
    never was (or is unknown)."""
    a = b.attempt if b is not None else None
    return a.admitted_at if a is not None else _NEVER


def status_of(world: World, key: Key, now: datetime) -> dict[str, Any] | None:
    """The status of one backfill at ``now`` (UTC), or None if the backfill is unknown or gone."""
    v = evaluate(world, key, now)
    if v is None:
        return None
    return status_from_verdict(world, world.backfills[key], v)
