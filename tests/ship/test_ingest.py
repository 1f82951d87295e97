"""The direct foreground ingest endpoint (backfill.controller.ingest) against a real PostgreSQL store.

Every error case asserts the status AND that the store's head did not move; the success case
reads the events back. One test goes over real HTTP (a ThreadingHTTPServer started here, not the
controller's server) with the example client ``report_foreground``.
"""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from backfill.controller.ingest import (
    MAX_REPORTS,
    IngestClientError,
    IngestEndpoint,
    TokenBuckets,
    idempotency_key,
    load_token,
    report_foreground,
    response_headers,
)
from backfill.core.events import ForegroundRequest, decode
from backfill.settings import Settings

pytestmark = pytest.mark.db

TOKEN = "s3cret-token-value"
NOW = datetime(2026, 11, 30, 10, 0, 0, tzinfo=timezone.utc)
NS, MODEL = "flexinfer-system", "gemma4-26b-a4b-gptq-5930k"
KNOWN = {(NS, MODEL), (NS, "qwen3-8b")}
GOOD_HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


class FakeMonotonic:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _endpoint(store, wakes: list, *, monotonic=None, **settings_overrides) -> IngestEndpoint:
    settings = Settings(**settings_overrides)
    return IngestEndpoint(
        TOKEN,
        store.append,
        lambda ns, m: (ns, m) in KNOWN,
        lambda: wakes.append(1),
        settings,
        lambda: NOW,
        monotonic=monotonic or FakeMonotonic(),
    )


def _body(*reports: dict) -> bytes:
    return json.dumps({"reports": list(reports)}).encode()


def _report(**kw) -> dict:
    r = {"namespace": NS, "model": MODEL, "time": "2026-11-30T09:59:30Z", "count": 2}
    r.update(kw)
    return {k: v for k, v in r.items() if v is not None}


@pytest.fixture
def wakes() -> list:
    return []


@pytest.fixture
def endpoint(event_store, wakes):
    return _endpoint(event_store, wakes)


def _assert_rejected(event_store, wakes, result, status: int, error: str) -> dict:
    got_status, body = result
    assert (got_status, body.get("error")) == (status, error), body
    assert "detail" in body
    json.dumps(body)  # JSON-able
    assert event_store.head() == 0, "nothing may be appended on an error"
    assert wakes == []
    return body


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_wrong_method_is_405(event_store, wakes, endpoint, method):
    body = _assert_rejected(event_store, wakes, endpoint.handle(method, GOOD_HEADERS, _body(_report()), "c"), 405, "method_not_allowed")
    assert response_headers(405, body) == {"Allow": "POST"}


