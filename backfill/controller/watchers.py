"""One thread per watched resource: list, then watch from the list's resourceVersion.

The loop of a :class:`Watcher` never ends on its own: a failed call is logged and retried after
a capped exponential back-off (``settings.backoff_initial_seconds`` doubling up to
``settings.backoff_max_seconds``); a 410 Gone (expired resourceVersion) lists again. Every list
also reconciles the log's belief: an object the log thinks exists but the list does not return
(deleted while nobody watched) gets its "gone" event. Each batch of events is appended to the
event log, then ``signal`` is set so the reconcile loop wakes.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from backfill.core import events as ev
from backfill.core.events import encode
from backfill.core.jobtemplate import BACKFILL_LABEL
from backfill.settings import Settings

from .translate import Pair, Translator, vanished

log = logging.getLogger("backfill.controller.watchers")

GROUP, VERSION = "ai.flexinfer", "v1alpha2"


@dataclass(frozen=True)
class Resource:
    """What to watch: a name, list functions (namespaced / cluster-wide) and extra arguments."""

    name: str
    namespaced: Callable[..., Any]
    cluster: Callable[..., Any]
    args: tuple = ()
    kwargs: tuple = ()


def resources(api: Any) -> dict[str, Resource]:
    """The six watched resources for an ApiClient."""
    co = client.CustomObjectsApi(api)
    batch = client.BatchV1Api(api)

    def custom(plural: str) -> Resource:
        return Resource(
            plural,
            co.list_namespaced_custom_object,
            co.list_cluster_custom_object,
            (GROUP, VERSION),
            (("plural", plural),),
        )

    return {
        "backfill": custom("modelbackfills"),
        "model": custom("models"),
        "gaming": custom("gamingsessions"),
        "lease": custom("gpuleases"),
        "cronjob": Resource("cronjobs", batch.list_namespaced_cron_job, batch.list_cron_job_for_all_namespaces),
        "job": Resource(
            "jobs",
            batch.list_namespaced_job,
            batch.list_job_for_all_namespaces,
            kwargs=(("label_selector", BACKFILL_LABEL),),
        ),
    }


class BatchAppender:
    """Appends the watchers' events on one thread, in arrival order, as many per transaction as
    have queued up (group commit): a burst of watch events costs a few appends, not one each,
    and a watch thread never waits for the database between two watch events.

    ``append_async(records)`` queues; ``append_sync(records)`` queues and waits until they are
    committed (the relist uses it, so a watcher is only ``synced`` once its list is in the log).
    A failed append is retried with capped back-off, keeping order; ``signal`` is set after
    every committed batch.
    """

    def __init__(self, append: Callable[[list], list], signal: threading.Event, settings: Settings) -> None:
        self._append = append
        self._signal = signal
        self._settings = settings
        self._cond = threading.Condition()
        self._pending: list = []
        self._committed = 0  # records committed so far (a counter, for append_sync)
        self._queued = 0
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="watch-appender", daemon=True)
        self._thread.start()

    def append_async(self, records: list) -> int:
        """Queue ``records``; returns the ticket (the count of records queued so far)."""
        with self._cond:
            self._pending.extend(records)
            self._queued += len(records)
            self._cond.notify_all()
            return self._queued

    def append_sync(self, records: list, timeout: float | None = None) -> None:
        """Queue ``records`` and wait until they are committed.

        Raises:
            TimeoutError: not committed within ``timeout`` seconds (None: wait for ever) or stopped.
        """
        ticket = self.append_async(records)
        with self._cond:
            if not self._cond.wait_for(lambda: self._committed >= ticket or self._stopped, timeout):
                raise TimeoutError("the event log did not accept the watch events in time")
            if self._committed < ticket:
                raise TimeoutError("stopped before the watch events were committed")

    def stop(self, timeout: float = 5.0) -> None:
        """Commit what is queued (best effort within ``timeout``), then stop."""
        with self._cond:
            self._cond.wait_for(lambda: not self._pending, timeout)
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        backoff = self._settings.backoff_initial_seconds
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopped)
                if self._stopped and not self._pending:
                    return
                batch, self._pending = self._pending, []
            try:
                self._append(batch)
            except Exception as exc:  # noqa: BLE001 - keep the events and retry
                log.warning(f"appending {len(batch)} watch events failed: {type(exc).__name__}: {exc}; retrying in {backoff:.1f}s")
                with self._cond:
                    self._pending[:0] = batch
                    if self._stopped:
                        return
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, self._settings.backoff_max_seconds)
                continue
            backoff = self._settings.backoff_initial_seconds
            with self._cond:
                self._committed += len(batch)
                self._cond.notify_all()
            self._signal.set()


class Watcher(threading.Thread):
    """List + watch one resource forever (until ``stop`` is set), appending translated events.

    Args:
        kind: ``backfill``, ``model``, ``gaming``, ``lease``, ``cronjob`` or ``job``.
        resource: from :func:`resources`.
        namespace: watch only this namespace (None: all).
        translate: ``(type, obj, now) -> [(event, key)]``.
        known: ``() -> [(namespace, name, uid)]`` of objects the log believes exist (for the
            relist reconciliation); for ``job``, live attempts whose Job was observed.
        append: ``(records) -> Any``, synchronous (the relist's events are in the log before
            the watcher says it is synced).
        append_async: ``(records) -> Any`` for watch events (a :class:`BatchAppender`); None:
            use ``append``.
        signal: set after every appended batch.
        on_object: optional ``(type, obj)`` hook (the finalizer check of ModelBackfills).
    """

    def __init__(
        self,
        kind: str,
        resource: Resource,
        *,
        namespace: str | None,
        translate: Callable[[str, dict, datetime], list[Pair]],
        known: Callable[[], Iterable[tuple[str, str, str]]],
        append: Callable[[list], list],
        signal: threading.Event,
        clock: Callable[[], datetime],
        settings: Settings,
        stop: threading.Event,
        on_object: Callable[[str, dict], None] | None = None,
        append_async: Callable[[list], Any] | None = None,
    ) -> None:
        super().__init__(name=f"watch-{kind}", daemon=True)
        self.append_async = append_async
        self.kind = kind
        self.resource = resource
        self.namespace = namespace
        self.translate = translate
        self.known = known
        self.append = append
        self.signal = signal
        self.clock = clock
        self.settings = settings
        self.stop_event = stop
        self.on_object = on_object
        self.synced = threading.Event()
        self.lists = 0
        self._watch: watch.Watch | None = None

    # -- calls --------------------------------------------------------------------------------

    def _call(self, **kw: Any) -> Any:
        r = self.resource
        args = r.args + ((self.namespace,) if self.namespace else ())
        func = r.namespaced if self.namespace else r.cluster
        kwargs = dict(r.kwargs)
        kwargs.update(kw)
        if r.args:  # custom objects: (group, version, [namespace,] plural)
            plural = kwargs.pop("plural")
            return func, args + (plural,), kwargs
        return func, ((self.namespace,) if self.namespace else ()), kwargs

    def _list(self) -> tuple[list[dict], str]:
        func, args, kwargs = self._call()
        resp = func(*args, _preload_content=False, **kwargs)
        body = json.loads(resp.data)
        return body.get("items") or [], body["metadata"]["resourceVersion"]

    def _emit(self, pairs: list[Pair], *, wait: bool = True) -> None:
        if not pairs:
            return
        records = [encode(e, k) for e, k in pairs]
        if not wait and self.append_async is not None:
            self.append_async(records)  # the appender signals the loop once committed
            return
        self.append(records)
        self.signal.set()

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        backoff = self.settings.backoff_initial_seconds
        while not self.stop_event.is_set():
            try:
                rv = self._relist()
                backoff = self.settings.backoff_initial_seconds
                while not self.stop_event.is_set():
                    rv = self._watch_once(rv)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch expired (410 Gone); relisting", extra={"resource": self.kind})
                    continue
                log.warning(f"{self.kind} watch failed: HTTP {exc.status} {exc.reason}; retrying in {backoff:.1f}s")
            except Exception as exc:  # noqa: BLE001 - the loop must never die silently
                if self.stop_event.is_set():
                    break
                log.warning(f"{self.kind} watch failed: {type(exc).__name__}: {exc}; retrying in {backoff:.1f}s")
            if self.stop_event.wait(backoff):
                break
            backoff = min(backoff * 2, self.settings.backoff_max_seconds)

    def _relist(self) -> str:
        items, rv = self._list()
        now = self.clock()
        pairs: list[Pair] = []
        present: set[tuple[str, str]] = set()
        for obj in items:
            m = obj.get("metadata") or {}
            present.add((m.get("namespace", ""), m.get("name", "")))
            if self.on_object is not None:
                self.on_object("ADDED", obj)
            pairs.extend(self._translate("ADDED", obj, now))
        for ns, name, uid in self.known():
            if self.namespace and ns != self.namespace:
                continue
            if self.kind == "job":
                backfill, job = name.split("/", 1)
                if (ns, job) not in present:
                    e = ev.JobDeleted(at=now, namespace=ns, backfill=backfill, name=job, uid=uid)
                    pairs.append((e, e.natural_key()))
            elif (ns, name) not in present:
                pairs.append(vanished(self.kind, ns, name, uid, now, rv))
        self._emit(pairs)
        self.lists += 1
        self.synced.set()
        self.signal.set()
        return rv

    def _watch_once(self, rv: str) -> str:
        func, args, kwargs = self._call()
        w = watch.Watch()
        self._watch = w
        try:
            for event in w.stream(
                func,
                *args,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=int(self.settings.watch_timeout_seconds),
                deserialize=False,
                **kwargs,
            ):
                if self.stop_event.is_set():
                    break
                kind = event["type"]
                obj = event["object"]
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    rv = new_rv
                if kind == "BOOKMARK":
                    continue
                if self.on_object is not None:
                    self.on_object(kind, obj)
                self._emit(self._translate(kind, obj, self.clock()), wait=False)
        finally:
            self._watch = None
        return rv

    def _translate(self, kind: str, obj: dict, now: Any) -> list:
        """Translate one object; a malformed object is logged and skipped, never fatal to the watch
        (otherwise one bad object would stall this resource's events for every other object)."""
        try:
            return self.translate(kind, obj, now)
        except Exception as exc:  # noqa: BLE001
            m = obj.get("metadata") if isinstance(obj, dict) else None
            name = f"{m.get('namespace', '')}/{m.get('name', '')}" if isinstance(m, dict) else "?"
            log.warning(f"{self.kind} {name}: skipped a malformed object: {type(exc).__name__}: {exc}".splitlines()[0],
                        extra={"resource": self.kind})
            return []

    def halt(self) -> None:
        """Ask the thread to stop and close its open watch connection (best effort)."""
        self.stop_event.set()
        w = self._watch
        resp = getattr(w, "_resp", None) if w is not None else None
        if resp is not None:
            try:  # shutdown() unblocks a read in progress in the watcher thread (urllib3 >= 2.3)
                getattr(resp, "shutdown", resp.close)()
            except Exception:  # noqa: BLE001
                pass


def known_objects(world: Any, kind: str) -> list[tuple[str, str, str]]:
    """What the folded log believes exists, per watched kind, as (namespace, name, uid)."""
    if kind == "backfill":
        return [(b.namespace, b.name, b.uid) for b in world.backfills.values() if not b.gone]
    if kind == "model":
        return [(ns, name, "") for (ns, name), m in world.models.items() if m.exists]
    if kind == "gaming":
        return [(ns, name, "") for (ns, name) in world.gaming]
    if kind == "lease":
        return [(ns, name, "") for (ns, name) in world.leases]
    if kind == "cronjob":
        return [(ns, name, "") for (ns, name), t in world.templates.items() if t.job_template is not None]
    if kind == "job":
        out = []
        for (ns, name), a in world.live.items():
            if a.created_at is not None or a.started_at is not None:
                out.append((ns, f"{name}/{a.job_name}", a.job_uid))
        return out
    return []


def translator_for(t: Translator, kind: str) -> Callable[[str, dict, datetime], list[Pair]]:
    """The ``(type, obj, now) -> [(event, key)]`` function of ``translator`` for ``kind``."""
    return {
        "backfill": t.backfill,
        "model": t.model,
        "gaming": t.gaming_session,
        "lease": t.gpu_lease,
        "cronjob": t.cronjob,
        "job": t.job,
    }[kind]
