"""A client-side rate limit for the controller's own writes to the apiserver (client-go's QPS/burst).

A token bucket: ``burst`` calls may go at once, then ``qps`` per second. It paces Job creates and
status writes so a thousand admissions due at once do not flood the apiserver; Job deletes never
wait for it (foreground always wins). Twelve lines of arithmetic under a lock: smaller than the
dependency a library would add.
"""

from __future__ import annotations

import threading
import time


class TokenBucket:
    """``acquire()`` blocks until a token is free. ``qps`` tokens per second, at most ``burst`` saved.

    ``clock``/``sleep`` (seconds) are injectable for tests (virtual time).

    Raises:
        ValueError: ``qps`` or ``burst`` not positive.
    """

    def __init__(self, qps: float, burst: int, *, clock=time.monotonic, sleep=time.sleep) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps, self.burst = float(qps), int(burst)
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)
        self._t = clock()
        self._lock = threading.Lock()

    def acquire(self) -> float:
        """Take one token, sleeping until there is one; returns the seconds waited."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._t) * self.qps)
            self._t = now
            self._tokens -= 1.0
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait
