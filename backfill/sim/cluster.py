"""A simulated cluster that drives the real projector over a foreground request trace.

Semantics (issue #3, so that any correct implementation gives the same numbers):

- A request at t with service time d keeps its model busy over [t, t+d]; overlapping or touching
  spans merge; idleSince is the end of the last busy span. Per model only the gaps between its
  first and last busy span are simulated: the model becomes Ready (and its ModelBackfill is
  applied) at its first arrival, and nothing is admitted at or after its last arrival.
- A Job is admitted at idleSince + idleFor if that is before the next arrival (an arrival at the
  same instant wins). It succeeds when its whole duration ends at or before the next arrival (a
  completion at the same instant as an arrival wins); otherwise the arrival preempts it, and with
  cancel latency Δ it keeps running Δ seconds into the busy span (foreground overlap; all its
  running seconds are wasted).
- After a success the next admission is at completion + repeatAfter if the model is still idle
  then; after a preemption it takes a fresh full idle window, and not before the preempted Job
  is gone (an arrival at the instant it is gone still wins). A run longer than maxRunDuration
  ends as ``deadline_exceeded`` at admission + maxRunDuration (and the declaration is Failed).
- Shards (issue #11 part 2, ``SimParams.shards`` = N): the job is N equal shards of job/N seconds
  (rounded to the microsecond) run one after another. At a preemption the shards finished at or
  before the arrival are kept (useful seconds), the running shard's seconds and the cancel-latency
  overlap are wasted, and the next attempt (after a fresh full idle window and the same gates)
  runs only the remaining shards; the job succeeds, and the cooldown starts, when the last shard
  completes. A ``deadline_exceeded`` attempt keeps nothing (the declaration is Failed). The
  projector knows nothing of shards: only the simulated Job's duration shrinks. (The live
  controller's resumable Indexed Jobs are issue #11 part 1, not yet built.)

The simulated cluster plays the actor and the Kubernetes side: it records the projector's
decisions as events, "creates" the Job at once (``JobCreated``), completes it after the job
duration (``JobSucceeded``) or at its deadline (``JobFailed``/DeadlineExceeded), and deletes it Δ
seconds after a cancel (``JobDeleted``). Every event gets the position it will have in a fresh
log, so ``replay`` over the stored run sees exactly these decisions.
"""

from __future__ import annotations

import heapq
from operator import attrgetter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable

from ..core import events as ev
from ..core.events import job_key, materialize
from ..core.commands import Admit, Block, Cancel, ReleaseFinalizer, Unblock, WakeAt
from ..core.fold import HANDLERS
from ..core.projector import FOREGROUND_DEMAND, decide, fold
from ..core.decisions import decision_record, validated
from ..core.runs import RunRow, row_of
from ..core.state import Key, World
from ..core.timefmt import plus_seconds
from ..core.durations import format_duration
from ..core.perf import paused_gc
from .traces import Trace

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)

# Same-instant ordering (see module docstring): Job endings, then arrivals, then wake-ups.
_JOB_END, _ARRIVAL, _WAKE = 0, 1, 2
# What a heap entry is (its fourth member), commonest first.
_K_SUCCEED, _K_WAKE, _K_ARRIVAL, _K_DEADLINE, _K_GONE, _K_GONE_WAKE, _K_SETUP = range(7)

TEMPLATE = {
    "metadata": {"labels": {"app": "model-eval-gauntlet"}},
    "spec": {
        "backoffLimit": 0,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "gauntlet", "image": "example/gauntlet:1", "resources": {"requests": {"cpu": "500m"}}}],
            }
        },
    },
}


def to_dt(us: int) -> datetime:
    """Integer microseconds since the epoch -> aware UTC datetime (exact)."""
    return EPOCH + us * _US


def to_us(dt: datetime) -> int:
    """Aware datetime -> integer microseconds since the epoch (exact)."""
    return (dt - EPOCH) // _US


