"""Robustness: IngestEndpoint.handle on hostile input, against a real PostgreSQL store (the
embedded server in a temporary directory). Bad input gets a 4xx JSON body and appends nothing;
the endpoint never raises and never answers 5xx for the client's own mistakes."""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill.controller.ingest import IngestEndpoint
from backfill.settings import Settings

NOW = datetime(2026, 11, 30, 10, 0, 0, tzinfo=timezone.utc)
NS, MODEL = "flexinfer-system", "gemma"
H = {"Authorization": "Bearer tok", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from backfill.store import EventStore, make_engine, resolve_database_url, upgrade
    from backfill.store.migrate import drop_schema

    url, _ = resolve_database_url(Settings(data_dir=tmp_path_factory.mktemp("pg")))
    schema = f"t_{secrets.token_hex(5)}"
    upgrade(url, schema)
    engine = make_engine(url, schema)
    es = EventStore(engine)
    yield es, engine
    es.close()
    engine.dispose()
    drop_schema(url, schema)


@pytest.fixture(scope="module")
def endpoint(store):
    es, _ = store
    return IngestEndpoint("tok", es.append, lambda ns, m: (ns, m) == (NS, MODEL), lambda: None,
                          Settings(ingest_burst=1_000_000, ingest_rate_per_second=1e6), lambda: NOW)


def _count(engine) -> int:
    with engine.connect() as c:
        return c.exec_driver_sql("SELECT count(*) FROM events").scalar()


def _call(endpoint, engine, body: bytes, headers=H):
    before = _count(engine)
    status, payload = endpoint.handle("POST", headers, body, "c1")
    json.dumps(payload)
    return status, payload, _count(engine) - before


def _report(**kw) -> dict:
    r = {"namespace": NS, "model": MODEL, "time": "2026-11-30T09:59:30Z", "count": 1}
    r.update(kw)
    return r


BAD_BODIES = {
    "id with NUL": b'{"reports":[{"namespace":"flexinfer-system","model":"gemma","time":"2026-11-30T09:59:30Z","id":"a\\u0000b"}]}',
    "numeric-string time inside the window": json.dumps({"reports": [_report(time=str(int(NOW.timestamp()) - 30))]}).encode(),
    "count 0": json.dumps({"reports": [_report(count=0)]}).encode(),
    "count -1": json.dumps({"reports": [_report(count=-1)]}).encode(),
    "count huge": json.dumps({"reports": [_report(count=10**30)]}).encode(),
    "count float": json.dumps({"reports": [_report(count=2.0)]}).encode(),
    "count NaN": b'{"reports":[{"namespace":"flexinfer-system","model":"gemma","time":"2026-11-30T09:59:30Z","count":NaN}]}',
    "1001 reports": json.dumps({"reports": [_report(id=str(i)) for i in range(1001)]}).encode(),
    "no reports": b'{"reports":[]}',
    "deep nesting": b"[" * 100000 + b"]" * 100000,
    "too big": b'{"reports":[' + b" " * 2_000_000 + b"]}",
    "naive time": json.dumps({"reports": [_report(time="2026-11-30T09:59:30")]}).encode(),
    "skew +1us": json.dumps({"reports": [_report(time="2026-11-30T08:59:59.999999Z")]}).encode(),
    "edge of calendar": json.dumps({"reports": [_report(time="9999-12-31T23:59:59-23:59")]}).encode(),
    "lone surrogate id": b'{"reports":[{"namespace":"flexinfer-system","model":"gemma","time":"2026-11-30T09:59:30Z","id":"\\ud800"}]}',
    "utf-16": json.dumps({"reports": [_report()]}).encode("utf-16"),
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_bad_bodies_are_4xx_and_append_nothing(endpoint, store, name):
    status, payload, appended = _call(endpoint, store[1], BAD_BODIES[name])
    assert 400 <= status < 500, (status, payload)
    assert payload.get("error")
    assert appended == 0


@pytest.mark.parametrize("headers", [
    {"Content-Type": "application/json"},
    {"Authorization": "Bearer\ttok", "Content-Type": "application/json"},  # RFC 6750: "Bearer" 1*SP token (two spaces are fine)
    {"Authorization": "Bearer tok", "Content-Type": "text/plain"},
    {"Authorization": "Bearer tok", "Content-Type": "application/json; charset=latin1"},
    {"Authorization": "Bearer tök", "Content-Type": "application/json"},
    {"Authorization": "", "Content-Type": ""},
])
def test_bad_headers_are_4xx(endpoint, store, headers):
    status, payload, appended = _call(endpoint, store[1], json.dumps({"reports": [_report()]}).encode(), headers)
    assert 400 <= status < 500 and appended == 0


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=12,
)
REPORT = st.fixed_dictionaries({}, optional={
    "namespace": st.sampled_from([NS, "", "X", "a" * 64]) | JSON,
    "model": st.sampled_from([MODEL, "nope", ""]) | JSON,
    "time": st.sampled_from(["2026-11-30T09:59:30Z", "2026-11-30T09:00:00Z", "2026-11-30T11:00:00.000001Z", "1796032770"]) | JSON,
    "count": st.integers(-5, 2_000_000) | JSON,
    "id": st.text(max_size=5) | JSON,
    "extra": JSON,
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(JSON.map(lambda v: {"reports": v}), st.lists(REPORT, max_size=3).map(lambda r: {"reports": r}), JSON))
def test_any_json_never_5xx(endpoint, store, body):
    status, payload, appended = _call(endpoint, store[1], json.dumps(body).encode())
    assert status == 202 or 400 <= status < 500, (status, payload)
    if status != 202:
        assert appended == 0
