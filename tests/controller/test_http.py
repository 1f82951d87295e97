"""The controller's HTTP server: TLS, and a declared body over the limit answered unread."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import logging
import ssl
import threading
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry

from backfill.controller.http import make_server
from backfill.controller.ingest import IngestEndpoint
from backfill.settings import Settings


def _self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_file, key_file


def _serve(server):
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    return t


def test_https_when_a_certificate_is_configured(tmp_path):
    cert, key = _self_signed(tmp_path)
    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True, tls_cert=cert, tls_key=key)
    _serve(server)
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        conn = http.client.HTTPSConnection("localhost", server.server_address[1], context=ctx, timeout=5)
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"ok\n")
        # plain HTTP on the TLS port does not get an answer
        plain = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
        try:
            plain.request("GET", "/healthz")
            status = plain.getresponse().status
        except (http.client.HTTPException, OSError):
            status = None
        assert status != 200
    finally:
        server.shutdown()


def test_connections_are_served_with_tcp_nodelay_over_tls_and_plain(tmp_path):
    """A re-trial: over TLS a 100 Continue reached the client ~40 ms late (Nagle waiting for the
    delayed ACK of the handshake's last bytes; 0.6 ms over plain HTTP). Every connection, TLS or
    not, is served with TCP_NODELAY (read back from the kernel)."""
    import socket

    cert, key = _self_signed(tmp_path)
    for tls in (True, False):
        server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True,
                             tls_cert=cert if tls else None, tls_key=key if tls else None)  # fmt: skip
        seen: list[int] = []
        handler = server.RequestHandlerClass
        setup = handler.setup

        def recording(self, setup=setup) -> None:
            setup(self)
            seen.append(self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        handler.setup = recording
        _serve(server)
        try:
            if tls:
                conn = http.client.HTTPSConnection("localhost", server.server_address[1], context=ssl.create_default_context(cafile=str(cert)), timeout=5)
            else:
                conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200
            conn.close()
        finally:
            server.shutdown()
            server.server_close()
        assert len(seen) == 1 and seen[0] != 0, (tls, seen)


def test_an_oversized_declared_body_is_refused_without_reading_it(tmp_path):
    appended: list = []
    settings = Settings(ingest_max_body_bytes=1000)
    endpoint = IngestEndpoint(
        "secret", lambda records: appended.extend(records) or [1] * len(records), lambda ns, m: True,
        lambda: None, settings, lambda: dt.datetime.now(dt.timezone.utc),
    )
    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True, ingest=endpoint)
    _serve(server)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
        conn.putrequest("POST", "/v1/foreground")
        conn.putheader("Authorization", "Bearer secret")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(10**9))  # a gigabyte is announced, 20 bytes are sent
        conn.endheaders()
        conn.send(b'{"reports": []}     ')
        resp = conn.getresponse()  # answered at once: the server did not wait for a gigabyte
        body = json.loads(resp.read())
        assert resp.status == 413 and body["error"] == "payload_too_large"
        assert appended == []
    finally:
        server.shutdown()


def _endpoint(appended: list) -> IngestEndpoint:
    return IngestEndpoint(
        "secret", lambda records: appended.extend(records) or [1] * len(records), lambda ns, m: True,
        lambda: None, Settings(), lambda: dt.datetime.now(dt.timezone.utc),
    )


def _ask(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Authorization": "Bearer secret", "Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_every_method_but_post_on_the_ingest_path_is_405_json_with_allow_post():
    """deploy/README.md promises 405 with a JSON body: GET answered 404 and PUT/DELETE/PATCH
    http.server's HTML 501 page (the handler never passed them to the endpoint)."""
    appended: list = []
    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True, ingest=_endpoint(appended))
    _serve(server)
    port = server.server_address[1]
    try:
        for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "BREW"):
            status, headers, body = _ask(port, method, "/v1/foreground", b'{"reports": []}' if method in ("PUT", "PATCH") else None)
            assert status == 405, (method, status, body)
            assert headers["allow"] == "POST" and headers["content-type"] == "application/json", (method, headers)
            payload = json.loads(body)
            assert payload["error"] == "method_not_allowed" and method in payload["detail"], (method, payload)
        status, headers, body = _ask(port, "HEAD", "/v1/foreground")
        assert (status, headers["allow"], body) == (405, "POST", b"")
        assert appended == []
        # an unknown path stays a 404 JSON, whatever the method
        for method in ("GET", "POST", "PUT", "DELETE", "BREW"):
            status, headers, body = _ask(port, method, "/nope")
            assert (status, headers["content-type"], json.loads(body)["error"]) == (404, "application/json", "not_found"), method
            assert "/metrics" in json.loads(body)["detail"], "every error body has a detail (deploy/README)"
    finally:
        server.shutdown()
        server.server_close()


