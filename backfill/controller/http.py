"""The controller's HTTP server: /metrics, /healthz, /readyz and POST /v1/foreground."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import sys
import threading
import time
from collections import Counter
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from backfill.errorlines import error_line

from .ingest import PATH as INGEST_PATH, declared_length, response_headers

log = logging.getLogger("backfill.controller.http")

#: Seconds a client may take to send its request (slow clients cannot pin a thread for ever).
REQUEST_TIMEOUT_SECONDS = 10.0
#: Seconds a client may take from the start of a request (of its connection, for the first:
#: the TLS handshake included) until the answer begins; then the connection is shut down. The
#: per-read REQUEST_TIMEOUT_SECONDS alone let a client that sends a byte every few seconds hold
#: its connection for ever.
REQUEST_DEADLINE_SECONDS = 30.0
#: Connections served at once (one thread each; bursts of 50 ingest reports fit). A connection
#: beyond them shuts the one that has waited longest for its request (line, headers or body) and
#: takes its slot: 128 idle connections, reopened as soon as closed, otherwise kept probes and
#: ingest out for good (an adversarial trial). When none is waiting (every one is being
#: answered) it is answered 503 at once (closed, over TLS) and not read. With MAX_HEADER_BYTES
#: and the ingest token checked before a body is read, clients without the token hold at most
#: 128 x 32 KiB. A trial: a client that opened connections and sent a
#: byte now and then held 18,700 threads of the controller and a load average of 590.
MAX_CONNECTIONS = 128
#: Bytes of a request's line and headers together; more is answered 431 (414 for the line alone).
#: http.server's own bounds (100 headers of 64 KiB each) let one connection hold 6.4 MB before
#: any routing (a trial: 100 connections, 791 MB).
MAX_HEADER_BYTES = 32 * 1024
#: Seconds the accept loop waits for the slot of a connection it shut for a new one (its thread
#: lets go of it within milliseconds).
EVICT_WAIT_SECONDS = 0.25
#: Seconds a new connection may send nothing before it ranks as silent (shut first at the
#: limit): its first byte comes within a round trip, and it is usually there when it is accepted.
SILENT_GRACE_SECONDS = 0.01
#: Seconds with no connection finding every slot taken before a time at the limit is over (its
#: end is logged then, not at every free slot in between).
LIMIT_QUIET_SECONDS = 5.0
#: Seconds between two warnings while connections stay at MAX_CONNECTIONS.
REFUSED_LOG_SECONDS = 60.0
#: Seconds a client may take to complete the TLS handshake; a slower or silent one is dropped.
#: The handshake runs on the connection's own thread, never on the accept loop, so a silent
#: client delays nobody else even before this expires.
TLS_HANDSHAKE_TIMEOUT_SECONDS = 5.0
#: Seconds between looks at the certificate and key files: a renewed pair (cert-manager renews the
#: Secret, the kubelet updates the mounted files) is served from the next connection after it,
#: without a restart.
TLS_RELOAD_CHECK_SECONDS = 5.0


#: The paths that answer GET and HEAD (any other method: 405).
_GET_PATHS = ("/metrics", "/healthz", "/readyz")
#: The answer to an unknown path: ``{"error", "detail"}`` as every error body (deploy/README).
NOT_FOUND = {"error": "not_found", "detail": f"no such path; the paths are {', '.join(_GET_PATHS)} (GET) and {INGEST_PATH} (POST)"}
#: The same with the ingest endpoint off: it names only the paths that answer, and why
#: ``/v1/foreground`` does not (a new user's trial: the detail listed it beside its own 404).
NOT_FOUND_NO_INGEST = {
    "error": "not_found",
    "detail": f"no such path; the paths are {', '.join(_GET_PATHS)} (GET); {INGEST_PATH} is off "
    "(set BACKFILL_INGEST_TOKEN_FILE to turn the ingest endpoint on)",
}

Probe = Callable[[], "bool | tuple[bool, list[str]]"]


def _answered(call: Callable[[], Any]) -> Any:
    """``call()``, or a 500 ``(status, body)`` when it raises (logged): a handler never dies of it."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001
        log.exception(f"ingest failed: {exc}")
        return 500, {"error": "internal_error", "detail": f"{type(exc).__name__} (logged by the controller)"}


