"""Direct foreground ingest: ``POST /v1/foreground``.

A router reports foreground requests per model, faster and finer than
``Model.status.lastActiveTime`` (which the platform's proxy writes about once a minute). Each
report becomes a :class:`~backfill.core.events.ForegroundRequest` event (``source="ingest"``);
in the controller the batch goes through the same intake as the watchers' events (folded in
memory by the preemptor, so a running backfill Job on that model is cancelled at once, even while
the store is away) and is appended to the log behind it.

This module knows nothing about HTTP servers or Kubernetes: :class:`IngestEndpoint.handle` takes
the method, headers, body and client address and returns ``(status, json_body)``. The HTTP server
routes ``POST /v1/foreground`` to it and adds the headers :func:`response_headers` names
(``WWW-Authenticate`` on 401, ``Retry-After`` on 429 and on a standby's 503). :meth:`IngestEndpoint.handle` never
raises: every failure is a JSON ``{"error": ..., "detail": ...}`` with a 4xx (client's fault,
nothing appended) or 503 (store or model lookup unavailable, or the replica still starting:
nothing appended; or ``not_leader``, below). A report that fails its own checks (schema, time
skew, an unknown Model) is refused alone: the call's other reports are acted on and appended,
and the 202 lists the refused ones under ``"rejected"`` (``[{"index": i, "error": ...,
"detail": ...}]``); only when every report is refused is the call a 422.

Request::

    POST /v1/foreground
    Authorization: Bearer <token>
    Content-Type: application/json

    {"reports": [{"namespace": "flexinfer-system", "model": "gemma4-26b-a4b-gptq-5930k",
                  "time": "2026-11-30T10:00:00Z", "count": 3, "id": "router-a/123"}]}

Response ``202 {"accepted": 1, "duplicates": 0}``, plus ``"spooled": n`` when ``n`` of the
accepted reports are acted on but not yet durable (the store did not answer in time): only the
leader answers so, since only the leader cancels, from memory, while the store is away. A standby
hands reports to the leader through the log alone; when the log did not take them within the wait
it answers ``503 {"error": "not_leader", ..., "spooled": n, "retry_after_seconds": 1}`` with
``Retry-After: 1`` (the reports stay spooled and reach the log later; the client retries, through
the Service, until a replica that can act, the leader, or a recovered log takes them). The
leader answers the same way, ``503 {"error": "cancel_unanswered", ...}``, when the log did not
take them and a cancel call of its own is unanswered (in flight or failed: the API server is
away from it, so it may be unable to act on them either), and ``503 {"error": "spool_full", ...}``
when reports this replica holds for the log fill their half of the spool (some of the call's
were neither acted on nor stored: retry). ``id`` is
optional: the idempotency key is the report's (UTC) time and its id, else its count, so
re-sending the same batch is harmless (:func:`idempotency_key`).

Order of checks: method (405), token (401), rate limit per client (429), content type (415),
declared body size (413), all from the headers before the body is read
(:meth:`IngestEndpoint.precheck`); then body size (413), JSON and the envelope (400 / 422), then
per report its schema, time skew and Model (refused alone; 422 when all are) (:meth:`IngestEndpoint.accept`). Before them
the HTTP server answers 411 ``length_required`` to a POST without ``Content-Length`` or with a
``Transfer-Encoding`` (http.server does not decode chunked bodies) and closes the connection.
"""

from __future__ import annotations

import hmac
import json
import math
import re
import threading
import logging
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator

from backfill.core.events import ForegroundRequest, encode
from backfill.core.records import EventRecord
from backfill.core.timefmt import parse_rfc3339
from backfill.errorlines import error_line
from backfill.settings import Settings

__all__ = [
    "PATH",
    "MAX_REPORTS",
    "ForegroundReport",
    "ForegroundBatch",
    "IngestEndpoint",
    "TokenBuckets",
    "RefusalNotes",
    "IngestClientError",
    "NotLeaderError",
    "ModelsNotLoadedError",
    "CancelUnansweredError",
    "SpoolFullError",
    "NOT_LEADER_RETRY_AFTER_SECONDS",
    "STARTING_RETRY_AFTER_SECONDS",
    "load_token",
    "idempotency_key",
    "response_headers",
    "report_foreground",
]

#: The route the HTTP server maps to :meth:`IngestEndpoint.handle`.
PATH = "/v1/foreground"
#: Most reports accepted in one call.
MAX_REPORTS = 1000
#: Largest ``count`` of one report (a sanity bound, not a rate).
MAX_COUNT = 1_000_000
#: Seconds a client is told to wait (``Retry-After``) before retrying a standby's ``503 not_leader``.
NOT_LEADER_RETRY_AFTER_SECONDS = 1
#: Seconds a client is told to wait before retrying a starting replica's ``503 starting`` (its log
#: not yet folded, its Models not yet listed: about a second at start-up).
STARTING_RETRY_AFTER_SECONDS = 1
_RFC3339 = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$")


#: A Content-Length of more significant digits than this is larger than any body limit.
_LENGTH_DIGITS = 18


def declared_length(header: str | None) -> int | None:
    """A ``Content-Length`` header's value in bytes, None when absent or not a non-negative
    decimal integer. A value of more than 18 significant digits is returned as ``2**62`` (over
    any limit: a 413), never converted (``int()`` refuses more than 4300 digits: a trial's
    hostile header got a 500)."""
    if header is None:
        return None
    text = header.strip()
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0")
    return int(digits or "0") if len(digits) <= _LENGTH_DIGITS else 1 << 62


# --------------------------------------------------------------------------- schema


class ForegroundReport(BaseModel):
    """One report: ``count`` foreground requests on ``namespace/model`` at ``time``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    namespace: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    model: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    #: RFC 3339 with a zone (``Z`` or ``+hh:mm``); naive times, numbers and digit strings are rejected.
    time: AwareDatetime
    count: int = Field(default=1, ge=1, le=MAX_COUNT)
    #: Optional client-chosen id: re-sending a report with the same id and time is a duplicate
    #: (:func:`idempotency_key`; the same id with another time is another report). Printable
    #: characters only (PostgreSQL text cannot hold NUL; control characters have no business here).
    id: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")

    @field_validator("time", mode="before")
    @classmethod
    def _rfc3339_text(cls, value: Any) -> Any:
        # pydantic reads "1796032770" as Unix seconds even in strict mode: require a date-time.
        if not isinstance(value, str) or not _RFC3339.match(value):
            raise ValueError("must be an RFC 3339 date-time with a zone, e.g. 2026-11-30T10:00:00Z")
        return parse_rfc3339(value)  # an aware UTC datetime (strict mode takes no strings here)


class ForegroundBatch(BaseModel):
    """The request body's envelope: 1 to :data:`MAX_REPORTS` reports, each validated on its own
    as a :class:`ForegroundReport` (:meth:`IngestEndpoint.accept`), so that one bad report is
    refused alone and the others are acted on."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    reports: list[Any] = Field(min_length=1, max_length=MAX_REPORTS)


def idempotency_key(report: ForegroundReport) -> str:
    """``ingest/{namespace}/{model}/{id}/{UTC time isoformat}``, or ``.../{UTC time
    isoformat}/{count}`` without an id.

    The time is always part of it: a re-sent report (same id, same time) is a duplicate, but an
    id used again with another time is another report (a new user's trial: a router whose
    ``router-a/N`` counter restarted had its new demand dropped as a duplicate, so the idle
    window was not restarted; and the leader, which had cancelled on it from memory, left a
    cancel the log could not explain). Two reports with one key therefore fold alike (the same
    model and time; ``count`` changes no decision)."""
    at = report.time.astimezone(timezone.utc).isoformat()
    tail = f"{report.id}/{at}" if report.id is not None else f"{at}/{report.count}"
    return f"ingest/{report.namespace}/{report.model}/{tail}"


log = logging.getLogger("backfill.controller.ingest")

#: Seconds between two log lines about the refused requests of one client with one error.
REFUSAL_LOG_SECONDS = 60.0


#: Refusal lines written at most in one REFUSAL_LOG_SECONDS, every client together.
REFUSAL_LOG_MAX_LINES = 100


