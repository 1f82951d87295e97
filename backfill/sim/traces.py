"""Foreground request traces: readers for the public traces and a seeded synthetic workload.

Every reader returns a :class:`Trace`: per model, the requests as ``(arrival, service_time)``
pairs in seconds since the Unix epoch (UTC) and seconds, sorted by arrival. Trace times without a
zone are read as UTC (shared/data/README.md).

Formats:
- ``alibaba-genai``: ``lora_request_trace.csv`` (columns ``gmt_create``, ``exec_time_seconds``,
  ``checkpoint_model_version_id``; an empty service time counts as 0; rows with an empty model
  (25 PENDING rows) are skipped and counted in ``Trace.skipped``).
- ``azure-llm``: ``AzureLLMInferenceTrace_{code,conv}.csv`` (column ``TIMESTAMP``; one model,
  named after the file's suffix, e.g. ``code``; service time 0, the trace has none).
- ``csv``: a header and ``model,timestamp[,duration_s]`` rows; timestamp ISO 8601 (a zone is
  honoured, none means UTC) or Unix seconds.
"""

from __future__ import annotations

import csv
import io
import math
import random
import stat
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

FORMATS = ("alibaba-genai", "azure-llm", "csv")


def counted(n: int | float, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 foreground request", "2 days" (a new
    user's trial read "1 foreground requests", "span 1 days"); thousands separated."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and line (``file:line: why``)."""


@dataclass
class Trace:
    """Requests per model: ``requests[model] = [(arrival_s, service_s), ...]`` sorted by arrival."""

    name: str
    requests: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    skipped: int = 0  # rows that name no model (e.g. Alibaba PENDING rows): not attributable

    def filtered(self, models: list[str] | None) -> "Trace":
        """A trace restricted to ``models`` (None or empty = all). Raises TraceError for unknown names."""
        if not models:
            return self
        missing = [m for m in models if m not in self.requests]
        if missing:
            raise TraceError(f"{self.name}: no requests for model(s) {', '.join(missing)}")
        return Trace(self.name, {m: self.requests[m] for m in models}, self.skipped)

    @property
    def count(self) -> int:
        """Total number of requests over all models."""
        return sum(len(v) for v in self.requests.values())


#: Largest accepted service time of one request, seconds (a year: anything longer is a unit mistake).
MAX_SERVICE_SECONDS = 365 * 86400.0
_MAX_EPOCH = datetime(9999, 1, 1, tzinfo=timezone.utc).timestamp()


def _epoch(text: str, where: str) -> float:
    t = text.strip()
    if not t:
        raise TraceError(f"{where}: empty timestamp")
    try:
        value = float(t)
    except ValueError:
        try:
            dt = datetime.fromisoformat(t[:-1] + "+00:00" if t[-1:] in ("Z", "z") else t)
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            value = dt.timestamp()
        except (ValueError, OverflowError):
            raise TraceError(f"{where}: bad timestamp {t!r}") from None
        if not 0 <= value < _MAX_EPOCH:  # a new user's trial: an RFC 3339 time was said to be Unix seconds
            raise TraceError(f"{where}: timestamp {t!r} is out of range (from 1970-01-01 up to, not including, 9999-01-01)")
    if not (math.isfinite(value) and 0 <= value < _MAX_EPOCH):
        raise TraceError(
            f"{where}: timestamp {t!r} is out of range (Unix seconds from 1970 up to, not including, 9999 expected; "
            "milliseconds?)"
        )
    return value


def _duration(text: str | None, where: str) -> float:
    if text is None or not text.strip():
        return 0.0
    try:
        d = float(text)
    except ValueError:
        raise TraceError(f"{where}: bad service time {text!r}") from None
    if not math.isfinite(d) or d < 0:
        raise TraceError(f"{where}: service time must be a finite number >= 0, got {text!r}")
    if d > MAX_SERVICE_SECONDS:
        raise TraceError(f"{where}: service time {text!r} s is longer than a year")
    return d


def _read_text(path: Path) -> str:
    """The text of trace ``path``: a file or a pipe (``--trace <(zcat t.csv.gz)``), in UTF-8.

    Raises:
        TraceError: unreadable, a device (``/dev/zero`` was read until the machine ran out of
            memory: an adversarial trial, 18.6 GB in 40 s) or socket, or not UTF-8 (the line)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise TraceError(f"{path}: is a directory, not a trace file")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise TraceError(f"{path}: not a file (a device or socket): give a trace file, or a pipe")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TraceError(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _read_rows(path: Path, required: tuple[str, ...]):
    reader = csv.reader(io.StringIO(_read_text(path), newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise TraceError(f"{path}:1: empty file, expected a header") from None
    except csv.Error as exc:
        raise TraceError(f"{path}:1: {exc}") from None
    header = [h.strip().lstrip("\ufeff") for h in header]
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)} (header: {','.join(header)[:200]}){_format_hint(header)}")
    idx = {c: header.index(c) for c in header}
    try:
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            yield reader.line_num, idx, row
    except csv.Error as exc:
        raise TraceError(f"{path}:{reader.line_num}: {exc}") from None


def _format_hint(header: list[str]) -> str:
    for fmt, cols in (("alibaba-genai", "gmt_create"), ("azure-llm", "TIMESTAMP"), ("csv", "timestamp")):
        if cols in header:
            return f"; is it --format {fmt}?"
    return ""


def _get(row: list[str], idx: dict[str, int], col: str, where: str) -> str:
    i = idx[col]
    if i >= len(row):
        raise TraceError(f"{where}: missing column {col}")
    return row[i]


def read_alibaba(path: Path) -> Trace:
    """Read the Alibaba GenAI 2026 ``lora_request_trace.csv``. Raises TraceError."""
    out: dict[str, list[tuple[float, float]]] = {}
    skipped = 0
    for line, idx, row in _read_rows(path, ("gmt_create", "exec_time_seconds", "checkpoint_model_version_id")):
        where = f"{path}:{line}"
        t = _epoch(_get(row, idx, "gmt_create", where), where)
        d = _duration(_get(row, idx, "exec_time_seconds", where), where)
        model = _get(row, idx, "checkpoint_model_version_id", where).strip()
        if not model:
            skipped += 1  # a request that never reached a model (PENDING rows): no demand to attribute
            continue
        out.setdefault(model, []).append((t, d))
    trace = _finish(path, out)
    trace.skipped = skipped
    return trace


def read_azure(path: Path) -> Trace:
    """Read an Azure LLM inference trace 2023 file (one model named after the file suffix)."""
    model = path.stem.rsplit("_", 1)[-1] if "_" in path.stem else path.stem
    reqs = [(_epoch(_get(row, idx, "TIMESTAMP", f"{path}:{line}"), f"{path}:{line}"), 0.0) for line, idx, row in _read_rows(path, ("TIMESTAMP",))]
    return _finish(path, {model: reqs})


def read_csv(path: Path) -> Trace:
    """Read a plain ``model,timestamp[,duration_s]`` CSV with a header row."""
    out: dict[str, list[tuple[float, float]]] = {}
    for line, idx, row in _read_rows(path, ("model", "timestamp")):
        where = f"{path}:{line}"
        model = _get(row, idx, "model", where).strip()
        if not model:
            raise TraceError(f"{where}: empty model")
        t = _epoch(_get(row, idx, "timestamp", where), where)
        d = _duration(row[idx["duration_s"]] if "duration_s" in idx and idx["duration_s"] < len(row) else None, where)
        out.setdefault(model, []).append((t, d))
    return _finish(path, out)


def _finish(path: Path, out: dict[str, list[tuple[float, float]]]) -> Trace:
    if not out:
        raise TraceError(f"{path}: no requests")
    for reqs in out.values():
        reqs.sort()
    return Trace(str(path), dict(sorted(out.items())))


def read_trace(path: str | Path, fmt: str) -> Trace:
    """Read ``path`` in format ``fmt`` (one of :data:`FORMATS`). Raises TraceError."""
    p = Path(path)
    if fmt == "alibaba-genai":
        return read_alibaba(p)
    if fmt == "azure-llm":
        return read_azure(p)
    if fmt == "csv":
        return read_csv(p)
    raise TraceError(f"unknown trace format {fmt!r}; use one of {', '.join(FORMATS)}")


class SyntheticTooLarge(TraceError):
    """:func:`synthetic` stopped: the workload would hold more than ``limit`` requests."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the synthetic workload holds more than {limit:,} requests")
        self.limit = limit


