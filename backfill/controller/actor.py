"""The actor: turns the projector's commands into Kubernetes calls and decision events.

Two asymmetric rules:

- **Starting is fail-closed.** An admission's decision event is appended to the log (synchronously)
  *before* the Job create it announces: what the log cannot explain is never started, and a store
  that is down means no start. The same holds for Block, Unblock and ReleaseFinalizer.
- **Stopping is fail-safe.** :meth:`Actor.preempt` (called by the preemptor) sends the Job DELETEs
  first, in parallel, and the decision goes to the spool beside them; nothing on that path waits
  for the database, a status write or an Event. A suspending cancel (issue 11) is the same call
  with a PATCH ``spec.suspend: true`` instead of the DELETE: same thread, same timeout, same
  immediate resend on a fresh connection, same fence. A resume (``Resume``) is an admission:
  recorded durably first, then ``spec.suspend: false``.

Observations the actor makes itself (``JobCreated``, ``JobDeleted`` on a 404, ``JobCreateRejected``
of a refused create) go through the spool too, in order with the watchers' events.

Re-issued creates and deletes (``CreateJob``/``DeleteJob``, emitted on every decide while one is
outstanding) are paced per Job: the first goes out at once (so a restarted controller finishes a
recorded decision immediately), later ones back off exponentially up to ``RETRY_MAX_SECONDS``
(a DELETE up to ``CANCEL_RETRY_MAX_SECONDS``).

Every API call carries a client-side timeout (``_request_timeout``). Before every mutation
``can_act()`` (leader election, an in-memory check) is asked. It never writes Model,
GamingSession, GPULease or CronJob objects.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from backfill.core import events as ev
from backfill.core.commands import (
    Admit,
    Block,
    Cancel,
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
from backfill.core.decisions import decision_record
from backfill.core.events import encode
from backfill.core.jobtemplate import API_GROUP, API_VERSION, build_job
from backfill.core.state import World
from backfill.core.verdict import JOB_DELETED, JOB_SUSPENDED
from backfill.core.timefmt import rfc3339
from backfill.errorlines import api_status, error_line, message_line

from .cancelwindow import CancelWindow
from .crash import crash_armed, crash_point

log = logging.getLogger("backfill.controller.actor")
_T = TypeVar("_T")


def job_uid(world: World, key: tuple[str, str], job_name: str) -> str:
    """The uid of ``key``'s Job ``job_name`` as the world knows it (its attempt's, or an
    unexplained Job's), "" when unknown."""
    b = world.backfills.get(key)
    if b is None:
        return ""
    # An unexplained Job first: one under an ended attempt's name is another object than that
    # attempt's Job (a live attempt's own Job is never listed as unexplained).
    uid = next((uid for name, uid in b.unexplained if name == job_name), "")
    if uid:
        return uid
    a = b.attempt
    return a.job_uid if a is not None and a.job_name == job_name else ""


def owner_uid(world: World, key: tuple[str, str]) -> str:
    """The uid of ModelBackfill ``key`` as the world knows it ("" when unknown): the owner a
    Job must name to be deleted when its own uid is unknown (:meth:`Actor.delete_job`)."""
    b = world.backfills.get(key)
    return b.uid if b is not None else ""


def controlled_by(metadata: Any, owner: str) -> bool:
    """True when a Job's ``metadata`` (a client model or API JSON) has a controller
    ownerReference to the object whose uid is ``owner``: it is that ModelBackfill's Job."""
    refs = metadata.get("ownerReferences") if isinstance(metadata, dict) else metadata.owner_references
    for ref in refs or []:
        uid, controller = (ref.get("uid"), ref.get("controller")) if isinstance(ref, dict) else (ref.uid, ref.controller)
        if controller and uid == owner:
            return True
    return False


FINALIZER = "modelbackfill.ai.flexinfer/finalizer"
PLURAL = "modelbackfills"
COMPONENT = "modelbackfill-controller"
CONFLICT_RETRIES = 5
#: Largest pause between two re-issues of the same create, seconds.
RETRY_MAX_SECONDS = 30.0
#: Largest pause between two re-issues of the same Job DELETE, seconds: stopping is fail-safe,
#: and a Job whose DELETE the API server refused for a while (an admission policy, an RBAC
#: lapse, a 5xx) ran on up to 30 s once it was accepted again (an adversarial trial: 7.0 s and
#: 11.2 s after the refusals ended). A refused DELETE costs the API server little; one per Job
#: every 5 s matches the contract's 5 s for background work to stop. A suspend (and a resume)
#: keeps :data:`RETRY_MAX_SECONDS`: it is re-asserted until the Job controller reports the Job
#: suspended, and at 5 s the re-assertions of 200 suspended Jobs nobody reported doubled the
#: reconcile loop's time and the cancel p99 beside it (``python -m bench --only latency``).
CANCEL_RETRY_MAX_SECONDS = 5.0
#: What :meth:`Actor._try_delete` returns when the attempt's own Job was never there.
NO_JOB = "no Job of the attempt"
#: Threads of the "job-deletes" pool (cancel calls: a burst of cancels goes out this many at a
#: time) and of the "job-creates" pool (admissions); the HTTP pool has room for both
#: (``kube.CONNECTION_POOL_SIZE``).
DELETE_WORKERS = 16
CREATE_WORKERS = 16


class NotLeader(Exception):
    """The leader lease was lost before a mutation."""


class StatusWriter:
    """Writes statuses on a thread of its own, so a slow GET/PUT never delays a cancel.

    ``submit(key, status)`` keeps only the latest status per key (older pending ones are
    superseded); the thread writes them in submission order through ``write(key, status)``.
    A failed write is logged and dropped: the actor's cache is not updated, so the next
    ``WriteStatus`` for that key (at the latest the periodic full re-check) writes it again.
    """

    def __init__(
        self, write: Callable[[tuple[str, str], Mapping[str, Any]], None], before: Callable[[], Any] = lambda: None
    ) -> None:
        self._write = write
        self._before = before
        self._pending: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._cond = threading.Condition()
        self._busy = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="status-writer", daemon=True)
        self._thread.start()

    def submit(self, key: tuple[str, str], status: Mapping[str, Any]) -> None:
        """Queue ``status`` for ``key`` (replacing a pending one); returns at once."""
        with self._cond:
            self._pending.pop(key, None)  # re-insert: the newest goes to the back
            self._pending[key] = status
            self._cond.notify()

    def idle(self, timeout: float = 10.0) -> bool:
        """Wait until nothing is pending or being written; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the writer thread (pending statuses are dropped)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopped)
                if self._stopped:
                    return
                key = next(iter(self._pending))
                status = self._pending.pop(key)
                self._busy = True
            try:
                self._before()  # e.g. yield to preemption DELETEs in flight (CancelWindow.wait)
                self._write(key, status)
            except NotLeader:
                pass
            except Exception as exc:  # noqa: BLE001 - retried by a later WriteStatus
                log.warning(f"status write failed: {error_line(exc)}",
                            extra={"backfill": f"{key[0]}/{key[1]}"})
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


def _once_more(call: Callable[..., _T], *args: Any) -> _T:
    """``call(*args)``, sent once more at once when the first send times out or breaks (urllib3
    errors; the pool gives the resend a fresh connection): a dead pooled connection must not
    hold a cancel for a whole timeout. The resend's errors, and any ApiException, propagate."""
    try:
        return call(*args)
    except urllib3.exceptions.HTTPError:
        return call(*args)