@pytest.mark.parametrize(
    "auth",
    [None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"bearer{TOKEN}", f"Bearer{TOKEN}", f"Bearer {TOKEN} x", TOKEN],
)
def test_missing_or_wrong_token_is_401(event_store, wakes, endpoint, auth):
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    body = _assert_rejected(event_store, wakes, endpoint.handle("POST", headers, _body(_report()), "c"), 401, "unauthorized")
    assert body["www_authenticate"].startswith("Bearer")
    assert response_headers(401, body)["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("auth", [f"bearer {TOKEN}", f"BEARER {TOKEN}", f"BeArEr {TOKEN}", f"Bearer  {TOKEN}"])
def test_the_auth_scheme_is_case_insensitive(event_store, wakes, endpoint, auth):
    """RFC 7235 2.1 (a hostile-input trial: ``bearer <token>`` got 401); RFC 6750 2.1 allows more
    than one space after the scheme (``"Bearer" 1*SP b64token``)."""
    headers = {"Authorization": auth, "Content-Type": "application/json"}
    assert endpoint.handle("POST", headers, _body(_report()), "c") == (202, {"accepted": 1, "duplicates": 0})


def test_header_names_are_case_insensitive(event_store, wakes, endpoint):
    headers = {"authorization": f"Bearer {TOKEN}", "CONTENT-TYPE": "application/json; charset=utf-8"}
    assert endpoint.handle("post", headers, _body(_report()), "c") == (202, {"accepted": 1, "duplicates": 0})


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"])
def test_wrong_content_type_is_415(event_store, wakes, endpoint, ctype):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if ctype is not None:
        headers["Content-Type"] = ctype
    _assert_rejected(event_store, wakes, endpoint.handle("POST", headers, _body(_report()), "c"), 415, "unsupported_media_type")


def test_body_over_limit_is_413(event_store, wakes):
    endpoint = _endpoint(event_store, wakes, ingest_max_body_bytes=200)
    big = _body(*[_report(id=f"r{i}") for i in range(5)])
    assert len(big) > 200
    body = _assert_rejected(event_store, wakes, endpoint.handle("POST", GOOD_HEADERS, big, "c"), 413, "payload_too_large")
    assert body["limit"] == 200
    # A declared Content-Length over the limit is refused even if the server read less.
    small = _body(_report())
    headers = {**GOOD_HEADERS, "Content-Length": "999999"}
    _assert_rejected(event_store, wakes, endpoint.handle("POST", headers, small, "c"), 413, "payload_too_large")


@pytest.mark.parametrize("raw", [b"", b"{", b"not json", b"\xff\xfe\x00", b'{"reports": [}'])
def test_malformed_json_is_400(event_store, wakes, endpoint, raw):
    _assert_rejected(event_store, wakes, endpoint.handle("POST", GOOD_HEADERS, raw, "c"), 400, "malformed_json")


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ([], ""),
        ({}, "reports"),
        ({"reports": []}, "reports"),
        ({"reports": [_report()], "extra": 1}, "extra"),
        ({"reports": [_report(namespace=None)]}, "reports.0.namespace"),
        ({"reports": [_report(model="")]}, "reports.0.model"),
        ({"reports": [_report(model="Bad Name!")]}, "reports.0.model"),
        ({"reports": [_report(time="2026-11-30T09:59:30")]}, "reports.0.time"),  # no zone
        ({"reports": [_report(time=1_795_000_000)]}, "reports.0.time"),  # a number
        ({"reports": [_report(time="yesterday")]}, "reports.0.time"),
        ({"reports": [_report(count=0)]}, "reports.0.count"),
        ({"reports": [_report(count="3")]}, "reports.0.count"),
        ({"reports": [_report(count=True)]}, "reports.0.count"),
        ({"reports": [_report(unknown="x")]}, "reports.0.unknown"),
        ({"reports": [_report(id=f"r{i}") for i in range(MAX_REPORTS + 1)]}, "reports"),
    ],
)
def test_schema_violation_is_422_naming_the_field(event_store, wakes, endpoint, payload, field):
    raw = json.dumps(payload).encode()
    body = _assert_rejected(event_store, wakes, endpoint.handle("POST", GOOD_HEADERS, raw, "c"), 422, "invalid_report")
    assert field in [d["field"] for d in body["detail"]], body["detail"]


@pytest.mark.parametrize("delta", [timedelta(hours=1, seconds=1), -timedelta(hours=1, seconds=1), timedelta(days=365)])
def test_time_too_far_from_now_is_422(event_store, wakes, endpoint, delta):
    bad = (NOW + delta).isoformat()
    raw = _body(_report(id="bad", time=bad), _report(id="bad2", time=bad))
    body = _assert_rejected(event_store, wakes, endpoint.handle("POST", GOOD_HEADERS, raw, "c"), 422, "time_out_of_range")
    assert [d["field"] for d in body["detail"]] == ["reports.0.time", "reports.1.time"]
    assert [(r["index"], r["error"]) for r in body["rejected"]] == [(0, "time_out_of_range"), (1, "time_out_of_range")]