def _probe(check: Probe | None) -> tuple[bool, list[str]]:
    if check is None:
        return True, []
    try:
        out = check()
    except Exception as exc:  # noqa: BLE001 - a failing check is a failing probe, never a 500 page
        return False, [f"check failed: {error_line(exc)}"]
    if isinstance(out, tuple):
        return bool(out[0]), list(out[1])
    return bool(out), []


def make_server(
    address: str,
    registry: CollectorRegistry,
    ready: Probe,
    ingest: Any = None,
    *,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    health: Probe | None = None,
    handshake_timeout: float = TLS_HANDSHAKE_TIMEOUT_SECONDS,
    tls_reload_seconds: float = TLS_RELOAD_CHECK_SECONDS,
) -> ThreadingHTTPServer:
    """A ThreadingHTTPServer bound to ``host:port`` (port 0: any free port); not started.

    ``ready()`` answers /readyz and ``health()`` /healthz (None: always healthy); each returns a
    bool or ``(ok, problems)``: 200 ``ok`` or 503 with one problem per line in the body.
    ``ingest`` (optional) handles POST /v1/foreground: ``precheck(method, headers, client) ->
    (status, dict) | None`` before the body is read (every other method on the path goes to it
    unread: it answers 405 with ``Allow: POST``; a refusal leaves the body unread), then
    ``accept(body) -> (status, dict)``;
    without it the path is 404. /metrics, /healthz and /readyz answer GET and HEAD, any other
    method 405 (``Allow: GET, HEAD``); an unknown path is 404. Every error body is JSON
    (http.server's own error page included), never HTML. With ``tls_cert`` and ``tls_key`` (PEM files) it serves HTTPS: the listening socket stays plain
    and each accepted connection does its TLS handshake on its own thread, within
    ``handshake_timeout`` seconds (else it is closed), so a client that connects and sends nothing
    blocks neither the accept loop nor other clients. A plain-HTTP connection likewise has its own
    thread and ``REQUEST_TIMEOUT_SECONDS`` for each read of its request; any request must be
    read within ``REQUEST_DEADLINE_SECONDS`` of its start, its line and headers within
    ``MAX_HEADER_BYTES``, and at most ``MAX_CONNECTIONS`` are served at once (one beyond shuts
    the one waiting longest for its request, or gets a 503 unread: :class:`_Server`). The certificate and key files are
    looked at again at most every ``tls_reload_seconds``: a renewed pair is served from the next
    connection on (a pair that does not load is logged and the previous one kept).

    Raises:
        OSError: the address cannot be bound; ssl.SSLError / OSError: unusable TLS files.
    """
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1]:8080, as Go writes it

    class Handler(BaseHTTPRequestHandler):
        server_version = "modelbackfill"
        timeout = REQUEST_TIMEOUT_SECONDS
        # TCP_NODELAY: a short write (a 100 Continue) waited ~40 ms over TLS for the client's
        # delayed ACK of the handshake's last bytes (Nagle; a re-trial)
        disable_nagle_algorithm = True

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet access log
            log.debug(fmt % args)

        def setup(self) -> None:
            super().setup()
            self.rfile = _HeaderBudget(self.rfile, MAX_HEADER_BYTES)

        def handle_one_request(self) -> None:
            """Each request of a connection (keep-alive) has REQUEST_DEADLINE_SECONDS until its
            answer and MAX_HEADER_BYTES for its line and headers."""
            self.server.deadlines.arm(self.connection)
            self.rfile.budget = self.rfile.limit
            super().handle_one_request()

        def send_response(self, code: int, message: str | None = None) -> None:
            self.server.deadlines.disarm()  # the request is read: the answer is not cut short
            super().send_response(code, message)

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            """http.server's own errors (a malformed request line, an over-long header...) as JSON, never HTML."""
            try:
                phrase = HTTPStatus(code).phrase
            except ValueError:
                phrase = "error"
            self.close_connection = True
            error = phrase.lower().replace(" ", "_").replace("-", "_")
            self._json(code, {"error": error, "detail": message or phrase}, {"Connection": "close"})

        def _send(self, code: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if getattr(self, "command", None) != "HEAD":  # a HEAD answer has the headers of the GET one and no body
                self.wfile.write(body)

        def _json(self, code: int, payload: dict, headers: dict | None = None) -> None:
            self._send(code, json.dumps(payload).encode(), "application/json", headers)

        def _unread_body(self) -> None:
            """A request whose body is not read: close the connection after the answer (the
            unread bytes would otherwise be taken for the next request)."""
            if self.headers.get("Content-Length", "0").strip() not in ("", "0") or self.headers.get("Transfer-Encoding"):
                self.close_connection = True

        def _route(self) -> None:
            """Every method but POST: GET/HEAD on the probes and /metrics, 405 (JSON, ``Allow``)
            for any other method on a known path, 404 JSON for an unknown path."""
            self.server.deadlines.disarm()  # the request is read (a body, if any, is left unread)
            path = self.path.split("?", 1)[0]
            method = self.command
            self._unread_body()
            if path == INGEST_PATH and ingest is not None:
                self._ingest_refused()  # the endpoint answers 405 (JSON, Allow: POST) before anything else
            elif path not in _GET_PATHS:
                self._json(404, NOT_FOUND if ingest is not None else NOT_FOUND_NO_INGEST)
            elif method not in ("GET", "HEAD"):
                detail = f"{method} is not allowed on {path}; use GET or HEAD"
                self._json(405, {"error": "method_not_allowed", "detail": detail, "allow": ["GET", "HEAD"]}, {"Allow": "GET, HEAD"})
            elif path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                ok, problems = _probe(health if path == "/healthz" else ready)
                if ok:
                    self._send(200, b"ok\n", "text/plain")
                else:
                    what = "unhealthy" if path == "/healthz" else "not ready"
                    body = "\n".join([what] + problems) + "\n"
                    self._send(503, body.encode(), "text/plain")

        def __getattr__(self, name: str) -> Any:
            # http.server dispatches a method M to do_M and answers an HTML 501 when there is
            # none: route every method (PUT, DELETE, PATCH, made-up ones...) through _route.
            if name.startswith("do_") and name != "do_POST":
                return self._route
            raise AttributeError(name)

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path != INGEST_PATH or ingest is None:
                self._route()  # 404, or 405 on a GET-only path
                return
            if self.headers.get("Transfer-Encoding") is not None or self.headers.get("Content-Length") is None:
                # http.server does not decode a chunked body (it read a valid report as an empty
                # one: 400 malformed_json, the report lost), and a Transfer-Encoding makes any
                # Content-Length beside it meaningless (RFC 9112 6.3). RFC 9110 15.5.12: 411.
                # The body is left unread, so the connection is closed after the answer.
                self._framing_refused(411, "length_required", "send the body with a Content-Length header (no Transfer-Encoding)")
                return
            if len({v.strip() for v in self.headers.get_all("Content-Length") or []}) > 1:
                # RFC 9112 6.3: a message with differing lengths is unrecoverable (a trial: the
                # size check read the last, the body read took the first: 250 MB read)
                self._framing_refused(400, "bad_request", "conflicting Content-Length headers")
                return
            length = declared_length(self.headers["Content-Length"])
            if length is None:
                self._framing_refused(400, "bad_request", "Content-Length must be a non-negative integer")
                return
            if self._ingest_refused():
                return  # the body is not read (a client without the token holds no memory with it)
            if self.request_version != "HTTP/1.0" and (self.headers.get("Expect") or "").strip().lower() == "100-continue":
                # The headers passed: send the body now (RFC 9110 10.1.1). Unanswered, a client
                # waits its own timeout first (a new user's trial: curl 1 s; the cancel a report
                # asks for that much later). http.server does this only when it speaks HTTP/1.1.
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = self.rfile.read(length) if length > 0 else b""
            self.server.deadlines.disarm()  # the request is read; the endpoint's own time is not the client's
            self._ingest_answer(*_answered(lambda: ingest.accept(body, self.client_address[0])))

        def _framing_refused(self, code: int, error: str, detail: str) -> None:
            """Answer an ingest POST whose body cannot be framed, unread (the connection then
            closed), and note it as the endpoint notes its own refusals (a re-trial: a chunked
            POST's 411 was the one refusal no line said)."""
            self.close_connection = True
            payload = {"error": error, "detail": detail}
            self._json(code, payload, {"Connection": "close"})
            refusals = getattr(ingest, "refusals", None)
            if refusals is not None:
                refusals.note(self.client_address[0], code, payload)

        def _ingest_refused(self) -> bool:
            """The endpoint's checks of the request line and headers (``ingest.precheck``: method,
            token, rate limit, content type, declared size); a refusal is answered here with the
            body unread (the connection then closed: :meth:`_unread_body`). True when refused."""
            refused = _answered(lambda: ingest.precheck(self.command, dict(self.headers.items()), self.client_address[0]))
            if refused is None:
                return False
            self._unread_body()
            self._ingest_answer(*refused)
            return True

        def _ingest_answer(self, code: int, payload: dict) -> None:
            self._json(code, payload, response_headers(code, payload))

    def ipv6(cls: type) -> type:  # an IPv6 address binds an AF_INET6 socket (a trial: [::1]:8090 did not resolve)
        return type(cls.__name__, (cls,), {"address_family": socket.AF_INET6}) if ":" in host else cls

    if tls_cert is not None and tls_key is not None:
        server: ThreadingHTTPServer = ipv6(_TLSServer)(
            (host or "0.0.0.0", int(port)), Handler, _CertificateFiles(Path(tls_cert), Path(tls_key), tls_reload_seconds),
            handshake_timeout, REQUEST_DEADLINE_SECONDS, MAX_CONNECTIONS,
        )
    else:
        server = ipv6(_Server)((host or "0.0.0.0", int(port)), Handler, REQUEST_DEADLINE_SECONDS, MAX_CONNECTIONS)
    server.daemon_threads = True
    return server


#: The listen backlog (the kernel caps it at ``net.core.somaxconn``). The standard library's 5
#: made a burst of ingest reports (50 at once) wait a SYN retransmit (1 s) or be reset.
LISTEN_BACKLOG = 1024


class _HeaderBudget:
    """A connection's input file whose ``readline`` (the request line and headers; a body is
    ``read``) yields at most ``limit`` bytes per request (``budget``, reset by the handler): past
    it a line longer than http.server accepts is returned, so it answers 414 (the line) or 431
    (a header) and reads no more."""

    def __init__(self, raw: Any, limit: int) -> None:
        self.raw = raw
        self.limit = limit
        self.budget = limit

    def readline(self, size: int = -1) -> bytes:
        if self.budget >= 0:
            line = self.raw.readline(self.budget + 1 if size < 0 else min(size, self.budget + 1))
            self.budget -= len(line)
            if self.budget >= 0:
                return line
        return b"x" * (size if size > 0 else 65537)  # over http.server's 65,536: refused

    def __getattr__(self, name: str) -> Any:  # read, close, closed, ...
        return getattr(self.raw, name)


def _shut(sock: socket.socket) -> None:
    """Shut connection ``sock`` down both ways (the plain socket's shutdown, also under TLS): a
    read blocked in it on the connection's thread returns, and the thread ends."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile


class _Deadlines:
    """The connections being read and when each must have been read: a connection whose
    deadline passes is shut down (its thread's blocked read returns, the thread ends).

    One entry per connection thread (``arm``/``disarm`` on that thread; :meth:`forget` when it
    ends), checked by one daemon thread every ``min(0.5, seconds / 4)`` seconds. A connection
    is *silent* from ``arm`` until :meth:`heard` (its first byte arrived)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._due: dict[int, tuple[socket.socket, float]] = {}  # thread ident -> (socket, monotonic deadline)
        self._silent: set[int] = set()  # thread idents of connections that have sent nothing yet
        self._client: dict[int, str] = {}  # thread ident -> its connection's client address
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self, sock: socket.socket, client: str | None = None) -> None:
        """The calling connection thread reads from ``sock`` now: due in ``seconds``. With
        ``client`` (its address): a new connection, silent until :meth:`heard`; without, the
        next request of the same connection."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="http-deadlines", daemon=True)
                    self._thread.start()
        with self._lock:
            ident = threading.get_ident()
            self._due[ident] = (sock, time.monotonic() + self.seconds)
            if client is not None:
                self._client[ident] = client
                self._silent.add(ident)

    def replace(self, sock: socket.socket) -> None:
        """The calling connection thread now reads from ``sock`` (the TLS socket that took over
        the armed one's descriptor: the armed socket object is detached, and shutting it down
        did nothing, so a connection mid-handshake held its slot until its handshake timeout;
        a re-trial: 300 clients that sent a byte of their ClientHello kept every probe out)."""
        with self._lock:
            ident = threading.get_ident()
            entry = self._due.get(ident)
            if entry is not None:
                self._due[ident] = (sock, entry[1])

    def heard(self) -> None:
        """The calling connection thread's client has sent its first byte."""
        with self._lock:
            self._silent.discard(threading.get_ident())

    def evict_oldest(self) -> bool:
        """Shut down a connection waiting for its request: one of the client with the most
        connections waiting, of those one that has sent nothing for
        :data:`SILENT_GRACE_SECONDS` since it connected, and of those the one that has waited
        longest (the earliest deadline); False when none is waiting. A new user's
        trial: over TLS a probe waiting for its handshake was as evictable as the 300 silent
        connections around it, reopened at once, and failed every probe; a re-trial's clients
        sent a byte of their ClientHello and stalled (silent first alone then shut the newest
        connection, a probe's, in the millisecond before its first byte was seen)."""
        with self._lock:
            if not self._due:
                return False
            waiting = Counter(self._client.get(i) for i in self._due)
            # silent for SILENT_GRACE_SECONDS: a client that connected and sent nothing; younger
            # ones rank as the rest (a re-trial: silent first shut the newest connection, a
            # probe's, in the moment before its first byte was seen, when every attacker had
            # sent a byte: half the probes failed)
            quiet = time.monotonic() + self.seconds - SILENT_GRACE_SECONDS
            ident = min(
                self._due,
                key=lambda i: (-waiting[self._client.get(i)], not (i in self._silent and self._due[i][1] <= quiet), self._due[i][1]),
            )
            sock = self._due.pop(ident)[0]
            self._silent.discard(ident)
        _shut(sock)
        return True

    def disarm(self) -> None:
        """The calling connection thread has read its request: not waiting for one now."""
        with self._lock:
            self._due.pop(threading.get_ident(), None)

    def forget(self) -> None:
        """The calling connection thread is done with its connection."""
        with self._lock:
            ident = threading.get_ident()
            self._due.pop(ident, None)
            self._silent.discard(ident)
            self._client.pop(ident, None)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(0.5, self.seconds / 4)):
            now = time.monotonic()
            with self._lock:
                late = [ident for ident, (_, due) in self._due.items() if due <= now]
                socks = [self._due.pop(ident)[0] for ident in late]
            for sock in socks:
                _shut(sock)


