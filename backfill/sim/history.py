"""A model's foreground history from the event log, for ``backfill recommend``.

Reads with the store's existing API (:meth:`backfill.store.EventStore.read` filtered by stream):
the ``ForegroundRequest`` events of one model become a trace (arrival ``at``, service time
``busy_until - at``, 0 when unknown), and for a ModelBackfill also its latest spec, the running
seconds of its succeeded runs and the cancel latencies it measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import events as ev
from ..core.durations import format_duration
from ..core.projector import FOREGROUND_DEMAND
from ..core.spec import Spec, parse_spec
from .traces import Trace, counted


class HistoryError(ValueError):
    """The log holds nothing to recommend from (unknown ModelBackfill, no foreground request...)."""


@dataclass
class History:
    """What the log says about one model (and, with ``--backfill``, one declaration).

    Attributes:
        trace: the model's foreground requests as a one-model :class:`Trace` (seconds, UTC).
        spec: the declaration's latest valid spec, or None (``--model`` or an invalid spec).
        job_seconds: running seconds of each succeeded run of the declaration.
        cancel_latencies: seconds from each foreground request that preempted an attempt to its
            Job being gone (``JobDeleted``), one per foreground preemption that completed.
        stale_cancels: foreground preemptions left out of :attr:`cancel_latencies` because
            their request is older than the Job (``JobCreated``): a late or stale report (a
            router's ``lastActiveTime`` from before the Job existed; a new user's trial: one such
            report 1.5 h old made the p95 "demand -> Job gone" 1h31m, and every row of the
            recommendation used it), which measures the signal's delay, not the cancel's; and
            those whose request is dated after the Job was gone (a reporter's clock ahead: a
            trial's were dropped without a word).
    """

    trace: Trace
    spec: Spec | None = None
    job_seconds: list[float] = field(default_factory=list)
    cancel_latencies: list[float] = field(default_factory=list)
    stale_cancels: int = 0

    def measured_job(self) -> float | None:
        """Median running seconds of the succeeded runs, or None when there were none."""
        return statistics.median(self.job_seconds) if self.job_seconds else None

    def measured_latency(self) -> float | None:
        """The 95th percentile (nearest rank) of :attr:`cancel_latencies`, seconds, or None."""
        if not self.cancel_latencies:
            return None
        xs = sorted(self.cancel_latencies)
        return xs[max(0, -(-95 * len(xs) // 100) - 1)]


def _events(store: Any, stream: str) -> list[tuple[int, Any]]:
    return [(r.position, ev.decode(r.type, r.version, r.data)) for r in store.read(stream_prefix=stream) if r.stream == stream]


def backfill_namespaces(store: Any, name: str, declared: Mapping[tuple[str, str], Any] | None = None) -> list[str]:
    """The namespaces in which a ModelBackfill named ``name`` was applied (its stream
    ``backfill/<namespace>/<name>`` holds a ``BackfillApplied``, or ``declared`` holds it: see
    :func:`pruned_declarations`), sorted: how a bare ``--backfill NAME`` is resolved, as
    ``runs`` and ``replay`` take one. Reads the backfill streams' rows, not their payloads.

    Raises: sqlalchemy / psycopg errors: the database cannot be read.
    """
    found = {ns for ns, n in (declared or {}) if n == name}
    for r in store.read(stream_prefix="backfill/"):
        parts = r.stream.split("/")
        if len(parts) == 3 and parts[2] == name and r.type == "BackfillApplied":
            found.add(parts[1])
    return sorted(found)


def pruned_declarations(store: Any) -> Mapping[tuple[str, str], Any]:
    """The ModelBackfills of the newest snapshot this release can read, by ``(namespace,
    name)``, when the log was pruned (their ``BackfillApplied`` may be gone with it; a trial:
    ``recommend --backfill`` said "not in the log" for a declaration whose spec never changed
    after its first scheduled prune); empty otherwise."""
    if not store.pruned_up_to():
        return {}
    from backfill.store import projection

    world = projection.latest(store, unreadable=[])
    return dict(world.backfills.items()) if world is not None else {}


def read_history(
    store: Any,
    namespace: str,
    *,
    backfill: str | None = None,
    model: str | None = None,
    declared: Mapping[tuple[str, str], Any] | None = None,
) -> History:
    """The history of ``backfill`` (its spec's model) or of ``model`` in ``namespace``.

    Args:
        store: a :class:`backfill.store.EventStore`.
        namespace: the Kubernetes namespace.
        backfill: a ModelBackfill name (its latest ``BackfillApplied`` names the model, else
            its state in ``declared``).
        model: a Model name (when no ``backfill`` is given).
        declared: :func:`pruned_declarations`, for a declaration whose ``BackfillApplied`` a
            prune dropped.

    Raises:
        HistoryError: the ModelBackfill is not in the log, its spec names no model, or the model
            has no foreground request.
        backfill.core.events.EventDecodeError: a stored event cannot be decoded.
        sqlalchemy / psycopg errors: the database cannot be read.
    """
    spec = None
    job_seconds: list[float] = []
    cancels: dict[str, int] = {}  # job name -> position of the foreground request that preempted it
    deleted: dict[str, Any] = {}
    created: dict[str, Any] = {}  # job name -> its JobCreated time
    if backfill is not None:
        applied = None
        # running seconds count from the Job's start, else its creation, as the runs projection
        # does; a resumable Job's (spec.preemption: Suspend) only while it ran: from each start or
        # resume to its suspension (a new user's trial: a Job that ran 28 s in three segments
        # over 1m40s measured 1m40s, and would be simulated as long)
        running: dict[str, Any] = {}  # job name -> the start of its current run (absent while suspended)
        ran: dict[str, float] = {}  # job name -> seconds of its ended runs (segments)
        for _, e in _events(store, f"backfill/{namespace}/{backfill}"):
            t = type(e)
            if t is ev.BackfillApplied:
                applied = e
            elif t is ev.JobCreated:
                created.setdefault(e.name, e.at)
            elif t is ev.JobRunning:
                if e.name not in ran:  # before any suspension (a later JobRunning is the resumed run's)
                    running.setdefault(e.name, e.at)
            elif t is ev.JobSuspended:
                start = running.pop(e.name, None) if e.name in running else (None if e.name in ran else created.get(e.name))
                ran[e.name] = ran.get(e.name, 0.0) + (max(0.0, (e.at - start).total_seconds()) if start is not None else 0.0)
            elif t is ev.JobResumed:
                running[e.name] = e.at
            elif t is ev.JobSucceeded and (e.name in running or e.name in created or e.name in ran):
                start = running.get(e.name, None if e.name in ran else created.get(e.name))
                last = (e.at - start).total_seconds() if start is not None else 0.0
                job_seconds.append(ran.get(e.name, 0.0) + last)
            elif t is ev.AttemptCancelled and e.reason == FOREGROUND_DEMAND:
                cancels[e.job_name] = e.cause
            elif t is ev.JobDeleted:
                deleted[e.name] = e.at
        state = (declared or {}).get((namespace, backfill))
        if applied is None and state is None:
            raise HistoryError(f"ModelBackfill {namespace}/{backfill} is not in the log")
        raw = applied.spec if applied is not None else state.raw_spec
        parsed = parse_spec(raw)
        if isinstance(parsed, Spec):
            spec = parsed
            model = parsed.model_ref
        else:
            model = raw.get("modelRef") if isinstance(raw, Mapping) else None
            if not isinstance(model, str) or not model:
                raise HistoryError(f"ModelBackfill {namespace}/{backfill}: its spec names no model ({parsed.reason})")
    assert model is not None
    requests: list[tuple[float, float]] = []
    at_of: dict[int, Any] = {}
    for pos, e in _events(store, f"model/{namespace}/{model}"):
        if type(e) is ev.ForegroundRequest:
            at_of[pos] = e.at
            busy = (e.busy_until - e.at).total_seconds() if e.busy_until is not None and e.busy_until > e.at else 0.0
            requests.append((e.at.timestamp(), busy))
    if not requests:
        raise HistoryError(f"Model {namespace}/{model} has no foreground request in the log")
    requests.sort()
    latencies, stale = [], 0
    for job, cause in cancels.items():
        if job not in deleted or cause not in at_of:
            continue
        if job in created and at_of[cause] < created[job]:
            stale += 1  # the request came before the Job existed: not a cancel latency
            continue
        latency = (deleted[job] - at_of[cause]).total_seconds()
        if latency >= 0:
            latencies.append(latency)
        else:
            stale += 1  # dated after the Job was gone (a reporter's clock ahead): left out, and said (a trial: dropped silently)
    trace = Trace(f"log {namespace}/{model}", {model: requests})
    return History(trace, spec, job_seconds, latencies, stale)


@dataclass(frozen=True)
class Input:
    """One model's history for ``recommend``.

    Attributes:
        source: where it came from (a trace file or ``schema S, backfill NS/NAME``), for titles.
        model: the model name.
        requests: sorted ``(arrival_s, service_s)``.
        spec: the declaration's spec when read for a ModelBackfill.
        job: measured job length (median succeeded run), seconds, or None (none, or a median of 0).
        latency: measured cancel latency (p95), seconds, or None.
        note: a line for the user about what was read, or "".
    """

    source: str
    model: str
    requests: list[tuple[float, float]]
    spec: Spec | None = None
    job: float | None = None
    latency: float | None = None
    note: str = ""


def from_trace(trace: Trace, models: list[str]) -> list[Input]:
    """The ``models`` of ``trace`` (all of a one-model trace when none is named).

    Raises:
        HistoryError: no model named and the trace has several (the message names the busiest).
        backfill.sim.traces.TraceError: a named model has no request.
    """
    if not models:
        if len(trace.requests) > 1:
            busiest = sorted(trace.requests, key=lambda m: (-len(trace.requests[m]), m))[:5]
            raise HistoryError(f"--model is required: {trace.name} has {len(trace.requests)} models (the busiest: {', '.join(busiest)})")
        models = list(trace.requests)
    tr = trace.filtered(models)
    return [Input(tr.name, m, tr.requests[m]) for m in tr.requests]


def from_log(store: Any, schema: str, targets: list[tuple[str, str, str]]) -> list[Input]:
    """One :class:`Input` per ``(kind, namespace, name)`` target, kind ``backfill`` or ``model``;
    its note says when the log was pruned (only the kept history is read).

    Raises: as :func:`read_history`.
    """
    out = []
    pruned = store.pruned_up_to()
    declared = pruned_declarations(store)
    for kind, ns, name in targets:
        h = read_history(store, ns, **{kind: name}, declared=declared)
        ((m, reqs),) = h.trace.requests.items()
        job, latency = h.measured_job(), h.measured_latency()
        # A median of 0 s (Jobs that ended within their start's second) is no job length to
        # simulate: not used, and said so (a new user's trial read "job 15m0s" above "median 0s").
        unusable = job is not None and job <= 0
        note = (
            f"{ns}/{name}: model {m}, {counted(len(reqs), 'foreground request')}; {counted(len(h.job_seconds), 'succeeded run')}"
            + (f" (median {format_duration(job)}{': too short to simulate, not used; give --job' if unusable else ''})" if job is not None else "")
            + f"; {counted(len(h.cancel_latencies), 'foreground cancel')} measured"
            + (f" (p95 demand -> Job gone {format_duration(latency)})" if latency is not None else "")
            + (f", {h.stale_cancels} left out (a request dated before its Job existed or after it was gone: a late report, or a reporter's clock off)" if h.stale_cancels else "")
            if kind == "backfill" else f"{ns}/{name}: {counted(len(reqs), 'foreground request')}"
        )
        if pruned:  # a day-2 trial: the retained history was read as if it were all of it
            note += f" (the log was pruned up to position {pruned}: only what it kept after that is read)"
        out.append(Input(f"schema {schema}, {kind} {ns}/{name}", m, reqs, h.spec, None if unusable else job, latency, note))
    return out