def test_probes_and_metrics_answer_get_and_head_and_405_json_otherwise():
    from backfill.controller.metrics import Metrics

    server = make_server("127.0.0.1:0", Metrics().registry, ready=lambda: True)  # ingest disabled
    _serve(server)
    port = server.server_address[1]
    try:
        for path in ("/healthz", "/readyz", "/metrics"):
            get_status, get_headers, get_body = _ask(port, "GET", path)
            head_status, head_headers, head_body = _ask(port, "HEAD", path)
            assert get_status == head_status == 200 and head_body == b"" and get_body
            assert head_headers["content-length"] == get_headers["content-length"] or path == "/metrics"
            for method in ("POST", "PUT", "DELETE", "PATCH", "BREW"):
                status, headers, body = _ask(port, method, path, b"{}" if method != "BREW" else None)
                assert status == 405 and headers["allow"] == "GET, HEAD", (path, method, status)
                payload = json.loads(body)
                assert payload["error"] == "method_not_allowed" and path in payload["detail"], payload
        # a disabled ingest endpoint is 404 for every method, and says it is off (a new user's
        # trial: the detail listed it among the paths that answer)
        for method in ("POST", "GET", "PUT"):
            status, _, body = _ask(port, method, "/v1/foreground", b"{}")
            payload = json.loads(body)
            assert (status, payload["error"]) == (404, "not_found"), method
            assert "/v1/foreground is off" in payload["detail"] and "BACKFILL_INGEST_TOKEN_FILE" in payload["detail"], payload
            assert "(POST)" not in payload["detail"], payload
    finally:
        server.shutdown()
        server.server_close()


def test_http_servers_own_errors_are_json_not_html():
    """A request line http.server cannot parse is answered by its send_error: JSON, not its HTML page."""
    import socket

    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True)
    _serve(server)
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as s:
            s.sendall(b"GET /healthz extra HTTP/1.0\r\n\r\n")  # four words: http.server's 400
            raw = b""
            while chunk := s.recv(4096):
                raw += chunk
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.split()[1] == b"400" and b"application/json" in head, raw
        assert json.loads(body)["error"] == "bad_request"
    finally:
        server.shutdown()
        server.server_close()


# ----------------------------------------------------------------------------- silent clients


def _recv_until_closed(sock, limit: float) -> bytes:
    """Everything ``sock`` receives until the server closes it; raises TimeoutError after ``limit`` s."""
    sock.settimeout(limit)
    raw = b""
    while chunk := sock.recv(4096):
        raw += chunk
    return raw


@pytest.fixture
def ingest_server():
    """``(port, appended)``: a plain-HTTP server with the ingest endpoint (token ``secret``) and
    the records it appended; shut down after the test."""
    appended: list = []
    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True, ingest=_endpoint(appended))
    _serve(server)
    yield server.server_address[1], appended
    server.shutdown()
    server.server_close()


