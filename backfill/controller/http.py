"""The controller's HTTP server: /metrics, /healthz, /readyz and POST /v1/foreground."""

from __future__ import annotations

import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .ingest import response_headers

log = logging.getLogger("backfill.controller.http")

#: Seconds a client may take to send its request (slow clients cannot pin a thread for ever).
REQUEST_TIMEOUT_SECONDS = 10.0


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
) -> ThreadingHTTPServer:
    """A ThreadingHTTPServer bound to ``host:port`` (port 0: any free port); not started.

    ``ready()`` answers /readyz and ``health()`` /healthz (None: always healthy); each returns a
    bool or ``(ok, problems)``: 200 ``ok`` or 503 with one problem per line in the body.
    ``ingest`` (optional) handles POST /v1/foreground through
    ``handle(method, headers, body, client) -> (status, dict)`` and has ``max_body_bytes``;
    without it the path is 404. With ``tls_cert`` and ``tls_key`` (PEM files) it serves HTTPS.

    Raises:
        OSError: the address cannot be bound; ssl.SSLError / OSError: unusable TLS files.
    """
    host, _, port = address.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        server_version = "modelbackfill"
        timeout = REQUEST_TIMEOUT_SECONDS

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet access log
            log.debug(fmt % args)

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, payload: dict, headers: dict | None = None) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, problems = _probe(health if path == "/healthz" else ready)
                if ok:
                    self._send(200, b"ok\n", "text/plain")
                else:
                    what = "unhealthy" if path == "/healthz" else "not ready"
                    body = "\n".join([what] + problems) + "\n"
                    self._send(503, body.encode(), "text/plain")
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path != "/v1/foreground" or ingest is None:
                self._json(404, {"error": "not found"})
                return
            declared = (self.headers.get("Content-Length") or "0").strip()
            if not (declared.isascii() and declared.isdigit() and len(declared) <= 18):
                self.close_connection = True
                self._json(400, {"error": "bad_request", "detail": "Content-Length must be a non-negative integer"})
                return
            length = int(declared)
            limit = getattr(ingest, "max_body_bytes", 1 << 20)
            # Never read more than the limit: an oversized declared length is refused unread
            # (the ingest endpoint answers 413 from the header) and the connection closed.
            if length > limit:
                body = b""  # unread; the endpoint sees the declared length and answers 413
                self.close_connection = True
            else:
                body = self.rfile.read(length) if length > 0 else b""
            try:
                code, payload = ingest.handle("POST", dict(self.headers.items()), body, self.client_address[0])
            except Exception as exc:  # noqa: BLE001
                log.exception(f"ingest failed: {exc}")
                code, payload = 500, {"error": "internal error"}
            self._json(code, payload, response_headers(code, payload))

    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
    server.daemon_threads = True
    if tls_cert is not None and tls_key is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(tls_cert), str(tls_key))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    """Run ``server.serve_forever`` on a daemon thread; returns the started thread."""
    t = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    t.start()
    return t
