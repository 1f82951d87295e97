"""The cancel window (issue 8): status writes, Events and the spool's appends wait while a
preemption DELETE is in flight, boundedly; the preemptor's bookkeeping never blocks."""

from __future__ import annotations

import threading
import time

from backfill.controller.cancelwindow import CancelWindow


def _waiter(w: CancelWindow) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(w.wait()), daemon=True)
    t.start()
    return t, out


def test_an_open_window_does_not_wait():
    assert CancelWindow().wait() == 0.0


def test_a_caller_waits_until_the_delete_in_flight_is_answered_and_the_linger_passed():
    w = CancelWindow(linger=0.05, cap=5.0)
    w.begin()
    t, out = _waiter(w)
    t.join(0.3)
    assert t.is_alive(), "the status write went out while a DELETE was in flight"
    ended = time.monotonic()
    w.end()
    t.join(2.0)
    assert not t.is_alive() and out[0] >= 0.3
    assert time.monotonic() - ended >= 0.05 - 0.005  # the linger after the answer


def test_a_cancel_storm_delays_a_caller_at_most_the_cap():
    w = CancelWindow(linger=0.05, cap=0.3)
    w.begin()  # never answered
    t, out = _waiter(w)
    t.join(3.0)
    assert not t.is_alive(), "a caller waited past the cap"
    assert 0.3 - 0.01 <= out[0] < 3.0


def test_begin_and_end_never_block_even_while_callers_wait():
    w = CancelWindow(linger=0.0, cap=5.0)
    w.begin()
    t, _ = _waiter(w)
    t0 = time.monotonic()
    for _ in range(100):
        w.begin()
        w.end()
    assert time.monotonic() - t0 < 1.0
    w.end()
    t.join(2.0)
    assert not t.is_alive()