class RefusalNotes:
    """The log lines of refused requests: a warning for a client's first refusal with an error
    (``unauthorized``, ``rate_limited``, ``spool_full``, ...), then at most one per client and
    error every ``every`` seconds, counting those refused meanwhile (a new user's trial: 401,
    429 and 503 ``spool_full`` answers wrote no line at all, so a router with a wrong token went
    unseen). At most ``max_lines`` such lines in any ``every`` seconds, every client together;
    past them one line when the window ends says how many were not logged (a re-trial: 1,500
    source addresses, each forgotten behind the others, wrote a line per request). Bounded
    memory: beyond ``max_keys`` pairs the least recently noted is forgotten."""

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        every: float = REFUSAL_LOG_SECONDS,
        max_keys: int = 1000,
        max_lines: int = REFUSAL_LOG_MAX_LINES,
    ) -> None:
        self._monotonic = monotonic
        self._every = every
        self._max_keys = max_keys
        self._max_lines = max_lines
        self._lock = threading.Lock()
        self._noted: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()  # -> (logged at, refused since)
        self._window = (-float("inf"), 0, 0)  # (start, lines written, refusals not logged) of the current window

    def note(self, client: str, status: int, body: Mapping[str, Any]) -> None:
        """Note one answer ``(status, body)`` to ``client``; only a refusal (4xx, 5xx) counts."""
        if status < 400:
            return
        error = str(body.get("error"))
        key, now = (client, error), self._monotonic()
        with self._lock:
            last = self._noted.get(key)
            if last is not None and now - last[0] < self._every:
                self._noted[key] = (last[0], last[1] + 1)
                return
            start, lines, unlogged = self._window
            if now - start >= self._every:
                if unlogged:
                    log.warning(f"ingest: {unlogged:,} more refused requests not logged in the last {now - start:.0f}s (at most "
                                f"{self._max_lines} lines every {self._every:g}s)")
                start, lines, unlogged = now, 0, 0
            if lines >= self._max_lines:
                self._window = (start, lines, unlogged + 1)
                return
            self._window = (start, lines + 1, unlogged)
            self._noted[key] = (now, 0)
            self._noted.move_to_end(key)
            while len(self._noted) > self._max_keys:
                self._noted.popitem(last=False)
        detail = str(body.get("detail"))
        detail = detail if len(detail) <= 200 else detail[:197] + "..."
        since = f" ({last[1]:,} more refused with {error} since the last line)" if last is not None and last[1] else ""
        log.warning(f"ingest: refused a request from {client}: {status} {error}: {detail}{since}")


# --------------------------------------------------------------------------- rate limit