@dataclass(frozen=True)
class SimParams:
    """Simulation parameters, seconds.

    Attributes:
        idle_for: the continuous idle window (spec.idleFor).
        max_run: spec.maxRunDuration (the Job's deadline).
        repeat_after: spec.repeatAfter (0 = one-shot).
        job: how long the background work takes when undisturbed.
        cancel_latency: seconds from the cancel decision to the Job being gone (Δ).
        signal_granularity: seconds added to the end of every busy span the projector sees, as
            the controller pads a coarse ``Model.status.lastActiveTime`` (setting
            ``foreground_signal_granularity_seconds``); 0 = an exact signal (a trace, or ingest).
            Preemption still follows the real arrivals: this only delays the idle windows.
        shards: N >= 1 equal shards the job is made of (1 = not resumable: a preemption loses
            the whole attempt).
        namespace: namespace of the simulated objects.
    """

    idle_for: float = 1800.0
    max_run: float = 1800.0
    repeat_after: float = 0.0
    job: float = 900.0
    cancel_latency: float = 0.0
    signal_granularity: float = 0.0
    shards: int = 1
    namespace: str = "sim"

    def shard_us(self) -> int:
        """One shard's duration in integer microseconds (job / shards, rounded)."""
        return round(self.job * 1e6 / self.shards)

    def spec(self, model: str) -> dict[str, Any]:
        """The ModelBackfill spec the simulation applies for ``model`` (Go durations)."""
        out = {
            "modelRef": model,
            "templateRef": "sim-template",
            "idleFor": format_duration(self.idle_for),
            "maxRunDuration": format_duration(self.max_run),
        }
        if self.repeat_after:
            out["repeatAfter"] = format_duration(self.repeat_after)
        return out


class SimLog(Sequence):
    """The simulated log, ``(position, event, idempotency_key)`` in log order (positions 1..N),
    as a read-only sequence.

    The simulation folds its events in their compiled forms (:func:`backfill.core.events.build`);
    an item read from here is the event itself, built on each read
    (:func:`backfill.core.events.materialize`: equal every time, not the same object), so a
    caller that only counts them or reads a part pays nothing for the rest.
    :meth:`compiled` gives the items as held.
    """

    __slots__ = ("_items",)

    def __init__(self, items: list[tuple[int, Any, str]] | None = None) -> None:
        self._items: list[tuple[int, Any, str]] = [] if items is None else items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [(p, materialize(e), k) for p, e, k in self._items[index]]
        p, e, k = self._items[index]
        return p, materialize(e), k

    def __iter__(self) -> Iterator[tuple[int, Any, str]]:
        for p, e, k in self._items:
            yield p, materialize(e), k

    def __eq__(self, other: object) -> bool:
        """Equal to a log or list of the same items (the events compared, whatever their form)."""
        if isinstance(other, SimLog):
            return len(self) == len(other) and list(self) == list(other)
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like the list it wraps

    def compiled(self) -> list[tuple[int, Any, str]]:
        """The items as held: an event may be its compiled form (it folds as the event). Do not
        change the list."""
        return self._items


@dataclass
class SimResult:
    """What a simulation produced.

    Attributes:
        events: ``(position, event, idempotency_key)`` in log order (positions 1..N), a
            :class:`SimLog`.
        runs: the final run row per attempt, in admission order.
        overlap: foreground-overlap seconds per model (Δ per foreground preemption).
        useful: useful seconds per ended attempt, keyed ``(backfill name, attempt)``: the
            shards it completed (a whole succeeded job with one shard; 0 when preempted
            without shards or deadline-exceeded).
        world: the final projected world.
    """

    events: SimLog = field(default_factory=SimLog)
    runs: list[RunRow] = field(default_factory=list)
    overlap: dict[str, float] = field(default_factory=dict)
    useful: dict[tuple[str, int], float] = field(default_factory=dict)
    world: World = field(default_factory=World)


def backfill_name(model: str) -> str:
    """The simulated ModelBackfill's name for ``model`` (lower-case DNS-1123)."""
    return "bf-" + "".join(ch if ch.isalnum() else "-" for ch in model.lower())


def sim_node(model: str) -> str:
    """The simulated node of ``model``: one node per model (a node must be known for admission,
    and one per model keeps the per-node contender gate from coupling models)."""
    return "node-" + backfill_name(model)[3:]


