"""Leader election on a ``coordination.k8s.io/v1`` Lease.

The holder renews every ``lease_renew_seconds``; another candidate takes the Lease over only
when it has seen the same Lease record (holder, renewTime, acquireTime, duration, transitions)
unchanged for ``leaseDurationSeconds`` (at most its own lease duration) on its own monotonic
clock, as client-go's ``observedTime`` does. The ``renewTime`` written by another replica is
never compared with this replica's wall clock: a standby whose clock ran 2.5-4 s ahead took the
Lease over while the leader still acted (helper-19's trial). The price, as in client-go: a
candidate that starts next to a Lease whose holder is already gone waits one lease duration
from its first read.
:meth:`LeaderElector.is_leader` is true until the local renew deadline (the start of the last
successful renew plus ``lease_duration - lease_renew``), so a leader that cannot renew stops
acting before anyone else may take over: the other candidate read the renewed record after it
was written, which was after the renew started.

Every Lease call carries a client-side ``_request_timeout`` (``request_timeout`` seconds), so an
unreachable or silent API server never blocks the election thread. While leading the thread
renews every ``renew`` seconds; while not leading it retries every ``retry`` seconds (1 s by
default, as client-go's ``RetryPeriod`` of 2 s in spirit): a leader whose Lease lapsed only because
the API server was unreachable finds its own identity still in the Lease and takes it back in the
first round after the server answers again. ``stop()`` releases a held Lease (holder cleared,
``leaseDurationSeconds: 1``) so a standby acquires it at once instead of after the lease duration.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from backfill.errorlines import api_status, error_line

log = logging.getLogger("backfill.controller.leader")

#: The Lease annotation in which the leader writes its event log's id
#: (:meth:`backfill.store.interface.EventLog.log_identity`): every replica must share one store.
LOG_ANNOTATION = "modelbackfill.ai.flexinfer/event-log"

#: Retry periods a takeable Lease whose record names another event log is left to the replicas
#: of that log before this one takes it (:meth:`LeaderElector._defer_to_the_log_owner`).
FOREIGN_DEFER_ROUNDS = 3


def _micro(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _without_retries(api: Any) -> Any:
    """A client like ``api`` whose calls are not retried by urllib3 (3 retries by default).

    A retried call would take up to four request timeouts; the election loop retries on its own,
    so one Lease call is bounded by ``request_timeout``.
    """
    cfg = copy.deepcopy(api.configuration)
    cfg.retries = 0
    return client.ApiClient(cfg)


def valid_holder(spec: Any, now: datetime, default_duration: float) -> str | None:
    """The identity that holds a Lease (its ``spec``, a ``V1LeaseSpec``) at ``now`` (aware UTC),
    or None: no holder, or its ``renewTime`` (else ``acquireTime``) plus
    ``leaseDurationSeconds`` (``default_duration`` seconds when unset) has passed.

    A wall-clock judgement, so it is used for a warning only (:func:`led_elsewhere`); an
    elector decides by :meth:`LeaderElector.try_acquire`'s observed time instead."""
    holder = spec.holder_identity or ""
    renewed = spec.renew_time or spec.acquire_time
    if not holder or renewed is None:
        return None
    if renewed.tzinfo is None:
        renewed = renewed.replace(tzinfo=timezone.utc)
    duration = spec.lease_duration_seconds or default_duration
    return holder if renewed + timedelta(seconds=duration) > now else None


def led_elsewhere(api: Any, name: str, namespace: str, now: datetime, duration: float, timeout: float) -> str | None:
    """For a controller started without leader election: the identity of another controller
    that holds the leader Lease ``namespace/name`` right now (one GET, ``timeout`` seconds), or
    None (no Lease, not held, expired, or the Lease cannot be read: nothing to say then).

    Two controllers acting on the same objects both admit and cancel; the caller warns."""
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(name, namespace, _request_timeout=timeout)
    except Exception:  # noqa: BLE001 - a warning only: absent, forbidden or unreachable, say nothing
        return None
    return valid_holder(lease.spec, now, duration) if lease.spec is not None else None


