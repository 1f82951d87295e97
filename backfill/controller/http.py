"""The controller's HTTP server: /metrics, /healthz, /readyz and POST /v1/foreground."""

from __future__ import annotations

import json
import logging
import ssl
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .ingest import PATH as INGEST_PATH, declared_length, response_headers

log = logging.getLogger("backfill.controller.http")

#: Seconds a client may take to send its request (slow clients cannot pin a thread for ever).
REQUEST_TIMEOUT_SECONDS = 10.0
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

Probe = Callable[[], "bool | tuple[bool, list[str]]"]


def _probe(check: Probe | None) -> tuple[bool, list[str]]:
    if check is None:
        return True, []
    try:
        out = check()
    except Exception as exc:  # noqa: BLE001 - a failing check is a failing probe, never a 500 page
        return False, [f"check failed: {type(exc).__name__}: {exc}"]
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
    ``ingest`` (optional) handles POST /v1/foreground through
    ``handle(method, headers, body, client) -> (status, dict)`` and has ``max_body_bytes``
    (every other method on the path goes to it unread: it answers 405 with ``Allow: POST``);
    without it the path is 404. /metrics, /healthz and /readyz answer GET and HEAD, any other
    method 405 (``Allow: GET, HEAD``); an unknown path is 404. Every error body is JSON
    (http.server's own error page included), never HTML. With ``tls_cert`` and ``tls_key`` (PEM files) it serves HTTPS: the listening socket stays plain
    and each accepted connection does its TLS handshake on its own thread, within
    ``handshake_timeout`` seconds (else it is closed), so a client that connects and sends nothing
    blocks neither the accept loop nor other clients. A plain-HTTP connection likewise has its own
    thread and ``REQUEST_TIMEOUT_SECONDS`` to send its request. The certificate and key files are
    looked at again at most every ``tls_reload_seconds``: a renewed pair is served from the next
    connection on (a pair that does not load is logged and the previous one kept).

    Raises:
        OSError: the address cannot be bound; ssl.SSLError / OSError: unusable TLS files.
    """
    host, _, port = address.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        server_version = "modelbackfill"
        timeout = REQUEST_TIMEOUT_SECONDS

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet access log
            log.debug(fmt % args)

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
            path = self.path.split("?", 1)[0]
            method = self.command
            self._unread_body()
            if path == INGEST_PATH and ingest is not None:
                self._ingest(b"")  # the endpoint answers 405 (JSON, Allow: POST) before anything else
            elif path not in _GET_PATHS:
                self._json(404, {"error": "not found"})
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
                self.close_connection = True
                self._json(411, {"error": "length_required",
                                 "detail": "send the body with a Content-Length header (no Transfer-Encoding)"},
                           {"Connection": "close"})
                return
            length = declared_length(self.headers["Content-Length"])
            if length is None:
                self.close_connection = True
                self._json(400, {"error": "bad_request", "detail": "Content-Length must be a non-negative integer"})
                return
            limit = getattr(ingest, "max_body_bytes", 1 << 20)
            # Never read more than the limit: an oversized declared length is refused unread
            # (the ingest endpoint answers 413 from the header) and the connection closed.
            if length > limit:
                body = b""  # unread; the endpoint sees the declared length and answers 413
                self.close_connection = True
            else:
                body = self.rfile.read(length) if length > 0 else b""
            self._ingest(body)

        def _ingest(self, body: bytes) -> None:
            try:
                code, payload = ingest.handle(self.command, dict(self.headers.items()), body, self.client_address[0])
            except Exception as exc:  # noqa: BLE001
                log.exception(f"ingest failed: {exc}")
                code, payload = 500, {"error": "internal error"}
            self._json(code, payload, response_headers(code, payload))

    if tls_cert is not None and tls_key is not None:
        server: ThreadingHTTPServer = _TLSServer(
            (host or "0.0.0.0", int(port)), Handler, _CertificateFiles(Path(tls_cert), Path(tls_key), tls_reload_seconds),
            handshake_timeout,
        )
    else:
        server = _Server((host or "0.0.0.0", int(port)), Handler)
    server.daemon_threads = True
    return server


#: The listen backlog (the kernel caps it at ``net.core.somaxconn``). The standard library's 5
#: made a burst of ingest reports (50 at once) wait a SYN retransmit (1 s) or be reset.
LISTEN_BACKLOG = 1024


class _Server(ThreadingHTTPServer):
    """A ThreadingHTTPServer with a listen backlog for bursts (:data:`LISTEN_BACKLOG`) whose
    per-connection errors are one structured log line, not a traceback on stderr."""

    request_queue_size = LISTEN_BACKLOG

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection's handler raised (a client that went away mid-request, mostly): log it
        (warning for anything but a reset or broken pipe) and go on serving the others."""
        exc = sys.exc_info()[1]
        client = client_address[0] if isinstance(client_address, tuple) and client_address else "?"
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug(f"connection from {client} ended: {type(exc).__name__}: {exc}")
        else:
            log.warning(f"request from {client} failed: {type(exc).__name__}: {exc}")


def _server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context for the PEM files ``cert`` and ``key``.

    Raises:
        ssl.SSLError / OSError: a file is missing, unreadable or not a matching pair."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


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
        self.context = _server_context(cert, key)
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
                log.warning(f"TLS certificate {self.cert} changed but does not load ({type(exc).__name__}: {exc}); "
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

    def __init__(self, address: tuple[str, int], handler: type, certificates: _CertificateFiles, handshake_timeout: float) -> None:
        self.certificates = certificates
        self.handshake_timeout = handshake_timeout
        super().__init__(address, handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """On the connection's thread: handshake within ``handshake_timeout`` s, then serve it."""
        request.settimeout(self.handshake_timeout)
        try:
            # handshakes now; detaches ``request``
            tls = self.certificates.current().wrap_socket(request, server_side=True)
        except (OSError, ValueError) as exc:  # ssl.SSLError, a timeout, a reset: drop this client only
            log.debug(f"TLS handshake with {client_address[0]} failed: {type(exc).__name__}: {exc}")
            return  # process_request_thread closes ``request``
        try:
            super().finish_request(tls, client_address)  # the handler sets its own request timeout
        finally:
            self.shutdown_request(tls)


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    """Run ``server.serve_forever`` on a daemon thread; returns the started thread."""
    t = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    t.start()
    return t