class _Server(ThreadingHTTPServer):
    """A ThreadingHTTPServer with a listen backlog for bursts (:data:`LISTEN_BACKLOG`) whose
    per-connection errors are one structured log line, not a traceback on stderr; it serves at
    most ``max_connections`` connections at once (one beyond shuts the one waiting longest for its
    request, or gets a 503 when none is waiting: :meth:`process_request`), each request read
    within ``deadline`` seconds (:class:`_Deadlines`)."""

    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type, deadline: float, max_connections: int) -> None:
        self.deadlines = _Deadlines(deadline)
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._refused = self._evicted = 0  # connections refused / shut for newer ones since the last line
        self._limit_since: float | None = None  # monotonic time the limit was reached (None: below it)
        self._limit_logged = 0.0
        self._limit_hit = 0.0  # monotonic time a connection last found every slot taken
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accept loop: a thread for ``request`` if one of the ``max_connections`` is free;
        else the slot of the connection waiting longest for its request, shut for it (the loop
        waits at most ``EVICT_WAIT_SECONDS`` for that slot); else :meth:`refuse` it."""
        if self._slots.acquire(blocking=False):
            self._below_limit()
        elif self.deadlines.evict_oldest() and self._slots.acquire(timeout=EVICT_WAIT_SECONDS):
            self._at_limit(evicted=True)  # the one waiting longest for its request made room
        else:
            self.refuse(request)
            self.shutdown_request(request)
            self._at_limit(evicted=False)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def _at_limit(self, evicted: bool) -> None:
        """Count a connection that found every slot taken (``evicted``: it took the slot of the
        one waiting longest for its request; else it was refused); a warning when the limit is
        first reached and then every ``REFUSED_LOG_SECONDS`` while it lasts, with the counts."""
        now = time.monotonic()
        self._limit_hit = now
        if self._limit_since is None:
            self._limit_since = self._limit_logged = now
            log.warning(f"HTTP: {self.max_connections} connections open, the most served at once: each new one shuts "
                        "one waiting for its request (the busiest client's, a silent one first, else the oldest), "
                        "or is answered 503 when none is waiting")
        if evicted:
            self._evicted += 1
        else:
            self._refused += 1
        if now - self._limit_logged >= REFUSED_LOG_SECONDS:
            log.warning(f"HTTP: still at {self.max_connections} connections: {self._evicted:,} shut for newer ones and "
                        f"{self._refused:,} refused in the last {now - self._limit_logged:.0f}s")
            self._evicted = self._refused = 0
            self._limit_logged = now

    def _below_limit(self) -> None:
        """A slot was free: the end of a time at the limit, if any, is logged with its counts,
        once no connection found the slots full for :data:`LIMIT_QUIET_SECONDS` (a re-trial: a
        pair of lines at every flip between a free slot and none, 630 lines in 3 minutes)."""
        if self._limit_since is not None and time.monotonic() - self._limit_hit >= LIMIT_QUIET_SECONDS:
            now = time.monotonic()
            log.info(f"HTTP: below {self.max_connections} connections again after {now - self._limit_since:.0f}s: "
                     f"{self._evicted:,} shut for newer ones and {self._refused:,} refused since the last line")
            self._limit_since = None
            self._evicted = self._refused = 0

    def first_byte_timeout(self) -> float:
        """Seconds a new connection may take to send its first byte (:meth:`first_byte`)."""
        return REQUEST_TIMEOUT_SECONDS

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """On the connection's thread: its first request is due in ``deadline`` seconds from now;
        it is served once its first byte arrives (:meth:`first_byte`), else closed."""
        self.deadlines.arm(request, client_address[0] if isinstance(client_address, tuple) and client_address else "?")
        try:
            if self.first_byte(request):
                super().process_request_thread(request, client_address)
            else:
                self.shutdown_request(request)
        finally:
            self.deadlines.forget()
            self._slots.release()

    def first_byte(self, request: Any) -> bool:
        """Wait (peek, nothing read) up to :meth:`first_byte_timeout` seconds for ``request``'s
        first byte and mark the connection heard (:meth:`_Deadlines.heard`: shut after every
        silent one when the slots run out); False when it closed, was shut or stayed silent."""
        try:
            request.settimeout(self.first_byte_timeout())
            if not request.recv(1, socket.MSG_PEEK):
                return False
        except OSError:  # a timeout, a reset, shut for a newer connection
            return False
        self.deadlines.heard()
        return True

    def refuse(self, request: Any) -> None:
        """Answer a connection over the limit, unread: 503 with ``Retry-After`` (best effort, not
        waiting on the client)."""
        body = b'{"error": "service_unavailable", "detail": "too many connections; retry"}'
        try:
            request.setblocking(False)
            request.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            request.recv(65536)  # what the client sent already: a close with it unread resets the answer
        except OSError:
            pass

    def server_close(self) -> None:
        self.deadlines.stop()
        super().server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection's handler raised (a client that went away mid-request, mostly): log it
        (warning for anything but a reset or broken pipe) and go on serving the others."""
        exc = sys.exc_info()[1]
        client = client_address[0] if isinstance(client_address, tuple) and client_address else "?"
        if isinstance(exc, (ConnectionError, TimeoutError, ssl.SSLError)):  # ssl: an EOF of a connection shut for a newer one (a re-trial: 1,454 warnings in 50 s)
            log.debug(f"connection from {client} ended: {error_line(exc)}")
        else:
            log.warning(f"request from {client} failed: {error_line(exc)}")