def _raw_answer(port: int, request: bytes) -> bytes:
    """Send the bytes ``request`` on a new connection; everything answered until the server closes it."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        return _recv_until_closed(s, 5.0)


def test_a_silent_tcp_connection_does_not_stall_the_https_server(tmp_path):
    """A TLS handshake run in the accept loop (the listening socket wrapped) waited, with no
    timeout, for a client that connected and sent nothing: /healthz hung until it went away."""
    import socket

    cert, key = _self_signed(tmp_path)
    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True, tls_cert=cert, tls_key=key)
    _serve(server)
    port = server.server_address[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # connects, sends nothing
            for _ in range(2):  # and again on a second connection: the first did not get lucky
                ctx = ssl.create_default_context(cafile=str(cert))
                conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=5)
                try:
                    conn.request("GET", "/healthz")
                    resp = conn.getresponse()
                    assert (resp.status, resp.read()) == (200, b"ok\n")
                finally:
                    conn.close()
    finally:
        server.shutdown()  # after the silent socket closed: the old code's accept loop is stuck until then
        server.server_close()


def test_a_silent_tls_client_is_dropped_after_the_handshake_timeout(tmp_path):
    import socket

    cert, key = _self_signed(tmp_path)
    server = make_server(
        "127.0.0.1:0", CollectorRegistry(), ready=lambda: True, tls_cert=cert, tls_key=key, handshake_timeout=0.3
    )
    _serve(server)
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as s:
            assert _recv_until_closed(s, 5.0) == b""  # closed by the server, nothing sent
    finally:
        server.shutdown()
        server.server_close()


def test_a_silent_plain_http_connection_blocks_nobody_and_is_dropped(monkeypatch):
    """Plain HTTP: one thread per connection, each with REQUEST_TIMEOUT_SECONDS to send its request."""
    import socket

    from backfill.controller import http as http_module

    monkeypatch.setattr(http_module, "REQUEST_TIMEOUT_SECONDS", 0.3)
    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True)
    _serve(server)
    port = server.server_address[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as silent:
            status, _, body = _ask(port, "GET", "/healthz")
            assert (status, body) == (200, b"ok\n")
            assert _recv_until_closed(silent, 5.0) == b""  # the server gave up on it and closed it
    finally:
        server.shutdown()
        server.server_close()


def _served_certificate(port: int) -> bytes:
    """The DER certificate the server presents (not verified: the test compares it itself)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=5)
    try:
        conn.request("GET", "/healthz")
        der = conn.sock.getpeercert(binary_form=True)
        assert conn.getresponse().status == 200
        return der
    finally:
        conn.close()


def _der(cert_file) -> bytes:
    return x509.load_pem_x509_certificate(cert_file.read_bytes()).public_bytes(serialization.Encoding.DER)


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path, caplog):
    """cert-manager renews the Secret and the kubelet swaps the mounted files (``..data`` symlink):
    the server read them only at start, so a controller running longer than the certificate's
    lifetime served an expired one until restarted. Now it serves the new pair from the next
    connection after the change, and keeps the previous one while a changed pair does not load."""
    import os

    mount = tmp_path / "mount"
    mount.mkdir()

    def publish(version: str, make) -> Path:
        """Write a version directory and swap ``..data`` to it at once, as the kubelet does."""
        directory = mount / f"..{version}"
        directory.mkdir()
        crt = make(directory)
        link = mount / "..data_tmp"
        link.symlink_to(directory.name)
        os.replace(link, mount / "..data")
        return crt

    first = publish("v1", lambda d: _self_signed(d)[0])
    for name in ("tls.crt", "tls.key"):
        (mount / name).symlink_to(f"..data/{name}")
    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True, tls_cert=mount / "tls.crt",
                         tls_key=mount / "tls.key", tls_reload_seconds=0.1)
    _serve(server)
    port = server.server_address[1]
    try:
        assert _served_certificate(port) == _der(first)
        second = publish("v2", lambda d: _self_signed(d)[0])
        assert _der(second) != _der(first)
        import time

        time.sleep(0.2)
        assert _served_certificate(port) == _der(second)

        def broken(d):
            (d / "tls.crt").write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
            (d / "tls.key").write_bytes((mount / "..v2" / "tls.key").read_bytes())
            return d / "tls.crt"

        with caplog.at_level("WARNING", logger="backfill.controller.http"):
            publish("v3", broken)
            time.sleep(0.2)
            assert _served_certificate(port) == _der(second)  # the previous pair is kept
            time.sleep(0.2)
            assert _served_certificate(port) == _der(second)
        warnings = [r.getMessage() for r in caplog.records if "does not load" in r.getMessage()]
        assert len(warnings) == 1, warnings  # once per change, not once per connection
    finally:
        server.shutdown()
        server.server_close()