def test_time_within_skew_in_another_zone_is_accepted(event_store, wakes, endpoint):
    # 10:59 at +01:00 is 09:59 UTC: inside the window.
    raw = _body(_report(time="2026-11-30T10:59:00+01:00"))
    assert endpoint.handle("POST", GOOD_HEADERS, raw, "c") == (202, {"accepted": 1, "duplicates": 0})
    (ev,) = list(event_store.read())
    assert ev.at == datetime(2026, 11, 30, 9, 59, tzinfo=timezone.utc)


def test_unknown_model_is_422_naming_it(event_store, wakes, endpoint):
    raw = _body(_report(model="no-such-model"), _report(namespace="other", model=MODEL), _report(model="no-such-model", id="2"))
    body = _assert_rejected(event_store, wakes, endpoint.handle("POST", GOOD_HEADERS, raw, "c"), 422, "unknown_model")
    assert body["detail"]["models"] == [f"{NS}/no-such-model", f"other/{MODEL}"]
    assert "no-such-model" in body["detail"]["message"]
    assert [r["index"] for r in body["rejected"]] == [0, 1, 2]


def test_a_bad_report_is_refused_alone_and_the_others_are_taken(event_store, wakes, endpoint):
    """An adversarial trial: one report on a deleted Model (or an hour off, or malformed) had
    the whole call answered 422, and the valid demand beside it was neither acted on nor
    stored. Each report is now checked on its own; the 202 lists the refused ones."""
    far = (NOW + timedelta(hours=2)).isoformat()
    raw = _body(
        _report(id="ok-1"),
        _report(model="deleted-model", id="gone"),
        _report(id="late", time=far),
        _report(id=""),  # schema: an empty id
        "not an object",
        _report(model="qwen3-8b", id="ok-2", count=1),
    )
    status, body = endpoint.handle("POST", GOOD_HEADERS, raw, "c")
    assert status == 202, body
    assert (body["accepted"], body["duplicates"]) == (2, 0)
    assert [(r["index"], r["error"]) for r in body["rejected"]] == [
        (1, "unknown_model"), (2, "time_out_of_range"), (3, "invalid_report"), (4, "invalid_report"),
    ]
    assert body["rejected"][0]["detail"]["model"] == f"{NS}/deleted-model"
    assert body["rejected"][1]["detail"]["field"] == "reports.2.time"
    assert [d["field"] for d in body["rejected"][2]["detail"]] == ["reports.3.id"]
    assert [d["field"] for d in body["rejected"][3]["detail"]] == ["reports.4"]
    json.dumps(body)
    events = [decode(s.type, s.version, s.data) for s in event_store.read()]
    assert [(e.model, e.count) for e in events] == [(MODEL, 2), ("qwen3-8b", 1)]
    assert wakes == [1]
    # The same call again: the taken reports are duplicates, the refused ones refused again.
    status, body = endpoint.handle("POST", GOOD_HEADERS, raw, "c")
    assert (status, body["accepted"], body["duplicates"], len(body["rejected"])) == (202, 0, 2, 4)
    assert event_store.head() == 2


def test_while_the_models_cannot_be_told_the_call_is_503_starting(event_store, wakes):
    """A starting replica (log not folded, Models not listed) answered 422 unknown_model for a
    Model that exists (an adversarial trial): now 503 ``starting`` with Retry-After."""
    from backfill.controller.ingest import ModelsNotLoadedError

    def starting(ns, m):
        raise ModelsNotLoadedError("this replica is starting")

    endpoint = IngestEndpoint(TOKEN, event_store.append, starting, lambda: wakes.append(1), Settings(), lambda: NOW, monotonic=FakeMonotonic())
    result = endpoint.handle("POST", GOOD_HEADERS, _body(_report()), "c")
    body = _assert_rejected(event_store, wakes, result, 503, "starting")
    assert response_headers(503, body) == {"Retry-After": "1"}


