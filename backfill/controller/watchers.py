"""One thread per watched kind: list, then watch from the list's resourceVersion, for ever.

The loop of a :class:`Watcher` never ends on its own (kopf's ``infinite_watch``): a failed call
is logged and retried after a capped exponential back-off (``settings.backoff_initial_seconds``
doubling up to ``settings.backoff_max_seconds``); a 410 Gone (an expired resourceVersion, on the
watch call or as an ``ERROR`` event inside the stream) lists again at once.

Timeouts: every list has the client-side timeout ``settings.api_timeout_seconds``; every watch
asks the server to end it after ``settings.watch_timeout_seconds`` and reads with a client-side
timeout of that plus ``settings.watch_stale_margin_seconds``, so a connection that goes silent
(apiserver paused, a half-open TCP connection) raises and is restarted by a relist. Between
those, :attr:`Watcher.stale` tells the readiness probe that a watcher has heard nothing for too
long.

Every list also reconciles the log's belief: an object the log believed to exist *before the
list was requested* and that the list does not return was deleted while nobody watched, and gets
its "gone" event (:attr:`~backfill.controller.kinds.Kind.vanish`). Taking the belief before the
list (not after) is what makes this safe: an object created while the list is in flight (a Job
the actor has just created) cannot be reported as deleted, because the belief predates it.

Each batch of events goes to ``observe`` (the controller's intake: the spool and the preemptor):
a watch thread never waits for the database.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from datetime import datetime
from typing import Any, Callable, Iterable

from kubernetes.watch.watch import iter_resp_lines
from kubernetes.client.exceptions import ApiException

from backfill.settings import Settings
from backfill.errorlines import error_line

from .kinds import Kind, Known
from .translate import Pair

log = logging.getLogger("backfill.controller.watchers")

#: What the 404 hint of a missing custom resource kind suggests: the README's try-out commands
#: (`kubectl apply -f deploy/crds/` also feeds kubectl the directory's kustomization.yaml, an
#: error; and client-side apply warns on CRDs applied server-side before).
TRYOUT_CRDS = "kubectl apply --server-side -f tests/envtest/crds/ && kubectl apply --server-side -k deploy/crds"


#: The deepest JSON the API server serves: its decoder (``sigs.k8s.io/json``, Go's
#: ``encoding/json``: ``maxNestingDepth``) refuses a document nested deeper than this.
API_MAX_NESTING = 10_000


def allow_api_nesting() -> None:
    """Let Python's JSON decoders (``json``, and the kubernetes client's) read every document the
    API server serves: they stop at the interpreter's recursion limit (1,000 by default), the
    API server at :data:`API_MAX_NESTING` levels. Raises the limit (process-wide, never lowers it)
    to that plus room for the callers' own frames. An adversarial trial: a Model whose free-form
    status held a value nested 1,000 levels deep (or any object's ``metadata.managedFields``, a
    GamingSession in another namespace) made its kind's every list and watch fail with
    ``RecursionError``, for ever: nothing on another Model was admitted, and a running Job was
    not cancelled on its Model's ``lastActiveTime`` nor on gaming intent. Decoding 10,000 levels
    needs a deep C stack: :data:`WATCH_STACK_BYTES`."""
    need = API_MAX_NESTING + 2_000
    if sys.getrecursionlimit() < need:
        sys.setrecursionlimit(need)


#: C stack of a watcher thread, bytes: decoding :data:`API_MAX_NESTING` levels takes between 1
#: and 2 MiB (measured: a 1 MiB thread stack overflowed, 2 MiB did not), so it is set here, not
#: left to the platform (8 MiB with glibc, 128 KiB with musl).
WATCH_STACK_BYTES = 16 << 20


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class Watcher(threading.Thread):
    """List + watch one kind until ``stop`` is set, handing translated events to ``observe``.

    Args:
        kind: the watched kind (:data:`backfill.controller.kinds.KINDS`).
        api: a kubernetes ApiClient.
        namespace: watch only this namespace (None: all). A namespaced controller passes
            :meth:`~backfill.controller.kinds.Kind.watch_namespace`: None for the node-level
            signals (GamingSessions, GPULeases), which gate its Models from any namespace.
        translate: ``(type, obj, now) -> [(event, key)]``.
        known: ``() -> [(namespace, name, uid)]`` of objects the log believes exist.
        observe: ``(pairs) -> entries``; returns at once (the spool appends behind).
        committed: ``(entries, timeout) -> bool``, waits until a relist's events are in the log
            (bounded: a watcher is synced after ``settings.api_timeout_seconds`` even when the
            store is away; the reconcile loop admits nothing until the spool has settled).
        clock: aware UTC now.
        on_object: optional ``(type, obj)`` hook (the ModelBackfill object cache and finalizer).
        after: the ``listed`` events of the watchers named by ``kind.lists_after``; the first
            list waits for them, at most ``settings.api_timeout_seconds`` in all (a kind that
            cannot be listed delays this one once, never for ever).
        list_call / watch_call: override the kubernetes client functions (tests).
        on_answered: optional ``()`` hook called when a list succeeds after a failed list or
            watch: the API server answers again (the controller re-sends failed cancels then).
    """

    def __init__(
        self,
        kind: Kind,
        api: Any,
        *,
        namespace: str | None,
        translate: Callable[[str, dict, datetime], list[Pair]],
        known: Callable[[], Iterable[Known]],
        observe: Callable[[list[Pair]], Any],
        committed: Callable[[Any, float], bool] = lambda entries, timeout: True,
        clock: Callable[[], datetime],
        settings: Settings,
        stop: threading.Event,
        on_object: Callable[[str, dict], None] | None = None,
        list_call: Callable[..., Any] | None = None,
        after: Iterable[threading.Event] = (),
        on_answered: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name=f"watch-{kind.name}", daemon=True)
        allow_api_nesting()
        self.kind = kind
        self.namespace = namespace
        self.translate = translate
        self.known = known
        self.observe = observe
        self.committed = committed
        self.clock = clock
        self.settings = settings
        self.stop_event = stop
        self.on_object = on_object
        self.after = list(after)
        self.on_answered = on_answered
        self.listed = threading.Event()  # a first list was handed to ``observe``
        self.synced = threading.Event()
        self.lists = 0
        self.restarts = 0
        self.last_seen = time.monotonic()
        self._resp: Any = None  # the open watch response; halt_watch() shuts it down
        #: Why the last list or watch call failed (one line), None once one succeeds: while set,
        #: this kind's signals cannot be read and nothing is admitted (fail-closed).
        self.failing: str | None = None
        self._relist_wanted = False  # halt_watch(relist=True): list again before the next watch
        self._relist_timer: threading.Timer | None = None  # a paced relist pending (halt_watch after=...)
        if list_call is None:
            namespaced, cluster, args, kwargs = kind.list_functions(api)
            if namespace:
                fn = namespaced
                args = args + (namespace,)
            else:
                fn = cluster

            def list_call(**kw: Any) -> Any:
                return fn(*args, **{**kwargs, **kw})

        self._list_call = list_call

    # -- health -------------------------------------------------------------------------------

    @property
    def stale(self) -> bool:
        """True when nothing (event, bookmark, list, end of a watch) was heard for longer than the
        watch timeout plus the margin: the connection is presumed dead."""
        limit = self.settings.watch_timeout_seconds + self.settings.watch_stale_margin_seconds
        return time.monotonic() - self.last_seen > limit

    # -- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread with a C stack of :data:`WATCH_STACK_BYTES` (the deepest JSON the
        API server serves is decoded on it)."""
        old = threading.stack_size(WATCH_STACK_BYTES)
        try:
            super().start()
        finally:
            threading.stack_size(old)

    def run(self) -> None:
        deadline = time.monotonic() + self.settings.api_timeout_seconds
        for first in self.after:
            if not self._wait_until(first.is_set, deadline) and not self.stop_event.is_set():
                log.warning(
                    f"{self.kind.name}: listing before every kind it lists after ({', '.join(self.kind.lists_after)}) "
                    "has listed once", extra={"resource": self.kind.name},
                )
                break
        backoff = self.settings.backoff_initial_seconds
        missing = False  # the last failure was a 404: the resource (its CRD) did not exist
        while not self.stop_event.is_set():
            try:
                # a relist asked for from here on asks for another (it may have missed this one)
                self._relist_wanted = False
                rv = self.relist()
                if self.failing is not None and self.on_answered is not None:
                    self.on_answered()  # the API server answers again after failing
                self.failing = None
                backoff = self.settings.backoff_initial_seconds
                while not self.stop_event.is_set() and not self._relist_wanted:
                    rv = self.watch_once(rv)
                if self._relist_wanted:
                    self._relist_wanted = False
                    continue  # list again at once
            except WatchExpired:
                log.info("watch expired (410 Gone); relisting", extra={"resource": self.kind.name})
                self.restarts += 1
                continue
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch expired (410 Gone); relisting", extra={"resource": self.kind.name})
                    self.restarts += 1
                    continue
                if missing and exc.status != 404:
                    # the resource exists now (a CRD installed after the start): that is progress, and the
                    # next failure (a 429 while the new watch cache warms up) starts its own back-off; a
                    # new user's trial waited 30 s more, carried over from the 404s
                    backoff = self.settings.backoff_initial_seconds
                missing = exc.status == 404
                self.failing = f"HTTP {exc.status} {exc.reason}"
                hint = ""
                if exc.status == 404 and self.kind.custom:
                    crd = f"{self.kind.plural}.ai.flexinfer"
                    self.failing = f"CRD {crd} is not installed (HTTP 404 on list)"
                    hint = f": the CRD {crd} is not installed (for a local try-out: {TRYOUT_CRDS})"
                log.warning(
                    f"{self.kind.name} watch failed: HTTP {exc.status} {exc.reason}{hint}; retrying in {backoff:.1f}s",
                    extra={"resource": self.kind.name},
                )
            except Exception as exc:  # noqa: BLE001 - the loop must never die silently
                if self.stop_event.is_set():
                    break
                missing = False
                self.failing = error_line(exc)
                log.warning(
                    f"{self.kind.name} watch failed: {error_line(exc)}; "
                    f"relisting in {backoff:.1f}s",
                    extra={"resource": self.kind.name},
                )
            self.restarts += 1
            if self.stop_event.wait(backoff):
                break
            backoff = min(backoff * 2, self.settings.backoff_max_seconds)

    def relist(self) -> str:
        """List, observe every object and every vanished one; returns the list's resourceVersion."""
        believed = [k for k in self.known() if not self.namespace or k[0] == self.namespace]  # before the list
        resp = self._list_call(_preload_content=False, _request_timeout=self.settings.api_timeout_seconds)
        body = json.loads(resp.data)
        items, rv = body.get("items") or [], body["metadata"]["resourceVersion"]
        self.last_seen = time.monotonic()
        now = self.clock()
        pairs: list[Pair] = []
        present: set[tuple[str, str]] = set()
        uids: set[str] = set()  # an object the log knows by its uid is there under any name it is listed as
        for obj in items:
            m = obj.get("metadata") or {}
            present.add((m.get("namespace", ""), self.kind.list_name(obj)))
            uids.add(m.get("uid") or "")
            if self.on_object is not None:
                self.on_object("ADDED", obj)
            pairs.extend(self._translate("ADDED", obj, now))
        for ns, name, uid in believed:
            # (a Job of ours whose ownerReference and label someone removed: listed as nobody's,
            # still there, still the attempt's: an adversarial trial)
            if (ns, name) not in present and not (uid and uid in uids):
                pairs.append(self.kind.vanish(ns, name, uid, now, rv))
        entries = self.observe(pairs) if pairs else []
        log.info(
            f"{self.kind.name}: listed {len(items)} objects at resourceVersion {rv} ({len(pairs)} observations)",
            extra={"resource": self.kind.name},
        )
        self.listed.set()  # in the spool's order: a kind listing after this one lands behind it
        if entries:
            deadline = time.monotonic() + self.settings.api_timeout_seconds
            self._wait_until(lambda: self.committed(entries, 0.05), deadline)
        self.lists += 1
        self.synced.set()
        return rv

    def watch_once(self, rv: str) -> str:
        """One watch from ``rv`` until the server ends it; returns the last resourceVersion seen.

        The stream is read here, line by line (``kubernetes.watch.iter_resp_lines``), not
        through ``kubernetes.watch.Watch.stream``: that one, asked not to deserialize, fails on
        an ``ERROR`` event with ``KeyError: 'raw_object'`` (client 37), so an expired
        resourceVersion inside the stream looked like a broken connection (a warning and a
        back-off before the relist).

        Raises:
            WatchExpired: a 410 inside the stream. Other API errors (an HTTP 410 on the call
            included: ``ApiException``) and connection errors propagate.
        """
        s = self.settings
        resp = self._open_watch(
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=int(s.watch_timeout_seconds),
            _request_timeout=(s.api_timeout_seconds, s.watch_timeout_seconds + s.watch_stale_margin_seconds),
            _preload_content=False,
        )
        try:
            for line in iter_resp_lines(resp):
                self.last_seen = time.monotonic()
                if self.stop_event.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):
                    continue
                kind = event.get("type")
                obj = event.get("object")
                if not isinstance(obj, dict):
                    continue
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpired(obj.get("message", "resourceVersion too old"))
                    raise RuntimeError(f"watch ERROR event: {obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    rv = new_rv
                if kind == "BOOKMARK":
                    continue
                if self.on_object is not None:
                    self.on_object(kind, obj)
                pairs = self._translate(kind, obj, self.clock())
                if pairs:
                    self.observe(pairs)
            self.last_seen = time.monotonic()  # the server ended the watch: it is alive
        finally:
            self._resp = None
            for done in (resp.close, resp.release_conn):
                try:
                    done()
                except Exception:  # noqa: BLE001
                    pass
        return rv

    def _open_watch(self, **kw: Any) -> Any:
        """Open the watch request and keep its response for :meth:`halt_watch`. A halt that came
        while the request was in flight (it saw no response to shut down) is honoured here, so a
        stopping watcher never waits for the server to end the watch."""
        resp = self._list_call(**kw)
        self._resp = resp
        if self.stop_event.is_set():  # halt() sets the event before it looks at _resp
            _shutdown(resp)
        return resp

    def _wait_until(self, done: Callable[[], bool], deadline: float) -> bool:
        """Poll ``done`` (every 50 ms at most) until it is true, ``deadline`` (monotonic seconds)
        passes or the watcher is halted; returns ``done()``'s last answer."""
        while True:
            if done():
                return True
            left = deadline - time.monotonic()
            if left <= 0 or self.stop_event.wait(min(0.05, left)):
                return done()

    def _translate(self, kind: str, obj: dict, now: Any) -> list:
        """Translate one object; a malformed object is logged and skipped, never fatal to the watch
        (otherwise one bad object would stall this kind's events for every other object)."""
        try:
            return self.translate(kind, obj, now)
        except Exception as exc:  # noqa: BLE001
            m = obj.get("metadata") if isinstance(obj, dict) else None
            name = f"{m.get('namespace', '')}/{m.get('name', '')}" if isinstance(m, dict) else "?"
            log.warning(
                f"{self.kind.name} {name}: skipped a malformed object: {error_line(exc)}",
                extra={"resource": self.kind.name},
            )
            return []

    def halt(self) -> None:
        """Ask the thread to stop and close its open watch connection (best effort)."""
        self.stop_event.set()
        self.halt_watch()

    def halt_watch(self, relist: bool = False, after: float = 0.0) -> None:
        """Close the open watch connection (best effort); with ``relist``, the watcher lists
        again before it watches again (however the closed watch ends). With ``after`` > 0 (the
        controller pacing relists that overflow the spool again) that happens ``after`` seconds
        from now, on a timer: the watch stays open meanwhile, so what it delivers (a Model's
        ``lastActiveTime``, a GamingSession) still cancels at once."""
        if after > 0:
            pending = self._relist_timer
            if pending is not None and pending.is_alive():
                return  # one paced relist at a time: asking again does not bring it closer
            if not self.stop_event.is_set():
                timer = threading.Timer(after, self.halt_watch, kwargs={"relist": relist})
                timer.daemon = True
                self._relist_timer = timer
                timer.start()
            return
        if relist:
            self._relist_wanted = True
        resp = self._resp
        if resp is not None:
            _shutdown(resp)


def _shutdown(resp: Any) -> None:
    """Unblock a read in progress on ``resp`` from another thread (urllib3 >= 2.3 ``shutdown``,
    else ``close``); best effort."""
    try:
        getattr(resp, "shutdown", resp.close)()
    except Exception:  # noqa: BLE001
        pass