def test_a_burst_of_connections_waits_in_the_backlog_not_for_a_syn_retransmit():
    """60 clients connect while the accept loop is busy (not serving yet): every connect
    completes at once and each is answered once serving starts (the standard library's backlog
    of 5 dropped the SYNs beyond it: a 1 s retransmit, or a reset)."""
    import socket

    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True)
    port = server.server_address[1]
    socks, serving = [], False
    try:
        for _ in range(60):
            s = socket.create_connection(("127.0.0.1", port), timeout=0.5)  # raises on a dropped SYN
            s.sendall(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
            socks.append(s)
        _serve(server)
        serving = True
        answers = []
        deadline = time.monotonic() + 5.0  # for all 60 together; a dropped handshake waits 1 s or more
        for s in socks:
            data = b""
            try:
                while True:
                    s.settimeout(max(0.01, deadline - time.monotonic()))
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except OSError as exc:  # a timeout or a reset
                data = f"{type(exc).__name__}".encode()
            answers.append(data.split(b"\r\n", 1)[0])
        assert answers == [b"HTTP/1.0 200 OK"] * 60
    finally:
        for s in socks:
            s.close()
        if serving:
            server.shutdown()  # waits for serve_forever: only once it runs
        server.server_close()


def test_a_client_that_goes_away_is_one_log_line_not_a_traceback(capfd, caplog):
    import logging

    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True)
    try:
        with caplog.at_level(logging.DEBUG, logger="backfill.controller.http"):
            try:
                raise BrokenPipeError(32, "Broken pipe")
            except BrokenPipeError:
                server.handle_error(None, ("10.0.0.7", 40000))
            try:
                raise ValueError("unexpected")
            except ValueError:
                server.handle_error(None, ("10.0.0.8", 40001))
        assert capfd.readouterr().err == ""  # socketserver's default printed a traceback here
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            ("DEBUG", "connection from 10.0.0.7 ended: BrokenPipeError: [Errno 32] Broken pipe"),
            ("WARNING", "request from 10.0.0.8 failed: ValueError: unexpected"),
        ]
    finally:
        server.server_close()


def test_connections_beyond_the_limit_shut_the_longest_waiting_and_get_no_thread_each(monkeypatch):
    """An adversarial trial: a client that opened connections and sent nothing (or a byte now and
    then) got one thread each, for as long as it kept them: 18,700 threads in the controller and
    a load average of 590. Then (a second trial) a cap alone let 128 idle connections, reopened
    as soon as closed, keep the probes and ingest out for good. Now at most MAX_CONNECTIONS are
    served at once, and a new one shuts the one that has waited longest for its request."""
    import socket

    from backfill.controller import http as http_module

    monkeypatch.setattr(http_module, "MAX_CONNECTIONS", 4, raising=False)
    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True)
    _serve(server)
    port = server.server_address[1]
    before = threading.active_count()
    held = []
    try:
        for _ in range(40):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(0.005)  # accepted in this order: the oldest is shut first
        assert threading.active_count() - before <= 4 + 1  # the 4 served, and the deadline watcher
        for _ in range(3):  # a probe behind 40 idle connections is answered, each time
            assert _ask(port, "GET", "/healthz")[0] == 200
        # every held one but those still in a slot was shut by the server, unanswered
        def shut_unanswered(sock) -> bool:
            try:
                return _recv_until_closed(sock, 0.5) == b""
            except TimeoutError:
                return False  # still open: it holds a slot

        shut = sum(1 for sock in held if shut_unanswered(sock))
        assert 40 - 4 <= shut <= 40, shut
    finally:
        for s in held:
            s.close()
        server.shutdown()
        server.server_close()


def test_a_new_connection_is_answered_503_when_every_slot_is_being_answered(monkeypatch, caplog):
    """When no connection is waiting for its request (each is being answered), a new one is
    answered 503 with Retry-After, unread, and the time at the limit is logged with its counts."""
    from backfill.controller import http as http_module

    monkeypatch.setattr(http_module, "MAX_CONNECTIONS", 2, raising=False)
    monkeypatch.setattr(http_module, "LIMIT_QUIET_SECONDS", 1.0)
    caplog.set_level(logging.INFO, logger="backfill.controller.http")
    release = threading.Event()
    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: release.wait(10))
    _serve(server)
    port = server.server_address[1]
    slow: list = []
    askers = [threading.Thread(target=lambda: slow.append(_ask(port, "GET", "/readyz")[0])) for _ in range(2)]
    try:
        for t in askers:
            t.start()
        time.sleep(0.5)  # both are being answered (the probe waits)
        status, headers, body = _ask(port, "GET", "/healthz")
        assert (status, headers["retry-after"], json.loads(body)["error"]) == (503, "1", "service_unavailable")
        release.set()
        for t in askers:
            t.join(5)
        assert slow == [200, 200]
        # a free slot within LIMIT_QUIET_SECONDS of the last refusal does not end the time at the
        # limit (a re-trial: a pair of lines at every flip, 630 in 3 minutes); one after it does
        assert _ask(port, "GET", "/healthz")[0] == 200
        assert not any(r.getMessage().startswith("HTTP: below") for r in caplog.records)
        time.sleep(1.1)
        assert _ask(port, "GET", "/healthz")[0] == 200
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    said = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("HTTP: 2 connections open, the most served at once") for m in said) == 1, said
    assert [m for m in said if m.startswith("HTTP: below")] == [
        next(m for m in said if m.startswith("HTTP: below 2 connections again after") and "0 shut for newer ones and 1 refused" in m)
    ], said


def test_a_client_trickling_its_request_is_cut_off_at_the_request_deadline(monkeypatch):
    """The per-read timeout alone let a client that sends a byte more often than it (here every
    0.2 s, the timeout 1 s) keep its connection, and its thread, for ever. Now the request must
    be read within REQUEST_DEADLINE_SECONDS (here 1 s): the server shuts the connection down."""
    import socket

    from backfill.controller import http as http_module

    monkeypatch.setattr(http_module, "REQUEST_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(http_module, "REQUEST_DEADLINE_SECONDS", 1.0, raising=False)
    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True)
    _serve(server)
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as s:
            t0, closed_after = time.monotonic(), None
            for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                try:
                    s.send(bytes([byte]))
                except OSError:  # reset: the server shut it down
                    closed_after = time.monotonic() - t0
                    break
                s.settimeout(0.2)
                try:
                    if s.recv(4096) == b"":  # the server shut it down
                        closed_after = time.monotonic() - t0
                        break
                except TimeoutError:
                    pass  # still open: send the next byte (every 0.2 s)
            assert closed_after is not None, "the trickling client kept its connection for 20 s"
            assert 1.0 <= closed_after < 3.0, closed_after
        status, _, body = _ask(server.server_address[1], "GET", "/healthz")
        assert (status, body) == (200, b"ok\n")  # others are served meanwhile and after
    finally:
        server.shutdown()
        server.server_close()


