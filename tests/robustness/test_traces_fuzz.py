"""Robustness: read_trace on malformed files raises only TraceError (``file:line: why``), and
every Trace it returns holds finite, datetime-representable times (the simulator converts them)."""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill.sim.traces import TraceError, read_trace

HEADERS = {
    "csv": "model,timestamp,duration_s",
    "alibaba-genai": "gmt_create,exec_time_seconds,checkpoint_model_version_id",
    "azure-llm": "TIMESTAMP,ContextTokens,GeneratedTokens",
}
CELL = st.one_of(
    st.sampled_from(["", "nan", "inf", "-inf", "1e300", "-1e12", "1764496770000", "1764496770", "2026-01-01T00:00:00Z",
                     "2026-01-01 00:00:00", "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "-3", "1e400",
                     "m1", '"', "\x00", "2026-13-01"]),
    st.text(max_size=8),
)


def _check_trace(trace) -> None:
    for reqs in trace.requests.values():
        for t, d in reqs:
            assert math.isfinite(t) and math.isfinite(d) and d >= 0
            datetime.fromtimestamp(t, timezone.utc)  # representable
            datetime.fromtimestamp(t + d, timezone.utc)


def _read(path: Path, fmt: str) -> None:
    try:
        trace = read_trace(path, fmt)
    except TraceError as exc:
        assert str(path) in str(exc)
        return
    _check_trace(trace)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(sorted(HEADERS)), rows=st.lists(st.lists(CELL, min_size=0, max_size=4), max_size=5))
def test_csv_like_rows(tmp_path, fmt, rows):
    path = tmp_path / "trace_code.csv"
    lines = [HEADERS[fmt]] + [",".join(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    _read(path, fmt)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(sorted(HEADERS)), data=st.binary(max_size=300))
def test_arbitrary_bytes(tmp_path, fmt, data):
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    _read(path, fmt)


@pytest.mark.parametrize("ts", ["nan", "inf", "-inf", "1e300", "-1e12", "1764496770000", "9999-12-31T23:59:59-23:59"])
def test_unrepresentable_timestamps_are_trace_errors(tmp_path, ts):
    path = tmp_path / "t.csv"
    path.write_text(f"model,timestamp\nm1,{ts}\nm1,2026-01-01T00:00:00Z\n")
    with pytest.raises(TraceError, match=re.escape(f"{path}:2:")):
        read_trace(path, "csv")


def test_huge_service_time_is_trace_error(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("model,timestamp,duration_s\nm1,2026-01-01T00:00:00Z,1e300\n")
    with pytest.raises(TraceError, match=re.escape(f"{path}:2:")):
        read_trace(path, "csv")


def test_decode_error_names_the_right_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"model,timestamp\nm1,2026-01-01T00:00:00Z\nm\xe9,2026-01-01T01:00:00Z\n")
    with pytest.raises(TraceError, match=re.escape(f"{path}:3:")):
        read_trace(path, "csv")


def test_directory_and_missing_file(tmp_path):
    for p in (tmp_path, tmp_path / "nope.csv"):
        with pytest.raises(TraceError):
            read_trace(p, "csv")
