"""API objects -> observation events (pure: no kubernetes import, no I/O but warning logs, no clock).

Input objects are API JSON dicts (camelCase: raw watch JSON or
``ApiClient.sanitize_for_serialization`` output). Every function returns a list of
``(event, idempotency_key)`` pairs ready for :func:`backfill.core.events.encode`.

Keys make re-deliveries harmless: a watch event delivered twice, or the same object seen again
by a relist, maps to the same key and is stored once. State observations are keyed by
``uid`` + ``resourceVersion``; foreground demand by the ``lastActiveTime`` value; deletions by
``uid``; Job facts by their natural keys.

:class:`Translator` keeps the little memory a translation needs (the last ``lastActiveTime`` per
Model: a time moving forward is foreground demand at that time, an unchanged one is none);
``known_last_active`` seeds it from the log, so a relist after a restart does not take the
unchanged value for a new request. A value that changed but moved back, cannot be read or cannot
be believed is demand at the time it was written (:func:`written_at`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from datetime import datetime, timedelta
from typing import Any, Mapping

from backfill.core import events as ev
from backfill.core import indexes
from backfill.core.jobtemplate import backfill_of_job, labelled_backfill
from backfill.core.storable import MAX_NAME_CHARS, bounded, nul_path, unstorable_message, without_nul
from backfill.core.timefmt import parse_rfc3339, plus_seconds

Pair = tuple[Any, str]

log = logging.getLogger("backfill.controller.translate")

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: Seconds by which ``Model.status.lastActiveTime`` may lag the real last request
#: (cluster-contract: the proxy writes it at most about once a minute). Settings override it.
DEFAULT_SIGNAL_GRANULARITY = 60.0
#: A ``lastActiveTime`` further ahead of the controller's clock than this, seconds, is not
#: believed (a proxy with a bad clock, a typo): it is read as an unreadable value, foreground
#: demand *now* (fail-safe), and is not remembered as the Model's last activity (a trial: one
#: write of ``9999-12-31T23:59:59Z`` put the admission in year 9999, for good). The same bound
#: as the ingest endpoint's default ``ingest_max_skew_seconds``.
LAST_ACTIVE_MAX_AHEAD_SECONDS = 3600.0
#: Seconds a ``lastActiveTime`` may lag its write beyond the signal granularity (clocks apart,
#: whole-second stamps) before it is read as the write allows (``Translator._activity``).
LAST_ACTIVE_BEHIND_TOLERANCE_SECONDS = 5.0


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_rfc3339(value)
    except ValueError:
        return None


def written_at(obj: Mapping[str, Any], now: datetime) -> datetime | None:
    """When ``status.lastActiveTime`` was last written, by the API server's clock (UTC): the
    latest ``time`` of the ``metadata.managedFields`` entries that own the field (the API server
    stamps an entry whenever its manager changes one of its fields), never after ``now`` (the
    controller's clock). None when no entry names it (an object from a test, or a server without
    field management).

    A date the object carries is the same on every re-delivery, relist and restart, so a demand
    dated by it is stored once and folds the same in memory and in the log (an adversarial
    trial: a value an hour ahead dated "now" cancelled the running Job again at every restart,
    and ``replay`` then found decisions the log cannot explain)."""
    entries = _meta(obj).get("managedFields")
    latest = None
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, Mapping):
            continue
        fields = entry.get("fieldsV1")
        status = fields.get("f:status") if isinstance(fields, Mapping) else None
        if not isinstance(status, Mapping) or "f:lastActiveTime" not in status:
            continue
        t = _time(entry.get("time"))
        if t is not None and (latest is None or t > latest):
            latest = t
    return now if latest is not None and latest > now else latest


#: A Job's time further ahead of the controller's clock than this, seconds, is not believed: it
#: is read as the moment it is seen (:func:`_job_time`). Clocks a few seconds apart are normal.
JOB_TIME_MAX_AHEAD_SECONDS = 60.0


def _job_time(value: Any, now: datetime, created: datetime | None = None) -> datetime | None:
    """A Job's time (creation, start, completion, a condition's transition: the Job controller's
    and the API server's clocks) as UTC; ``now``, when it is seen, for one more than
    :data:`JOB_TIME_MAX_AHEAD_SECONDS` ahead of it; ``created`` (the Job's creation) for one
    before that; None when absent or unreadable. An adversarial trial: a ``completionTime`` in
    2030 counted 96,821,425 s of work, and one a day ahead held a ``repeatAfter: 1m`` backfill's
    next run a day; a re-trial: one a day back ended the run before its admission and the next
    was admitted at once, ``repeatAfter`` or not."""
    t = _time(value)
    if t is None:
        return None
    if (t - now).total_seconds() > JOB_TIME_MAX_AHEAD_SECONDS:
        t = now
    return created if created is not None and t < created else t


def _ident(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    m = _meta(obj)
    return m.get("namespace", "") or "", m.get("name", "") or "", m.get("uid", "") or "", str(m.get("resourceVersion", ""))


#: How a JSON value of each Python type is named in a message.
_JSON_KINDS = {str: "a string", list: "an array", int: "a number", float: "a number", bool: "a boolean"}


def _storable(content: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """``(content, "")``, or, when a NUL character is in it (the log cannot store one,
    :mod:`backfill.core.storable`), ``(content with U+FFFD for each NUL, the Blocked message)``:
    content copied into a Job is never changed silently."""
    where = nul_path(content, path)
    return (content, "") if not where else (without_nul(content), unstorable_message(where))


def model_node(obj: Mapping[str, Any]) -> str:
    """The Model's node: ``status.gpu.node``, else ``spec.nodeSelector["kubernetes.io/hostname"]``."""
    status = obj.get("status")
    gpu = status.get("gpu") if isinstance(status, Mapping) else None
    node = gpu.get("node") if isinstance(gpu, Mapping) else None
    if node:
        return _name(node)
    spec = obj.get("spec")
    selector = spec.get("nodeSelector") if isinstance(spec, Mapping) else None
    return _name(selector.get(HOSTNAME_LABEL)) if isinstance(selector, Mapping) else ""


def model_shared(obj: Mapping[str, Any]) -> str:
    """A Model's shared-GPU group, ``spec.gpu.shared`` ("" when absent or malformed)."""
    spec = obj.get("spec")
    gpu = spec.get("gpu") if isinstance(spec, Mapping) else None
    return _name(gpu.get("shared")) if isinstance(gpu, Mapping) else ""


def _name(value: Any) -> str:
    """A node name or shared group as the events carry it: text, "" for none, bounded to
    :data:`~backfill.core.storable.MAX_NAME_CHARS` (every source of one passes here, so bounded
    names still compare equal exactly when the names do)."""
    return bounded(str(value or ""), MAX_NAME_CHARS)


def _spec_key(prefix: str, obj: Mapping[str, Any], uid: str, rv: str) -> str:
    """``{prefix}/{uid}/gen/{metadata.generation}``: once per spec change, not per
    resourceVersion (a label, an annotation or a status write changes no generation: a fault
    trial's 30 label patches of a GamingSession stored 30 copies of it; a hostile-input trial's
    CronJob status writes, 20 copies of its template). Without a generation (never from an API
    server): ``{prefix}/{uid}/{rv}``."""
    generation = _meta(obj).get("generation")
    return f"{prefix}/{uid}/gen/{generation}" if isinstance(generation, int) and generation > 0 else f"{prefix}/{uid}/{rv}"


class Translator:
    """Turns watch events into log events. Thread-safe (one lock around its small memory).

    Args:
        known_last_active: optional ``(namespace, model) -> datetime | None``, the latest
            ``lastActiveTime`` the log holds for a Model (the projection's ``ModelState.last_active``).
        signal_granularity: seconds added to a ``lastActiveTime`` to make the busy span of its
            ForegroundRequest (``busy_until = lastActiveTime + granularity``): the proxy writes
            the field at most about once a minute, so the real last request may be that much
            later, and an idle window counted from the bare value could start early. Only this
            signal is padded; ingest reports carry their own times. The padding is stored in
            the event, so replay reproduces every decision whatever the setting is later.
    """

    def __init__(self, known_last_active: Any = None, *, signal_granularity: float = DEFAULT_SIGNAL_GRANULARITY) -> None:
        if not signal_granularity >= 0:
            raise ValueError(f"signal_granularity {signal_granularity!r} must be >= 0 seconds")
        self._pad = timedelta(seconds=signal_granularity)
        self._last_active: dict[str, datetime] = {}
        self._last_unreadable: dict[str, str] = {}  # uid -> mark of the last odd lastActiveTime write (_odd_write)
        self._odd_mode: dict[str, str] = {}  # GamingSession uid -> the odd spec.mode last warned about
        self._clock_noted: set[str] = set()  # Model uids whose lastActiveTime moved back or lagged its write (_note_clock)
        self._last_raw: dict[str, Any] = {}  # Model uid -> status.lastActiveTime as last seen (a value, not parsed)
        self._readiness: dict[str, tuple[str, str, str]] = {}  # Model uid -> (phase, node, shared) last emitted
        self._known = known_last_active
        self._lock = threading.Lock()

    def forget_seen(self) -> None:
        """Forget which ``lastActiveTime`` (and unreadable value) each Model was last seen with:
        the next observation is judged against the log's (``known_last_active``). After
        observations were dropped (the spool was full), a relist then offers the dropped demand
        again instead of taking it for already seen."""
        with self._lock:
            self._last_active.clear()
            self._last_unreadable.clear()
            self._readiness.clear()
            self._last_raw.clear()

    # -- ModelBackfill ------------------------------------------------------------------------

    def backfill(self, kind: str, obj: Mapping[str, Any], now: datetime) -> list[Pair]:
        """ModelBackfill -> BackfillApplied (key uid/generation), BackfillDeleting, BackfillDeleted.

        A ``spec`` that is not an object is applied as ``{}`` with an ``unstorable`` message
        (``Blocked InvalidSpec``), so the object gets a status and its finalizer is released."""
        ns, name, uid, rv = _ident(obj)
        if kind == DELETED:
            return [(ev.BackfillDeleted(at=now, namespace=ns, name=name, uid=uid), f"mbf/{uid}/deleted")]
        m = _meta(obj)
        raw = obj.get("spec") or {}
        if isinstance(raw, Mapping):
            spec, unstorable = _storable(dict(raw), "spec")
        else:  # stored under a looser CRD (a hostile-input trial: no status, and no finalizer release)
            spec, unstorable = {}, f"spec must be an object, not {_JSON_KINDS.get(type(raw), 'a ' + type(raw).__name__)}"
        out: list[Pair] = [
            (
                ev.BackfillApplied(
                    at=now,
                    namespace=ns,
                    name=name,
                    uid=uid,
                    generation=int(m.get("generation") or 0),
                    spec=spec,
                    unstorable=unstorable,
                ),
                f"mbf/{uid}/gen/{int(m.get('generation') or 0)}",
            )
        ]
        if m.get("deletionTimestamp"):
            out.append((ev.BackfillDeleting(at=now, namespace=ns, name=name, uid=uid), f"mbf/{uid}/deleting"))
        return out

    # -- Model --------------------------------------------------------------------------------

    def model(self, kind: str, obj: Mapping[str, Any], now: datetime) -> list[Pair]:
        """Model -> ModelReady/ModelNotReady/ModelDeleted, and a ForegroundRequest when
        ``status.lastActiveTime`` moved forward (key ``fg/{uid}/{lastActiveTime}``; busy until
        ``lastActiveTime`` + the signal granularity).

        Readiness is emitted when its phase, node or shared group differs from what this
        translator last emitted for the Model: the proxy rewrites the status about once a minute
        (``lastActiveTime``), and a ModelReady per rewrite doubled the log's growth on busy
        models (a trial). A restart, or :meth:`forget_seen`, emits it once again."""
        ns, name, uid, rv = _ident(obj)
        if kind == DELETED:
            with self._lock:
                self._last_active.pop(uid, None)
                self._last_unreadable.pop(uid, None)
                self._readiness.pop(uid, None)
                self._clock_noted.discard(uid)
                self._last_raw.pop(uid, None)
            return [(ev.ModelDeleted(at=now, namespace=ns, model=name), f"model/{uid}/deleted")]
        status = obj.get("status")
        status = status if isinstance(status, Mapping) else {}
        out: list[Pair] = []
        node, shared = model_node(obj), model_shared(obj)
        ready = status.get("phase") == "Ready"
        phase = "Ready" if ready else str(status.get("phase") or "")
        with self._lock:
            changed = self._readiness.get(uid) != (phase, node, shared)
            self._readiness[uid] = (phase, node, shared)
        if not changed:
            pass
        elif ready:
            out.append((ev.ModelReady(at=now, namespace=ns, model=name, node=node, shared=shared, uid=uid), f"model/{uid}/{rv}/ready"))
        else:
            out.append(
                (
                    ev.ModelNotReady(at=now, namespace=ns, model=name, phase=phase, node=node, shared=shared, uid=uid),
                    f"model/{uid}/{rv}/notready",
                )
            )
        raw = status.get("lastActiveTime")
        with self._lock:
            cold = uid not in self._last_raw  # the first look since the start (or forget_seen)
            unchanged = not cold and self._last_raw[uid] == raw
            self._last_raw[uid] = raw
        if unchanged:
            # Not written again: a re-delivery, or a write of other fields (a re-trial: a moved-back
            # value then counted as demand at every write of another status field by its owner).
            return out
        active = _time(raw)
        written = written_at(obj, now)
        if active is not None and (active - now).total_seconds() > LAST_ACTIVE_MAX_AHEAD_SECONDS:
            out.extend(self._unreadable_demand(ns, name, uid, raw, written, now, f"is more than {LAST_ACTIVE_MAX_AHEAD_SECONDS:g} s ahead of the controller's clock"))
        elif active is not None:
            with self._lock:
                prev = self._last_active.get(uid)
                if prev is None and self._known is not None:
                    prev = self._known(ns, name)
            if cold and prev is not None and active <= prev:
                # Not past what the log holds: taken as seen. Its write's stamp may have moved
                # since (a write of other fields by its owner): a re-trial's restart read such a
                # value as a new write and cancelled the running Job. A value moved back while no
                # controller watched is missed; the traffic it stood for writes again.
                return out
            at, key = self._activity(ns, name, uid, raw, active, written)
            with self._lock:
                moved = prev is None or at > prev
                if moved:
                    self._last_active[uid] = at
                    self._last_unreadable.pop(uid, None)  # an odd value seen again later is a new write
            if not moved and at < prev:
                out.extend(self._moved_back_demand(ns, name, uid, raw, prev, written, now))
            elif moved:
                out.append(
                    (
                        ev.ForegroundRequest(
                            at=at,
                            namespace=ns,
                            model=name,
                            source="lastActiveTime",
                            busy_until=plus_seconds(at, self._pad.total_seconds()) if self._pad else None,
                        ),
                        key,
                    )
                )
        elif raw is not None and raw != "":
            out.extend(self._unreadable_demand(ns, name, uid, raw, written, now))
        return out

    def _activity(self, ns: str, name: str, uid: str, raw: Any, active: datetime, written: datetime | None) -> tuple[datetime, str]:
        """``(activity time, idempotency key)`` of a readable ``lastActiveTime`` write: its value
        ``active``, key ``fg/{uid}/{value}``; but when the value is further behind its write
        (``written``: :func:`written_at`) than the signal granularity plus
        :data:`LAST_ACTIVE_BEHIND_TOLERANCE_SECONDS` -- a proxy whose clock is behind: the
        proxy writes the field within a granularity of the request it reports -- the earliest
        time the write allows, the write's time less the granularity, keyed by the write too
        (logged once per Model). A re-trial: a proxy 40 s behind, its values past the latest
        one seen, wrote every 2 s, each dated 40 s back; none extended the busy span the others
        had set, and a Job was admitted and ran 20 s through the writes."""
        if written is None:
            return active, f"fg/{uid}/{raw}"
        floor = written - self._pad
        if (floor - active).total_seconds() <= LAST_ACTIVE_BEHIND_TOLERANCE_SECONDS:
            return active, f"fg/{uid}/{raw}"
        self._note_clock(
            ns, name, uid,
            f"status.lastActiveTime {str(raw)[:64]!r} is {(written - active).total_seconds():.0f} s behind its write "
            f"({written.isoformat()}): read as {floor.isoformat()}",
        )  # fmt: skip
        return floor, f"fg/{uid}/{raw}/{written.isoformat()}"

    def _note_clock(self, ns: str, name: str, uid: str, what: str) -> None:
        """Log ``what`` of Model ``ns/name`` (a lastActiveTime behind its write or moved back):
        the Model's first such line at info, the others at debug (two proxies apart write one a
        minute each for ever)."""
        with self._lock:
            first = uid not in self._clock_noted
            self._clock_noted.add(uid)
        log.log(
            logging.INFO if first else logging.DEBUG,
            f"Model {ns}/{name}: {what}" + (" (later such writes: debug lines)" if first else ""),
            extra={"backfill": f"{ns}/{name}"},
        )

    def _odd_write(self, uid: str, raw: Any, written: datetime | None, now: datetime) -> tuple[datetime, str] | None:
        """``(when, mark)`` of a ``lastActiveTime`` write whose value is no activity time:
        ``when`` is its write ``written`` (:func:`written_at`), else ``now``; ``mark`` names the
        value and that write (a digest of the value, ``/`` the write's time when known), for the
        idempotency key. None when this translator saw that write already (a re-delivery)."""
        digest = hashlib.sha256(repr(raw).encode("utf-8", "backslashreplace")).hexdigest()[:16]
        mark = digest if written is None else f"{digest}/{written.isoformat()}"
        with self._lock:
            if self._last_unreadable.get(uid) == mark:
                return None
            self._last_unreadable[uid] = mark
        return (now if written is None else written), mark

    def _unreadable_demand(self, ns: str, name: str, uid: str, raw: Any, written: datetime | None, now: datetime, why: str = "") -> list[Pair]:
        """Fail safe (issue: hostile input): a ``lastActiveTime`` that changed but cannot be read
        (or, with ``why``, cannot be believed: :data:`LAST_ACTIVE_MAX_AHEAD_SECONDS`) counts as
        foreground demand when it was written (``written``: :func:`written_at`, else *now*), and says so
        (``source="lastActiveTime-unreadable"``).

        Keyed by a digest of the raw value and the write's time, so a re-delivery, relist or
        restart's look at the same write is stored once (and, dated the same, folds to nothing
        in memory either); another unreadable value, or the same one written again, is demand
        again. ``why`` is logged (a warning) once per such write."""
        seen = self._odd_write(uid, raw, written, now)
        if seen is None:
            return []
        when, mark = seen
        if why:
            log.warning(
                f"Model {ns}/{name}: status.lastActiveTime {str(raw)[:64]!r} {why}: taken as foreground demand "
                f"at its write ({when.isoformat()}), not as the model's last activity",
                extra={"backfill": f"{ns}/{name}"},
            )
        event = ev.ForegroundRequest(at=when, namespace=ns, model=name, source="lastActiveTime-unreadable")
        return [(event, f"fg/{uid}/unreadable/{mark}")]

    def _moved_back_demand(
        self, ns: str, name: str, uid: str, raw: Any, prev: datetime, written: datetime | None, now: datetime
    ) -> list[Pair]:
        """A ``lastActiveTime`` written with a value before the latest one seen (``prev``): a
        write by the proxy all the same -- a replica or a restarted proxy whose clock is behind
        -- so foreground demand (an adversarial trial: writes every 5 s, each 10 minutes back,
        were all ignored and a Job was admitted and ran through them). Dated when it was
        written (``written``: :func:`written_at`, else *now*) and busy for the signal granularity after it,
        as a value moving forward is; ``source="lastActiveTime-moved-back"``. The latest value
        stays the one a later write must pass to be dated by its own value. Keyed as
        :meth:`_unreadable_demand`. Logged once per such write (:meth:`_note_clock`)."""
        seen = self._odd_write(uid, raw, written, now)
        if seen is None:
            return []
        when, mark = seen
        self._note_clock(
            ns, name, uid,
            f"status.lastActiveTime moved back to {str(raw)[:64]!r} from {prev.isoformat()}: taken as foreground demand "
            f"at its write ({when.isoformat()})",
        )  # fmt: skip
        busy = plus_seconds(when, self._pad.total_seconds()) if self._pad else None
        event = ev.ForegroundRequest(at=when, namespace=ns, model=name, source="lastActiveTime-moved-back", busy_until=busy)
        return [(event, f"fg/{uid}/moved-back/{mark}")]

    # -- GamingSession ------------------------------------------------------------------------

    def gaming_session(self, kind: str, obj: Mapping[str, Any], now: datetime) -> list[Pair]:
        """GamingSession -> GamingIntentStarted (gaming mode, unexpired; still while being
        deleted) or GamingIntentEnded.

        The mode is read fail-closed (seed: a signal that cannot be read -> do not start
        background work): only exactly ``inference`` is no intent; ``gaming``, an absent or empty
        mode and any other value (``Gaming``, `` gaming``, a typo, a non-string) are gaming
        intent (cluster-contract: ``mode`` is ``gaming`` by default, or ``inference``). A value
        that is neither is logged once per session (and again if it changes to another such
        value) as a warning saying it is taken as gaming intent."""
        ns, name, uid, rv = _ident(obj)
        spec = obj.get("spec") or {}
        expires = _time(spec.get("expiresAt"))
        mode = spec.get("mode")
        node = _name(spec.get("nodeName"))
        if kind == DELETED:
            with self._lock:
                self._odd_mode.pop(uid, None)
        elif mode not in (None, "", "gaming", "inference"):
            self._warn_odd_mode(ns, name, uid, mode)
        # A session being deleted (deletionTimestamp, finalizer held) is still intent until gone.
        if kind != DELETED and mode != "inference" and node and (expires is None or expires > now):
            return [
                (
                    ev.GamingIntentStarted(at=now, namespace=ns, session=name, node=node, expires_at=expires),
                    f"{_spec_key('gaming', obj, uid, rv)}/started",
                )
            ]
        # (ended by its spec, or by its expiry passing: once per generation either way)
        key = f"gaming/{uid}/deleted" if kind == DELETED else f"{_spec_key('gaming', obj, uid, rv)}/ended"
        return [(ev.GamingIntentEnded(at=now, namespace=ns, session=name), key)]

    def _warn_odd_mode(self, ns: str, name: str, uid: str, mode: Any) -> None:
        """Warn that ``spec.mode`` (neither ``gaming`` nor ``inference``) is taken as gaming
        intent: once per session uid and value (a relist or a status update says nothing new)."""
        shown = repr(mode)[:80]
        with self._lock:
            if self._odd_mode.get(uid) == shown:
                return
            self._odd_mode[uid] = shown
        log.warning(
            f"GamingSession {ns}/{name}: spec.mode {shown} is neither 'gaming' nor 'inference'; "
            "taken as gaming intent (fail-closed)",
            extra={"resource": "gamingsession"},
        )

    # -- GPULease -----------------------------------------------------------------------------

    def gpu_lease(self, kind: str, obj: Mapping[str, Any], now: datetime) -> list[Pair]:
        """GPULease -> GPULeaseActive (node, group, expiresAt), or GPULeaseEnded (deleted, or
        its ``expiresAt`` already past when seen: ended now, as a GamingSession's; a fault trial
        shortened a blocking lease to an expiry 10 minutes back, and the gate was taken as
        ended then: the Job was admitted 0.25 s after the edit, with ``idleFor`` 20s)."""
        ns, name, uid, rv = _ident(obj)
        if kind == DELETED:
            return [(ev.GPULeaseEnded(at=now, namespace=ns, lease=name), f"gpulease/{uid}/deleted")]
        spec = obj.get("spec") or {}
        expires = _time(spec.get("expiresAt"))
        if expires is not None and expires <= now:
            return [(ev.GPULeaseEnded(at=now, namespace=ns, lease=name), f"{_spec_key('gpulease', obj, uid, rv)}/ended")]
        return [
            (
                ev.GPULeaseActive(
                    at=now,
                    namespace=ns,
                    lease=name,
                    node=_name(spec.get("node")),
                    group=_name(spec.get("group")),
                    expires_at=expires,
                ),
                f"{_spec_key('gpulease', obj, uid, rv)}/active",
            )
        ]

    # -- CronJob ------------------------------------------------------------------------------

    def cronjob(self, kind: str, obj: Mapping[str, Any], now: datetime) -> list[Pair]:
        """CronJob -> CronJobSeen (its ``spec.jobTemplate``; key ``cronjob/{uid}/gen/{generation}``:
        once per spec change) or CronJobMissing."""
        ns, name, uid, rv = _ident(obj)
        if kind == DELETED:
            return [(ev.CronJobMissing(at=now, namespace=ns, name=name), f"cronjob/{uid}/deleted")]
        spec = obj.get("spec")
        template = spec.get("jobTemplate") if isinstance(spec, Mapping) else None
        # Not an object (a hostile or broken CronJob): an empty template, which the projector
        # blocks as invalid, never an exception that would skip the object.
        template, unstorable = _storable(dict(template) if isinstance(template, Mapping) else {}, "spec.jobTemplate")
        # Keyed by the spec's generation: the CronJob controller writes the status at every run
        # (lastScheduleTime, active).
        key = _spec_key("cronjob", obj, uid, rv)
        return [(ev.CronJobSeen(at=now, namespace=ns, name=name, job_template=template, unstorable=unstorable), key)]

    # -- owned Jobs ---------------------------------------------------------------------------

    def job(self, kind: str, obj: Mapping[str, Any], now: datetime) -> list[Pair]:
        """A ModelBackfill's Job -> JobCreated/JobRunning/JobSucceeded/JobFailed/JobDeleted, each
        with its natural key. The backfill is the Job's controller ownerReference (its full name,
        even past 63 characters; the label may be hashed); a Job without one but with the name
        label gives the same events with ``owned=False`` (see :class:`backfill.core.events._JobEvent`).

        Indexed Jobs (issue 11) also give ``JobProgress`` when ``status.completedIndexes`` is
        non-empty (normalised interval syntax; a malformed value is ignored), ``JobSuspended``
        when ``spec.suspend`` is true, condition ``Suspended`` is True and ``status.active`` is 0
        (the pods are gone), and ``JobResumed`` when ``spec.suspend`` is false and condition
        ``Suspended`` is False (the Job controller's ``JobResumed`` transition)."""
        ns, name, uid, _ = _ident(obj)
        m = _meta(obj)
        backfill = backfill_of_job(m)
        owned = backfill is not None
        if not owned:
            # Only labelled (ours with the ownerReference removed, or somebody else's): the fold
            # takes it only as an attempt's Job of the uid the log knows.
            backfill = labelled_backfill(m)
            if not backfill or not uid:
                return []
        common = dict(namespace=ns, backfill=backfill, name=name, uid=uid, owned=owned)
        if kind == DELETED:
            return _natural([ev.JobDeleted(at=now, **common)])
        created = _job_time(m.get("creationTimestamp"), now)  # (always there on an API server's Job)
        out: list[Any] = [ev.JobCreated(at=created or now, **common)]
        if m.get("deletionTimestamp"):
            out.append(ev.JobTerminating(at=_job_time(m.get("deletionTimestamp"), now, created) or now, **common))
        status = obj.get("status") or {}
        start = _job_time(status.get("startTime"), now, created)
        if start is not None:
            out.append(ev.JobRunning(at=start, **common))
        ranges = indexes.parse(status.get("completedIndexes"))
        done = indexes.format_ranges(ranges) if ranges else ""
        if done:
            active = status.get("active")
            active = active if isinstance(active, int) and not isinstance(active, bool) and active >= 0 else 0
            out.append(ev.JobProgress(at=now, completed_indexes=done, active=active, **common))
        spec = obj.get("spec") or {}
        suspend = spec.get("suspend") is True if isinstance(spec, Mapping) else False
        for c in status.get("conditions") or []:
            if not isinstance(c, Mapping):
                continue
            when = _job_time(c.get("lastTransitionTime"), now, created) or now
            if c.get("type") == "Suspended":
                # A suspension is keyed by the Job's resourceVersion (a resume and a re-suspend
                # before the Job controller flips the condition leave its time unchanged), a
                # resume by the condition's transition time (one per resume, not per status write).
                if c.get("status") == "True" and suspend and not status.get("active"):
                    out.append(ev.JobSuspended(at=when, completed_indexes=done, episode=_ident(obj)[3], observed_at=now, **common))
                elif c.get("status") == "False" and not suspend:
                    episode = str(c.get("lastTransitionTime") or _ident(obj)[3])
                    out.append(ev.JobResumed(at=when, completed_indexes=done, episode=episode, **common))
                continue
            if c.get("status") != "True":
                continue
            if c.get("type") == "Complete":
                out.append(ev.JobSucceeded(at=_job_time(status.get("completionTime"), now, created) or when, completed_indexes=done, **common))
            elif c.get("type") == "Failed":
                out.append(ev.JobFailed(at=when, reason=str(c.get("reason") or "JobFailed"), **common))
        return _natural(out)


def _natural(events: list[Any]) -> list[Pair]:
    return [(e, e.natural_key()) for e in events]


def vanished(kind: str, namespace: str, name: str, uid: str, now: datetime, list_rv: str) -> Pair:
    """The "gone" event for an object the log believes exists but a (re)list did not return.

    ``kind`` is one of ``backfill``, ``model``, ``gaming``, ``lease``, ``cronjob``; the key
    names the list's resourceVersion so a repeated relist of the same state is stored once.
    """
    key = f"relist/{kind}/{namespace}/{name}/{list_rv}"
    if kind == "backfill":
        return ev.BackfillDeleted(at=now, namespace=namespace, name=name, uid=uid), f"mbf/{uid}/deleted"
    if kind == "model":
        return ev.ModelDeleted(at=now, namespace=namespace, model=name), key
    if kind == "gaming":
        return ev.GamingIntentEnded(at=now, namespace=namespace, session=name), key
    if kind == "lease":
        return ev.GPULeaseEnded(at=now, namespace=namespace, lease=name), key
    if kind == "cronjob":
        return ev.CronJobMissing(at=now, namespace=namespace, name=name), key
    raise ValueError(f"unknown kind {kind!r}")