def test_a_post_without_the_token_is_refused_before_its_body_is_read(ingest_server):
    """An adversarial trial: 600 connections declaring a 1 MiB body with no token, sending it
    all but the last byte, held 600 MiB; the body was read before the token was checked. Now
    the token (and method, rate limit, content type, size) are checked from the headers: the
    401 comes before a byte of the body is sent (the old code waited for it: a timeout here)."""
    port, appended = ingest_server
    for auth in (b"", b"Authorization: Bearer wrong\r\n"):
        answer = _raw_answer(port, b"POST /v1/foreground HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Type: application/json\r\nContent-Length: 1000000\r\n" + auth + b"\r\n")  # fmt: skip
        # closed after the answer: the body stays unread
        assert answer.startswith(b"HTTP/1.0 401 "), answer[:200]
        assert b"www-authenticate: bearer" in answer.lower()
    assert appended == []


def test_request_headers_over_the_budget_are_refused_431():
    """The same trial: 100 connections, each sending 98 headers of 65 kB (http.server's own
    bounds are 100 headers of 64 KiB), held 791 MB before any routing. The line and headers of
    a request now have MAX_HEADER_BYTES (32 KiB) in all."""

    from backfill.controller import http as http_module

    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True)
    _serve(server)
    port = server.server_address[1]
    try:
        answer = _raw_answer(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 8000) for i in range(10)) + b"\r\n")
        assert answer.startswith(b"HTTP/1.0 431 "), answer[:200]
        # a request just under the budget is served, and so is the next one on a new connection
        pad = getattr(http_module, "MAX_HEADER_BYTES", 32 * 1024) - 200
        answer = _raw_answer(port, b"GET /healthz HTTP/1.0\r\nX-Pad: " + b"a" * pad + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(b"ok\n"), answer[:200]
    finally:
        server.shutdown()
        server.server_close()


def test_an_ipv6_address_in_brackets_is_served():
    """An adversarial trial: ``BACKFILL_METRICS_ADDRESS=[::1]:18090`` failed with ``[Errno -2] Name
    or service not known`` (the brackets kept, an IPv4 socket)."""
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:  # a machine without IPv6 on loopback
        pytest.skip(f"no IPv6 loopback here: {exc}")
    server = make_server("[::1]:0", CollectorRegistry(), ready=lambda: True)
    _serve(server)
    try:
        assert server.socket.family == socket.AF_INET6
        conn = http.client.HTTPConnection("::1", server.server_address[1], timeout=5)
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"ok\n")
        conn.close()
    finally:
        server.shutdown()
        server.server_close()


def test_conflicting_content_lengths_are_400_unread(ingest_server):
    """An adversarial trial: ``Content-Length: 300000000`` then ``Content-Length: 10`` passed the
    size check (it read the last) while the body was read by the first: 250 MB read on one
    connection; a first value of 10**20 raised MemoryError and dropped the connection unanswered."""
    port, appended = ingest_server
    for first in (b"300000000", b"99999999999999999999"):
        answer = _raw_answer(port, b"POST /v1/foreground HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n"
                             b"Content-Type: application/json\r\nContent-Length: " + first + b"\r\nContent-Length: 10\r\n\r\n")  # fmt: skip
        assert answer.startswith(b"HTTP/1.0 400 ") and b"conflicting Content-Length headers" in answer, answer[:300]
    assert appended == []


def test_a_certificate_pair_that_does_not_load_is_named(tmp_path):
    """A new user's trial: a non-PEM file gave ``HTTP server on ...: [SSL] PEM lib (_ssl.c:3905)``,
    naming neither file."""
    bad = tmp_path / "tls.crt"
    bad.write_text("not a certificate\n")
    absent = tmp_path / "tls.key"
    with pytest.raises(ValueError) as exc:
        make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True, tls_cert=bad, tls_key=bad)
    assert str(exc.value).startswith(f"TLS certificate file {bad}, key file {bad}: not a PEM certificate and its matching private key ([SSL]")
    with pytest.raises(ValueError) as exc:
        make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True, tls_cert=absent, tls_key=absent)
    # ssl names no file of a missing one: the message does (a second trial)
    assert str(exc.value) == f"TLS certificate file {absent}, key file {absent}: No such file or directory: {absent}"
    (tmp_path / "pair").mkdir()
    cert, _ = _self_signed(tmp_path / "pair")
    with pytest.raises(ValueError) as exc:
        make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True, tls_cert=cert, tls_key=absent)
    assert str(exc.value) == f"TLS certificate file {cert}, key file {absent}: No such file or directory: {absent}"


