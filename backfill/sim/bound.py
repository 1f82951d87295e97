"""The clairvoyant bound: the most useful work any schedule can get out of a model's idle gaps.

Issue #11 part 2. The bound is the optimum of a *relaxed* problem that every schedule under the
controller's rules (the real controller, ``simulate``, any choice of ``idleFor``) is feasible
for, so it is a true upper bound on their useful seconds:

- Work is done only inside idle gaps, the spans between a model's merged busy spans (first to
  last, as simulated). A shard counts only if it runs wholly inside one gap (it may end at the
  instant of the next arrival; a completion at the same instant as an arrival wins).
- A job is ``shards`` (N) equal shards of ``job / N`` seconds run one after another; the shards
  of one job may be spread over several gaps and each finished shard counts as useful work
  (partial progress counts: ``simulate --shards N`` keeps finished shards at a preemption). With
  N = 1 a job counts only when it runs whole within one gap.
- After the last shard of a job completes at c, no shard of the next job starts before
  ``c + repeatAfter`` — also when that reaches into a later gap. ``repeatAfter`` = 0 is one-shot:
  nothing runs after the first job.
- Relaxations (why the bound can exceed what a controller gets): no idle wait (``idleFor`` = 0),
  full knowledge of future arrivals, and ``maxRunDuration`` only removes shards longer than it
  (such a shard can never finish: every attempt would hit its deadline); a shorter attempt limit
  is otherwise ignored, as if an attempt could end at any shard boundary.

For this relaxed problem greedy earliest start is optimal: by induction the k-th shard of the
greedy schedule completes no later than the k-th shard of any feasible schedule (its earliest
feasible start is no later, since the other schedule's start is feasible for it too, and an
earlier job completion only moves the cooldown earlier). :func:`clairvoyant` computes it.

All times are integer microseconds, exactly as the simulated cluster rounds them, so the bound
and the simulation compare without rounding error.
"""

from __future__ import annotations

from dataclasses import dataclass


def spans_us(requests: list[tuple[float, float]]) -> list[tuple[int, int]]:
    """Merged busy spans ``(start_us, end_us)`` of sorted ``(arrival_s, service_s)`` requests.

    Rounded like the simulated cluster (arrival and service time each to the microsecond);
    overlapping or touching spans merge.
    """
    spans: list[list[int]] = []
    for t, d in requests:
        a = round(t * 1e6)
        b = a + round(d * 1e6)
        if spans and a <= spans[-1][1]:
            if b > spans[-1][1]:
                spans[-1][1] = b
        else:
            spans.append([a, b])
    return [(a, b) for a, b in spans]


def gaps_us(requests: list[tuple[float, float]]) -> list[tuple[int, int]]:
    """Idle gaps ``(start_us, end_us)`` between consecutive busy spans (first to last span only)."""
    spans = spans_us(requests)
    return [(cur[1], nxt[0]) for cur, nxt in zip(spans, spans[1:])]


@dataclass(frozen=True)
class Bound:
    """The clairvoyant optimum for one model.

    Attributes:
        jobs: whole jobs (all N shards) the optimum completes.
        shards: shards it completes (including those of an unfinished last job).
        useful: their seconds (shards x shard length), the bound on useful seconds.
        idle: total idle seconds (the sum of all gaps): the physical limit of any schedule.
    """

    jobs: int
    shards: int
    useful: float
    idle: float


def clairvoyant(
    gaps: list[tuple[int, int]], *, job: float, shards: int = 1, repeat_after: float = 0.0, max_run: float = float("inf")
) -> Bound:
    """The greedy earliest-start optimum over ``gaps`` (see the module docstring for the model).

    Args:
        gaps: sorted, disjoint idle gaps ``(start_us, end_us)`` (see :func:`gaps_us`).
        job: undisturbed job length, seconds (> 0).
        shards: N >= 1 equal shards per job.
        repeat_after: cooldown after a job's last shard, seconds (0 = one-shot).
        max_run: spec.maxRunDuration, seconds: a shard longer than it never counts.

    Returns:
        A :class:`Bound`.

    Raises:
        ValueError: ``job`` <= 0 or ``shards`` < 1.
    """
    if job <= 0 or shards < 1:
        raise ValueError("job must be > 0 and shards >= 1")
    idle = sum(b - a for a, b in gaps) / 1e6
    shard = round(job * 1e6 / shards)
    if shard <= 0 or shard > max_run * 1e6:
        return Bound(0, 0, 0.0, idle)
    cool = round(repeat_after * 1e6)
    free = None  # earliest start allowed by the cooldown
    left, jobs, done = shards, 0, 0
    for a, b in gaps:
        t = a if free is None or free < a else free
        while t < b:
            k = min(left, (b - t) // shard)
            if k <= 0:
                break
            t += k * shard
            left -= k
            done += k
            if left:
                break  # the gap is used up mid-job
            jobs += 1
            if cool == 0:
                return Bound(jobs, done, done * shard / 1e6, idle)  # one-shot
            left = shards
            t += cool
            free = t
    return Bound(jobs, done, done * shard / 1e6, idle)
