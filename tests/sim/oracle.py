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


def oracle(requests, idle_for, job, repeat_after, max_run, delta=0.0):
    """Counts for one model: attempts, succeeded, preempted, deadline, useful_s, wasted_s, overlap_s."""
    spans = busy_spans(requests)
    out = dict(attempts=0, succeeded=0, preempted=0, deadline=0, useful=0.0, wasted=0.0, overlap=0.0, windows=0)
    failed = False
    one_shot_done = False
    for (s0, idle_since), (next_arrival, _) in zip(spans, spans[1:]):
        if idle_since + idle_for < next_arrival:
            out["windows"] += 1
        if failed or one_shot_done:
            continue
        t = idle_since + idle_for
        while t < next_arrival:
            out["attempts"] += 1
            if job > max_run:
                end = t + max_run
                if end <= next_arrival:
                    out["deadline"] += 1
                    out["wasted"] += max_run
                    failed = True
                    break
            else:
                end = t + job
                if end <= next_arrival:
                    out["succeeded"] += 1
                    out["useful"] += job
                    if repeat_after == 0:
                        one_shot_done = True
                        break
                    t = end + repeat_after
                    continue
            # preempted by the arrival
            out["preempted"] += 1
            out["wasted"] += next_arrival + delta - t
            out["overlap"] += delta
            break
    return out
