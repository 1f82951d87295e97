"""The preemptor and the spool on the in-memory store (middle tier: no apiserver, no PostgreSQL).

Each test drives the real :class:`Spool` and :class:`Preemptor` and then audits the log the spool
wrote with the replay auditor: every cancel decided in memory must be what the projector derives
from the log at the decision's basis.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

from backfill.controller.preempt import Preemptor
from backfill.controller.spool import Spool
from backfill.core import events as ev
from backfill.core.audit import Auditor
from backfill.core.events import decode_many, encode
from backfill.core.jobtemplate import job_name
from backfill.core.projector import fold
from backfill.core.state import World
from backfill.store.memory import MemoryBackend, MemoryEventStore

from ..core.builders import TEMPLATE

NS = "ns"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
SPEC = {"modelRef": "m", "templateRef": "cj", "idleFor": "10m"}
JOB = job_name("b", "u1", 1)


def _store_with_running_attempt() -> tuple[MemoryEventStore, World, list]:
    store = MemoryEventStore(MemoryBackend())
    history = [
        (ev.ModelReady(at=T0, namespace=NS, model="m", node="n1"), "ready"),
        (ev.CronJobSeen(at=T0, namespace=NS, name="cj", job_template=TEMPLATE), "cj"),
        (ev.BackfillApplied(at=T0, namespace=NS, name="b", uid="u1", generation=1, spec=SPEC), "applied-1"),
    ]
    admitted = ev.AttemptAdmitted(
        at=T0 + timedelta(minutes=10), namespace=NS, backfill="b", uid="u1", attempt=1, generation=1, job_name=JOB,
        model="m", node="n1", cause=1, basis=3,
    )
    created = ev.JobCreated(at=T0 + timedelta(minutes=10), namespace=NS, backfill="b", name=JOB, uid="job")
    history += [(admitted, None), (created, None)]
    positions = store.append([encode(e, k) for e, k in history])
    world = World()
    for p, (e, _) in zip(positions, history):
        world = fold(world, e, p)
    return store, world, history


def _audit(store: MemoryEventStore) -> Auditor:
    auditor = Auditor()
    for batch in store.read_payloads(0):
        for (position, *_), e in zip(batch, decode_many([(t, v, d) for _, t, v, d in batch])):
            auditor.feed(position, e)
    return auditor


def test_a_cancel_named_after_its_state_resolves_to_the_basis_even_after_a_duplicate():
    """Suspend (a cause without an event of its own: the state) decided with a re-observed,
    already stored ``JobCreated`` as the last event in memory: the duplicate resolves to its old
    position, yet the recorded cause must be the basis replay derives."""
    store, durable, history = _store_with_running_attempt()
    committed = threading.Event()
    spool = Spool(store.append, store.positions_of, committed.set)
    executed: list = []
    pre = Preemptor(lambda: durable, spool, lambda cmds, world: executed.extend(cmds), lambda: True, lambda: T0 + timedelta(minutes=11))
    suspended = ev.BackfillApplied(at=T0 + timedelta(minutes=11), namespace=NS, name="b", uid="u1", generation=2, spec={**SPEC, "suspend": True})
    created_again = history[-1][0]  # the watch delivers the Job again: same natural key, already stored
    spool.put([(suspended, "applied-2"), (created_again, created_again.natural_key())])
    cancels = pre.run_once()
    assert [(c.reason, c.attempt) for c in cancels] == [("Suspended", 1)]
    assert executed == cancels
    assert spool.wait_committed(spool.unfolded(0), 5) and _wait(lambda: spool.backlog == 0)
    spool.stop()
    auditor = _audit(store)
    (cancel,) = [e for _, e in _events(store) if isinstance(e, ev.AttemptCancelled)]
    assert cancel.basis == 6 and cancel.cause == 6  # the new BackfillApplied's position, not the duplicate's 5
    assert auditor.divergences == [] and auditor.checked == 2


def test_a_demand_stored_first_by_another_replica_is_the_cancels_cause_not_the_last_position():
    """A second trial: the standby stored the demand first (position 6); the leader folded it
    (a duplicate) last, behind another model's report it spooled itself (7). The cancel
    recorded 7, the other model's report, as its cause: the demand names its own event, the copy
    stored first."""
    store, durable, _ = _store_with_running_attempt()
    demand = ev.ForegroundRequest(at=T0 + timedelta(minutes=12), namespace=NS, model="m", source="lastActiveTime")
    assert store.append([encode(demand, "fg-m")]) == [6]  # the standby's copy
    committed = threading.Event()
    spool = Spool(store.append, store.positions_of, committed.set)
    pre = Preemptor(lambda: durable, spool, lambda cmds, world: None, lambda: True, lambda: T0 + timedelta(minutes=12))
    other = ev.ForegroundRequest(at=T0 + timedelta(minutes=11), namespace=NS, model="m2", source="ingest")
    spool.put([(other, "fg-m2"), (demand, "fg-m")])
    assert [(c.reason, c.attempt) for c in pre.run_once()] == [("ForegroundDemand", 1)]
    assert spool.wait_committed(spool.unfolded(0), 5) and _wait(lambda: spool.backlog == 0)
    spool.stop()
    (cancel,) = [e for _, e in _events(store) if isinstance(e, ev.AttemptCancelled)]
    assert (cancel.cause, cancel.basis) == (6, 7)  # the demand's stored position; the state it was decided on
    assert _audit(store).divergences == []


def test_demand_cancels_from_memory_while_the_store_refuses_and_replays_clean_after():
    store, durable, _ = _store_with_running_attempt()
    down, spool = _spool_of_a_store_that_is_down(store)
    executed: list = []
    pre = Preemptor(lambda: durable, spool, lambda cmds, world: executed.extend(cmds), lambda: True, lambda: T0 + timedelta(minutes=12))
    request = ev.ForegroundRequest(at=T0 + timedelta(minutes=12), namespace=NS, model="m", source="ingest")
    spool.put([(request, "fg-1")])
    cancels = pre.run_once()  # nothing is durable: the cancel is decided and executed from memory
    assert [(c.reason, c.attempt) for c in cancels] == [("ForegroundDemand", 1)] and executed == cancels
    assert _wait(lambda: not spool.healthy) and spool.backlog == 2  # the request and the decision wait
    assert pre.run_once() == []  # decided once
    down.clear()
    assert _wait(lambda: spool.backlog == 0)
    spool.stop()
    kinds = [type(e).__name__ for _, e in _events(store)][-2:]
    assert kinds == ["ForegroundRequest", "AttemptCancelled"]  # the cause before the decision
    (cancel,) = [e for _, e in _events(store) if isinstance(e, ev.AttemptCancelled)]
    assert cancel.cause == 6 and cancel.basis == 6
    assert _audit(store).divergences == []


def _spool_of_a_store_that_is_down(store: MemoryEventStore) -> tuple[threading.Event, Spool]:
    """A spool whose appends to ``store`` fail while the returned event is set (it is: clear it
    to bring the store back), retried every 10-50 ms."""
    down = threading.Event()
    down.set()

    def append(records):
        if down.is_set():
            raise ConnectionError("the store is down")
        return store.append(records)

    return down, Spool(append, store.positions_of, lambda: None, backoff_initial=0.01, backoff_max=0.05)


def _events(store: MemoryEventStore) -> list:
    return [
        (position, e)
        for batch in store.read_payloads(0)
        for (position, *_), e in zip(batch, decode_many([(t, v, d) for _, t, v, d in batch]))
    ]


def _wait(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_resync_sweep_never_holds_an_observed_demand_behind_it():
    """``poke(None)`` (the loop's resync) over 200 running backfills is swept in chunks *after*
    the keys new observations affect: the observed demand is cancelled in the first pass, and the
    sweep still finds the cancels only the durable projection can show (requests another replica
    stored), within ceil(200 / SWEEP_CHUNK) passes."""
    from backfill.controller.preempt import SWEEP_CHUNK

    n, late = 200, range(190, 200)
    world, pos = World(), 0

    def add(e):
        nonlocal world, pos
        pos += 1
        world = fold(world, e, pos)

    add(ev.CronJobSeen(at=T0, namespace=NS, name="cj", job_template=TEMPLATE))
    for i in range(n):
        m, b = f"m{i:03}", f"b{i:03}"
        add(ev.ModelReady(at=T0, namespace=NS, model=m, node=f"n{i:03}"))
        add(ev.BackfillApplied(at=T0, namespace=NS, name=b, uid=f"u{i}", generation=1, spec={**SPEC, "modelRef": m}))
        add(ev.AttemptAdmitted(at=T0 + timedelta(minutes=10), namespace=NS, backfill=b, uid=f"u{i}", attempt=1,
                               generation=1, job_name=f"{b}-1", model=m, node=f"n{i:03}", cause=pos, basis=pos))  # fmt: skip
        add(ev.JobCreated(at=T0 + timedelta(minutes=10), namespace=NS, backfill=b, name=f"{b}-1", uid=f"j{i}"))
    for i in late:  # stored by someone else: only a sweep of the durable projection sees them
        add(ev.ForegroundRequest(at=T0 + timedelta(minutes=11), namespace=NS, model=f"m{i:03}", source="ingest"))
    durable = world
    spool = Spool(lambda records: list(range(pos + 1, pos + 1 + len(records))), lambda keys: {}, lambda: None)
    executed: list = []
    pre = Preemptor(lambda: durable, spool, lambda cmds, w: executed.extend(cmds), lambda: True, lambda: T0 + timedelta(minutes=12))
    pre.poke(None)
    spool.put([(ev.ForegroundRequest(at=T0 + timedelta(minutes=12), namespace=NS, model="m005", source="ingest"), "fg-5")])
    first = pre.run_once()
    assert [c.key[1] for c in first] == ["b005"], "the observed demand waits behind the sweep"
    passes = 1
    while pre.signal.is_set() and passes < 50:
        pre.signal.clear()
        pre.run_once()
        passes += 1
    spool.stop()
    assert sorted(c.key[1] for c in executed) == ["b005"] + [f"b{i:03}" for i in late]
    assert passes == -(-n // SWEEP_CHUNK)


def test_a_cancel_decided_in_memory_is_logged_with_its_real_position_once_recorded(caplog):
    """The cancel's own log line goes out with the DELETE, before the log has a position for it;
    the spool logs the decision's real position, cause and basis when it commits (a new user
    matched cancel lines to ``backfill replay`` positions and found provisional ones)."""
    import logging

    store, durable, _ = _store_with_running_attempt()
    spool = Spool(store.append, store.positions_of, lambda: None)
    pre = Preemptor(lambda: durable, spool, lambda cmds, world: None, lambda: True, lambda: T0 + timedelta(minutes=12))
    with caplog.at_level(logging.INFO, logger="backfill.controller.spool"):
        spool.put([(ev.ForegroundRequest(at=T0 + timedelta(minutes=12), namespace=NS, model="m", source="ingest"), "fg-1")])
        assert len(pre.run_once()) == 1
        assert _wait(lambda: spool.backlog == 0)
        spool.stop()
    (pos, cancel), = [(p, e) for p, e in _events(store) if isinstance(e, ev.AttemptCancelled)]
    lines = [r for r in caplog.records if getattr(r, "decision", None) == "AttemptCancelled"]
    assert [(r.position, r.backfill) for r in lines] == [(pos, f"{NS}/b")]
    assert f"at position {pos} (cause {cancel.cause}, basis {cancel.basis})" in lines[0].getMessage()


def test_unfolded_after_a_seq_returns_only_what_arrived_later_while_the_store_is_away():
    def refuse(records):
        raise ConnectionError("the store is down")

    spool = Spool(refuse, lambda keys: {}, lambda: None, backoff_initial=0.05, backoff_max=0.05)
    requests = [(ev.ForegroundRequest(at=T0 + timedelta(seconds=i), namespace=NS, model="m", source="ingest"), f"fg-{i}") for i in range(6)]
    entries = spool.put(requests)
    spool.put_decision(lambda resolve: (requests[0][0], "never-built"), entries[:1])  # a deferred decision: never listed
    later = spool.put(requests[:1])
    try:
        assert [e.seq for e in spool.unfolded(0)] == [e.seq for e in entries + later]
        assert [e.seq for e in spool.unfolded(0, entries[3].seq)] == [entries[4].seq, entries[5].seq, later[0].seq]
        assert spool.unfolded(0, later[0].seq) == []
    finally:
        spool.stop()


def test_lag_is_the_age_of_the_oldest_observation_a_projection_lacks_while_an_append_hangs():
    """A paused store fails nothing: the append just never answers. ``lag`` (what the loop holds
    statuses on) is the oldest missing entry's wait, measured here against the test's own clock."""
    store = MemoryEventStore(MemoryBackend())
    release = threading.Event()

    def hang(records):
        release.wait(10)
        return store.append(records)

    spool = Spool(hang, store.positions_of, lambda: None)
    request = ev.ForegroundRequest(at=T0, namespace=NS, model="m", source="ingest")
    try:
        assert spool.lag(0) == 0.0
        before = time.monotonic()
        spool.put([(request, "fg-lag")])
        time.sleep(0.3)
        lag = spool.lag(0)
        waited = time.monotonic() - before  # read after lag: the entry was spooled after ``before``
        assert spool.healthy and 0.3 <= lag <= waited
        release.set()
        assert _wait(lambda: spool.backlog == 0)
        (pos,) = [p for p, _ in _events(store)]
        assert spool.lag(pos - 1) >= 0.3  # committed, but after the projection's position
        assert spool.lag(pos) == 0.0 and spool.settled(pos)
    finally:
        release.set()
        spool.stop()


def _store_before_admission() -> tuple[MemoryEventStore, World, ev.AttemptAdmitted]:
    """The log up to the declaration (no attempt yet), and the admission the actor then appends."""
    store = MemoryEventStore(MemoryBackend())
    history = [
        (ev.ModelReady(at=T0, namespace=NS, model="m", node="n1"), "ready"),
        (ev.CronJobSeen(at=T0, namespace=NS, name="cj", job_template=TEMPLATE), "cj"),
        (ev.BackfillApplied(at=T0, namespace=NS, name="b", uid="u1", generation=1, spec=SPEC), "applied-1"),
    ]
    world = World()
    for p, (e, _) in zip(store.append([encode(e, k) for e, k in history]), history):
        world = fold(world, e, p)
    admitted = ev.AttemptAdmitted(
        at=T0 + timedelta(minutes=10), namespace=NS, backfill="b", uid="u1", attempt=1, generation=1, job_name=JOB,
        model="m", node="n1", cause=1, basis=3,
    )
    return store, world, admitted


def test_an_admission_this_process_appended_is_cancellable_before_the_loop_reads_it_back():
    """Fault breaker: PostgreSQL hung right after the admission's append; the durable projection
    never got the attempt, so a demand cancelled nothing. The actor now hands its appends over."""
    store, durable, admitted = _store_before_admission()
    spool = Spool(store.append, store.positions_of, lambda: None)
    executed: list = []
    pre = Preemptor(lambda: durable, spool, lambda cmds, world: executed.extend(cmds), lambda: True, lambda: T0 + timedelta(minutes=11))
    (position,) = store.append([encode(admitted, admitted.natural_key())])
    pre.recorded([(position, admitted)])
    pre.run_once()
    assert pre.cancelling((NS, "b"), 1) is False
    request = ev.ForegroundRequest(at=T0 + timedelta(minutes=11), namespace=NS, model="m", source="ingest")
    spool.put([(request, "fg-1")])
    cancels = pre.run_once()  # the durable projection still has no attempt
    assert [(c.reason, c.attempt, c.job_name) for c in cancels] == [("ForegroundDemand", 1, JOB)] and executed == cancels
    assert pre.cancelling((NS, "b"), 1) is True  # the actor creates no Job for it now
    assert _wait(lambda: spool.backlog == 0)
    spool.stop()
    (cancel,) = [e for _, e in _events(store) if isinstance(e, ev.AttemptCancelled)]
    assert cancel.basis >= position, "the cancel's basis does not hold the admission it cancels"
    assert _audit(store).divergences == []


def test_a_demand_seen_while_not_leading_is_cancelled_once_leadership_is_gained():
    """Fault breaker: the standby observed the demand, took the Lease over while the store was
    away, and cancelled nothing until the store came back."""
    store, durable, _ = _store_with_running_attempt()
    spool = Spool(lambda records: (_ for _ in ()).throw(ConnectionError("down")), store.positions_of, lambda: None,
                  backoff_initial=0.01, backoff_max=0.05)  # fmt: skip
    leading = threading.Event()
    executed: list = []
    pre = Preemptor(lambda: durable, spool, lambda cmds, world: executed.extend(cmds), leading.is_set, lambda: T0 + timedelta(minutes=12))
    spool.put([(ev.ForegroundRequest(at=T0 + timedelta(minutes=12), namespace=NS, model="m", source="ingest"), "fg-1")])
    assert pre.run_once() == [] and executed == []  # not the leader: nothing sent
    assert pre.run_once() == []  # nothing new observed since
    leading.set()
    cancels = pre.run_once()  # no new observation, no durable change: leadership alone
    assert [(c.reason, c.attempt) for c in cancels] == [("ForegroundDemand", 1)]
    spool.stop()


def test_a_refused_cancel_call_is_sent_again_from_memory():
    """Fault breaker: a webhook refused the DELETE while PostgreSQL was away; only the loop's
    re-issue (which needs the store) sent it again."""
    store, durable, _ = _store_with_running_attempt()
    spool = Spool(lambda records: (_ for _ in ()).throw(ConnectionError("down")), store.positions_of, lambda: None,
                  backoff_initial=0.01, backoff_max=0.05)  # fmt: skip
    sent_again: list = []
    pre = Preemptor(
        lambda: durable, spool, lambda cmds, world: None, lambda: True, lambda: T0 + timedelta(minutes=12),
        execute_again=lambda cmds, world: sent_again.extend(cmds),
    )  # fmt: skip
    spool.put([(ev.ForegroundRequest(at=T0 + timedelta(minutes=12), namespace=NS, model="m", source="ingest"), "fg-1")])
    (cancel,) = pre.run_once()
    pre.run_once()
    assert sent_again == []  # nothing failed yet
    pre.retry(cancel.key, after=0.0)  # the actor: the DELETE answered 500
    pre.run_once()
    assert [(type(c).__name__, c.job_name) for c in sent_again] == [("DeleteJob", JOB)]
    spool.stop()


def test_the_status_follows_a_cancel_made_from_memory_until_the_durable_projection_shows_it_done():
    """While the store refuses, the preemptor writes the status from its own projection
    (Cancelling, then waiting for a fresh window once the Job is seen gone), and the loop's
    older status of that backfill is not written, until the durable projection shows the end."""
    store, durable, _ = _store_with_running_attempt()
    down, spool = _spool_of_a_store_that_is_down(store)
    written: list = []
    pre = Preemptor(
        lambda: durable, spool, lambda cmds, world: None, lambda: True, lambda: T0 + timedelta(minutes=12), statuses=written.extend
    )
    key = (NS, "b")
    spool.put([(ev.ForegroundRequest(at=T0 + timedelta(minutes=12), namespace=NS, model="m", source="ingest"), "fg-1")])
    assert [c.reason for c in pre.run_once()] == ["ForegroundDemand"]
    assert [(c.key, c.status["phase"], c.status["jobName"]) for c in written] == [(key, "Cancelling", JOB)]
    assert pre.writes_status(key)
    written.clear()
    gone = ev.JobDeleted(at=T0 + timedelta(minutes=12, seconds=1), namespace=NS, backfill="b", name=JOB, uid="job")
    spool.put([(gone, gone.natural_key())])
    assert pre.run_once() == []
    (status,) = [c.status for c in written]
    assert (status["phase"], status["jobName"], status["reason"]) == ("WaitingForIdle", None, "IdleWindow")
    pre.settle(durable)  # the durable projection still shows the attempt Running: nothing changes
    assert pre.writes_status(key)
    down.clear()
    assert _wait(lambda: spool.backlog == 0)
    spool.stop()
    caught_up = World()
    for position, e in _events(store):
        caught_up = fold(caught_up, e, position)
    assert caught_up.backfills[key].attempt.result == "preempted"
    pre.settle(caught_up)
    assert not pre.writes_status(key)


def test_a_status_from_memory_never_says_starting_for_an_admission_only_the_loop_can_make():
    """A trial: the status flipped to ``Starting``/``Resuming`` from memory while the Job stayed
    suspended and nothing was admitted. Once the window has passed in memory, the store still
    away, the preemptor writes no status of that backfill (the loop holds the admission)."""
    store, durable, _ = _store_with_running_attempt()
    down, spool = _spool_of_a_store_that_is_down(store)
    written: list = []
    now = [T0 + timedelta(minutes=12)]
    pre = Preemptor(lambda: durable, spool, lambda cmds, world: None, lambda: True, lambda: now[0], statuses=written.extend)
    spool.put([(ev.ForegroundRequest(at=now[0], namespace=NS, model="m", source="ingest"), "fg-1")])
    assert [c.reason for c in pre.run_once()] == ["ForegroundDemand"]
    gone = ev.JobDeleted(at=now[0] + timedelta(seconds=1), namespace=NS, backfill="b", name=JOB, uid="job")
    spool.put([(gone, gone.natural_key())])
    pre.run_once()
    assert written[-1].status["phase"] == "WaitingForIdle"
    written.clear()
    # its status is written again when the admission falls due, with no observation to wake the
    # pass (a fault trial: "admission at 06:37:34 if the model stays idle" read 11 s after it)
    assert pre._status_due == {(NS, "b"): now[0] + timedelta(minutes=10, seconds=1)}  # idleFor 10m from the Job gone
    now[0] += timedelta(minutes=9)
    pre.run_once()
    assert written == []  # not yet
    now[0] += timedelta(minutes=2)  # an admission is due in memory
    pre.run_once()
    (status,) = [c.status for c in written]  # waiting, not Starting: only the loop admits
    assert (status["phase"], status["reason"], status["jobName"]) == ("WaitingForIdle", "ForegroundDemand", None)
    assert status["message"].startswith("attempt 1 ended (ForegroundDemand); the next admission is due and waits for the event log")
    down.clear()
    spool.stop()


def test_after_a_spec_change_cancelled_from_memory_the_status_waits_for_the_log_not_cancelling():
    """A fault trial: a spec change while the store was paused cancelled the Job at once, but the
    status stayed ``Cancelling`` with the deleted Job's name for the whole outage: the new
    generation's admission was due at once (no fresh idle window after a spec change), and a
    status with an admission due in memory was not written at all."""
    store, durable, _ = _store_with_running_attempt()
    down, spool = _spool_of_a_store_that_is_down(store)
    written: list = []
    now = T0 + timedelta(minutes=12)
    pre = Preemptor(lambda: durable, spool, lambda cmds, world: None, lambda: True, lambda: now, statuses=written.extend)
    changed = ev.BackfillApplied(at=now, namespace=NS, name="b", uid="u1", generation=2, spec={**SPEC, "env": {"X": "1"}})
    spool.put([(changed, "applied-2")])
    assert [c.reason for c in pre.run_once()] == ["SpecChanged"]
    assert [(c.status["phase"], c.status["jobName"]) for c in written] == [("Cancelling", JOB)]
    written.clear()
    gone = ev.JobDeleted(at=now + timedelta(seconds=1), namespace=NS, backfill="b", name=JOB, uid="job")
    spool.put([(gone, gone.natural_key())])
    assert pre.run_once() == []
    (status,) = [c.status for c in written]
    assert (status["phase"], status["reason"], status["jobName"]) == ("WaitingForIdle", "SpecChanged", None)
    assert [(c["status"], c["reason"]) for c in status["conditions"]] == [("False", "SpecChanged")]
    down.clear()
    spool.stop()


def test_stopping_with_records_the_store_refused_says_how_many_are_dropped(caplog):
    """A replica stopped during an outage exited with 5 records spooled and no word of them."""
    import logging

    store = MemoryEventStore(MemoryBackend())
    _, spool = _spool_of_a_store_that_is_down(store)
    spool.put([(ev.ForegroundRequest(at=T0, namespace=NS, model="m", source="ingest"), f"fg-{i}") for i in range(3)])
    assert _wait(lambda: not spool.healthy)
    with caplog.at_level(logging.WARNING, logger="backfill.controller.spool"):
        spool.stop(timeout=0.5)
    (record,) = [r for r in caplog.records if "spooled record" in r.getMessage()]
    assert record.getMessage().startswith("stopping with 3 spooled record(s) the event log did not accept; they are dropped (")
    assert _events(store) == []


def test_a_job_someone_else_resumes_is_suspended_again_from_memory_while_the_store_is_away():
    """An adversarial trial: with PostgreSQL stopped, a suspended Job (``preemption: Suspend``)
    that someone resumed ran 82 s, until the store came back and the loop re-issued the
    suspend; the preemptor folded the resume but re-sent only calls that had failed."""
    from ..core.builders import t
    from ..core.test_resumable import suspended_log

    log, admit, cancel = suspended_log()
    log.cancel(cancel, 800.5).job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    durable = log.world
    assert durable.backfills[cancel.key].attempt.lifecycle == "Suspended"
    spool = Spool(lambda records: (_ for _ in ()).throw(ConnectionError("down")), lambda keys: {}, lambda: None,
                  backoff_initial=0.01, backoff_max=0.05)  # fmt: skip
    sent: list = []
    pre = Preemptor(
        lambda: durable, spool, lambda cmds, world: None, lambda: True, lambda: t(900),
        execute_again=lambda cmds, world, failed=True: sent.append(([(type(c).__name__, c.job_name) for c in cmds], failed)),
    )  # fmt: skip
    pre.run_once()
    assert sent == []  # suspended, and nothing new
    resumed = ev.JobResumed(at=t(850), namespace=cancel.key[0], backfill="b", name=admit.job_name, uid=f"uid-{admit.job_name}", episode="x")
    spool.put([(resumed, resumed.natural_key())])
    pre.run_once()
    assert sent == [([("SuspendJob", admit.job_name)], False)]
    spool.stop()


def test_a_suspending_attempt_is_decided_again_every_second_while_the_store_is_away(monkeypatch):
    """A re-trial: with PostgreSQL stopped, someone cleared ``spec.suspend`` right after the
    preemptor's suspend, before any ``Suspended`` status (no event says so): the Job ran 65 s,
    until the store came back. The preemptor now decides a Suspending attempt again every
    second (re-asserting its suspend, paced by the actor) until it is observed suspended."""
    from backfill.controller import preempt as preempt_module

    from ..core.builders import t
    from ..core.test_resumable import suspended_log

    log, admit, cancel = suspended_log()
    log.cancel(cancel, 800.5)  # Suspending: the Job not observed suspended yet
    durable = log.world
    spool = Spool(lambda records: (_ for _ in ()).throw(ConnectionError("down")), lambda keys: {}, lambda: None,
                  backoff_initial=0.01, backoff_max=0.05)  # fmt: skip
    spool.put([(ev.ModelReady(at=t(800.6), namespace=NS, model="other", node="n9"), "other-ready")])
    assert _wait(lambda: not spool.healthy)  # the store refuses appends
    now = [time.monotonic()]
    monkeypatch.setattr(preempt_module.time, "monotonic", lambda: now[0])  # the same module: every clock here
    sent: list = []
    pre = Preemptor(
        lambda: durable, spool, lambda cmds, world: None, lambda: True, lambda: t(801),
        execute_again=lambda cmds, world, failed=True: sent.extend((type(c).__name__, failed) for c in cmds),
    )  # fmt: skip
    pre.run_once()  # leadership's sweep decides it
    assert sent == [("SuspendJob", False)]
    pre.run_once()
    assert len(sent) == 1  # not due yet
    now[0] += preempt_module.REASSERT_SECONDS
    pre.run_once()
    assert sent == [("SuspendJob", False)] * 2
    log.job("JobSuspended", admit.job_name, 803, completed_indexes="0-1", episode="rv1")
    durable = log.world  # observed suspended: nothing more to assert
    now[0] += preempt_module.REASSERT_SECONDS
    pre.run_once()
    now[0] += preempt_module.REASSERT_SECONDS
    pre.run_once()
    assert len(sent) == 2
    spool.stop()