@pytest.mark.parametrize(
    "first, spread",
    [(b"", False), (b"\x16", False), (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", False), (b"\x16", True)],
    ids=["silent", "one-byte", "partial-hello", "one-byte-from-many-addresses"],
)
def test_stalled_connections_reopened_at_once_do_not_keep_https_probes_out(tmp_path, monkeypatch, first, spread):
    """A new user's trial: 300 TCP connections that never began a TLS handshake, each reopened
    as soon as the server closed it, failed 21 of 21 /healthz probes over HTTPS (2 s timeout; 0
    of 18 over plain HTTP): a probe's connection, waiting for its handshake, was as evictable as
    the silent ones and was shut by the next of them. A connection that has sent nothing yet is
    now shut before one that has (oldest first). A re-trial: clients that sent the first byte of
    a ClientHello (or half of one) and stalled kept every probe out still: the shutdown of an
    evicted connection went to the socket object the TLS socket had detached, did nothing, and
    the connection held its slot until its handshake timed out (5 s). ``first``: what each
    stalled client sends (nothing, one byte, a partial ClientHello). A connection of the client
    with the most connections waiting goes before another client's: the stalled ones that sent
    something come from one address here and the probes from another (a kubelet's, a
    router's); silent ones are shut first whoever sent them (the probes share their address).
    ``spread``: a second re-trial's stalled clients came from 300 addresses, one connection
    each, and half the probes failed: silent first shut the probe's own connection in the
    moment before its first byte was seen; a connection ranks as silent only after
    ``SILENT_GRACE_SECONDS`` now."""
    import socket

    from backfill.controller import http as http_module

    monkeypatch.setattr(http_module, "MAX_CONNECTIONS", 32 if first else 8, raising=False)
    cert, key = _self_signed(tmp_path)
    server = make_server("127.0.0.1:0", CollectorRegistry(), ready=lambda: True, tls_cert=cert, tls_key=key)
    _serve(server)
    port = server.server_address[1]
    stop = threading.Event()

    def silent_clients(n: int) -> None:
        """``n`` connections that send nothing, each reopened as soon as the server closes it."""
        import selectors

        made = [0]

        def connect() -> socket.socket:
            made[0] += 1
            i = made[0] % 500
            source = (f"127.1.{i // 250}.{i % 250 + 1}", 0) if spread else None
            sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=source)
            if first:
                sock.sendall(first)
            return sock

        sel = selectors.DefaultSelector()
        try:
            for _ in range(n):
                sel.register(connect(), selectors.EVENT_READ)
            while not stop.is_set():
                for k, _ in sel.select(timeout=0.05):
                    sel.unregister(k.fileobj)
                    k.fileobj.close()
                    if not stop.is_set():
                        sel.register(connect(), selectors.EVENT_READ)
        finally:
            for k in list(sel.get_map().values()):
                k.fileobj.close()
            sel.close()

    attack = threading.Thread(target=silent_clients, args=(80 if first else 40,), daemon=True)
    attack.start()
    try:
        time.sleep(0.5)  # every slot taken, the rest churning
        answered = 0
        for _ in range(8):
            ctx = ssl.create_default_context(cafile=str(cert))
            source = ("127.0.0.2", 0) if first else None
            conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=2, source_address=source)
            try:
                conn.request("GET", "/healthz")
                resp = conn.getresponse()
                answered += (resp.status, resp.read()) == (200, b"ok\n")
            except OSError as exc:
                print("probe failed:", repr(exc))
            finally:
                conn.close()
        assert answered == 8
    finally:
        stop.set()
        attack.join(timeout=5)
        server.shutdown()
        server.server_close()