def _server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context for the PEM files ``cert`` and ``key``.

    Raises:
        ssl.SSLError / OSError: a file is missing, unreadable or not a matching pair."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


def _load_failure(exc: BaseException, cert: Path, key: Path) -> str:
    """Why the pair ``cert``, ``key`` did not load, in a few words: ``ssl.SSLError`` says only
    "[SSL] PEM lib" of a file that is not PEM, or of a key that does not match, and the error
    of a missing file names no file (a trial)."""
    if isinstance(exc, ssl.SSLError):
        return f"not a PEM certificate and its matching private key ({exc})"
    if isinstance(exc, OSError) and exc.strerror:
        missing = list(dict.fromkeys(str(p) for p in (cert, key) if not p.exists()))
        named = exc.filename or ", ".join(missing)
        return f"{exc.strerror}: {named}" if named else exc.strerror
    return str(exc)


class _CertificateFiles:
    """The server's TLS context, loaded again when the certificate or key file changes.

    At most every ``check_seconds`` (monotonic) the two files are stat()ed (a mounted Secret's
    files are symlinks the kubelet swaps at once); a changed pair is loaded into a new context
    for the connections after it. A pair that does not load (half written, mismatched) is
    logged once and the previous context kept, and tried again at the next change.

    Raises (from the constructor): ssl.SSLError / OSError for unusable files at start."""

    def __init__(self, cert: Path, key: Path, check_seconds: float = TLS_RELOAD_CHECK_SECONDS) -> None:
        self.cert, self.key, self.check_seconds = cert, key, check_seconds
        self._lock = threading.Lock()
        self._seen = self._signature()
        self._failed: tuple | None = None
        try:
            self.context = _server_context(cert, key)
        except (OSError, ValueError) as exc:  # named: "[SSL] PEM lib (_ssl.c:3905)" named neither file (a new user's trial)
            raise ValueError(f"TLS certificate file {cert}, key file {key}: {_load_failure(exc, cert, key)}") from None
        self._checked = time.monotonic()

    def _signature(self) -> tuple:
        out = []
        for path in (self.cert, self.key):
            try:
                st = path.stat()
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def current(self) -> ssl.SSLContext:
        """The context for a new connection (reloaded first when the files changed)."""
        with self._lock:
            if time.monotonic() - self._checked < self.check_seconds:
                return self.context
            self._checked = time.monotonic()
            seen = self._signature()
            if seen == self._seen or seen == self._failed:
                return self.context
            try:
                self.context = _server_context(self.cert, self.key)
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                self._failed = seen
                log.warning(f"TLS certificate {self.cert} changed but does not load ({error_line(exc)}); "
                            "still serving the previous one")
                return self.context
            self._seen, self._failed = seen, None
            log.info(f"TLS certificate {self.cert} reloaded")
            return self.context