def test_rate_limit_per_client_is_429_with_retry_after(event_store, wakes):
    clock = FakeMonotonic()
    endpoint = _endpoint(event_store, wakes, monotonic=clock, ingest_rate_per_second=0.5, ingest_burst=2)
    raw = _body(_report())
    assert endpoint.handle("POST", GOOD_HEADERS, raw, "10.0.0.1")[0] == 202
    assert endpoint.handle("POST", GOOD_HEADERS, raw, "10.0.0.1")[0] == 202  # a duplicate, still a request
    head = event_store.head()
    n_wakes = len(wakes)
    status, body = endpoint.handle("POST", GOOD_HEADERS, _body(_report(id="new")), "10.0.0.1")
    assert (status, body["error"]) == (429, "rate_limited")
    assert body["retry_after_seconds"] == 2  # one token at 0.5/s
    assert response_headers(429, body) == {"Retry-After": "2"}
    assert event_store.head() == head and len(wakes) == n_wakes
    # Requests without the token are 401 and take nothing from the bucket (an adversarial trial:
    # token-less POSTs from a router's address left the router's own reports 429).
    assert endpoint.handle("POST", {}, raw, "10.0.0.1")[0] == 401
    clock.t += 2.0  # one token back
    for _ in range(50):
        assert endpoint.handle("POST", {}, raw, "10.0.0.1")[0] == 401
    assert endpoint.handle("POST", GOOD_HEADERS, _body(_report(id="after-401s")), "10.0.0.1")[0] == 202
    # Another client is unaffected; the first recovers after the refill.
    assert endpoint.handle("POST", GOOD_HEADERS, _body(_report(id="other")), "10.0.0.2")[0] == 202
    clock.t += 2.0
    assert endpoint.handle("POST", GOOD_HEADERS, _body(_report(id="new")), "10.0.0.1")[0] == 202


def test_refused_requests_are_logged_once_per_client_and_error_a_minute(event_store, wakes, caplog):
    """A new user's trial: 401, 400, 413, 415, 422, 429 and 503 ``spool_full`` answers wrote no
    line at all; a router with a wrong token went unseen. Each client's first refusal with an
    error is a warning now, then one a minute with the count refused meanwhile."""
    import logging

    caplog.set_level(logging.INFO, logger="backfill.controller.ingest")
    clock = FakeMonotonic()
    endpoint = _endpoint(event_store, wakes, monotonic=clock)
    wrong = {**GOOD_HEADERS, "Authorization": "Bearer nope"}

    def lines() -> list[str]:
        out = [r.getMessage() for r in caplog.records if r.name == "backfill.controller.ingest"]
        caplog.clear()
        return out

    for _ in range(30):
        assert endpoint.handle("POST", wrong, _body(_report()), "10.0.0.7")[0] == 401
    assert endpoint.handle("POST", GOOD_HEADERS, b"{", "10.0.0.7")[0] == 400
    assert endpoint.handle("POST", wrong, _body(_report()), "10.0.0.8")[0] == 401
    assert endpoint.handle("POST", GOOD_HEADERS, _body(_report()), "10.0.0.7")[0] == 202  # not a refusal
    said = lines()
    assert said[0] == "ingest: refused a request from 10.0.0.7: 401 unauthorized: invalid bearer token"
    assert said[1].startswith("ingest: refused a request from 10.0.0.7: 400 malformed_json: ") and "Invalid JSON" in said[1]
    assert said[2:] == ["ingest: refused a request from 10.0.0.8: 401 unauthorized: invalid bearer token"]
    clock.t += 59.0
    assert endpoint.handle("POST", wrong, _body(_report()), "10.0.0.7")[0] == 401
    assert lines() == []
    clock.t += 1.0
    assert endpoint.handle("POST", wrong, _body(_report()), "10.0.0.7")[0] == 401
    assert lines() == [
        "ingest: refused a request from 10.0.0.7: 401 unauthorized: invalid bearer token (30 more refused with unauthorized since the last line)"
    ]
    assert all(r.levelname == "WARNING" for r in caplog.records)
    # every client together, at most REFUSAL_LOG_MAX_LINES lines a minute, then one line saying
    # how many were not logged (a re-trial: 1,500 source addresses wrote a line per request)
    from backfill.controller.ingest import REFUSAL_LOG_MAX_LINES

    clock.t += 60.0
    for i in range(REFUSAL_LOG_MAX_LINES + 50):
        assert endpoint.handle("POST", wrong, _body(_report()), f"10.1.{i // 250}.{i % 250}")[0] == 401
    assert len(lines()) == REFUSAL_LOG_MAX_LINES
    clock.t += 60.0
    assert endpoint.handle("POST", wrong, _body(_report()), "10.2.0.1")[0] == 401
    assert lines() == [
        "ingest: 50 more refused requests not logged in the last 60s (at most 100 lines every 60s)",
        "ingest: refused a request from 10.2.0.1: 401 unauthorized: invalid bearer token",
    ]


def test_token_buckets_bounded_memory_and_idle_eviction():
    clock = FakeMonotonic()
    buckets = TokenBuckets(rate=10.0, burst=5, max_clients=100, monotonic=clock)
    for i in range(1000):
        assert buckets.take(f"c{i}") == 0.0
    assert len(buckets) == 100  # the least recently seen were forgotten
    clock.t += 0.5  # 5 tokens / 10 per s: every bucket is full again -> forgotten
    buckets.take("fresh")
    assert len(buckets) == 1
    for _ in range(4):  # 5 - the one taken above
        assert buckets.take("fresh") == 0.0
    assert buckets.take("fresh") == pytest.approx(0.1)


def test_store_failure_is_503_and_controller_survives(event_store, wakes):
    def broken(records):
        raise RuntimeError("database is down")

    endpoint = IngestEndpoint(TOKEN, broken, lambda ns, m: True, lambda: wakes.append(1), Settings(), lambda: NOW)
    status, body = endpoint.handle("POST", GOOD_HEADERS, _body(_report()), "c")
    assert (status, body["error"]) == (503, "store_unavailable")
    assert "database is down" in body["detail"]
    assert wakes == [] and event_store.head() == 0
    assert "Retry-After" not in response_headers(status, body)


def test_a_standby_that_could_not_hand_the_report_on_is_503_not_leader_with_retry_after(event_store, wakes):
    """``Controller.ingest_append`` raises NotLeaderError on a standby whose log did not take the
    reports in time (tests/controller/test_ingest_standby.py drives the real one)."""
    from backfill.controller.ingest import NotLeaderError

    def standby(records):
        raise NotLeaderError(len(records))

    endpoint = IngestEndpoint(TOKEN, standby, lambda ns, m: True, lambda: wakes.append(1), Settings(), lambda: NOW)
    status, body = endpoint.handle("POST", GOOD_HEADERS, _body(_report(), _report(id="b")), "c")
    assert (status, body["error"], body["spooled"]) == (503, "not_leader", 2)
    assert response_headers(status, body) == {"Retry-After": "1"}
    assert wakes == [] and event_store.head() == 0


def test_empty_token_is_refused(event_store):
    with pytest.raises(ValueError):
        IngestEndpoint("", event_store.append, lambda ns, m: True, lambda: None, Settings(), lambda: NOW)


def test_load_token_strips_and_rejects_empty(tmp_path):
    (tmp_path / "token").write_text(f"  {TOKEN}\n")
    assert load_token(tmp_path / "token") == TOKEN
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="^the file is empty$"):
        load_token(tmp_path / "empty")
    with pytest.raises(ValueError, match="^No such file or directory$"):
        load_token(tmp_path / "missing")


# ----------------------------------------------------------------------------- success


