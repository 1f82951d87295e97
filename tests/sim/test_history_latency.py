"""``recommend``'s measured cancel latency (``backfill.sim.history``): from the preempting
request to the Job gone, leaving out requests older than the Job (a new user's trial: a
``lastActiveTime`` 1.5 h stale made the p95 1h31m, and every recommendation row used it)."""

from __future__ import annotations

from backfill.core import events as ev
from backfill.core.commands import Admit, Cancel
from backfill.sim.history import from_log, read_history
from backfill.store.memory import MemoryBackend, MemoryEventStore
from tests.core.builders import NS, Log, t

IDLE = 600.0  # the builders' idleFor 10m


def _preempted(log: Log, admit_at: float, created_at: float, request_at: float, gone_at: float) -> None:
    """Admit at ``admit_at``, the Job created at ``created_at``, a foreground request dated
    ``request_at`` reported then, the cancel, the Job gone at ``gone_at`` (seconds)."""
    admit = next(c for c in log.decide(admit_at) if isinstance(c, Admit))
    log.admit(admit, admit_at).job("JobCreated", admit.job_name, created_at)
    log.request(request_at)
    decided = max(created_at, request_at) + 0.01
    cancel = next(c for c in log.decide(decided) if isinstance(c, Cancel))
    log.cancel(cancel, decided).job("JobDeleted", admit.job_name, gone_at)


def test_a_request_older_than_the_job_is_not_a_cancel_latency():
    log = Log().ready(0).cronjob(0).apply(0)
    _preempted(log, IDLE, IDLE + 1, IDLE + 5, IDLE + 5.25)  # 0.25 s after the request
    second = IDLE + 5.25 + IDLE + 1
    # a stale report: dated 300 s before this Job existed, though after the last known request
    _preempted(log, second, second + 1, second - 300, second + 2.5)
    third = second + 2.5 + IDLE + 1
    _preempted(log, third, third + 1, third + 3, third + 4)  # 1 s
    store = MemoryEventStore(MemoryBackend())
    store.append([ev.encode(e, f"k/{pos}") for pos, e in log.events])
    h = read_history(store, NS, backfill="b")
    assert sorted(h.cancel_latencies) == [0.25, 1.0] and h.stale_cancels == 1
    assert h.measured_latency() == 1.0
    (inp,) = from_log(store, "s", [("backfill", NS, "b")])
    assert inp.latency == 1.0 and "2 foreground cancels measured (p95 demand -> Job gone 1s), 1 left out" in inp.note