class LeaseNamespaceMissing(Exception):
    """The Lease's namespace does not exist (a configuration error, not a transient failure)."""

    def __init__(self, namespace: str) -> None:
        super().__init__(namespace)
        self.namespace = namespace


#: A number in a failure's text, for :meth:`LeaderElector.report_failure`'s "same failure".
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _seconds(value: float) -> str:
    """``value`` seconds for a log line: ``15``, ``0.5``, ``2,147,483,647`` (``:g`` wrote
    ``2.14748e+09`` of a Lease edited to the largest leaseDurationSeconds)."""
    return format(value, ",.3f").rstrip("0").rstrip(".")


def describe_failure(exc: BaseException, namespace: str) -> str:
    """One line for a failed Lease call: for an API error its status and the API server's own
    message (which names the user, verb and namespace of a 403), and for a 403 the fix: the RBAC
    the Lease needs in ``namespace``, or another Lease namespace."""
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason  # the failure itself, as the watchers say it (a new user's trial: "MaxRetryError: ... (Caused by ...)")
    if not isinstance(exc, ApiException):
        return error_line(exc)
    head = f"{exc.status} {exc.reason or ''}".strip()
    _, message = api_status(exc)  # the API server's own message, the one rule (backfill.errorlines)
    text = head + (f": {message}" if message and message != (exc.reason or "").strip() else "")
    if exc.status == 403:
        text += (f"; grant get, create and update on coordination.k8s.io leases in the namespace {namespace} "
                 "(the Role in deploy/base/rbac.yaml), or set --lease-namespace/BACKFILL_LEASE_NAMESPACE to the "
                 "namespace where they are granted; retrying every second")
    return text