def test_batch_is_appended_in_one_call_and_read_back(event_store, wakes):
    calls: list[int] = []

    def append(records):
        calls.append(len(records))
        return event_store.append(records)

    endpoint = IngestEndpoint(
        TOKEN, append, lambda ns, m: (ns, m) in KNOWN, lambda: wakes.append(1), Settings(), lambda: NOW
    )
    reports = [
        _report(time="2026-11-30T09:59:30Z", count=3, id="router-a/1"),
        _report(time="2026-11-30T09:59:31Z", count=1),
        _report(model="qwen3-8b", time="2026-11-30T10:00:05+00:00"),
    ]
    assert endpoint.handle("POST", GOOD_HEADERS, _body(*reports), "router-a") == (202, {"accepted": 3, "duplicates": 0})
    assert calls == [3]
    assert wakes == [1]

    stored = list(event_store.read())
    assert [s.position for s in stored] == [1, 2, 3]
    events = [decode(s.type, s.version, s.data) for s in stored]
    assert all(isinstance(e, ForegroundRequest) and e.source == "ingest" for e in events)
    assert [(e.namespace, e.model, e.at, e.count) for e in events] == [
        (NS, MODEL, datetime(2026, 11, 30, 9, 59, 30, tzinfo=timezone.utc), 3),
        (NS, MODEL, datetime(2026, 11, 30, 9, 59, 31, tzinfo=timezone.utc), 1),
        (NS, "qwen3-8b", datetime(2026, 11, 30, 10, 0, 5, tzinfo=timezone.utc), 2),
    ]
    assert [s.stream for s in stored] == [f"model/{NS}/{MODEL}", f"model/{NS}/{MODEL}", f"model/{NS}/qwen3-8b"]
    assert [s.idempotency_key for s in stored] == [
        f"ingest/{NS}/{MODEL}/router-a/1/2026-11-30T09:59:30+00:00",
        f"ingest/{NS}/{MODEL}/2026-11-30T09:59:31+00:00/1",
        f"ingest/{NS}/qwen3-8b/2026-11-30T10:00:05+00:00/2",
    ]

    # The same batch again: all duplicates, nothing appended, the loop is not woken.
    assert endpoint.handle("POST", GOOD_HEADERS, _body(*reports), "router-a") == (202, {"accepted": 0, "duplicates": 3})
    assert event_store.head() == 3
    assert wakes == [1]


def test_an_id_used_again_with_another_time_is_another_report(event_store, wakes, endpoint):
    """A router whose ``router-a/N`` counter restarted (a new user's trial): the new demand was
    dropped as a duplicate, and the idle window not restarted by it."""
    first = _report(time="2026-11-30T09:59:30Z", id="router-a/1")
    again = _report(time="2026-11-30T09:59:40Z", id="router-a/1")
    assert endpoint.handle("POST", GOOD_HEADERS, _body(first), "c") == (202, {"accepted": 1, "duplicates": 0})
    assert endpoint.handle("POST", GOOD_HEADERS, _body(again), "c") == (202, {"accepted": 1, "duplicates": 0})
    # the same report re-sent (same id, same instant, another zone) is a duplicate
    resent = _report(time="2026-11-30T11:59:40+02:00", id="router-a/1", count=7)
    assert endpoint.handle("POST", GOOD_HEADERS, _body(resent), "c") == (202, {"accepted": 0, "duplicates": 1})
    stored = [decode(s.type, s.version, s.data) for s in event_store.read()]
    assert [e.at for e in stored] == [datetime(2026, 11, 30, 9, 59, 30, tzinfo=timezone.utc), datetime(2026, 11, 30, 9, 59, 40, tzinfo=timezone.utc)]


def test_same_instant_in_another_zone_is_a_duplicate(event_store, wakes, endpoint):
    a = _report(time="2026-11-30T09:59:30Z")
    b = _report(time="2026-11-30T11:59:30+02:00")
    assert endpoint.handle("POST", GOOD_HEADERS, _body(a, b), "c") == (202, {"accepted": 1, "duplicates": 1})
    from backfill.controller.ingest import ForegroundReport

    assert idempotency_key(ForegroundReport.model_validate_json(json.dumps(b))) == (
        f"ingest/{NS}/{MODEL}/2026-11-30T09:59:30+00:00/2"
    )


