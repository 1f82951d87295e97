"""The actor: turns the projector's commands into decision events and Kubernetes calls.

Rules: a decision event is appended *before* the call it announces (so the log explains every
mutation); a decision whose idempotency key is already stored (another instance decided the
same thing) is not acted on again, except deletes, which are always safe. Before every mutation
``can_act()`` (leader election) is checked. It never writes Model, GamingSession, GPULease or
CronJob objects.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping

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
    Unblock,
    WakeAt,
    WriteStatus,
)
from backfill.core.events import encode
from backfill.core.jobtemplate import API_GROUP, API_VERSION, build_job
from backfill.core.state import World
from backfill.core.timefmt import rfc3339

log = logging.getLogger("backfill.controller.actor")

FINALIZER = "modelbackfill.ai.flexinfer/finalizer"
PLURAL = "modelbackfills"
COMPONENT = "modelbackfill-controller"
CONFLICT_RETRIES = 5


class NotLeader(Exception):
    """The leader lease was lost before a mutation."""


class StatusWriter:
    """Writes statuses on a thread of its own, so a slow GET/PUT never delays a cancel.

    ``submit(key, status)`` keeps only the latest status per key (older pending ones are
    superseded); the thread writes them in submission order through ``write(key, status)``.
    A failed write is logged and dropped: the actor's cache is not updated, so the next
    ``WriteStatus`` for that key (at the latest the periodic full re-check) writes it again.
    """

    def __init__(self, write: Callable[[tuple[str, str], Mapping[str, Any]], None]) -> None:
        self._write = write
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
                self._write(key, status)
            except NotLeader:
                pass
            except Exception as exc:  # noqa: BLE001 - retried by a later WriteStatus
                log.warning(f"status write failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                            extra={"backfill": f"{key[0]}/{key[1]}"})
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


class Actor:
    """Executes commands against the API server and the event log.

    Args:
        api: a kubernetes ApiClient.
        append: ``(records) -> positions`` (EventStore.append).
        clock: aware UTC now.
        can_act: leader check (always True without leader election).
        identity: reported as the Events' reporting instance.
    """

    def __init__(
        self,
        api: Any,
        append: Callable[[list], list],
        clock: Callable[[], datetime],
        can_act: Callable[[], bool] = lambda: True,
        identity: str = COMPONENT,
    ) -> None:
        self.api = api
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.append_records = append
        self.clock = clock
        self.can_act = can_act
        self.identity = identity
        self._written: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._lock = threading.Lock()
        self.appended = 0
        self._decided_at: datetime | None = None
        self.statuses = StatusWriter(self.write_status)
        self._side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k8s-events")
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="job-deletes")

    def close(self) -> None:
        """Stop the status writer and the side threads (pending Events are still sent)."""
        self.statuses.stop()
        self._side.shutdown(wait=True)
        self._pool.shutdown(wait=True)

    def _decision_time(self) -> datetime:
        return self._decided_at or self.clock()

    # -- helpers ------------------------------------------------------------------------------

    def _guard(self) -> None:
        if not self.can_act():
            raise NotLeader("leader lease not held")

    def _append(self, event: Any, key: str | None = None) -> int | None:
        self._guard()
        pos = self.append_records([encode(event, key)])[0]
        if pos is not None:
            self.appended += 1
        return pos

    def _event(self, ns: str, name: str, uid: str, reason: str, message: str, type_: str = "Normal") -> None:
        """A core/v1 Event on the ModelBackfill (best effort)."""
        now = rfc3339(self.clock().replace(microsecond=0))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": ns},
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
                self._guard()
                self.core.create_namespaced_event(ns, body)
            except Exception as exc:  # noqa: BLE001 - an Event is informative only
                log.warning(f"event {reason} on {ns}/{name} not recorded: {exc}".splitlines()[0])

        self._side.submit(create)  # off the reconcile thread: an Event never delays a decision

    # -- dispatch -----------------------------------------------------------------------------

    def execute(
        self,
        commands: Iterable[Any],
        world: World,
        now: datetime | None = None,
        interrupted: Callable[[], bool] = lambda: False,
    ) -> list[tuple[str, str]]:
        """Run ``commands`` in order; one failing command is logged and does not stop the rest.

        ``now`` is the time ``decide`` was called with: decision events carry it as ``at`` so
        ``backfill replay`` re-derives them at exactly that time (default: the clock). Leading
        ``Cancel`` commands are executed together (one append, parallel deletes). After each
        other command, ``interrupted()`` is asked; when it is true (new events are waiting) the
        rest is left undone, so a cancel never queues behind a run of admissions.

        Returns:
            The keys whose commands were left undone (decide them again: ``decide`` is pure,
            and nothing was recorded for them).
        """
        self._decided_at = now
        todo = [c for c in commands if not isinstance(c, WakeAt)]
        cancels = [c for c in todo if isinstance(c, Cancel)]
        if cancels:
            try:
                self._guard()
                self.cancel_many(cancels, world)
            except NotLeader:
                log.info("not the leader any more: commands skipped")
                return []
            except Exception as exc:  # noqa: BLE001 - the projector re-issues DeleteJob
                log.error(f"cancel failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            todo = [c for c in todo if not isinstance(c, Cancel)]
        for i, cmd in enumerate(todo):
            try:
                self._guard()
                self._dispatch(cmd, world)
            except NotLeader:
                log.info("not the leader any more: commands skipped")
                return []
            except Exception as exc:  # noqa: BLE001 - retried by the projector's retry timers
                log.error(
                    f"{type(cmd).__name__} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                    extra={"backfill": f"{cmd.key[0]}/{cmd.key[1]}"},
                )
            if not isinstance(cmd, WriteStatus) and interrupted():
                # every remaining key, status-only ones too: they are decided again next pass
                return sorted({c.key for c in todo[i + 1 :]})
        return []

    def _dispatch(self, cmd: Any, world: World) -> None:
        t = type(cmd)
        if t is WriteStatus:
            self.statuses.submit(cmd.key, cmd.status)
        elif t is Admit:
            self.admit(cmd, world)
        elif t is CreateJob:
            b = world.backfills[cmd.key]
            self.create_job(cmd.key, b.uid, cmd.attempt, cmd.job_name, world)
        elif t is DeleteJob:
            b = world.backfills[cmd.key]
            self.delete_job(cmd.key, cmd.job_name, b.uid)
        elif t is Block:
            self.block(cmd, world)
        elif t is Unblock:
            self.unblock(cmd, world)
        elif t is ReleaseFinalizer:
            self.release_finalizer(cmd, world)
        else:  # pragma: no cover
            raise TypeError(f"unknown command {cmd!r}")

    # -- admit / create -----------------------------------------------------------------------

    def admit(self, cmd: Admit, world: World) -> None:
        """Record ``AttemptAdmitted`` (at the decide time, with basis and cause), emit an Event, create the Job.

        A decision already stored (another instance admitted it) creates nothing."""
        ns, name = cmd.key
        now = self._decision_time()
        decision = ev.AttemptAdmitted(
            at=now,
            namespace=ns,
            backfill=name,
            cause=cmd.cause,
            basis=world.position,
            uid=cmd.uid,
            attempt=cmd.attempt,
            generation=cmd.generation,
            job_name=cmd.job_name,
            model=cmd.model,
            node=cmd.node,
        )
        if self._append(decision) is None:
            log.info(f"attempt {cmd.attempt} already admitted elsewhere", extra={"backfill": f"{ns}/{name}"})
            return
        log.info(
            f"admitted attempt {cmd.attempt}: Job {cmd.job_name}",
            extra={"backfill": f"{ns}/{name}", "position": world.position, "decision": "AttemptAdmitted"},
        )
        self._event(ns, name, cmd.uid, "Admitted", f"idle window complete; creating Job {cmd.job_name} (attempt {cmd.attempt})")
        self.create_job(cmd.key, cmd.uid, cmd.attempt, cmd.job_name, world)

    def create_job(self, key: tuple[str, str], uid: str, attempt: int, job_name: str, world: World) -> None:
        """Create the attempt's Job from the CronJob template in ``world``; record ``JobCreated``.

        AlreadyExists with our controller ownerReference counts as created. Any refusal records
        ``JobCreateRejected`` (never ``JobFailed``: no Job exists) with the HTTP status, the API
        server's reason and message, and whether it is permanent
        (:func:`~backfill.core.events.create_rejection_is_permanent`: 400/422, or a template
        that cannot be built) or transient (403 quota, 404, 409 of a foreign Job, 429, 5xx, no
        response), so the projector blocks or backs off. Only a lost lease (``NotLeader``)
        propagates."""
        ns, name = key
        b = world.backfills.get(key)
        spec = b.spec if b is not None else None
        template = world.templates.get((ns, spec.template_ref)) if spec is not None else None
        common = dict(namespace=ns, backfill=name, name=job_name)
        rej = b.rejection if b is not None else None
        number = rej.count + 1 if rej is not None and rej.attempt == attempt else 1

        def reject(code: int, reason: str, message: str, permanent: bool, retry_after: float | None = None) -> None:
            log.error(
                f"Job {job_name} refused ({'permanent' if permanent else 'transient'}): HTTP {code} {reason}: {message}",
                extra={"backfill": f"{ns}/{name}", "position": world.position, "decision": "JobCreateRejected"},
            )
            self._append(
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
            body = build_job(template.job_template, namespace=ns, backfill=name, backfill_uid=uid, attempt=attempt, spec=spec)
        except ValueError as exc:
            reject(0, "InvalidTemplate", str(exc), permanent=True)
            return
        self._guard()
        try:
            created = self.batch.create_namespaced_job(ns, body)
            job_uid = created.metadata.uid
        except ApiException as exc:
            if exc.status == 409:
                try:
                    existing = self.batch.read_namespaced_job(job_name, ns)
                except Exception as read_exc:  # noqa: BLE001 - a transient refusal, retried
                    reject(409, "AlreadyExists", f"Job {job_name} exists and could not be read: {_first_line(read_exc)}", False)
                    return
                owners = existing.metadata.owner_references or []
                if not any(o.uid == uid and o.controller for o in owners):
                    reject(409, "AlreadyExists", f"Job {job_name} exists and is not owned by this ModelBackfill", False)
                    return
                job_uid = existing.metadata.uid
            else:
                code = int(exc.status or 0)
                reason, message = _status_of(exc)
                reject(code, reason, message, ev.create_rejection_is_permanent(code), _retry_after(exc))
                return
        except Exception as exc:  # noqa: BLE001 - no response (timeout, connection): transient
            reject(0, type(exc).__name__, _first_line(exc), permanent=False)
            return
        self._append(ev.JobCreated(at=self.clock(), uid=job_uid, **common))

    # -- cancel / delete ----------------------------------------------------------------------

    def cancel_many(self, cmds: list[Cancel], world: World) -> None:
        """Record the cancel decisions (one append), delete the Jobs (Background, in parallel),
        then emit the Events (on the side thread): nothing but the deletes waits on the API.

        A decision already stored (another instance decided it) still deletes: deletes are safe.
        """
        decisions = [
            ev.AttemptCancelled(
                at=self._decision_time(),
                namespace=c.key[0],
                backfill=c.key[1],
                cause=c.cause,
                basis=world.position,
                uid=c.uid,
                attempt=c.attempt,
                job_name=c.job_name,
                reason=c.reason,
                message=c.message,
            )
            for c in cmds
        ]
        self._guard()
        positions = self.append_records([encode(d) for d in decisions])
        self.appended += sum(p is not None for p in positions)
        if len(cmds) == 1:
            errors = [self._try_delete(cmds[0])]
        else:
            errors = list(self._pool.map(self._try_delete, cmds))
        for c, pos, error in zip(cmds, positions, errors):
            ns, name = c.key
            if error is not None:
                log.error(f"deleting Job {c.job_name} failed: {error}", extra={"backfill": f"{ns}/{name}"})
            if pos is not None:
                log.info(
                    f"cancelled attempt {c.attempt} ({c.reason}): {c.message}",
                    extra={"backfill": f"{ns}/{name}", "position": c.cause, "decision": "AttemptCancelled"},
                )
                self._event(ns, name, c.uid, c.reason, f"cancelled Job {c.job_name}: {c.message}", "Warning")

    def _try_delete(self, cmd: Cancel) -> str | None:
        try:
            self.delete_job(cmd.key, cmd.job_name, cmd.uid)
            return None
        except Exception as exc:  # noqa: BLE001 - retried by the projector's DeleteJob timer
            return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def delete_job(self, key: tuple[str, str], job_name: str, uid: str) -> None:
        """Delete the Job with ``propagationPolicy=Background``; a 404 records ``JobDeleted``."""
        ns, name = key
        self._guard()
        try:
            self.batch.delete_namespaced_job(job_name, ns, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._append(ev.JobDeleted(at=self.clock(), namespace=ns, backfill=name, name=job_name))

    # -- block / unblock ----------------------------------------------------------------------

    def block(self, cmd: Block, world: World) -> None:
        """Record ``BackfillBlocked`` (once per reason, cause and generation) and emit a Warning Event."""
        ns, name = cmd.key
        b = world.backfills.get(cmd.key)
        uid = b.uid if b is not None else ""
        decision = ev.BackfillBlocked(at=self._decision_time(), namespace=ns, backfill=name, cause=cmd.cause, basis=world.position, reason=cmd.reason, message=cmd.message)
        key = f"decision/{ns}/{name}/{uid}/block/{cmd.reason}/{cmd.cause}/{b.generation if b else 0}"
        if self._append(decision, key) is not None:
            log.info(f"blocked: {cmd.reason}: {cmd.message}", extra={"backfill": f"{ns}/{name}", "decision": "BackfillBlocked"})
            self._event(ns, name, uid, cmd.reason, cmd.message, "Warning")

    def unblock(self, cmd: Unblock, world: World) -> None:
        """Record ``BackfillUnblocked`` and emit an ``Unblocked`` Event."""
        ns, name = cmd.key
        b = world.backfills.get(cmd.key)
        uid = b.uid if b is not None else ""
        decision = ev.BackfillUnblocked(at=self._decision_time(), namespace=ns, backfill=name, cause=cmd.cause, basis=world.position)
        if self._append(decision, f"decision/{ns}/{name}/{uid}/unblock/{cmd.cause}") is not None:
            self._event(ns, name, uid, "Unblocked", "the blocking condition is gone")

    # -- finalizer ----------------------------------------------------------------------------

    def _update_finalizers(self, ns: str, name: str, uid: str, add: bool) -> bool:
        """Add or remove our finalizer with optimistic concurrency; False if the object is gone."""
        for _ in range(CONFLICT_RETRIES):
            try:
                obj = self.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL, name)
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
            obj["metadata"]["finalizers"] = finalizers
            self._guard()
            try:
                self.custom.replace_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL, name, obj)
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
        self._append(
            ev.FinalizerReleased(at=self._decision_time(), namespace=ns, backfill=name, uid=cmd.uid, cause=world.position, basis=world.position)
        )
        log.info("finalizer released", extra={"backfill": f"{ns}/{name}", "decision": "FinalizerReleased"})

    # -- status -------------------------------------------------------------------------------

    def write_status(self, key: tuple[str, str], status: Mapping[str, Any]) -> None:
        """Write ``status`` through the status subresource.

        Skips a status identical to the last one written for ``key``. Fields of the current
        status that the projector does not manage are kept, foreign conditions are kept, and
        the Ready condition keeps its ``lastTransitionTime`` while its status is unchanged.
        A 409 Conflict is retried on a fresh read.
        """
        with self._lock:
            if self._written.get(key) == status:
                return
        ns, name = key
        for _ in range(CONFLICT_RETRIES):
            try:
                obj = self.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL, name)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            current = obj.get("status") or {}
            merged = merge_status(current, status, self.clock())
            if merged == current:
                break
            obj["status"] = merged
            self._guard()
            try:
                self.custom.replace_namespaced_custom_object_status(API_GROUP, API_VERSION, ns, PLURAL, name, obj)
                break
            except ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:
                    raise
                log.info("status conflict; retrying on a fresh read", extra={"backfill": f"{ns}/{name}"})
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


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def _status_of(exc: ApiException) -> tuple[str, str]:
    """(reason, message) of an API error: the ``metav1.Status`` body if there is one."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    reason = str(body.get("reason") or exc.reason or "")
    message = str(body.get("message") or (exc.body if isinstance(exc.body, str) else "") or exc.reason or "")
    return reason, message.strip()


def _retry_after(exc: ApiException) -> float | None:
    """The ``Retry-After`` header of an API error in seconds (delta-seconds form only), or None."""
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None


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