class _TLSServer(_Server):
    """A ThreadingHTTPServer whose connections do their TLS handshake on their own thread.

    Wrapping the listening socket would run every handshake inside ``accept()`` on the accept
    loop, with no timeout: one connection that sends nothing would stall every other client
    (probes included) until it closed. Each connection uses the certificate files' current
    context (:class:`_CertificateFiles`: a renewed certificate is served without a restart).
    """

    def __init__(self, address: tuple[str, int], handler: type, certificates: _CertificateFiles, handshake_timeout: float,
                 deadline: float, max_connections: int) -> None:
        self.certificates = certificates
        self.handshake_timeout = handshake_timeout
        super().__init__(address, handler, deadline, max_connections)

    def refuse(self, request: Any) -> None:
        """Over TLS a connection over the limit is closed unanswered (a 503 would need a handshake)."""

    def first_byte_timeout(self) -> float:
        """The handshake's own timeout: a client that sends nothing is dropped after it."""
        return self.handshake_timeout

    def finish_request(self, request: Any, client_address: Any) -> None:
        """On the connection's thread: handshake within ``handshake_timeout`` s, then serve it."""
        request.settimeout(self.handshake_timeout)
        try:
            # detaches ``request``: the TLS socket owns its descriptor from here, so the deadlines
            # (and an eviction) shut that one down
            tls = self.certificates.current().wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as exc:
            log.debug(f"TLS setup with {client_address[0]} failed: {error_line(exc)}")
            return  # process_request_thread closes ``request``
        self.deadlines.replace(tls)
        try:
            tls.do_handshake()
        except (OSError, ValueError) as exc:  # ssl.SSLError, a timeout, a reset, an eviction: drop this client only
            log.debug(f"TLS handshake with {client_address[0]} failed: {error_line(exc)}")
            self.shutdown_request(tls)
            return
        try:
            super().finish_request(tls, client_address)  # the handler sets its own request timeout
        finally:
            self.shutdown_request(tls)


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    """Run ``server.serve_forever`` on a daemon thread; returns the started thread."""
    t = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    t.start()
    return t
