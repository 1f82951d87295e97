"""The pacing of re-issued Job calls (``Actor.due``): creates, suspends and resumes back off to
30 s, DELETEs to 5 s (an adversarial trial: a Job whose DELETE an admission policy refused ran on 11.2 s after
the policy was lifted, the re-sends having backed off toward 30 s; stopping is fail-safe)."""

from __future__ import annotations

from datetime import datetime, timezone

from kubernetes import client

from backfill.controller import actor as actor_module
from backfill.controller.actor import Actor


def _pauses(monkeypatch, verb: str, calls: int) -> list[float]:
    """The gaps between the moments ``verb`` of one Job is due, polling every 0.1 s."""
    now = [1000.0]
    monkeypatch.setattr(actor_module.time, "monotonic", lambda: now[0])
    api = client.ApiClient()  # no call is made: only the pacing is asked
    try:
        a = Actor(api, append=lambda records: [], clock=lambda: datetime(2026, 12, 6, tzinfo=timezone.utc))
        due_at: list[float] = []
        while len(due_at) < calls:
            if a.due(verb, "ns", "job-1"):
                due_at.append(now[0])
            now[0] = round(now[0] + 0.1, 1)
        a.close()
    finally:
        api.close()
    return [round(b - a, 1) for a, b in zip(due_at, due_at[1:])]


def test_a_refused_delete_is_re_sent_at_least_every_5_seconds(monkeypatch):
    assert _pauses(monkeypatch, "delete", 8) == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]


def test_creates_suspends_and_resumes_back_off_to_30_seconds(monkeypatch):
    # a suspend is re-asserted until the Job controller reports the Job suspended: at 5 s, the
    # re-assertions of 200 unreported Jobs doubled the reconcile loop's time in the latency bench
    for verb in ("create", "suspend", "resume"):
        assert _pauses(monkeypatch, verb, 8) == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_a_new_suspend_round_or_a_new_cancel_is_sent_at_once(monkeypatch):
    """An adversarial trial: a Job someone else resumed (a new Suspending round) was suspended
    again 26 s later, on the back-off the earlier round's re-sends had reached."""
    now = [1000.0]
    monkeypatch.setattr(actor_module.time, "monotonic", lambda: now[0])
    api = client.ApiClient()
    try:
        a = Actor(api, append=lambda records: [], clock=lambda: datetime(2026, 12, 7, tzinfo=timezone.utc))
        sent = []
        for _ in range(300):  # round 1 re-sent for 30 s: the pause grows to 16 s
            if a.suspend_due("ns", "job-1", 1):
                sent.append(now[0])
            now[0] = round(now[0] + 0.1, 1)
        assert [round(b - x, 1) for x, b in zip(sent, sent[1:])] == [1.0, 2.0, 4.0, 8.0]
        assert not a.suspend_due("ns", "job-1", 1)  # round 1: still paced
        assert a.suspend_due("ns", "job-1", 2)  # someone resumed it: round 2's first goes out now
        assert not a.suspend_due("ns", "job-1", 2)
        now[0] += 1.0
        assert a.suspend_due("ns", "job-1", 2)  # then 1 s, 2 s ... again
        a.restart_pace("delete", "ns", "job-1")  # a new cancel (as Actor.preempt): no carried pause
        assert a.due("delete", "ns", "job-1") and not a.due("delete", "ns", "job-1")
        a.close()
    finally:
        api.close()