class TokenBuckets:
    """A token bucket per client, with bounded memory.

    Each call to :meth:`take` costs one token; a bucket holds at most ``burst`` tokens and refills
    at ``rate`` tokens/s. A client idle long enough for its bucket to be full again is
    indistinguishable from a new one, so it is forgotten; beyond ``max_clients`` the least recently
    seen client is forgotten as well (it then starts with a full bucket: memory wins over
    precision under a flood of distinct addresses). Thread-safe.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        max_clients: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or burst < 1 or max_clients < 1:
            raise ValueError("rate must be > 0, burst and max_clients >= 1")
        self.rate = float(rate)
        self.burst = float(burst)
        self.max_clients = max_clients
        self._now = monotonic
        self._lock = threading.Lock()
        # client -> (tokens, last refill time); ordered by last use (oldest first).
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, client: str) -> float:
        """Take one token for ``client``: 0.0 if allowed, else the seconds until one is available."""
        with self._lock:
            now = self._now()
            self._evict_idle(now)
            tokens, last = self._buckets.pop(client, (self.burst, now))
            tokens = min(self.burst, tokens + max(0.0, now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[client] = (tokens - 1.0, now)
                wait = 0.0
            else:
                self._buckets[client] = (tokens, now)
                wait = (1.0 - tokens) / self.rate
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
            return wait

    def _evict_idle(self, now: float) -> None:
        full_after = self.burst / self.rate
        while self._buckets:
            client, (_tokens, last) = next(iter(self._buckets.items()))
            if now - last < full_after:
                return  # ordered by last use: every later one is more recent
            del self._buckets[client]


# --------------------------------------------------------------------------- endpoint


class ModelsNotLoadedError(RuntimeError):
    """Raised by ``known_model`` while the replica cannot tell which Models exist yet (starting:
    the log not yet folded, or the Models not yet listed). Answered 503 ``starting`` with
    ``Retry-After``: a starting replica answered 422 ``unknown_model`` for a Model that exists,
    and the router, told not to retry, dropped the demand (an adversarial trial; the ingest
    Service sends to replicas that are not ready)."""


class NotLeaderError(RuntimeError):
    """Raised by an ``append`` (``Controller.ingest_append``) on a replica that is not the leader
    when the log did not take the reports within its wait: only the leader cancels, and it learns
    of a standby's reports through the log alone. The reports are still spooled (``spooled`` of
    them not yet durable) and reach the log when it returns; the endpoint answers 503
    ``error`` with ``detail`` and ``Retry-After`` so the client retries (harmless: idempotency
    keys)."""

    error = "not_leader"
    detail = (
        "this replica is not the leader and the event log cannot take the report now, so the "
        "leader cannot learn of it; retry (the report is spooled here and reaches the log later; "
        "its idempotency key makes a retry harmless)"
    )

    def __init__(self, spooled: int) -> None:
        super().__init__(f"{self.error}: the event log did not take {spooled} report(s) in time")
        self.spooled = spooled


class CancelUnansweredError(NotLeaderError):
    """Raised by an ``append`` (``Controller.ingest_append``) on the leader when the log did not
    take the reports within its wait and a cancel call of this replica is still unanswered (in
    flight, or failed and waiting for its re-send): the reports are acted on by nobody yet. A
    chaos soak: with PostgreSQL down, a leader cut off from the API server answered 202 to a
    report; the router did not retry, the standby that took the Lease over never learnt of it,
    and the Job ran until the store came back (31 s). Answered as :class:`NotLeaderError`, with
    its own ``error``, so the client retries, through the Service, until a replica that can act
    takes the report."""

    error = "cancel_unanswered"
    detail = (
        "the event log cannot take the report now and a cancel call of this replica (the leader) has not "
        "been answered by the API server, so nobody may act on the report; retry (another replica may; "
        "the report is spooled here and reaches the log later; its idempotency key makes a retry harmless)"
    )


class SpoolFullError(NotLeaderError):
    """Raised by an ``append`` (``Controller.ingest_append``) when the spool had no room for
    ``dropped`` of the reports (the event log has been away long and the reports' share of the
    spool is full): those are neither acted on nor stored. Answered 503 ``spool_full`` with
    ``Retry-After`` (a fault trial: such reports were counted as ``duplicates``, so the router
    never sent them again). ``spooled`` of them were taken (acted on, stored later)."""

    error = "spool_full"
    detail = (
        "the event log has not taken reports for a while and this replica holds as many as it may in memory: "
        "some reports of this call were not taken (neither acted on nor stored); retry (its idempotency key "
        "makes a retry of the others harmless)"
    )

    def __init__(self, spooled: int, dropped: int) -> None:
        RuntimeError.__init__(self, f"{self.error}: {dropped} report(s) not taken, the spool is full")
        self.spooled = spooled
        self.dropped = dropped


def load_token(path: str | Path) -> str:
    """The bearer token in ``path`` (a mounted Secret key), surrounding whitespace stripped.

    Raises:
        ValueError: the file cannot be read (its ``strerror``, e.g. "No such file or
            directory"), is not UTF-8, or is empty; the message does not name the file.
    """
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(exc.strerror or str(exc)) from None
    if not token:
        raise ValueError("the file is empty")
    return token


def _error(status: int, error: str, detail: Any = None, **extra: Any) -> tuple[int, dict[str, Any]]:
    return status, {"error": error, "detail": detail, **extra}


def response_headers(status: int, body: Mapping[str, Any]) -> dict[str, str]:
    """Extra HTTP headers the server should send with ``(status, body)`` from :meth:`IngestEndpoint.handle`."""
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = str(body.get("www_authenticate", 'Bearer realm="modelbackfill"'))
    if status in (429, 503) and "retry_after_seconds" in body:
        headers["Retry-After"] = str(body["retry_after_seconds"])
    if status == 405:
        headers["Allow"] = "POST"
    return headers


def _validation_detail(exc: ValidationError, prefix: str = "") -> list[dict[str, Any]]:
    """pydantic's errors as ``{"field", "message", "type"}``, each field a dotted path below
    ``prefix`` (e.g. ``reports.1.time``)."""
    head = [prefix] if prefix else []
    return [
        {"field": ".".join(head + [str(p) for p in e["loc"]]), "message": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_input=False, include_context=False)
    ]


class IngestEndpoint:
    """``POST /v1/foreground`` as a plain callable (see the module docstring for the contract).

    Args:
        token: the bearer token clients must send (compared in constant time).
        append: takes the records, returning per record a position, None (duplicate) or 0
            (accepted, not yet durable), e.g. ``EventStore.append`` or the controller's
            ``Controller.ingest_append``; it raises :class:`NotLeaderError` on a standby that
            could not hand the records to the leader (answered 503 ``not_leader``), any other
            exception when the store failed (503 ``store_unavailable``).
        known_model: ``(namespace, model) -> bool``: does the Model exist (e.g. from the
            controller's cache)? Raises :class:`ModelsNotLoadedError` while it cannot tell yet.
        on_appended: called after an append that stored at least one new event (wakes the
            controller loop).
        settings: size, skew and rate limits (``ingest_*``).
        clock: now, timezone-aware.
        monotonic: the clock of the rate limiter (tests inject one).
        scope: the one namespace the controller watches (``settings.namespace``), or None for
            all: a report on another namespace is refused alone as ``namespace_not_watched``
            (a new user's trial read "no such Model" of a Model that existed outside it).
    """

    def __init__(
        self,
        token: str,
        append: Callable[[list[EventRecord]], list[int | None]],
        known_model: Callable[[str, str], bool],
        on_appended: Callable[[], None],
        settings: Settings,
        clock: Callable[[], datetime],
        *,
        monotonic: Callable[[], float] = time.monotonic,
        max_clients: int = 10_000,
        scope: str | None = None,
    ) -> None:
        if not token:
            raise ValueError("the ingest token must not be empty")
        self._expected = token.encode()
        self._append = append
        self._known_model = known_model
        self._on_appended = on_appended
        self._clock = clock
        self._scope = scope
        self.max_body_bytes = settings.ingest_max_body_bytes
        self.max_skew = timedelta(seconds=settings.ingest_max_skew_seconds)
        self.buckets = TokenBuckets(
            settings.ingest_rate_per_second, settings.ingest_burst, max_clients=max_clients, monotonic=monotonic
        )
        self.refusals = RefusalNotes(monotonic)

    # -- the one entry point --------------------------------------------------------------------

    def handle(self, method: str, headers: Mapping[str, str], body: bytes, client: str) -> tuple[int, dict[str, Any]]:
        """Handle one request; never raises. Returns ``(status, JSON-able body)``: the header
        checks (:meth:`precheck`), then the body's (:meth:`accept`)."""
        return self.precheck(method, headers, client) or self.accept(body, client)

    def precheck(self, method: str, headers: Mapping[str, str], client: str) -> tuple[int, dict[str, Any]] | None:
        """The checks a request's line and headers decide, before its body is read: method (405),
        token (401), rate limit (429, one token of ``client``'s bucket taken), content type (415),
        declared body size (413). ``(status, JSON-able body)`` of the first that fails, else None
        (then :meth:`accept` the body). Never raises. The HTTP server reads no body before this
        passes (an adversarial trial: 600 connections declaring 1 MiB with no token held 600 MiB)."""
        try:
            answer = self._precheck(method, headers, client)
        except Exception as exc:  # noqa: BLE001 - the controller must keep running
            answer = _error(500, "internal_error", error_line(exc))
        if answer is not None:
            self.refusals.note(client, *answer)
        return answer

    def accept(self, body: bytes, client: str = "") -> tuple[int, dict[str, Any]]:
        """The body of a request whose headers passed :meth:`precheck`: its size (413), JSON and
        envelope (400 / 422), per report its schema, time skew and Model (a report that fails
        one is refused alone and listed under ``rejected``; 422 when every report is; 503
        ``starting`` or ``model_lookup_unavailable`` when the Models cannot be told), then the
        append of the others (202, 503). Never raises. A refusal is logged
        (:class:`RefusalNotes`, under ``client``)."""
        try:
            answer = self._accept(body)
        except Exception as exc:  # noqa: BLE001 - the controller must keep running
            answer = _error(500, "internal_error", error_line(exc))
        self.refusals.note(client or "?", *answer)
        return answer

    def _precheck(self, method: str, headers: Mapping[str, str], client: str) -> tuple[int, dict[str, Any]] | None:
        if method.upper() != "POST":
            return _error(405, "method_not_allowed", f"{method} is not allowed; use POST", allow=["POST"])

        # The token before the rate limit: requests without it take nothing from their client's
        # bucket (an adversarial trial: 150 token-less POSTs from a router's address left its
        # own reports 429 rate_limited).
        h = {k.lower(): v for k, v in headers.items()}
        # The scheme is case-insensitive (RFC 7235 2.1; a trial: "bearer <token>" got 401), the
        # token compared in constant time.
        scheme, _, credentials = h.get("authorization", "").strip().partition(" ")
        presented = credentials.strip().encode() if scheme.lower() == "bearer" else b""
        if not hmac.compare_digest(presented, self._expected):
            reason = "missing bearer token" if not presented else "invalid bearer token"
            return _error(401, "unauthorized", reason, www_authenticate='Bearer realm="modelbackfill"')

        wait = self.buckets.take(client)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            return _error(
                429, "rate_limited", f"too many requests from {client}; retry after {retry} s", retry_after_seconds=retry
            )

        media_type, _, params = h.get("content-type", "").partition(";")
        if media_type.strip().lower() != "application/json":
            return _error(415, "unsupported_media_type", f"content type must be application/json, got {media_type.strip()!r}")
        charset = next(
            (p.split("=", 1)[1].strip().strip('"').lower() for p in params.split(";") if p.strip().lower().startswith("charset=")),
            "utf-8",
        )
        if charset not in ("utf-8", "utf8"):
            return _error(415, "unsupported_media_type", f"charset must be utf-8, got {charset!r}")

        declared = declared_length(h.get("content-length"))
        if declared is not None and declared > self.max_body_bytes:
            return _error(413, "payload_too_large", f"body over {self.max_body_bytes} bytes", limit=self.max_body_bytes)
        return None

    def _accept(self, body: bytes) -> tuple[int, dict[str, Any]]:
        if len(body) > self.max_body_bytes:
            return _error(413, "payload_too_large", f"body over {self.max_body_bytes} bytes", limit=self.max_body_bytes)

        try:
            batch = ForegroundBatch.model_validate_json(body)
        except ValidationError as exc:
            detail = _validation_detail(exc)
            if any(d["type"] == "json_invalid" for d in detail):
                return _error(400, "malformed_json", detail)
            return _error(422, "invalid_report", detail)

        # Each report is checked on its own: one that fails is refused alone and the others are
        # acted on (an adversarial trial: one report on a deleted Model, or with a time an hour
        # off, had the whole call answered 422, so the batch's valid demand was dropped, never
        # retried, and the running Job it should have cancelled ran on). The checks, in order:
        # schema, time skew, namespace (a namespaced controller's), Model.
        now = self._clock()
        refused: dict[int, tuple[str, Any]] = {}  # report index -> (error, detail)
        valid: list[tuple[int, ForegroundReport]] = []
        for i, raw in enumerate(batch.reports):
            try:
                r = ForegroundReport.model_validate(raw)
            except ValidationError as exc:
                refused[i] = ("invalid_report", _validation_detail(exc, f"reports.{i}"))
                continue
            if abs(r.time - now) > self.max_skew:
                refused[i] = ("time_out_of_range", {
                    "field": f"reports.{i}.time", "time": r.time.isoformat(),
                    "message": f"further than {self.max_skew.total_seconds():g} s from the controller's clock ({now.isoformat()})",
                })
                continue
            if self._scope is not None and r.namespace != self._scope:
                refused[i] = ("namespace_not_watched", {
                    "field": f"reports.{i}.namespace",
                    "message": f"this controller watches only the namespace {self._scope}, not {r.namespace}",
                })
                continue
            valid.append((i, r))
        pairs = list(dict.fromkeys((r.namespace, r.model) for _, r in valid))
        try:
            unknown = {pair for pair in pairs if not self._known_model(*pair)}
        except ModelsNotLoadedError as exc:
            return _error(503, "starting", str(exc), retry_after_seconds=STARTING_RETRY_AFTER_SECONDS)
        except Exception as exc:  # noqa: BLE001
            return _error(503, "model_lookup_unavailable", error_line(exc))
        for i, r in valid:
            if (r.namespace, r.model) in unknown:
                refused[i] = ("unknown_model", {"model": f"{r.namespace}/{r.model}", "message": f"no such Model: {r.namespace}/{r.model}"})
        rejected = [{"index": i, "error": e, "detail": d} for i, (e, d) in sorted(refused.items())]
        reports = [r for i, r in valid if i not in refused]
        if not reports:
            return _all_refused(rejected)

        records = [
            encode(
                ForegroundRequest(
                    at=r.time.astimezone(timezone.utc),
                    namespace=r.namespace,
                    model=r.model,
                    source="ingest",
                    count=r.count,
                ),
                idempotency_key(r),
            )
            for r in reports
        ]
        try:
            positions = self._append(records)
        except NotLeaderError as exc:  # and CancelUnansweredError
            return _error(503, exc.error, exc.detail, spooled=exc.spooled, retry_after_seconds=NOT_LEADER_RETRY_AFTER_SECONDS)
        except Exception as exc:  # noqa: BLE001
            return _error(503, "store_unavailable", error_line(exc))
        accepted = sum(1 for p in positions if p is not None)
        spooled = sum(1 for p in positions if p == 0)
        if accepted:
            try:
                self._on_appended()
            except Exception:  # noqa: BLE001 - the events are stored; the loop's poll catches up
                pass
        body: dict[str, Any] = {"accepted": accepted, "duplicates": len(records) - accepted}
        if spooled:
            body["spooled"] = spooled
        if rejected:
            body["rejected"] = rejected
        return 202, body


def _all_refused(rejected: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """The 422 of a call whose every report was refused: ``error`` the first check that failed
    in the order schema, time skew, namespace, Model; ``detail`` what that check found over the
    whole call (the field errors; the times; the namespaces; ``{"models", "message"}``);
    ``rejected`` every report's."""
    for kind in ("invalid_report", "time_out_of_range", "namespace_not_watched", "unknown_model"):
        found = [r["detail"] for r in rejected if r["error"] == kind]
        if not found:
            continue
        if kind == "invalid_report":
            detail: Any = [d for ds in found for d in ds]
        elif kind in ("time_out_of_range", "namespace_not_watched"):
            detail = found
        else:
            models = list(dict.fromkeys(d["model"] for d in found))
            detail = {"models": models, "message": "no such Model: " + ", ".join(models)}
        return _error(422, kind, detail, rejected=rejected)
    raise AssertionError(f"no refusal among {rejected!r}")  # pragma: no cover - called with refusals only


# --------------------------------------------------------------------------- example client


class IngestClientError(RuntimeError):
    """The endpoint answered with an error status (``status``, parsed JSON ``body``)."""

    def __init__(self, status: int, body: Any, retry_after: str | None = None) -> None:
        super().__init__(f"ingest failed with HTTP {status}: {body}")
        self.status = status
        self.body = body
        self.retry_after = retry_after


def _report_json(report: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(report)
    t = out.get("time")
    if isinstance(t, datetime):
        if t.tzinfo is None:
            raise ValueError("report time must be timezone-aware")
        out["time"] = t.isoformat()
    return out


def report_foreground(
    url: str, token: str, reports: Sequence[Mapping[str, Any]], timeout: float = 2.0
) -> dict[str, Any]:
    """Send foreground reports to a controller's ingest endpoint (standard library only).

    Args:
        url: the endpoint, e.g. ``https://modelbackfill-ingest.flexinfer-system.svc:8443/v1/foreground``.
        token: the bearer token.
        reports: dicts with ``namespace``, ``model``, ``time`` (aware datetime or RFC 3339 text),
            optional ``count`` (default 1) and ``id``.
        timeout: seconds for the whole call.

    Returns:
        The response body, ``{"accepted": n, "duplicates": m}``, plus ``"spooled": k`` when ``k``
        reports were acted on but are not durable yet (the leader's store is away): they live
        only in that replica's memory; send them again (same ``id``) until an answer has none;
        plus ``"rejected": [{"index", "error", "detail"}]`` for reports refused on their own
        (the others were taken; sending a refused one again is refused again).

    Raises:
        IngestClientError: the endpoint answered 4xx/5xx (``status``, ``body``, ``retry_after``);
            on a 429 or 503 with ``retry_after`` (a standby during a store outage: ``not_leader``),
            send the same reports again after that many seconds (a duplicate is harmless).
        urllib.error.URLError: the endpoint could not be reached.
    """
    data = json.dumps({"reports": [_report_json(r) for r in reports]}).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - caller's URL
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        raise IngestClientError(exc.code, body, exc.headers.get("Retry-After")) from None
