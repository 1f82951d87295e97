"""The cancel window: lower-priority work yields to preemption DELETEs in flight.

A foreground cancel is one API call, but the machine it runs on is shared: the apiserver serving
our status PUTs and Kubernetes Events, and PostgreSQL committing the spool's appends, take the
same cores the Job DELETE needs (issue 8: foreground always wins, at the floor's latency). So
while a preemption DELETE is in flight, and for ``linger`` seconds after the last one answered
(a demand rarely comes alone: the next DELETE of a burst follows within milliseconds), the status
writer, the Event side thread and the spool's writer wait before their next call, at most ``cap``
seconds each time, so a cancel storm can delay them but never stall them.

Only the work that can wait waits here: nothing on the cancel path calls :meth:`CancelWindow.wait`,
and the preemptor's own bookkeeping (:meth:`begin` / :meth:`end`) never blocks.
"""

from __future__ import annotations

import threading
import time


class CancelWindow:
    """Counts preemption DELETEs in flight; :meth:`wait` holds lower-priority callers.

    Args:
        linger: seconds the window stays closed after the last DELETE answered.
        cap: the longest a single :meth:`wait` holds its caller, seconds.
    """

    def __init__(self, linger: float = 0.02, cap: float = 0.5) -> None:
        self.linger, self.cap = linger, cap
        self._cond = threading.Condition()
        self._inflight = 0
        self._last_end = 0.0  # time.monotonic() of the last answered DELETE
        self.waited = 0.0  # seconds callers spent waiting, in all (for the benchmark's breakdown)

    @property
    def inflight(self) -> int:
        """Preemption DELETEs sent and not yet answered (nor failed)."""
        with self._cond:
            return self._inflight

    def begin(self) -> None:
        """A preemption DELETE is about to be sent."""
        with self._cond:
            self._inflight += 1

    def end(self) -> None:
        """That DELETE was answered (or failed)."""
        with self._cond:
            self._inflight = max(0, self._inflight - 1)
            self._last_end = time.monotonic()
            self._cond.notify_all()

    def wait(self) -> float:
        """Block while a DELETE is in flight or answered less than ``linger`` seconds ago, at
        most ``cap`` seconds; returns the seconds waited (0.0 when the window was open)."""
        t0 = time.monotonic()
        deadline = t0 + self.cap
        with self._cond:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    break
                if self._inflight:
                    self._cond.wait(deadline - now)
                    continue
                quiet_at = self._last_end + self.linger
                if now >= quiet_at:
                    break
                self._cond.wait(min(quiet_at, deadline) - now)
        waited = time.monotonic() - t0
        if waited > 0.0005:
            self.waited += waited
            return waited
        return 0.0
