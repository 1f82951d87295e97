"""An independent oracle for the simulation semantics of issue #3 (no project code used).

Straight from the issue text: merge busy spans, walk each gap between the first and last span,
and place admissions, successes and preemptions arithmetically.
"""

from __future__ import annotations


def busy_spans(requests):
    """Merge [t, t+d] spans (overlapping or touching) of sorted (t, d) requests."""
    spans = []
    for t, d in sorted(requests):
        end = t + d
        if spans and t <= spans[-1][1]:
            if end > spans[-1][1]:
                spans[-1][1] = end
        else:
            spans.append([t, end])
    return spans


def oracle(requests, idle_for, job, repeat_after, max_run, delta=0.0, shards=1):
    """Counts for one model: attempts, succeeded, preempted, deadline, useful_s, wasted_s, overlap_s.

    Issue #11 part 2: the job is ``shards`` equal shards; a preemption keeps the shards finished
    by the arrival (useful) and the next attempt runs only the rest; a success's cooldown carries
    into later gaps (admission at the later of idleSince + idleFor and completion + repeatAfter).
    Assumes ``delta <= idle_for`` (the preempted Job is gone before the next admission is due).
    """
    spans = busy_spans(requests)
    out = dict(attempts=0, succeeded=0, preempted=0, deadline=0, useful=0.0, wasted=0.0, overlap=0.0, windows=0)
    shard = job / shards
    left = shards
    cooldown_end = None
    failed = False
    one_shot_done = False
    for (s0, idle_since), (next_arrival, _) in zip(spans, spans[1:]):
        if idle_since + idle_for < next_arrival:
            out["windows"] += 1
        if failed or one_shot_done:
            continue
        t = idle_since + idle_for
        if cooldown_end is not None and cooldown_end > t:
            t = cooldown_end
        while t < next_arrival:
            out["attempts"] += 1
            need = left * shard
            if need > max_run:
                end = t + max_run
                if end <= next_arrival:
                    out["deadline"] += 1
                    out["wasted"] += max_run
                    failed = True
                    break
            else:
                end = t + need
                if end <= next_arrival:
                    out["succeeded"] += 1
                    out["useful"] += need
                    left = shards
                    if repeat_after == 0:
                        one_shot_done = True
                        break
                    t = cooldown_end = end + repeat_after
                    continue
            # preempted by the arrival: the shards finished by then are kept
            kept = int((next_arrival - t) // shard)
            out["preempted"] += 1
            out["useful"] += kept * shard
            out["wasted"] += next_arrival + delta - t - kept * shard
            out["overlap"] += delta
            left -= kept
            break
    return out


def bound_oracle(requests, job, shards, repeat_after, max_run):
    """The clairvoyant optimum, shard by shard: each shard at the earliest instant it fits in a
    gap after the previous one (and after the cooldown when it starts a new job). Returns
    (whole jobs, shards, useful seconds, idle seconds)."""
    spans = busy_spans(requests)
    gaps = [(a[1], b[0]) for a, b in zip(spans, spans[1:])]
    idle = sum(b - a for a, b in gaps)
    shard = job / shards
    if shard > max_run:
        return 0, 0, 0.0, idle
    t, i, done, jobs = float("-inf"), 0, 0, 0
    while True:
        while i < len(gaps) and max(t, gaps[i][0]) + shard > gaps[i][1]:
            i += 1
        if i == len(gaps):
            break
        t = max(t, gaps[i][0]) + shard
        done += 1
        if done % shards == 0:
            jobs += 1
            if repeat_after == 0:
                break
            t += repeat_after
    return jobs, done, done * shard, idle
