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
    # a report dated after its Job was gone (a reporter's clock ahead, within the ingest skew):
    # left out and counted (a new user's trial: 4 preemptions read "3 measured", nothing left out)
    fourth = third + 4 + IDLE + 1
    _preempted(log, fourth, fourth + 1, fourth + 30, fourth + 2)
    store = MemoryEventStore(MemoryBackend())
    store.append([ev.encode(e, f"k/{pos}") for pos, e in log.events])
    h = read_history(store, NS, backfill="b")
    assert sorted(h.cancel_latencies) == [0.25, 1.0] and h.stale_cancels == 2


def test_a_resumable_job_s_length_is_its_running_time_not_the_span_of_its_segments():
    """A new user's trial: a ``spec.preemption: Suspend`` Job that ran 28.4 s in three segments
    over 1m40s measured "median 1m40s", the time suspended and waiting for idle windows
    included: ``recommend`` would simulate it as that long. Its runs count alone now; a Job
    that was never suspended keeps its start-to-success time."""
    log = Log().ready(0).cronjob(0).apply(0)
    log.request(1)
    admit = next(c for c in log.decide(IDLE + 1) if isinstance(c, Admit))
    name = admit.job_name
    log.admit(admit, IDLE).job("JobCreated", name, IDLE + 1).job("JobRunning", name, IDLE + 2)
    log.job("JobSuspended", name, IDLE + 12, completed_indexes="0", episode="1")  # ran 10 s
    log.job("JobResumed", name, IDLE + 60, episode="r1").job("JobSuspended", name, IDLE + 75, completed_indexes="0-1", episode="2")  # 15 s
    log.job("JobResumed", name, IDLE + 200, episode="r2").job("JobSucceeded", name, IDLE + 203.5)  # 3.5 s
    store = MemoryEventStore(MemoryBackend())
    store.append([ev.encode(e, f"k/{pos}") for pos, e in log.events])
    assert read_history(store, NS, backfill="b").job_seconds == [10 + 15 + 3.5]
    # never suspended: from its start to its success, as before
    plain = Log().ready(0).cronjob(0).apply(0)
    plain.request(1)
    admit = next(c for c in plain.decide(IDLE + 1) if isinstance(c, Admit))
    plain.admit(admit, IDLE).job("JobCreated", admit.job_name, IDLE + 1).job("JobRunning", admit.job_name, IDLE + 2)
    plain.job("JobSucceeded", admit.job_name, IDLE + 42)
    store = MemoryEventStore(MemoryBackend())
    store.append([ev.encode(e, f"k/{pos}") for pos, e in plain.events])
    assert read_history(store, NS, backfill="b").job_seconds == [40.0]
