"""The controller's HTTP server: TLS, and a declared body over the limit answered unread."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import ssl
import threading

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