class Actor:
    """Executes commands against the API server and the event log.

    Args:
        api: a kubernetes ApiClient.
        append: ``(records) -> positions``, synchronous (EventStore.append): decisions that allow
            a mutation (admit, block, unblock, finalizer release) are durable before it.
        observe: ``(pairs) -> entries``, asynchronous (Spool.put): the actor's own observations.
        clock: aware UTC now.
        can_act: leader check (always True without leader election); in memory.
        identity: reported as the Events' reporting instance.
        timeout: client-side timeout of every API call, seconds.
        delete_timeout: client-side timeout of a Job DELETE, seconds (sent once more at once on
            a fresh connection when it times out).
        cached: ``key -> ModelBackfill object | None``, the latest copy seen (spares the GET
            before a status PUT); None: always GET.
        remember: ``(key, object)``, told the object a status PUT returned (the newest copy).
        limiter / status_limiter: pace Job creates / status writes, each its own bucket so an
            admission never queues behind thousands of status writes (``acquire()``, a
            :class:`~backfill.controller.ratelimit.TokenBucket`); None: unpaced. Deletes never wait.
        window: the :class:`~backfill.controller.cancelwindow.CancelWindow` its preemption
            DELETEs open; status writes and Events wait for it (default: one of its own).
    """

    def __init__(
        self,
        api: Any,
        append: Callable[[list], list],
        clock: Callable[[], datetime],
        can_act: Callable[[], bool] = lambda: True,
        identity: str = COMPONENT,
        *,
        observe: Callable[[list], Any] | None = None,
        timeout: float = 10.0,
        delete_timeout: float = 2.0,
        cached: Callable[[tuple[str, str]], Mapping[str, Any] | None] | None = None,
        remember: Callable[[tuple[str, str], Any], None] | None = None,
        limiter: Any = None,
        status_limiter: Any = None,
        window: CancelWindow | None = None,
    ) -> None:
        self.api = api
        self.window = window if window is not None else CancelWindow()
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.append_records = append
        self._observe = observe
        self.clock = clock
        self.can_act = can_act
        self.identity = identity
        self.timeout = timeout
        self.delete_timeout = delete_timeout
        self._cached = cached
        self._remember = remember
        self._written: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._lock = threading.Lock()
        self._pace: dict[tuple[str, str, str], tuple[float, float]] = {}  # (verb, ns, job) -> (next allowed, pause)
        self._suspend_rounds: dict[tuple[str, str], int] = {}  # (ns, job) -> the suspend round last paced
        self._terminating_noted: set[tuple[str, str]] = set()  # (ns, job) whose JobTerminating Event was sent
        self._suspension_noted: set[tuple[str, str]] = set()  # (ns, job) whose JobSuspended cancel was said
        self._unexplained_noted: set[tuple[str, str]] = set()  # (ns, job) whose UnexplainedJob Event was sent
        #: backfill keys cancelled whose next status write is the crash hook's ``cancel/status-written``
        #: (only with that hook armed: a cancel whose Job went at once skips the Cancelling phase)
        self._cancel_unreported: set[tuple[str, str]] = set()
        #: Called with a backfill key when its cancel call failed (the preemptor's retry).
        self.on_preempt_failed: Callable[[tuple[str, str]], None] | None = None
        #: Called with ``[(position, event)]`` of the admissions and resumes just appended, before
        #: any Job is created (the preemptor can cancel them before the loop reads them back).
        self.on_recorded: Callable[[list[tuple[int, Any]]], None] | None = None
        #: ``(key, attempt) -> bool``: a cancel of that attempt is in flight (no create then).
        self.cancelled_in_memory: Callable[[tuple[str, str], int], bool] | None = None
        #: ``key -> bool``: the preemptor writes that backfill's status from memory (a cancel it
        #: made that the durable projection does not show yet): a ``WriteStatus`` of the loop's
        #: for it is older and is not written.
        self.status_in_memory: Callable[[tuple[str, str]], bool] | None = None
        self.appended = 0
        self._decided_at: datetime | None = None
        self.statuses = StatusWriter(self.write_status, before=self.window.wait)
        self._side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k8s-events")
        self._pool = ThreadPoolExecutor(max_workers=DELETE_WORKERS, thread_name_prefix="job-deletes")
        self._creates = ThreadPoolExecutor(max_workers=CREATE_WORKERS, thread_name_prefix="job-creates")
        self._limiter = limiter
        self._status_limiter = status_limiter

    def close(self) -> None:
        """Stop the status writer and the side threads (pending Events are still sent)."""
        self.statuses.stop()
        self._side.shutdown(wait=True)
        self._pool.shutdown(wait=True)
        self._creates.shutdown(wait=True)

    def _decision_time(self) -> datetime:
        return self._decided_at or self.clock()

    # -- helpers ------------------------------------------------------------------------------

    def _guard(self) -> None:
        if not self.can_act():
            raise NotLeader("leader lease not held")

    def _append(self, event: Any, key: str | None = None) -> int | None:
        """Append a decision synchronously (it must be durable before the call it allows)."""
        self._guard()
        pos = self.append_records([encode(event, key)])[0]
        if pos is not None:
            self.appended += 1
        return pos

    def _record(self, cmd: Any, world: World) -> int | None:
        """Append ``cmd``'s decision record (decided on ``world`` at the decide time)."""
        event, key = decision_record(cmd, at=self._decision_time(), basis=world.position)
        return self._append(event, key)

    def _observed(self, event: Any) -> None:
        """An observation of the actor's own (JobCreated, JobDeleted, JobCreateRejected): spooled in order
        with the watchers' events; synchronous when no spool is wired (tests)."""
        if self._observe is not None:
            self._observe([(event, event.natural_key())])
            self.appended += 1
        else:
            self._append(event)

    def due(self, verb: str, ns: str, job: str) -> bool:
        """Whether a (re-)issued ``verb`` ("create", "delete", "suspend" or "resume") of Job
        ``ns/job``, or a "finalize" (the finalizer's release) of ModelBackfill ``ns/job``, may go
        out now; marks it issued. The first is always due; then 1 s, 2 s, 4 s
        ... up to :data:`CANCEL_RETRY_MAX_SECONDS` apart for a delete, :data:`RETRY_MAX_SECONDS`
        for the others."""
        now = time.monotonic()
        cap = CANCEL_RETRY_MAX_SECONDS if verb == "delete" else RETRY_MAX_SECONDS
        with self._lock:
            allowed, pause = self._pace.get((verb, ns, job), (0.0, 0.5))
            if now < allowed:
                return False
            pause = min(pause * 2, cap)
            self._pace[(verb, ns, job)] = (now + pause, pause)
            if len(self._pace) > 10_000:  # forget the oldest (Jobs long gone)
                for k in sorted(self._pace, key=lambda k: self._pace[k][0])[:5_000]:
                    del self._pace[k]
            return True

    def suspend_due(self, ns: str, job: str, round_: int) -> bool:
        """:meth:`due` of a re-issued suspend of round ``round_`` (``SuspendJob.round``): a new
        round's first call (someone else resumed the Job since) is due at once, whatever the
        pause the last round's re-sends reached (an adversarial trial: a foreign resume was
        suspended again 26 s later, on a back-off carried over)."""
        with self._lock:
            last = self._suspend_rounds.get((ns, job))
            self._suspend_rounds[(ns, job)] = round_
            if last is not None and last != round_:
                self._pace.pop(("suspend", ns, job), None)
            if len(self._suspend_rounds) > 10_000:  # forget the rest (Jobs long gone)
                self._suspend_rounds = {(ns, job): round_}
        return self.due("suspend", ns, job)

    def restart_pace(self, verb: str, ns: str, job: str) -> None:
        """Forget the pace of ``verb`` on Job ``ns/job``: a new cancel's calls start at 1 s
        again, not at the pause an earlier cancel of the same Job reached."""
        with self._lock:
            self._pace.pop((verb, ns, job), None)
            if verb == "suspend":
                self._suspend_rounds.pop((ns, job), None)

    def hurry_cancels(self) -> None:
        """Make every paced DELETE and suspend due at once (then 1 s, 2 s ... apart again): the
        API server answers again, and a cancel whose calls failed while it did not must not wait
        out a back-off of up to ``RETRY_MAX_SECONDS`` (an adversarial trial: the Job went 23 s
        after the API server came back, with PostgreSQL paused too). Creates keep their pace."""
        with self._lock:
            for k in [k for k in self._pace if k[0] in ("delete", "suspend")]:
                del self._pace[k]

    def _event(self, ns: str, name: str, uid: str, reason: str, message: str, type_: str = "Normal") -> None:
        """A core/v1 Event on the ModelBackfill (best effort, on the side thread)."""
        now = rfc3339(self.clock().replace(microsecond=0))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name[:200]}.", "namespace": ns},
            "involvedObject": {
                "apiVersion": f"{API_GROUP}/{API_VERSION}",
                "kind": "ModelBackfill",
                "name": name,
                "namespace": ns,
                "uid": uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.identity[:128],
        }

        def create() -> None:
            try:
                self.window.wait()  # informative only: after the cancels in flight
                self._guard()
                self.core.create_namespaced_event(ns, body, _request_timeout=self.timeout)
            except Exception as exc:  # noqa: BLE001 - an Event is informative only
                log.warning(f"event {reason} on {ns}/{name} not recorded: {error_line(exc)}")

        self._side.submit(create)  # off the reconcile thread: an Event never delays a decision

    def run_ended(self, row: Any) -> None:
        """A Kubernetes Event for an attempt (a ``runs`` row, :class:`backfill.core.runs.RunRow`)
        that ended other than by a decision of ours, which has its Event already: its Job
        completed (Normal ``Completed``), failed (Warning ``JobFailed``), ran past
        maxRunDuration (Warning ``DeadlineExceeded``), or was deleted before it ended (Warning
        ``JobDeleted``). A new user's trial found no Event on the ModelBackfill for a failed Job or
        one deleted by hand. Called once per ended row, by the replica that counts it.

        Each of these ends also has a log line (``attempt N ended: <result> (<reason>)``; info
        for a completion, else a warning), naming the event that ended it
        (:attr:`RunRow.deciding_position`): a new user's trial saw "admitted attempt 1" and then
        nothing when the Job completed. An end by a decision of ours has the decision's line
        (``cancelled attempt N``, ``suspended attempt N segment S``)."""
        ns, name, uid, job = row.namespace, row.backfill, row.backfill_uid, row.job_name
        if row.result == "succeeded":
            self._event(ns, name, uid, "Completed", f"Job {job} completed (attempt {row.attempt})")
        elif row.result == "failed":
            self._event(ns, name, uid, "JobFailed", f"Job {job} failed (attempt {row.attempt}): {row.reason}", "Warning")
        elif row.result == "deadline_exceeded":
            self._event(ns, name, uid, "DeadlineExceeded", f"Job {job} ran past spec.maxRunDuration (attempt {row.attempt})", "Warning")
        elif row.result == "cancelled" and row.reason == JOB_DELETED:
            message = f"Job {job} was deleted before it ended, by no cancel of this controller's log (attempt {row.attempt})"
            self._event(ns, name, uid, JOB_DELETED, message, "Warning")
        else:
            return
        (log.info if row.result == "succeeded" else log.warning)(
            # a resumed attempt's row is its last segment's (a new user's trial read "5.0s of
            # work" for an attempt that ran 21 s in three segments)
            f"attempt {row.attempt} ended: {row.result} ({row.reason}), Job {job}, {row.running_seconds:.1f}s of work"
            + (f" in segment {row.segment}, its last (backfill runs lists every segment)" if row.segment > 1 else ""),
            extra={"backfill": f"{ns}/{name}", "position": row.deciding_position},
        )

    # -- dispatch -----------------------------------------------------------------------------

    def execute(
        self,
        commands: Iterable[Any],
        world: World,
        now: datetime | None = None,
        interrupted: Callable[[], bool] = lambda: False,
    ) -> list[tuple[str, str]]:
        """Run ``commands`` (the reconcile loop's: never a ``Cancel``) in order; one failing
        command is logged and does not stop the rest.

        ``now`` is the time ``decide`` was called with: decision events carry it as ``at`` so
        ``backfill replay`` re-derives them at exactly that time (default: the clock). Re-issued
        deletes go first. After each other command ``interrupted()`` is asked; when it is true
        (new events are waiting) the rest is left undone.

        Returns:
            The keys whose commands were left undone (decide them again: ``decide`` is pure,
            and nothing was recorded for them).
        """
        self._decided_at = now
        todo = [c for c in commands if not isinstance(c, (WakeAt, Cancel, Admit, Resume, Block, Unblock))]
        todo.sort(key=lambda c: 0 if isinstance(c, (DeleteJob, SuspendJob)) else 1)  # stable: per-key order kept
        admits = [c for c in commands if isinstance(c, (Admit, Resume))]
        blocks = [c for c in commands if isinstance(c, (Block, Unblock))]
        if blocks:  # before the admissions: an Unblock comes before the Admit it allows
            try:
                self._guard()
                self.block_many(blocks, world)
            except NotLeader:
                log.info("not the leader any more: commands skipped")
                return []
            except Exception as exc:  # noqa: BLE001 - nothing recorded: decided again next pass
                log.error(f"recording {len(blocks)} block/unblock decisions failed: {error_line(exc)}", extra={"position": world.position})
                return sorted({c.key for c in blocks} | {c.key for c in admits})
        for i, cmd in enumerate(todo):
            try:
                self._guard()
                self._dispatch(cmd, world)
            except NotLeader:
                log.info("not the leader any more: commands skipped")
                return []
            except Exception as exc:  # noqa: BLE001 - re-issued by the next decide
                log.error(
                    f"{type(cmd).__name__} failed: {error_line(exc)}",
                    extra={"backfill": f"{cmd.key[0]}/{cmd.key[1]}", "position": world.position, "decision": type(cmd).__name__},
                )
            if not isinstance(cmd, (WriteStatus, DeleteJob, SuspendJob)) and interrupted():
                # every remaining key, status-only ones too: they are decided again next pass
                return sorted({c.key for c in todo[i + 1 :]} | {c.key for c in admits})
        for kind, start, noun, verb in ((Resume, self.resume_many, "resumes", "resuming"), (Admit, self.admit_many, "admissions", "admitting")):
            batch = [c for c in admits if isinstance(c, kind)]
            if not batch:
                continue
            try:
                self._guard()
                start(batch, world)
            except NotLeader:
                log.info(f"not the leader any more: {noun} skipped")
            except Exception as exc:  # noqa: BLE001 - nothing recorded: decided again next pass
                log.error(f"{verb} {len(batch)} attempts failed: {error_line(exc)}", extra={"position": world.position})
        return []

    def _dispatch(self, cmd: Any, world: World) -> None:
        t = type(cmd)
        if t is WriteStatus:
            if self.status_in_memory is None or not self.status_in_memory(cmd.key):
                self.statuses.submit(cmd.key, cmd.status)
        elif t is CreateJob:
            if self.due("create", cmd.key[0], cmd.job_name):
                b = world.backfills[cmd.key]
                self.create_job(cmd.key, b.uid, cmd.attempt, cmd.job_name, world)
        elif t is DeleteJob:
            if self.due("delete", cmd.key[0], cmd.job_name):
                if cmd.unexplained:
                    self._note_unexplained(cmd, world)
                else:
                    self._note_foreign_suspension(cmd, world)
                    self._note_terminating(cmd, world)
                self.delete_job(cmd.key, cmd.job_name, job_uid(world, cmd.key, cmd.job_name), owner_uid(world, cmd.key))
        elif t is SuspendJob:
            if self.suspend_due(cmd.key[0], cmd.job_name, cmd.round):
                b = world.backfills.get(cmd.key)
                a = b.attempt if b is not None else None
                log.info(
                    f"suspending Job {cmd.job_name} again (not observed suspended yet, or its spec.suspend was cleared "
                    f"by someone else): the recorded cancel stands (its cause: position {a.cancel_pos if a is not None else '?'})",
                    extra={"backfill": f"{cmd.key[0]}/{cmd.key[1]}", "position": a.cancel_pos if a is not None else None,
                           "decision": "AttemptCancelled"},
                )  # fmt: skip
                self.suspend_job(cmd.key, cmd.job_name, True, job_uid(world, cmd.key, cmd.job_name), owner_uid(world, cmd.key))
        elif t is ResumeJob:
            if not self._cancel_in_flight(cmd.key, cmd.job_name, world, "ResumeJob") and self.due("resume", cmd.key[0], cmd.job_name):
                self.suspend_job(cmd.key, cmd.job_name, False, job_uid(world, cmd.key, cmd.job_name), owner_uid(world, cmd.key))
        elif t is ReleaseFinalizer:
            if self.due("finalize", cmd.key[0], cmd.key[1]):
                self.release_finalizer(cmd, world)
        else:  # pragma: no cover - Admit, Resume, Block, Unblock are batched by execute; Cancel is the preemptor's
            raise TypeError(f"not dispatched one by one: {cmd!r}")

    # -- admit / create -----------------------------------------------------------------------

    def admit_many(self, cmds: list[Admit], world: World) -> None:
        """Record every ``AttemptAdmitted`` in one append (durable before any create: fail-closed),
        then create the Jobs in parallel ("job-creates", paced by the limiter) and emit the Events.

        A decision already stored (another instance admitted it) creates nothing here (the
        re-issued CreateJob does, if it is still outstanding). Raises when the append fails:
        then nothing was recorded and nothing is created."""
        records = [decision_record(c, at=self._decision_time(), basis=world.position) for c in cmds]
        self._guard()
        positions = self.append_records([encode(e, k) for e, k in records])
        self._recorded(records, positions)
        admitted = [c for c, p in zip(cmds, positions) if p is not None]
        self.appended += len(admitted)
        if admitted:
            crash_point("admit/decision-appended")
        for c, p in zip(cmds, positions):
            ns, name = c.key
            if p is None:
                log.info(f"attempt {c.attempt} already admitted elsewhere", extra={"backfill": f"{ns}/{name}"})
                continue
            log.info(
                f"admitted attempt {c.attempt}: Job {c.job_name}",
                # the decision's own position in the log (a new user's trial: the basis, one
                # before it, was logged, where a cancel's line names its event's position)
                extra={"backfill": f"{ns}/{name}", "position": p, "decision": "AttemptAdmitted"},
            )
            self._event(ns, name, c.uid, "Admitted", f"idle window complete; creating Job {c.job_name} (attempt {c.attempt})")
            self.due("create", ns, c.job_name)  # the first create is this one

        def create(c: Admit) -> None:
            try:
                self.create_job(c.key, c.uid, c.attempt, c.job_name, world)
            except NotLeader:
                pass
            except Exception as exc:  # noqa: BLE001 - re-issued by the next decide (CreateJob)
                log.error(f"creating Job {c.job_name} failed: {error_line(exc)}", extra={"backfill": f"{c.key[0]}/{c.key[1]}"})

        if len(admitted) == 1:
            create(admitted[0])
        else:
            list(self._creates.map(create, admitted))

    def _cancel_in_flight(self, key: tuple[str, str], job_name: str, world: World, decision: str) -> bool:
        """True (and a log line) when a cancel of ``key``'s current attempt is in flight: decided
        in memory by the preemptor, not yet in ``world`` (the durable projection). A resume sent
        now could land after the cancel's suspend and run the Job through the demand (a new
        user's trial: the loop's re-sent ``ResumeJob`` cleared ``spec.suspend`` the same second
        the cancel set it, and the Job ran on resumed 31 s while the status said
        ``WaitingForIdle``)."""
        b = world.backfills.get(key)
        a = b.attempt if b is not None else None
        if a is None or self.cancelled_in_memory is None or not self.cancelled_in_memory(key, a.number):
            return False
        log.info(
            f"not resuming Job {job_name}: its attempt {a.number} is being cancelled",
            extra={"backfill": f"{key[0]}/{key[1]}", "position": world.position, "decision": decision},
        )
        return True

    def create_job(self, key: tuple[str, str], uid: str, attempt: int, job_name: str, world: World) -> None:
        """Create the attempt's Job from the CronJob template in ``world``; observe ``JobCreated``.

        AlreadyExists with our controller ownerReference counts as created. Any refusal observes
        ``JobCreateRejected`` (never ``JobFailed``: no Job exists) with the HTTP status, the API
        server's reason and message, and whether it is permanent
        (:func:`~backfill.core.events.create_rejection_is_permanent`: 400/422, or a template
        that cannot be built) or transient (403 quota, 404, 409 of a foreign Job, 429, 5xx, no
        response), so the projector blocks or backs off. Only a lost lease (``NotLeader``)
        propagates."""
        ns, name = key
        if self.cancelled_in_memory is not None and self.cancelled_in_memory(key, attempt):
            # A cancel of this attempt is in flight (decided in memory, not yet read back): a
            # create now could land after its delete and run through the demand.
            log.info(f"not creating Job {job_name}: its attempt is being cancelled", extra={"backfill": f"{ns}/{name}", "decision": "CreateJob"})
            return
        b = world.backfills.get(key)
        spec = b.spec if b is not None else None
        template = world.templates.get((ns, spec.template_ref)) if spec is not None else None
        common = dict(namespace=ns, backfill=name, name=job_name)
        rej = b.rejection if b is not None else None
        number = rej.count + 1 if rej is not None and rej.attempt == attempt else 1

        def reject(code: int, reason: str, message: str, permanent: bool, retry_after: float | None = None) -> None:
            # A permanent refusal blocks the declaration (an error); a transient one is retried
            # with back-off (a warning at each retry, not an error: a quota can stay full for hours).
            (log.error if permanent else log.warning)(
                f"Job {job_name} refused ({'permanent' if permanent else 'transient'}): HTTP {code} {reason}: {message}",
                extra={"backfill": f"{ns}/{name}", "position": world.position, "decision": "JobCreateRejected"},
            )
            self._observed(
                ev.JobCreateRejected(
                    at=self.clock(), attempt=attempt, rejection=number, code=code, reason=reason, message=message[:1024],
                    permanent=permanent, template_pos=template.pos if template is not None else 0,
                    retry_after=retry_after, **common,
                )
            )

        if spec is None or template is None or template.job_template is None:
            ref = spec.template_ref if spec is not None else "?"
            reject(0, "TemplateNotFound", f"CronJob {ns}/{ref} not found", permanent=True)
            return
        try:
            body = build_job(
                template.job_template, namespace=ns, backfill=name, backfill_uid=uid, attempt=attempt, spec=spec, name=job_name
            )
        except ValueError as exc:
            reject(0, "InvalidTemplate", str(exc), permanent=True)
            return
        if self._limiter is not None:
            self._limiter.acquire()
        self._guard()
        try:
            crash_point("admit/create-sent")
            created = self.batch.create_namespaced_job(ns, body, _request_timeout=self.timeout)
            job_uid, created_at = created.metadata.uid, created.metadata.creation_timestamp
            crash_point("admit/create-answered")
        except ApiException as exc:
            if exc.status == 409:
                try:
                    existing = self.batch.read_namespaced_job(job_name, ns, _request_timeout=self.timeout)
                except Exception as read_exc:  # noqa: BLE001 - a transient refusal, retried
                    reject(409, "AlreadyExists", f"Job {job_name} exists and could not be read: {error_line(read_exc)}", False)
                    return
                if not controlled_by(existing.metadata, uid):
                    reject(409, "AlreadyExists", f"Job {job_name} exists and is not owned by this ModelBackfill", False)
                    return
                job_uid, created_at = existing.metadata.uid, existing.metadata.creation_timestamp
            else:
                code = int(exc.status or 0)
                reason, message = api_status(exc)
                reject(code, reason, message, ev.create_rejection_is_permanent(code), _retry_after(exc))
                return
        except NotLeader:
            raise  # the fence refused it: nothing was sent, nothing to record
        except Exception as exc:  # noqa: BLE001 - no response (timeout, connection): transient
            reject(0, type(exc).__name__, message_line(exc) or type(exc).__name__, permanent=False)
            return
        # The Job's creationTimestamp (whole seconds), as the watcher records it: whichever of
        # the two reaches the log first, status.startedAt has one precision (a new user's trial
        # saw both); the clock only when the answer has none.
        at = created_at.astimezone(timezone.utc) if isinstance(created_at, datetime) and created_at.tzinfo is not None else self.clock()
        self._observed(ev.JobCreated(at=at, uid=job_uid, **common))
        crash_point("admit/jobcreated-appended")

    # -- cancel / delete ----------------------------------------------------------------------

    def preempt(self, cmds: list[Cancel], world: World) -> None:
        """Send the Job DELETEs of ``cmds`` now (Background propagation; for a suspending cancel,
        issue 11, the ``spec.suspend: true`` PATCH instead) on the "job-deletes" pool, one call
        per Job in parallel, and return without waiting for the answers: the
        preemptor's next observation is never held behind an earlier cancel's round trip. Each
        answer is logged and its Event emitted (side thread) by the pool. Never raises and never
        touches the store: the preemptor spools the decisions beside these calls."""
        try:
            self._guard()
        except NotLeader:
            log.info("not the leader any more: cancels skipped")
            return
        for c in cmds:
            verb = "suspend" if c.suspend else "delete"
            self.restart_pace(verb, c.key[0], c.job_name)  # a new cancel: not an earlier one's back-off
            self.due(verb, c.key[0], c.job_name)  # this is the first one
            self.window.begin()
            self._pool.submit(self._cancel_one, c, job_uid(world, c.key, c.job_name))

    def submit_statuses(self, cmds: list[WriteStatus]) -> None:
        """Queue the statuses of ``cmds`` on the status writer (the preemptor's, derived from
        memory); returns at once, never raises, never touches the store."""
        for c in cmds:
            self.statuses.submit(c.key, c.status)

    def preempt_again(self, cmds: list[Any], world: World, failed: bool = True) -> None:
        """Re-send, on the "job-deletes" pool, the calls of cancels whose call failed
        (``failed``), or the suspends the preemptor re-asserts from memory (a Job someone else
        resumed while the store is away: not ``failed``): ``DeleteJob`` / ``SuspendJob`` from
        the preemptor's projection, each paced by :meth:`due` (:meth:`suspend_due`); a failure
        asks the preemptor to retry again. Never raises, never touches the store."""
        try:
            self._guard()
        except NotLeader:
            return
        for c in cmds:
            suspend = isinstance(c, SuspendJob)
            if not (self.suspend_due(c.key[0], c.job_name, c.round) if suspend else self.due("delete", c.key[0], c.job_name)):
                if failed:
                    self._preempt_failed(c.key)  # not yet: ask again after the pause
                continue
            self.window.begin()
            self._pool.submit(self._again_one, c, suspend, job_uid(world, c.key, c.job_name), owner_uid(world, c.key))

    def _again_one(self, c: Any, suspend: bool, uid: str, owner: str) -> None:
        try:
            error = self._try_delete(c.key, c.job_name, suspend, uid, owner)
        finally:
            self.window.end()
        if error is NO_JOB:
            return  # nothing of ours to delete (logged by _own_job_uid)
        if error is not None:
            log.error(
                f"{'suspending' if suspend else 'deleting'} Job {c.job_name} failed again (re-sent from memory): {error}",
                extra={"backfill": f"{c.key[0]}/{c.key[1]}", "decision": "AttemptCancelled"},
            )
            self._preempt_failed(c.key)
            return
        log.info(
            f"{'suspended' if suspend else 'deleted'} Job {c.job_name} (a cancel's call re-sent from memory)",
            extra={"backfill": f"{c.key[0]}/{c.key[1]}", "decision": "AttemptCancelled"},
        )

    def _recorded(self, records: list[tuple[Any, str]], positions: list[int | None]) -> None:
        hook = self.on_recorded
        if hook is not None:
            hook([(p, e) for (e, _), p in zip(records, positions) if p is not None])

    def _preempt_failed(self, key: tuple[str, str]) -> None:
        hook = self.on_preempt_failed
        if hook is not None:
            try:
                hook(key)
            except Exception:  # noqa: BLE001
                pass

    def _cancel_one(self, c: Cancel, uid: str = "") -> None:
        """One preemption DELETE, or suspend (issue 11) (a pool thread): the call, then its log
        line and Event. ``uid``: the Job's, when the world knows it (for a 404's JobDeleted)."""
        try:
            error = self._try_delete(c.key, c.job_name, c.suspend, uid, c.uid)
        finally:
            self.window.end()
        ns, name = c.key
        # Decided in memory: its log position exists once the spool commits it (the spool logs
        # "recorded AttemptCancelled at position P (cause C, basis B)" then); none is named here.
        extra = {"backfill": f"{ns}/{name}", "decision": "AttemptCancelled"}
        if error is NO_JOB:  # a new user's trial: the Event said "cancelled Job X" of another's Job X, left running
            log.info(f"cancelled attempt {c.attempt} ({c.reason}) before its Job {c.job_name} was created: {c.message}", extra=extra)
            self._event(ns, name, c.uid, c.reason, f"cancelled attempt {c.attempt} before its Job {c.job_name} was created: {c.message}", "Warning")
            return
        if error is not None:
            # Not "cancelled": the call did not go through (a fault trial read "failed
            # (re-issued)" then "cancelled attempt N" and no re-send followed).
            log.error(
                f"{'suspending' if c.suspend else 'deleting'} Job {c.job_name} failed, sent again while this replica leads: {error}",
                extra=extra,
            )
            self._preempt_failed(c.key)
            log.info(f"cancelling attempt {c.attempt} ({c.reason}), its Job {c.job_name} not {'suspended' if c.suspend else 'deleted'} yet: {c.message}", extra=extra)
            self._event(ns, name, c.uid, c.reason, f"cancelling Job {c.job_name} (the call failed and is sent again): {c.message}", "Warning")
            return
        if c.suspend:
            log.info(f"suspended attempt {c.attempt} segment {c.segment} ({c.reason}): {c.message}", extra=extra)
            # its message says "...; suspending Job J (completed indexes are kept)" already (a
            # new user's trial read it twice in the Event)
            self._event(ns, name, c.uid, c.reason, c.message, "Warning")
        else:
            log.info(f"cancelled attempt {c.attempt} ({c.reason}): {c.message}", extra=extra)
            self._event(ns, name, c.uid, c.reason, f"cancelled Job {c.job_name}: {c.message}", "Warning")
        if crash_armed("cancel/status-written"):
            self._cancel_unreported.add(c.key)

    def _note_unexplained(self, cmd: DeleteJob, world: World) -> None:
        """Say once per Job (a warning log line and a Warning Event) that a Job the
        ModelBackfill owns is deleted because no logged attempt explains it."""
        with self._lock:
            if (cmd.key[0], cmd.job_name) in self._unexplained_noted:
                return
            self._unexplained_noted.add((cmd.key[0], cmd.job_name))
        b = world.backfills.get(cmd.key)
        message = (
            f"Job {cmd.job_name} is owned by this ModelBackfill but is not in the event log (another controller, "
            "or a database restored from an older backup?): deleting it; nothing is admitted until it is gone"
        )
        log.warning(message, extra={"backfill": f"{cmd.key[0]}/{cmd.key[1]}", "position": world.position, "decision": "DeleteJob"})
        self._event(cmd.key[0], cmd.key[1], b.uid if b is not None else "", "UnexplainedJob", message, "Warning")

    def _note_foreign_suspension(self, cmd: DeleteJob, world: World) -> None:
        """Say once per Job (a warning log line and a Warning Event, as a cancel does) that a
        ``spec.preemption: Delete`` Job someone else suspended is deleted (the fold's
        ``JobSuspended`` cancel, which has no decision of its own: a second trial found neither)."""
        b = world.backfills.get(cmd.key)
        a = b.attempt if b is not None else None
        if a is None or a.job_name != cmd.job_name or a.resumable or a.cancel_reason != JOB_SUSPENDED:
            return
        with self._lock:
            if (cmd.key[0], cmd.job_name) in self._suspension_noted:
                return
            self._suspension_noted.add((cmd.key[0], cmd.job_name))
        message = a.cancel_message or f"Job {cmd.job_name} was suspended by someone else: deleting it"
        log.warning(f"cancelling attempt {a.number} ({JOB_SUSPENDED}): {message}",
                    extra={"backfill": f"{cmd.key[0]}/{cmd.key[1]}", "position": a.cancel_pos, "decision": "DeleteJob"})  # fmt: skip
        self._event(cmd.key[0], cmd.key[1], b.uid, JOB_SUSPENDED, message, "Warning")

    def _note_terminating(self, cmd: DeleteJob, world: World) -> None:
        """One Warning Event per Job that a finalizer holds after its delete (``JobTerminating``)."""
        b = world.backfills.get(cmd.key)
        a = b.attempt if b is not None else None
        if a is None or a.job_name != cmd.job_name or a.terminating_since is None:
            return
        with self._lock:
            if (cmd.key[0], cmd.job_name) in self._terminating_noted:
                return
            self._terminating_noted.add((cmd.key[0], cmd.job_name))
        self._event(
            cmd.key[0], cmd.key[1], b.uid, "JobTerminating",
            f"Job {cmd.job_name} is still terminating (a finalizer holds it); the delete is retried with back-off "
            "and nothing is admitted on its model or node until it is gone",
            "Warning",
        )

    def _try_delete(self, key: tuple[str, str], job_name: str, suspend: bool, uid: str = "", owner: str = "") -> str | None:
        """The preemption call (``spec.suspend: true`` PATCH, else DELETE, see :meth:`delete_job`
        for ``uid`` and ``owner``); returns the error's one line, or None when it was answered
        (re-sent by the preemptor's retry and by the next decide's DeleteJob / SuspendJob), or
        :data:`NO_JOB` when the attempt's own Job was never there to delete."""
        try:
            if suspend:
                self.suspend_job(key, job_name, True, uid, owner)
            elif not self.delete_job(key, job_name, uid, owner):
                return NO_JOB
            return None
        except Exception as exc:  # noqa: BLE001
            return error_line(exc)

    def delete_job(self, key: tuple[str, str], job_name: str, uid: str = "", owner: str = "") -> bool:
        """Delete our Job ``job_name`` with ``propagationPolicy=Background``, never another's of
        the same name; a 404 observes ``JobDeleted`` (with ``uid``, the Job's uid when known: the
        same idempotency key as the watch's).

        ``uid`` known (the log saw the Job created): the DELETE carries it as a precondition, so
        a Job created under the same name by someone else after ours went is left alone (the
        API server answers 409 Conflict: ours is gone, observed ``JobDeleted``). ``uid`` unknown
        (the attempt's create was never confirmed: in flight, answer lost, or refused because
        a Job of that name exists that is not ours, a trial) and ``owner`` (the ModelBackfill's
        uid) given: the Job is read first (one GET, the delete's timeout); ours (its controller
        ownerReference is ``owner``) is deleted under its uid, another's is not touched and our
        attempt's Job is observed absent (``JobDeleted``). Returns False in that case only (no
        Job of the attempt was there: nothing was sent), True when the DELETE was answered. Raises
        ApiException for any other answer, urllib3 errors when the resend also fails (the re-issue
        retries)."""
        ns, name = key
        self._guard()
        try:
            target = self._target_uid(key, job_name, uid, owner, "deleted")
            if target is None:
                return False
            uid = target
            crash_point("cancel/delete-sent")
            _once_more(self._delete_call, ns, job_name, uid)
            crash_point("cancel/delete-answered")
        except ApiException as exc:
            if exc.status != 404 and not (exc.status == 409 and uid):  # 409: the uid precondition failed
                raise
            self._observed(ev.JobDeleted(at=self.clock(), namespace=ns, backfill=name, name=job_name, uid=uid))
        return True

    def _target_uid(self, key: tuple[str, str], job_name: str, uid: str, owner: str, verb: str) -> str | None:
        """The uid a call on Job ``job_name`` is made under (:meth:`delete_job`,
        :meth:`suspend_job`): ``uid`` when known, or when no ``owner`` is given (by name alone);
        else the Job's own uid if ModelBackfill ``owner`` controls it (:meth:`_own_job_uid`).
        None when our attempt's Job is not there (absent, or another's under its name, left
        alone: ``verb`` says how in the log): ``JobDeleted`` is observed and nothing is sent.
        Raises as :meth:`_own_job_uid`."""
        if uid or not owner:
            return uid
        ns, name = key
        uid = self._own_job_uid(ns, name, job_name, owner, verb)
        if not uid:
            self._observed(ev.JobDeleted(at=self.clock(), namespace=ns, backfill=name, name=job_name))
            return None
        return uid

    def _own_job_uid(self, ns: str, name: str, job_name: str, owner: str, verb: str = "deleted") -> str:
        """The uid of Job ``job_name`` if ModelBackfill ``owner`` (a uid) controls it; "" when it
        does not exist or is someone else's (logged). The delete's discipline: its timeout, one
        immediate resend on a fresh connection, the answer read raw (no client models). Raises
        ApiException other than 404, urllib3 errors when the resend fails too."""
        try:
            meta = _once_more(self._read_meta, ns, job_name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return ""
        if controlled_by(meta, owner):
            return str(meta.get("uid") or "")
        log.warning(
            f"Job {job_name} is not owned by this ModelBackfill: not {verb} (the attempt's own Job was never created)",
            extra={"backfill": f"{ns}/{name}", "decision": "AttemptCancelled"},
        )
        return ""

    def _read_meta(self, ns: str, job_name: str) -> dict[str, Any]:
        """One GET of a Job with the delete's timeout; its ``metadata`` (API JSON), read raw."""
        resp = self.batch.read_namespaced_job(job_name, ns, _request_timeout=self.delete_timeout, _preload_content=False)
        try:
            return json.loads(resp.data).get("metadata") or {}
        finally:
            resp.release_conn()

    def _delete_call(self, ns: str, job_name: str, uid: str = "") -> None:
        """One DELETE of a Job (Background propagation, ``delete_timeout`` seconds; with ``uid``,
        a precondition on it). The answer is read raw and not deserialized into client models
        (milliseconds of Python that would hold the interpreter while other cancels wait); an
        error status still raises ApiException."""
        # With a body the API server reads DeleteOptions from it alone (the query's
        # propagationPolicy is ignored: a Job's default is to orphan its pods, held by the
        # orphan finalizer until the garbage collector acts), so the policy goes in it too.
        body = {"propagationPolicy": "Background", "preconditions": {"uid": uid}} if uid else None
        resp = self.batch.delete_namespaced_job(
            job_name, ns, propagation_policy="Background", body=body, _request_timeout=self.delete_timeout, _preload_content=False
        )
        resp.read()  # drained, so the connection goes back to the pool clean
        resp.release_conn()

    def suspend_job(self, key: tuple[str, str], job_name: str, suspend: bool, uid: str = "", owner: str = "") -> None:
        """Set our Job's ``spec.suspend``, never another's of the same name; a 404 observes
        ``JobDeleted``.

        ``uid`` known: a JSON patch whose first operation tests ``/metadata/uid`` (the PATCH has
        no preconditions of its own), so a Job created under the same name by someone else after
        ours went is neither suspended nor resumed: the API server refuses the patch (422), a GET
        confirms the Job of that name is not ours, and ours is observed gone (``JobDeleted`` with
        ``uid``). ``uid`` unknown and ``owner`` given: the Job is read first, as for
        :meth:`delete_job`. (Resuming a suspended Job of someone else's would start work the log
        cannot explain; an adversarial review.)

        ``suspend=True`` is the preemption of a resumable declaration (issue 11): exactly the
        delete's discipline, so it stops the pods as fast: the fence (``_guard`` here and the
        client's), the delete's client-side timeout, one immediate resend on a fresh
        connection when the first send times out or breaks (setting the field twice is
        harmless), the answer drained raw like the delete's. ``suspend=False`` is a recorded
        resume (the call's normal timeout). Raises what the API server answers otherwise (the
        re-issue retries it)."""
        ns, name = key
        self._guard()
        timeout = self.delete_timeout if suspend else self.timeout
        try:
            target = self._target_uid(key, job_name, uid, owner, "suspended" if suspend else "resumed")
            if target is None:
                return
            uid = target
            body: Any = (
                [{"op": "test", "path": "/metadata/uid", "value": uid}, {"op": "add", "path": "/spec/suspend", "value": suspend}]
                if uid
                else {"spec": {"suspend": suspend}}
            )
            _once_more(self._patch_call, ns, job_name, body, timeout)
        except ApiException as exc:
            if exc.status != 404 and not (exc.status == 422 and uid and self._replaced(ns, job_name, uid)):
                raise
            self._observed(ev.JobDeleted(at=self.clock(), namespace=ns, backfill=name, name=job_name, uid=uid))

    def _replaced(self, ns: str, job_name: str, uid: str) -> bool:
        """After a 422 to a uid-tested patch: True when no Job named ``job_name`` has ``uid`` any
        more (gone, or another object under that name), False when it is still ours (the 422 was
        for something else: raised by the caller). One GET, the delete's timeout."""
        try:
            return self._read_meta(ns, job_name).get("uid") != uid
        except ApiException as exc:
            if exc.status != 404:
                raise
            return True

    def resume_many(self, cmds: list[Resume], world: World) -> None:
        """Record every ``AttemptResumed`` in one append (durable before any call: a resume is an
        admission, fail-closed), then clear each Job's ``spec.suspend`` and emit the Events.
        A decision already stored elsewhere sends nothing here (the re-issued ``ResumeJob`` does).
        Raises when the append fails: then nothing was recorded and nothing is sent."""
        records = [decision_record(c, at=self._decision_time(), basis=world.position) for c in cmds]
        self._guard()
        positions = self.append_records([encode(e, k) for e, k in records])
        self._recorded(records, positions)
        for c, p in zip(cmds, positions):
            ns, name = c.key
            if p is None:
                continue
            self.appended += 1
            log.info(
                f"resumed attempt {c.attempt} segment {c.segment}: Job {c.job_name}",
                extra={"backfill": f"{ns}/{name}", "position": p, "decision": "AttemptResumed"},  # the decision's own (as an admission's)
            )
            self._event(ns, name, c.uid, "Resumed", f"idle window complete; resuming Job {c.job_name} (attempt {c.attempt}, segment {c.segment})")
            self.due("resume", ns, c.job_name)  # the first resume is this one
            if self._cancel_in_flight(c.key, c.job_name, world, "AttemptResumed"):
                continue  # recorded; the cancel folded after it suspends the new segment
            try:
                self.suspend_job(c.key, c.job_name, False, job_uid(world, c.key, c.job_name), owner_uid(world, c.key))
            except NotLeader:
                raise
            except Exception as exc:  # noqa: BLE001 - re-issued by the next decide (ResumeJob)
                log.error(f"resuming Job {c.job_name} failed (re-issued): {error_line(exc)}", extra={"backfill": f"{ns}/{name}"})

    def _patch_call(self, ns: str, job_name: str, body: Any, timeout: float) -> None:
        """One PATCH of a Job's spec (a dict: strategic merge; a list: JSON patch), its answer
        drained raw like :meth:`_delete_call`'s."""
        resp = self.batch.patch_namespaced_job(job_name, ns, body, _request_timeout=timeout, _preload_content=False)
        resp.read()
        resp.release_conn()

    # -- block / unblock ----------------------------------------------------------------------

    def block_many(self, cmds: list[Any], world: World) -> None:
        """Record the ``BackfillBlocked``/``BackfillUnblocked`` decisions of ``cmds`` in one append
        (a thousand declarations unblocked at once cost one transaction), then emit their Events:
        a Warning with the reason for a block (once per reason, cause and generation), an
        ``Unblocked`` Event for an unblock."""
        records = [decision_record(c, at=self._decision_time(), basis=world.position) for c in cmds]
        self._guard()
        positions = self.append_records([encode(e, k) for e, k in records])
        for c, p in zip(cmds, positions):
            if p is None:
                continue
            self.appended += 1
            ns, name = c.key
            if isinstance(c, Block):
                log.info(
                    f"blocked: {c.reason}: {c.message}",
                    extra={"backfill": f"{ns}/{name}", "position": c.cause, "decision": "BackfillBlocked"},
                )
                self._event(ns, name, c.uid, c.reason, c.message, "Warning")
            else:
                log.info("unblocked", extra={"backfill": f"{ns}/{name}", "position": c.cause, "decision": "BackfillUnblocked"})
                self._event(ns, name, c.uid, "Unblocked", "the blocking condition is gone")

    # -- finalizer ----------------------------------------------------------------------------

    def _update_finalizers(self, ns: str, name: str, uid: str, add: bool) -> bool:
        """Add or remove our finalizer with optimistic concurrency; False if the object is gone."""
        t = self.timeout
        for _ in range(CONFLICT_RETRIES):
            try:
                obj = self.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL, name, _request_timeout=t)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            meta = obj.get("metadata") or {}
            if uid and meta.get("uid") != uid:
                return False
            finalizers = list(meta.get("finalizers") or [])
            if add == (FINALIZER in finalizers):
                return True
            if add and meta.get("deletionTimestamp"):
                return True  # never add to an object being deleted
            finalizers = finalizers + [FINALIZER] if add else [f for f in finalizers if f != FINALIZER]
            obj = for_update(obj)
            obj["metadata"]["finalizers"] = finalizers
            self._guard()
            try:
                self.custom.replace_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL, name, obj, _request_timeout=t)
                return True
            except ApiException as exc:
                if exc.status == 404:
                    return False
                if exc.status != 409:
                    raise
        raise RuntimeError(f"finalizer update of {ns}/{name}: too many conflicts")

    def ensure_finalizer(self, ns: str, name: str, uid: str) -> None:
        """Add our finalizer to a live ModelBackfill that lacks it."""
        self._update_finalizers(ns, name, uid, add=True)

    def release_finalizer(self, cmd: ReleaseFinalizer, world: World) -> None:
        """Remove our finalizer from the ModelBackfill and record ``FinalizerReleased``."""
        ns, name = cmd.key
        self._update_finalizers(ns, name, cmd.uid, add=False)
        self._record(cmd, world)
        log.info("finalizer released", extra={"backfill": f"{ns}/{name}", "position": world.position, "decision": "FinalizerReleased"})

    # -- status -------------------------------------------------------------------------------

    def write_status(self, key: tuple[str, str], status: Mapping[str, Any]) -> None:
        """Write ``status`` through the status subresource (a PUT with the object's resourceVersion).

        Skips a status identical to the last one written for ``key``. The object comes from the
        watch's cache when there is one (no GET before the PUT); a 409 Conflict is retried on a
        fresh GET. Fields of the current status that the projector does not manage are kept,
        foreign conditions are kept, and the Ready condition keeps its ``lastTransitionTime``
        while its status is unchanged.
        """
        with self._lock:
            if self._written.get(key) == status:
                return
        ns, name = key
        t = self.timeout
        obj = self._cached(key) if self._cached is not None else None
        for _ in range(CONFLICT_RETRIES):
            if obj is None:
                try:
                    obj = self.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL, name, _request_timeout=t)
                except ApiException as exc:
                    if exc.status == 404:
                        return
                    raise
            current = obj.get("status") or {}
            merged = merge_status(current, status, self.clock())
            if merged == current:
                break
            body = for_update(obj)
            body["status"] = merged
            if self._status_limiter is not None:
                self._status_limiter.acquire()
            self._guard()
            try:
                written = self.custom.replace_namespaced_custom_object_status(
                    API_GROUP, API_VERSION, ns, PLURAL, name, body, _request_timeout=t
                )
                if self._remember is not None and isinstance(written, dict):
                    self._remember(key, written)
                phase = merged.get("phase")
                if phase in ("Starting", "Running"):
                    crash_point("admit/status-written")
                elif phase == "Cancelling" or key in self._cancel_unreported:
                    self._cancel_unreported.discard(key)
                    crash_point("cancel/status-written")
                break
            except ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:
                    raise
                log.info("status conflict; retrying on a fresh read", extra={"backfill": f"{ns}/{name}"})
                obj = None
        else:
            raise RuntimeError(f"status of {ns}/{name}: too many conflicts")
        with self._lock:
            self._written[key] = copy.deepcopy(dict(status))

    def forget(self, key: tuple[str, str] | None = None) -> None:
        """Forget what was written for ``key`` (None: for every key), so the next write compares
        with the object itself (after a full resync, or when leadership changed hands)."""
        with self._lock:
            if key is None:
                self._written.clear()
            else:
                self._written.pop(key, None)


