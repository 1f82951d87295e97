"""The client-side token bucket on virtual time: ``burst`` calls at once, then ``qps`` per second."""

from __future__ import annotations

import pytest

from backfill.controller.ratelimit import TokenBucket


class VirtualTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_burst_goes_at_once_then_qps_paces():
    vt = VirtualTime()
    bucket = TokenBucket(qps=10, burst=3, clock=vt.clock, sleep=vt.sleep)
    waits = [bucket.acquire() for _ in range(6)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert waits[3:] == pytest.approx([0.1, 0.1, 0.1])
    assert vt.now == pytest.approx(100.3)


def test_idle_time_refills_up_to_burst_only():
    vt = VirtualTime()
    bucket = TokenBucket(qps=2, burst=2, clock=vt.clock, sleep=vt.sleep)
    bucket.acquire(), bucket.acquire()
    vt.now += 60  # a long pause refills at most `burst` tokens
    assert [bucket.acquire() for _ in range(3)] == pytest.approx([0.0, 0.0, 0.5])


@pytest.mark.parametrize("qps, burst", [(0, 1), (-1, 5), (1, 0)])
def test_bad_settings_are_refused(qps, burst):
    with pytest.raises(ValueError):
        TokenBucket(qps, burst)