class LeaderElector:
    """Acquire and renew a Lease in a background thread; ``is_leader()`` for the actor.

    Args:
        api: a ``kubernetes.client.ApiClient``.
        name, namespace: the Lease (``coordination.k8s.io/v1``).
        identity: this candidate's ``holderIdentity``.
        duration: ``leaseDurationSeconds``, seconds.
        renew: renew period while leading, seconds: the leader acts until ``duration - renew``
            after the start of its last renew (never when that is not positive: it never leads);
            :class:`backfill.settings.Settings` asks for ``duration >= 3 * renew``.
        retry: retry period while not leading, seconds (default ``min(1, renew)``).
        request_timeout: client-side timeout of every Lease call, seconds (default
            ``min(2.5, renew / 2)``), so one round (a read and a write) fits in the renew period.
        clock: the wall clock (timezone-aware UTC) written into the Lease; never compared with
            another replica's times.
        monotonic: the local clock, seconds, of the renew deadline and of when another holder's
            record was first seen (default ``time.monotonic``; a test advances it).
        log_identity: this replica's event log id, written into the Lease's
            :data:`LOG_ANNOTATION` while it leads; a holder that wrote another one is a replica
            on another store (:attr:`foreign_log`). None: not written, not compared.
    """

    def __init__(
        self,
        api: Any,
        *,
        name: str,
        namespace: str,
        identity: str,
        duration: float,
        renew: float,
        retry: float | None = None,
        request_timeout: float | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        monotonic: Callable[[], float] = time.monotonic,
        log_identity: str | None = None,
    ) -> None:
        self.api = api
        self.log_identity = log_identity
        #: ``(holder, its log id)`` while the Lease names a holder that writes to another event
        #: log than this replica's (replicas on separate stores), else None: /readyz says so.
        self.foreign_log: tuple[str, str] | None = None
        self._foreign_said: tuple[str, str] | None = None
        self._takeable: tuple | None = None  # a takeable Lease naming another log, and since when
        self._takeable_at = 0.0
        self.coord = client.CoordinationV1Api(_without_retries(api))
        self.name, self.namespace, self.identity = name, namespace, identity
        self.duration, self.renew = duration, renew
        self.retry = retry if retry is not None else min(1.0, renew)
        self.request_timeout = request_timeout if request_timeout is not None else min(2.5, renew / 2)
        self.clock, self.monotonic = clock, monotonic
        self._deadline = 0.0
        self._leading = False  # acquired and not yet seen lost or given up (for the "lost" warning)
        self._observed: tuple | None = None  # the Lease record last read (client-go's observedRecord)
        self._observed_at = 0.0  # self.monotonic() when that record was first read (observedTime)
        self.healthy = False  # the last attempt reached the API server
        self._reported: str | None = None  # the failure last logged (the same one is not logged again)
        self._standby_for: str | None = None  # the holder last logged as leading instead of us
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        """True while the lease is held and its local renew deadline has not passed."""
        return self.monotonic() < self._deadline

    def try_acquire(self) -> bool:
        """One acquire-or-renew round; returns whether this candidate holds the lease now."""
        t0 = self.monotonic()
        now = self.clock()
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            held = self._observed
            if held is not None and held[0] and held[0] != self.identity and self._observed_at + self._honoured(held[3]) > self.monotonic():
                # The Lease vanished (deleted by hand) while another candidate held it: its
                # record is honoured until it would have lapsed, and its holder creates it again
                # at its next renew (a trial: this standby created it at once and both led until
                # the old leader's next renew, up to 5 s; the old one admitted meanwhile).
                self._standing_by(held[0], held[3])
                return False
            try:
                self.coord.create_namespaced_lease(self.namespace, self._new_lease(now), _request_timeout=self.request_timeout)
            except ApiException as exc2:
                if exc2.status == 409:
                    # Another candidate created it first (the Lease was deleted by hand): a
                    # leader stops at once (a fault trial: it acted on until its old deadline,
                    # 4.5 s of two leaders).
                    self._standing_by("the candidate that created it first", self.duration)
                    return False
                if exc2.status == 404:  # the create of a namespaced object 404s only without its namespace
                    raise LeaseNamespaceMissing(self.namespace) from None
                raise
            return self._won(t0)
        spec = lease.spec
        holder = spec.holder_identity or ""
        theirs = (lease.metadata.annotations or {}).get(LOG_ANNOTATION)
        # A record written to another event log is another replica's even under this identity:
        # this one's previous process, restarted on another store (the Deployment's identity is
        # the pod's name; a re-trial: it took the Lease at once and deleted the running Job).
        foreign = bool(self.log_identity and theirs and theirs != self.log_identity)
        if foreign and holder == self.identity and self._leading:
            foreign = False  # our own record, its annotation edited by hand: this renew writes it back
        held = bool(holder) and (holder != self.identity or foreign) and self._held_by_another(spec)
        self._note_foreign(holder, theirs if foreign else None, held=held)
        if held:
            self._standing_by(holder, spec.lease_duration_seconds)
            return False
        if foreign and self._defer_to_the_log_owner(lease):
            # still the other log's Lease: not ready meanwhile (a re-trial read 200 for 0.5-3 s
            # at each handover)
            self.foreign_log = (holder or "the replica that released it", theirs)  # type: ignore[assignment]
            return False
        transitions = spec.lease_transitions or 0
        acquired = spec.acquire_time if holder == self.identity and spec.acquire_time else now
        if holder != self.identity:
            transitions += 1
        body = self.api.sanitize_for_serialization(lease)
        body["spec"] = self._spec(acquired, now, transitions)
        if self.log_identity:
            body["metadata"].setdefault("annotations", {})[LOG_ANNOTATION] = self.log_identity
        try:
            self.coord.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status == 409:
                self._deadline = 0.0
                return False
            raise
        if foreign:  # said once taken (a re-trial: said before a write that then lost the race)
            self._say_foreign("took the leader Lease over from", holder, theirs)  # type: ignore[arg-type]
        return self._won(t0)

    def check_namespace(self) -> None:
        """Check, before start-up's slow steps (migration, refold), that the Lease's namespace
        exists: a dry-run create of the Lease (``dryRun=All``: nothing is stored; the ``create``
        verb the election needs anyway). A new user's trial waited 2.5 s, through the migration,
        the refold and every watcher's start, for the one-line error of ``--lease-namespace
        nope``.

        Raises:
            LeaseNamespaceMissing: the create 404s (a namespaced create 404s only without its
                namespace). Any other failure (the Lease exists: 409; forbidden; unreachable) is
                left to the election rounds, which report it.
        """
        try:
            self.coord.create_namespaced_lease(
                self.namespace, self._new_lease(self.clock()), dry_run="All", _request_timeout=self.request_timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                raise LeaseNamespaceMissing(self.namespace) from None
        except Exception:  # noqa: BLE001 - unreachable, a timeout: the election rounds report it
            pass

    def _new_lease(self, now: datetime) -> dict:
        """The body of a Lease this candidate creates, holding it from ``now``."""
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.log_identity:
            metadata["annotations"] = {LOG_ANNOTATION: self.log_identity}
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": self._spec(now, now, 0)}

    def _note_foreign(self, holder: str, theirs: str | None, *, held: bool) -> None:
        """Set :attr:`foreign_log` from the Lease just read: while ``held`` by a holder whose
        record names ``theirs``, another event log's id than this replica's (None: the same
        log, or nothing to compare), and say so once per holder and id."""
        self.foreign_log = (holder, theirs) if held and theirs else None
        if self.foreign_log is not None and self.foreign_log != self._foreign_said:
            self._foreign_said = self.foreign_log
            self._say_foreign("the leader Lease is held by", holder, theirs)  # type: ignore[arg-type]

    def _say_foreign(self, what: str, holder: str, theirs: str) -> None:
        """The error line for a Lease whose record names another event log (an operator's
        trial: a replica on its own store took over silently, deleted the running Job as
        unexplained and set every status's attempts back to 0)."""
        who = holder if holder and holder != self.identity else (
            "this identity's previous process" if holder else "the replica that released it"  # a SIGTERM'd leader releases
        )
        log.error(
            f"{what} {who}, which writes to another event log (id {theirs}; this replica's: {self.log_identity}): every "
            "replica must use the same database and schema (BACKFILL_DATABASE_URL, or one BACKFILL_DATA_DIR for the "
            "embedded server); a replica on another store knows none of the other's runs"
        )

    def _defer_to_the_log_owner(self, lease: Any) -> bool:
        """True (stand by this round) until a takeable Lease whose record names another event
        log has stayed unchanged for :data:`FOREIGN_DEFER_ROUNDS` retry periods: a replica on
        that log's store (the right one) takes it first (a re-trial: a replica that knew it was
        on another store won 5 of 9 released Leases). It still takes it then: stopping work
        must not wait for a replica that may not exist."""
        record = (lease.spec.holder_identity, lease.spec.renew_time, lease.metadata.resource_version)
        seen = self.monotonic()
        if record != self._takeable:
            self._takeable, self._takeable_at = record, seen
        return seen - self._takeable_at < FOREIGN_DEFER_ROUNDS * self.retry

    def _held_by_another(self, spec: Any) -> bool:
        """Whether another candidate's record in ``spec`` is still valid: this elector first read
        it (unchanged since) less than its ``leaseDurationSeconds`` (else our duration) ago on
        :attr:`monotonic`, the read's end. client-go's ``observedTime`` rule (leaderelection.go)."""
        record = (spec.holder_identity, spec.renew_time, spec.acquire_time, spec.lease_duration_seconds,
                  spec.lease_transitions)  # fmt: skip
        seen = self.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, seen
        return self._observed_at + self._honoured(spec.lease_duration_seconds) > seen

    def _honoured(self, written: float | None) -> float:
        """Seconds another holder's unchanged record is honoured: its ``leaseDurationSeconds``
        (our duration when unset), never more than our own duration. A record claiming longer
        (a Lease edited by hand, or left by a release configured otherwise) held every replica
        standing by, nothing admitted or cancelled, for as long as it claimed (a fault trial:
        100,000 s). Every replica should run with the same duration: one whose holder renews
        less often than another's duration is taken over between its renews."""
        return min(written or self.duration, self.duration)

    def _spec(self, acquired: datetime, now: datetime, transitions: int) -> dict:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._written_duration(),
            "acquireTime": _micro(acquired),
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }

    def _written_duration(self) -> int:
        """``leaseDurationSeconds`` as written in the Lease: whole seconds (the API's int32), at least 1."""
        return max(1, int(round(self.duration)))

    def _won(self, t0: float) -> bool:
        was = self.is_leader()
        self._leading = True
        # Never past the Lease as written (whole seconds, at least 1): a deadline of
        # max(renew, duration - renew) outlived a Lease shorter than the renew period, and a
        # standby took over while this leader still acted (a new user's trial: duration 1, renew 5).
        self._deadline = t0 + min(self.duration, self._written_duration()) - self.renew
        self._standby_for = None
        if not was:
            log.info(f"acquired leader lease {self.namespace}/{self.name} as {self.identity}")
        return True

    def _standing_by(self, holder: str, written: float | None) -> None:
        """Another candidate holds a valid Lease (``written``: its ``leaseDurationSeconds``):
        this one does not lead. Logged once per holder (a standby said nothing at all, and a
        leader whose Lease was taken over did not say it had lost it, nor did one that was paused
        past its deadline and found another holder when it resumed: a new user's trial); a
        warning when the record claims longer than this replica honours (:meth:`_honoured`)."""
        was = self._leading
        self._deadline = 0.0
        self._leading = False
        honoured = self._honoured(written)
        if was:
            log.warning(f"lost leader lease {self.namespace}/{self.name}: it is held by {holder} now")
        elif holder != self._standby_for:
            log.info(
                f"standing by: leader lease {self.namespace}/{self.name} is held by {holder} "
                f"(taken over once its record has stayed unchanged for {_seconds(honoured)} s)"
            )
        if holder != self._standby_for and written and written > honoured:
            log.warning(
                f"leader lease {self.namespace}/{self.name}: {holder}'s record claims {_seconds(written)} s; this replica "
                f"honours at most its own lease duration, {_seconds(honoured)} s (BACKFILL_LEASE_DURATION_SECONDS: "
                "set the same on every replica)"
            )
        self._standby_for = holder

    def next_wait(self) -> float:
        """Seconds until the next round: the renew period while leading, else the retry period."""
        return self.renew if self.is_leader() else self.retry

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire()
                self.healthy = True
                if self._reported is not None:
                    log.info(f"leader election: the Lease {self.namespace}/{self.name} answers again")
                    self._reported = None
            except LeaseNamespaceMissing as exc:
                self.healthy = False
                log.error(f"leader election: namespace {exc.namespace} does not exist (create it or set BACKFILL_LEASE_NAMESPACE)")
            except Exception as exc:  # noqa: BLE001 - keep trying; is_leader() expires on its own
                self.healthy = False
                self.report_failure(exc)
            self._stop.wait(self.next_wait())

    def report_failure(self, exc: BaseException) -> None:
        """Log a failed round (:func:`describe_failure`) as a warning, unless it is the failure
        logged last: a refused Lease is one line with its fix, not a line every second. Two
        failures that differ only in numbers (a timeout's remaining seconds, a port) are one."""
        text = describe_failure(exc, self.namespace)
        key = _NUMBER.sub("#", text)  # "read timeout=0.4998" and "=0.4991" are one failure (a trial)
        if key != self._reported:
            log.warning(f"leader election: {text}")
            self._reported = key

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """Stop renewing; when holding the lease, release it so a standby takes over at once.

        Takes at most about ``3 * request_timeout + 0.5`` seconds (the join of an in-flight round,
        then one read and one replace): 8 s with the defaults, inside the Deployment's
        terminationGracePeriodSeconds (30 s) with the controller's own stop after it (at most 5 s).
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.request_timeout + 0.5)
        if release and self.is_leader():
            self._deadline = 0.0
            self._leading = False
            try:
                lease = self.coord.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.request_timeout)
                if lease.spec.holder_identity == self.identity:
                    body = self.api.sanitize_for_serialization(lease)
                    body["spec"]["holderIdentity"] = None
                    body["spec"]["leaseDurationSeconds"] = 1
                    body["spec"]["renewTime"] = _micro(self.clock())
                    self.coord.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=self.request_timeout)
                    log.info(f"released leader lease {self.namespace}/{self.name}")
            except Exception as exc:  # noqa: BLE001
                log.warning(f"leader election: release failed: {error_line(exc)}")