def synthetic(
    seed: int = 7, models: int = 4, days: float = 2.0, start: str = "2026-01-05T00:00:00+00:00", *, max_requests: int | None = None
) -> Trace:
    """A seeded synthetic workload, documented so its numbers can be reproduced.

    Each model alternates busy sessions and quiet gaps: a session is a Poisson burst of requests
    (mean 1 request per 20 s, 5 to 60 minutes long, service time 2 to 30 s uniform); the quiet gap
    after it is exponential with a mean of 45 minutes (so some gaps are long enough for a backfill
    and some are not), about 1,800 requests per model-day. ``random.Random(seed)`` drives
    everything; model names are ``syn-0``...

    Raises:
        SyntheticTooLarge: more than ``max_requests`` requests in all (None: no limit), found
            while generating, so a workload too large to simulate costs no more than the limit
            (a new user's trial: ``--synthetic-models 1000 --days 366`` grew past 5 GB before
            ``--max-attempts`` refused it).
    """
    rng = random.Random(seed)
    t0 = datetime.fromisoformat(start).timestamp()
    end = t0 + days * 86400
    out: dict[str, list[tuple[float, float]]] = {}
    left = max_requests if max_requests is not None else -1
    for i in range(models):
        t = t0 + rng.uniform(0, 600)
        reqs: list[tuple[float, float]] = []
        while t < end:
            session_end = t + rng.uniform(300, 3600)
            while t < session_end and t < end:
                if left == 0:
                    raise SyntheticTooLarge(max_requests or 0)
                left -= 1
                reqs.append((round(t, 3), round(rng.uniform(2, 30), 3)))
                t += rng.expovariate(1 / 20)
            t += rng.expovariate(1 / 2700)
        out[f"syn-{i}"] = reqs
    return Trace(f"synthetic(seed={seed}, models={models}, days={days:g})", out)