def _retry_after(exc: ApiException) -> float | None:
    """The ``Retry-After`` header of an API error in seconds (delta-seconds form only), or None."""
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None


def for_update(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` (API JSON) as the body of an update: a shallow copy whose ``metadata`` leaves out
    ``managedFields`` (the API server keeps them when an update omits them). The client turns a
    body into JSON by a Python recursion two frames a level: an adversarial trial's
    ModelBackfill with ``managedFields`` nested 9,000 levels deep (the API server takes 10,000)
    had every status write and finalizer update fail with ``RecursionError``."""
    body = dict(obj)
    meta = body.get("metadata")
    if isinstance(meta, Mapping):
        body["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return body


def merge_status(current: Mapping[str, Any], desired: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The status to write: ``current`` with ``desired`` applied (None removes a field).

    Conditions are merged by type: ours replace theirs of the same type, others stay. A
    condition's ``lastTransitionTime`` is kept when its status did not change, else set to now.
    """
    out = dict(current)
    for k, v in desired.items():
        if k == "conditions":
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    if "conditions" in desired:
        old = {c.get("type"): c for c in current.get("conditions") or [] if isinstance(c, Mapping)}
        mine = {c["type"] for c in desired["conditions"]}
        conds = [c for c in current.get("conditions") or [] if c.get("type") not in mine]
        stamp = rfc3339(now.replace(microsecond=0))
        for c in desired["conditions"]:
            c = dict(c)
            prev = old.get(c["type"])
            if prev is not None and prev.get("status") == c.get("status") and prev.get("lastTransitionTime"):
                c["lastTransitionTime"] = prev["lastTransitionTime"]
            else:
                c["lastTransitionTime"] = stamp
            conds.append(c)
        out["conditions"] = conds
    return out