def attempts_bound(requests: Mapping[str, Sequence[tuple[float, float]]], params: SimParams) -> int:
    """An upper bound on the attempts a simulation of ``requests`` (per model, sorted
    ``(arrival_s, service_s)``) with ``params`` admits: per model, two per request (a request
    preempts at most one attempt, and the attempt finishing a preempted job's last shards may
    succeed early) plus one, plus, when it repeats, one per ``min(job as simulated, max_run) +
    repeat_after`` of the span between its first and last request (nothing is admitted after
    the last)."""
    # the job as simulated: ``shards`` shards of ``shard_us`` (rounded: may be shorter than ``job``)
    cycle = min(params.shards * params.shard_us() / 1e6, params.job, params.max_run) + params.repeat_after
    total = 0
    for reqs in requests.values():
        if not reqs:
            continue
        total += 2 * len(reqs) + 1
        if params.repeat_after:
            total += int((reqs[-1][0] - reqs[0][0]) // cycle)
    return total


_NO_BACKFILL = ev.with_compiled(ev.ForegroundRequest, ev.ModelReady, ev.BackfillApplied, ev.CronJobSeen)


def simulate(
    trace: Trace, params: SimParams, progress: Callable[[int], None] | None = None, *, fast: bool = True
) -> SimResult:
    """Run the simulation (see :func:`_simulate`) with the cyclic collector paused
    (:func:`backfill.core.perf.paused_gc`: 15-40% faster, safe since nothing here forms cycles).

    Raises:
        SimulationRangeError: its times run past 9999-12-31 (an adversarial trial: a request
            late in year 9998 with a long signal granularity ended in an OverflowError traceback).
    """
    with paused_gc():
        try:
            return _simulate(trace, params, progress, fast=fast)
        except OverflowError:
            raise SimulationRangeError(
                "the simulation reaches past 9999-12-31 (the last representable time): a request late in year 9998 plus its "
                "service time, the signal granularity or a Job's run; use earlier timestamps or shorter durations"
            ) from None


class SimulationRangeError(ValueError):
    """A simulation whose times run past the last representable instant (9999-12-31, UTC)."""


def _simulate(
    trace: Trace, params: SimParams, progress: Callable[[int], None] | None = None, *, fast: bool = True
) -> SimResult:
    """Run the projector over ``trace`` with ``params``; see the module docstring for semantics.

    Args:
        trace: per-model requests (epoch seconds, service seconds).
        params: the declaration and the simulated cluster's timings.
        progress: called with the number of requests processed since the last call.
        fast: build the simulator's own observations and decision records in their compiled
            forms without validation (:func:`backfill.core.events.build`: the values are ours
            and typed; they fold as the events, and :class:`SimLog` gives the events), skip the
            decision at a Job's end and record an attempt when the next admission replaces it;
            False validates every event with pydantic. Same results either way
            (``tests/sim/test_fast_path.py``).

    Returns:
        A :class:`SimResult`. Deterministic for the same inputs.
    """
    ns = params.namespace
    if params.shards < 1:
        raise ValueError("shards must be >= 1")
    shards = params.shards
    shard_us = params.shard_us()
    max_us = round(params.max_run * 1e6)
    delta_us = round(params.cancel_latency * 1e6)
    pad_us = round(params.signal_granularity * 1e6)
    make = ev.build if fast else validated
    # The commonest observations call their class directly (with ``type=``, as a compiled form
    # must): no dict of values in between, 5x cheaper than ``build``.
    created, succeeded, request = (ev.compiled_class(c) if fast else c for c in (ev.JobCreated, ev.JobSucceeded, ev.ForegroundRequest))
    key_of = ev.key_of
    result = SimResult()
    log = result.events.compiled()
    add = log.append
    world = World()
    heap: list[tuple[int, int, int, int, Any]] = []
    heappush, heappop = heapq.heappush, heapq.heappop
    seq = 0
    horizon: dict[str, int] = {}
    model_of: dict[tuple[str, str], str] = {}
    runs: dict[tuple[str, int], tuple[Any, Any]] = {}
    wakes: dict[tuple[str, str], int] = {}
    cancelled: set[tuple[str, int]] = set()
    overlap = result.overlap
    useful = result.useful
    left: dict[str, int] = {}  # backfill name -> shards still to run in the current job
    started: dict[tuple[str, int], tuple[int, int]] = {}  # (name, attempt) -> (admitted us, shards)

    def append(event: Any, key: str | None = None) -> None:
        nonlocal world
        pos = len(log) + 1
        add((pos, event, key or key_of(event)))
        world = fold(world, event, pos)
        if type(event) in _NO_BACKFILL:
            return
        b = world.backfills.get((ns, event.backfill))
        if b is not None and b.attempt is not None:
            runs[(b.uid, b.attempt.number)] = (b, b.attempt)  # rows are built once, at the end

    handlers = HANDLERS

    def append_fast(event: Any, key: str | None = None) -> None:
        # Runs are kept by the admission that replaces the attempt (``act``), not after every
        # event as ``append`` does.
        nonlocal world
        pos = len(log) + 1
        add((pos, event, key or key_of(event)))
        world = handlers[type(event)](world, event, pos)  # fold(world, event, pos), one call less

    if fast:
        append = append_fast  # noqa: F811 - same log and world, fewer run captures

    def wake(key: Key, at: int, at_dt: datetime) -> None:
        """A wake-up for ``key`` at ``at`` us, which is ``at_dt`` (none at or after its model's
        last arrival). The heap entry carries ``at_dt``: the decision then needs no conversion
        from microseconds (0.5 us each, three a cycle before)."""
        nonlocal seq
        if at >= horizon[model_of[key]] or wakes.get(key) == at:
            return
        wakes[key] = at
        seq += 1
        heappush(heap, (at, _WAKE, seq, _K_WAKE, (key, at_dt)))

    def push(us: int, prio: int, kind: int, payload: Any) -> None:
        nonlocal seq
        seq += 1
        heappush(heap, (us, prio, seq, kind, payload))

    job_spans: dict[int, timedelta] = {}  # a Job's run in us -> as a timedelta
    repeat_us: dict[float, int] = {}  # spec.repeatAfter (seconds) -> whole us, as plus_seconds adds it

    def act(now_us: int, now: datetime, keys) -> None:
        # ``now`` is ``now_us`` as a datetime (the caller has it)
        for cmd in decide(world, now, keys):
            t = type(cmd)
            if t is WakeAt:
                wake(cmd.key, (cmd.at - EPOCH) // _US, cmd.at)
            elif t is Admit:
                # An attempt's final state is the one it has when the next admission replaces it
                # (or at the end): its run row is kept then.
                b = world.backfills.get(cmd.key)
                if b is not None and b.attempt is not None:
                    runs[(b.uid, b.attempt.number)] = (b, b.attempt)
                append(*decision_record(cmd, at=now, basis=world.position, compiled=fast))
                name = cmd.key[1]
                job = cmd.job_name
                uid = "job-" + job
                append(created(type="JobCreated", at=now, namespace=ns, backfill=name, name=job, uid=uid), job_key(ns, job, "JobCreated", uid))
                todo = left.get(name, shards)
                started[(name, cmd.attempt)] = (now_us, todo)
                job_us = todo * shard_us
                kind = _K_SUCCEED
                if job_us > max_us:
                    job_us, kind = max_us, _K_DEADLINE
                span = job_spans.get(job_us)
                if span is None:
                    span = job_spans[job_us] = job_us * _US
                # the end as a datetime too (exact: whole microseconds), for the Job's end event;
                # past 9999-12-31 it is computed (and fails) only if the end is reached, as before
                try:
                    end = now + span
                except OverflowError:
                    end = None
                push(now_us + job_us, _JOB_END, kind, (cmd.key, cmd.attempt, job, end, todo))
            elif t is Cancel:
                append(*decision_record(cmd, at=now, basis=world.position, compiled=fast))
                cancelled.add((cmd.key[1], cmd.attempt))
                push(now_us + delta_us, _JOB_END, _K_GONE, (cmd.key, cmd.attempt, cmd.job_name, now_us, cmd.reason))
            elif t is Block or t is Unblock:
                append(*decision_record(cmd, at=now, basis=world.position, compiled=fast))
            elif t is ReleaseFinalizer:  # pragma: no cover - nothing is deleted in a simulation
                pass

    # Set-up: the shared CronJob template, then per model at its first arrival: Ready + backfill.
    first = min((reqs[0][0] for reqs in trace.requests.values() if reqs), default=0.0)
    t0 = round(first * 1e6)
    append(ev.CronJobSeen(at=to_dt(t0), namespace=ns, name="sim-template", job_template=TEMPLATE), "sim/cronjob")
    # A model's requests enter the heap one at a time (the next when one is popped: a heap of
    # about three entries per model, not one per request), each with the sequence number it
    # would have had pushed all at once here, so that the order is the same.
    arrivals: dict[str, tuple[list[tuple[float, float]], list[int], int, list[int]]] = {}
    for model, reqs in trace.requests.items():
        if not reqs:
            continue
        key = (ns, backfill_name(model))
        model_of[key] = model
        horizon[model] = round(reqs[-1][0] * 1e6)
        push(round(reqs[0][0] * 1e6), _ARRIVAL, _K_SETUP, model)
        n = len(reqs)
        at = [round(t * 1e6) for t, _ in reqs]  # the heap's order: the microsecond, then the index
        ordered = all(at[j] <= at[j + 1] for j in range(n - 1))
        order = list(range(n)) if ordered else sorted(range(n), key=at.__getitem__)
        arrivals[model] = (reqs, order, seq + 1, at)  # request j's sequence number: seq + 1 + j
        heappush(heap, (at[order[0]], _ARRIVAL, seq + 1 + order[0], _K_ARRIVAL, (model, 0)))
        seq += n

    done = 0
    while heap:
        now_us, _prio, _seq, kind, payload = heappop(heap)
        if kind == _K_SUCCEED or kind == _K_DEADLINE:
            key, attempt, name, now, todo = payload
            if (key[1], attempt) in cancelled:
                continue  # the arrival preempted it first
            if now is None:
                now = EPOCH + now_us * _US  # OverflowError: past the last representable instant
            if kind == _K_SUCCEED:
                uid = "job-" + name
                append(succeeded(type="JobSucceeded", at=now, namespace=ns, backfill=key[1], name=name, uid=uid), job_key(ns, name, "JobSucceeded", uid))
                useful[(key[1], attempt)] = todo * shard_us / 1e6
                left[key[1]] = shards  # the next job starts from the first shard
            else:
                useful[(key[1], attempt)] = 0.0
                append(make(ev.JobFailed, at=now, namespace=ns, backfill=key[1], name=name, uid="job-" + name, reason="DeadlineExceeded"))
            if fast:
                # Nothing to decide at a Job's end: the attempt was admitted (so the declaration
                # was valid, not suspended, not blocked) and only its own Job events happened
                # since. A failure makes the generation terminal (no command, no wake-up); a
                # success is Succeeded with nextRunTime = completion + repeatAfter (seed), the
                # only wake-up ``decide`` would give (none for a one-shot).
                repeat = world.backfills[key].spec.repeat_after
                if kind == _K_SUCCEED and repeat:
                    step = repeat_us.get(repeat)
                    if step is None:
                        step = repeat_us[repeat] = timedelta(seconds=repeat) // _US
                    # ``at`` in us without converting it back (exact: plus_seconds adds that
                    # timedelta; saturated, both are past every horizon: no wake-up either way)
                    wake(key, now_us + step, plus_seconds(now, repeat))
                continue
            act(now_us, now, (key,))
        elif kind == _K_WAKE:
            key, now = payload
            if wakes.get(key) == now_us:
                del wakes[key]
                act(now_us, now, (key,))
        elif kind == _K_ARRIVAL:
            model, k = payload
            reqs, order, base, at = arrivals[model]
            i = order[k]
            d = reqs[i][1]
            if k + 1 < len(order):
                j = order[k + 1]
                heappush(heap, (at[j], _ARRIVAL, base + j, _K_ARRIVAL, (model, k + 1)))
            now = EPOCH + now_us * _US
            end_us = now_us + round(d * 1e6) + pad_us
            e = request(
                type="ForegroundRequest",
                at=now, namespace=ns, model=model, source="trace", busy_until=EPOCH + end_us * _US if end_us > now_us else None,
            )
            append(e, f"trace/{ns}/{model}/{i}")
            act(now_us, now, world.backfills_of_model(ns, model))
            done += 1
            if progress is not None and done % 2000 == 0:
                progress(2000)
        elif kind == _K_GONE:
            key, attempt, name, cancel_us, reason = payload
            admitted_us, todo = started[(key[1], attempt)]
            kept = min(todo - 1, (cancel_us - admitted_us) // shard_us)  # shards done by the cancel
            useful[(key[1], attempt)] = kept * shard_us / 1e6
            left[key[1]] = todo - kept
            append(make(ev.JobDeleted, at=EPOCH + now_us * _US, namespace=ns, backfill=key[1], name=name, uid="job-" + name))
            if reason == FOREGROUND_DEMAND:
                model = model_of[key]
                overlap[model] = overlap.get(model, 0.0) + (now_us - cancel_us) / 1e6
            if now_us < horizon[model_of[key]]:  # nothing is admitted at or after the last arrival
                push(now_us, _WAKE, _K_GONE_WAKE, key)  # an arrival at this same instant comes first
        elif kind == _K_GONE_WAKE:
            act(now_us, EPOCH + now_us * _US, (payload,))
        elif kind == _K_SETUP:
            model = payload
            now = to_dt(now_us)
            name = backfill_name(model)
            append(ev.ModelReady(at=now, namespace=ns, model=model, node=sim_node(model)), f"sim/ready/{model}")
            append(
                ev.BackfillApplied(at=now, namespace=ns, name=name, uid=f"uid-{name}", generation=1, spec=params.spec(model)),
                f"sim/applied/{name}",
            )
    if progress is not None:
        progress(done % 2000)
    if fast:
        for b in world.backfills.values():
            if b.attempt is not None:
                runs[(b.uid, b.attempt.number)] = (b, b.attempt)
    result.runs = sorted([row_of(b, a) for b, a in runs.values()], key=attrgetter("admitted_at", "backfill", "attempt"))
    result.world = world
    return result
