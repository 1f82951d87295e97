"""A fast, pure re-statement of ``simulate``'s per-model outcome, for parameter sweeps.

``backfill recommend`` simulates dozens of parameter sets per model; the projector-driven
simulation (:mod:`backfill.sim.cluster`) costs 0.1-0.3 s per set on the busiest Alibaba model,
this walk over the idle gaps about a millisecond. It follows the semantics in
:mod:`backfill.sim.cluster`'s docstring exactly, in the same integer microseconds, for one
ModelBackfill per model with no gaming sessions or GPU leases (what ``simulate`` sets up):

- per gap (idle since ``a``, next arrival ``b``) an attempt is admitted at the latest of
  ``a + idleFor``, the previous success's ``completion + repeatAfter`` and the instant the last
  preempted Job was gone (``arrival + cancel latency``), if that is before ``b``;
- an attempt runs the remaining shards; it succeeds if they end at or before ``b`` (and fit in
  maxRunDuration), hits its deadline if ``admission + maxRunDuration <= b`` first (the
  declaration is then Failed), else ``b`` preempts it and the shards finished by ``b`` are kept;
- ``repeatAfter`` 0 is one-shot.

``tests/sim/test_sweep.py`` checks that it equals the projector-driven simulation on the real
Alibaba trace for several parameter sets; if the projector's rules change, that test fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from .bound import gaps_us
from .cluster import SimParams


@dataclass(frozen=True)
class Outcome:
    """What one ModelBackfill gets from one model's trace (seconds for durations).

    Attributes mirror :class:`backfill.sim.report.ModelReport`: attempts, succeeded, preempted,
    deadline_exceeded, useful, wasted, overlap (foreground-overlap seconds).
    """

    attempts: int
    succeeded: int
    preempted: int
    deadline_exceeded: int
    useful: float
    wasted: float
    overlap: float


def outcome(gaps: list[tuple[int, int]], params: SimParams) -> Outcome:
    """Walk ``gaps`` (from :func:`backfill.sim.bound.gaps_us`) under ``params``; see the module docstring.

    Raises:
        ValueError: ``params.shards`` < 1.
    """
    if params.shards < 1:
        raise ValueError("shards must be >= 1")
    shard = params.shard_us()
    idle = round(params.idle_for * 1e6)
    max_us = round(params.max_run * 1e6)
    cool = round(params.repeat_after * 1e6)
    delta = round(params.cancel_latency * 1e6)
    n = params.shards
    left = n
    floor = None  # no admission before this (cooldown end or the preempted Job gone)
    attempts = succeeded = preempted = deadline = 0
    useful = wasted = overlap = 0
    for a, b in gaps:
        t = a + idle
        if floor is not None and floor > t:
            t = floor
        stop = False
        while t < b:
            attempts += 1
            need = left * shard
            if need <= max_us:
                end = t + need
                if end <= b:
                    succeeded += 1
                    useful += need
                    left = n
                    if cool == 0:
                        stop = True
                        break
                    t = floor = end + cool
                    continue
            elif t + max_us <= b:
                deadline += 1
                wasted += max_us
                stop = True
                break
            kept = min(left - 1, (b - t) // shard)
            preempted += 1
            useful += kept * shard
            wasted += b + delta - t - kept * shard
            overlap += delta
            left -= kept
            floor = b + delta if floor is None or b + delta > floor else floor
            break
        if stop:
            break
    return Outcome(attempts, succeeded, preempted, deadline, useful / 1e6, wasted / 1e6, overlap / 1e6)


def outcome_of(requests: list[tuple[float, float]], params: SimParams) -> Outcome:
    """:func:`outcome` over one model's sorted ``(arrival_s, service_s)`` requests."""
    return outcome(gaps_us(requests), params)