# ----------------------------------------------------------------------------- over HTTP


def _serve(endpoint: IngestEndpoint):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _respond(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in response_headers(status, body).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _dispatch(self) -> None:
            if self.path != "/v1/foreground":
                self._respond(404, {"error": "not_found", "detail": self.path})
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, endpoint.max_body_bytes + 1))
            self._respond(*endpoint.handle(self.command, dict(self.headers.items()), body, self.client_address[0]))

        do_POST = do_GET = _dispatch

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def test_report_foreground_over_http(event_store, wakes):
    endpoint = IngestEndpoint(
        TOKEN,
        event_store.append,
        lambda ns, m: (ns, m) in KNOWN,
        lambda: wakes.append(1),
        Settings(),
        lambda: datetime.now(timezone.utc),
    )
    server, thread = _serve(endpoint)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/foreground"
    try:
        now = datetime.now(timezone.utc).replace(microsecond=0)
        reports = [
            {"namespace": NS, "model": MODEL, "time": now, "count": 4, "id": "http-1"},
            {"namespace": NS, "model": MODEL, "time": (now - timedelta(seconds=5)).isoformat()},
        ]
        assert report_foreground(url, TOKEN, reports) == {"accepted": 2, "duplicates": 0}
        assert report_foreground(url, TOKEN, reports) == {"accepted": 0, "duplicates": 2}
        events = [decode(s.type, s.version, s.data) for s in event_store.read()]
        assert [(e.model, e.at, e.count, e.source) for e in events] == [
            (MODEL, now, 4, "ingest"),
            (MODEL, now - timedelta(seconds=5), 1, "ingest"),
        ]
        assert wakes == [1]

        with pytest.raises(IngestClientError) as exc_info:
            report_foreground(url, "wrong", reports)
        assert exc_info.value.status == 401
        assert exc_info.value.body["error"] == "unauthorized"

        with pytest.raises(IngestClientError) as exc_info:
            report_foreground(url, TOKEN, [{"namespace": NS, "model": "nope", "time": now}])
        assert (exc_info.value.status, exc_info.value.body["error"]) == (422, "unknown_model")
        assert event_store.head() == 2

        with pytest.raises(ValueError):
            report_foreground(url, TOKEN, [{"namespace": NS, "model": MODEL, "time": now.replace(tzinfo=None)}])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_namespaced_controller_refuses_reports_on_other_namespaces_by_name(event_store, wakes):
    """A new user's trial: a controller limited to one namespace answered "no such Model" for a
    Model that existed in another; such a report is now refused alone, saying why."""
    endpoint = IngestEndpoint(
        TOKEN, event_store.append, lambda ns, m: True, lambda: wakes.append(1), Settings(), lambda: NOW,
        monotonic=FakeMonotonic(), scope=NS,
    )
    status, body = endpoint.handle("POST", GOOD_HEADERS, _body(_report(id="in"), _report(id="out", namespace="other")), "c")
    assert (status, body["accepted"]) == (202, 1), body
    (refused,) = body["rejected"]
    assert (refused["index"], refused["error"]) == (1, "namespace_not_watched")
    assert refused["detail"]["message"] == f"this controller watches only the namespace {NS}, not other"
    body = _assert_rejected_after(event_store, 1, endpoint.handle("POST", GOOD_HEADERS, _body(_report(id="out2", namespace="other")), "c"))
    assert body["error"] == "namespace_not_watched" and [d["field"] for d in body["detail"]] == ["reports.0.namespace"]


def _assert_rejected_after(event_store, head: int, result) -> dict:
    status, body = result
    assert status == 422, body
    assert event_store.head() == head
    return body
