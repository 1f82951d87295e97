"""PostgreSQL faults under a running controller (issue 8 "Tests that must exist", issue 9
"Database faults"): the cancel never waits on the store.

The controller runs as a real subprocess; the test plays the Job controller; the outcome is read
from the cluster (Jobs, statuses) and from the log (PostgreSQL, after it returns).
"""

from __future__ import annotations

import contextlib
import json
import re
import time

import pytest

from .harness import JobPlayer, Kube, assert_replay_clean, demand, log_events, of_type, run_rows, timed, wait_for
from .workload import CANCEL_BOUND_SECONDS, cluster_invariants, declare, log_invariants, post_reports, settled_log_invariants, start_running

pytestmark = pytest.mark.kube

#: How long the store stays away after the demand (longer than the 2 s idle window, so an
#: admission while it is down would have happened).
OUTAGE_AFTER_DEMAND_SECONDS = 4.0
#: /readyz must say which dependency is missing.
STORE_WORDS = re.compile(r"store|database|postgres", re.I)


@contextlib.contextmanager
def store_fault(pg, schema: str, fault: str):
    """``stop``: pg_ctl stop -m fast (connections refused); ``pause``: postmaster and backends
    SIGSTOPped (connections hang); ``lock``: ACCESS EXCLUSIVE on the events table (statements hang)."""
    if fault == "stop":
        pg.stop()
        try:
            yield
        finally:
            pg.start()
    elif fault == "pause":
        pg.pause()
        try:
            yield
        finally:
            pg.resume()
    elif fault == "lock":
        with pg.lock_events(schema):
            yield
    else:  # pragma: no cover
        raise ValueError(fault)


@pytest.mark.parametrize("fault", ["stop", "pause", "lock"])
def test_demand_while_the_store_is_away_cancels_at_once(kube: Kube, player: JobPlayer, controllers, fault):
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf", "gemma")])
    proc = controllers().start()
    proc.wait_ready()
    job = start_running(kube, player, "bf")

    with store_fault(pg, schema, fault):
        last_active = demand(kube, "gemma")
        t0 = time.monotonic()
        try:
            seconds = timed(lambda: kube.job(job) is None, timeout=CANCEL_BOUND_SECONDS, what=f"Job {job} deleted with the store {fault}")
        finally:
            print(f"store {fault}: demand -> Job {job} gone: {time.monotonic() - t0:.2f} s (bound {CANCEL_BOUND_SECONDS} s)")
        print(f"store {fault}: cancel took {seconds:.2f} s")
        # Past the idle window: nothing may be admitted while the log cannot record it.
        deadline = t0 + OUTAGE_AFTER_DEMAND_SECONDS
        while time.monotonic() < deadline:
            assert [j.metadata.name for j in kube.jobs()] == [], "a Job was created while the store was away"
            time.sleep(0.2)
        status, body = proc.http("/readyz")
        assert status == 503 and STORE_WORDS.search(body), f"/readyz with the store {fault}: {status} {body!r}"
        # The status follows the cancel made from memory (not Running over a Job that is gone):
        # the preempted attempt waits for a fresh idle window, with no Job named.
        seen = wait_for(lambda: _left_running(kube.status("bf")), timeout=5, what=f"status no longer Running with the store {fault}")
        assert (seen.get("phase"), seen.get("jobName")) == ("WaitingForIdle", None), seen
        assert proc.alive, proc.tail()

    if fault == "pause":  # a hang answers nothing and fails nothing: said in the log all the same (a new user's trial)
        said = [json.loads(l)["msg"] for l in proc.log_path.read_text().splitlines() if "has not answered for" in l]
        assert said and "nothing is admitted until it answers" in said[0], said
        wait_for(lambda: "the event log answers again after" in proc.log_path.read_text(), timeout=10, what="the end of the stall logged")

    # The store is back: the log catches up with what happened while it was away.
    def logged() -> bool:
        events = log_events(pg.url, schema)
        fg = [e for _, e in of_type(events, "ForegroundRequest") if e.model == "gemma"]
        cancels = [e for _, e in of_type(events, "AttemptCancelled") if e.attempt == 1]
        deleted = [e for _, e in of_type(events, "JobDeleted") if e.name == job]
        return bool(fg and cancels and deleted)

    wait_for(logged, timeout=20, what="the missed demand, cancel and deletion in the log")
    events = log_events(pg.url, schema)
    fg = [(p, e) for p, e in of_type(events, "ForegroundRequest") if e.model == "gemma"]
    assert [e.at.strftime("%Y-%m-%dT%H:%M:%SZ") for _, e in fg][-1] == last_active
    (cancel_pos, cancel), = [(p, e) for p, e in of_type(events, "AttemptCancelled") if e.attempt == 1]
    assert cancel.reason == "ForegroundDemand" and cancel.cause == fg[-1][0], (cancel, fg)
    row = wait_for(
        lambda: [r for r in run_rows(pg.url, schema) if r.attempt == 1 and r.ended_at is not None],
        timeout=10, what="run row of attempt 1 ended",
    )[0]  # fmt: skip
    assert (row.result, row.reason, row.job_name) == ("preempted", "ForegroundDemand", job)
    assert cluster_invariants(kube) == []
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []
    assert_replay_clean(pg.url, schema)


def _left_running(status: dict) -> dict | None:
    """``status`` once its phase is neither Running nor Cancelling, else None."""
    return status if status.get("phase") not in (None, "Running", "Cancelling") else None


def test_store_restarted_under_a_running_controller(kube: Kube, player: JobPlayer, controllers):
    """The LISTEN connection does not survive a restart: the wake-up path must recover, and the
    next demand is cancelled promptly and recorded."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf", "gemma")])
    proc = controllers().start()
    proc.wait_ready()
    job = start_running(kube, player, "bf")
    t0 = time.monotonic()
    pg.stop()
    pg.start()
    print(f"store restart took {time.monotonic() - t0:.2f} s")
    wait_for(proc.ready, timeout=15, what="/readyz 200 after the store restarted")
    demand(kube, "gemma")
    seconds = timed(lambda: kube.job(job) is None, timeout=CANCEL_BOUND_SECONDS, what=f"Job {job} deleted after the restart")
    print(f"store restarted: demand -> Job gone {seconds:.2f} s")
    wait_for(
        lambda: [r for r in run_rows(pg.url, schema) if r.attempt == 1 and r.result == "preempted"],
        timeout=10, what="attempt 1 preempted in the runs table",
    )  # fmt: skip
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []
    assert_replay_clean(pg.url, schema)


def test_a_controller_sigtermed_while_the_store_hangs_exits_in_time(kube: Kube, player: JobPlayer, controllers):
    """A fault trial: SIGTERM with PostgreSQL hung released the Lease at once, but the process
    lived on until the store answered (52 and 63 s: past the Deployment's 30 s grace), its
    main thread waiting for the LISTEN connection a hung read held. It exits within the
    harness's bound now (10 s), the store still hung, and exiting does not stop the running Job
    (a stop without a cancel condition leaves it to the next controller: still there after the
    exit)."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf", "gemma")])
    proc = controllers().start()
    proc.wait_ready()
    job = start_running(kube, player, "bf")
    pg.pause()
    try:
        time.sleep(2.0)  # the loop's read and the LISTEN wait now hang on the store
        t0 = time.monotonic()
        code = proc.terminate()  # raises past STOP_TIMEOUT
        print(f"SIGTERM with the store hung: exited {code} after {time.monotonic() - t0:.2f} s")
        assert code == 0
        assert kube.job(job) is not None
    finally:
        pg.resume()
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []


def test_counters_match_the_log_after_batches_retried_on_store_errors(kube: Kube, player: JobPlayer, controllers):
    """The store goes away as three admissions come due and while their cancels are decided:
    the controller retries its batches; afterwards every counter on /metrics equals what the
    log says (no attempt counted twice because a batch was retried)."""
    pg, schema = controllers.pg, controllers.schema
    pairs = [("bf-1", "m1"), ("bf-2", "m2"), ("bf-3", "m3")]
    declare(kube, pairs)
    proc = controllers().start()
    proc.wait_ready()
    pg.stop()
    try:
        time.sleep(3)  # the 2 s idle windows complete while the store is away
    finally:
        pg.start()
    jobs = [start_running(kube, player, name) for name, _ in pairs]
    pg.stop()
    try:
        for _, model in pairs:
            demand(kube, model)
        time.sleep(2)
    finally:
        pg.start()
    wait_for(lambda: all(kube.job(j) is None for j in jobs), timeout=20, what="every Job deleted once the store is back")
    wait_for(lambda: len([r for r in run_rows(pg.url, schema) if r.attempt == 1 and r.result]) == 3, timeout=20,
             what="three ended first attempts")  # fmt: skip
    # Quiet: the second attempts are admitted and their Jobs created (then nothing happens).
    wait_for(lambda: sorted(j.metadata.name.rsplit("-", 1)[1] for j in kube.jobs()) == ["2", "2", "2"], timeout=20,
             what="the three second attempts' Jobs")  # fmt: skip
    wait_for(lambda: len(of_type(log_events(pg.url, schema), "JobCreated")) >= 6, timeout=10, what="six JobCreated")
    time.sleep(1)
    events = log_events(pg.url, schema)
    admitted = len(of_type(events, "AttemptAdmitted"))
    ended = len([r for r in run_rows(pg.url, schema) if r.result])
    starts = proc.metric("flexinfer_model_backfill_starts_total")
    completions = proc.metric("flexinfer_model_backfill_completions_total")
    preemptions = proc.metric("flexinfer_model_backfill_preemptions_total")
    print(f"after two store outages: starts {starts}, completions {completions}, preemptions {preemptions}; "
          f"log: {admitted} admitted, {ended} ended")  # fmt: skip
    assert (starts, completions) == (admitted, ended)
    assert preemptions == len([r for r in run_rows(pg.url, schema) if r.result == "preempted"])
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []
    assert_replay_clean(pg.url, schema)


def test_a_demand_dropped_by_a_full_spool_cancels_once_the_store_is_back(kube: Kube, player: JobPlayer, controllers):
    """Fault breaker: with the spool full (10,000 records here, the least it may hold), a demand observed while the store
    was stopped was dropped and, the translator having seen its lastActiveTime, never observed
    again: the Job ran on after the store came back and the log held no demand. Past the bound
    observations are still dropped (memory is bounded), but once the backlog has drained every
    watcher relists and judges lastActiveTime against the log: the dropped demand cancels then,
    and the log explains it."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf", "gemma"), ("other", "llama")])
    fill = [f"fill{i}" for i in range(100)]  # Models with no backfill: their demand only fills the spool
    for i, m in enumerate(fill):
        kube.model(m, node=f"fill-node-{i}")
    proc = controllers(BACKFILL_SPOOL_MAX_RECORDS="10000").start()
    proc.wait_ready()
    job = start_running(kube, player, "bf")
    pg.stop()
    try:
        from datetime import timedelta

        from .harness import now_s, ts

        from concurrent.futures import ThreadPoolExecutor

        def flood(model: str) -> None:  # other models' demand, each write a new lastActiveTime
            # ahead of its write, never behind it: a value more than 5 s behind its write is read
            # as the write's second, and writes within one second are one demand (a CI run's slow
            # flood fell behind its base time and never filled the spool)
            for i in range(110):
                kube.set_status("models", model, {"phase": "Ready", "lastActiveTime": ts(now_s() + timedelta(seconds=i + 1))})

        with ThreadPoolExecutor(16) as pool:  # 11,000 observations: past the spool's 10,000
            list(pool.map(flood, fill))
        wait_for(lambda: any("spool full" in str(r.get("msg", "")) for r in proc.logs()), timeout=30, what="the spool filled")
        demand(kube, "gemma")
        time.sleep(1.0)
        print(f"spool full: the Job {'still runs' if kube.job(job) is not None else 'is gone'} 1 s after the dropped demand")
    finally:
        pg.start()
    seconds = timed(lambda: kube.job(job) is None, timeout=30, what=f"Job {job} deleted after the store returned")
    print(f"spool full: Job gone {seconds:.2f} s after the store returned")
    wait_for(lambda: [e for _, e in of_type(log_events(pg.url, schema), "AttemptCancelled") if e.backfill == "bf"],
             timeout=10, what="the cancel of bf in the log")  # fmt: skip
    events = log_events(pg.url, schema)
    assert [e.reason for _, e in of_type(events, "AttemptCancelled") if e.backfill == "bf"] == ["ForegroundDemand"]
    assert [e for _, e in of_type(events, "ForegroundRequest") if e.model == "gemma"], "the dropped demand is not in the log"
    assert cluster_invariants(kube) == []
    assert_replay_clean(pg.url, schema)


def test_an_ingest_flood_with_the_store_stopped_is_refused_and_leaves_room_for_a_demand(kube: Kube, player: JobPlayer, controllers, tmp_path):
    """A fault trial: with PostgreSQL paused, 130 calls of 1,000 reports filled the spool; a
    fresh report was then answered ``202 {"accepted": 0, "duplicates": 1}`` (never retried,
    never stored) and neither it nor a ``lastActiveTime`` bump cancelled the running Job. Reports
    now fill at most half the spool, and those it cannot take are answered 503 ``spool_full``
    (refused, not dropped: no relist follows), a re-send of held reports is taken.

    A new user's trial: a flood on one Model (PostgreSQL slow) refused a report on another
    Model whose Job ran on. A call's first report on a Model with a running attempt is taken
    now even when the reports' half of the spool is full."""
    pg, schema = controllers.pg, controllers.schema
    token = tmp_path / "ingest-token"
    token.write_text("t0ken\n")
    declare(kube, [("bf", "gemma"), ("other", "llama")])
    kube.model("mistral", node="node-9")  # the flood's Model: no ModelBackfill on it
    proc = controllers(BACKFILL_SPOOL_MAX_RECORDS="10000", BACKFILL_INGEST_TOKEN_FILE=str(token)).start()
    proc.wait_ready()
    job = start_running(kube, player, "bf")
    other_job = start_running(kube, player, "other")
    pg.stop()
    try:
        from datetime import timedelta

        from .harness import now_s, ts

        stale = ts(now_s() - timedelta(seconds=3000))  # no new demand: only fills the spool
        answers = [
            post_reports(proc, [{"namespace": kube.ns, "model": "mistral", "time": stale, "id": f"flood/{c}/{i}"} for i in range(1000)])
            for c in range(11)  # 11,000: past the whole spool, as the trial's flood
        ]
        codes = [(status, body.get("error"), body.get("accepted"), body.get("spooled")) for status, body, _ in answers]
        print(f"11 calls of 1,000 reports, the store stopped, a spool of 10,000: {codes}")
        # the reports' half is full: a report on llama, whose Job runs, is still taken and cancels
        on_llama = post_reports(proc, [{"namespace": kube.ns, "model": "llama", "time": ts(now_s()), "id": "llama-1"}])
        seconds = timed(lambda: kube.job(other_job) is None, timeout=CANCEL_BOUND_SECONDS, what=f"Job {other_job} deleted on a report")
        print(f"a report on llama after the flood: {on_llama[:2]}; Job gone {seconds:.2f} s later")
        demand(kube, "gemma")  # a lastActiveTime bump: the watchers' half of the spool is free
        seconds = timed(lambda: kube.job(job) is None, timeout=CANCEL_BOUND_SECONDS, what=f"Job {job} deleted on a demand after the flood")
        print(f"demand after the flood: Job gone {seconds:.2f} s later, the store still stopped")
        fresh = post_reports(proc, [{"namespace": kube.ns, "model": "gemma", "time": ts(now_s()), "id": "fresh-1"}])
        # a re-send of the first call, held already: taken, not refused (a second trial)
        resent = post_reports(proc, [{"namespace": kube.ns, "model": "mistral", "time": stale, "id": f"flood/0/{i}"} for i in range(1000)])
    finally:
        pg.start()
    # reports fill at most half of the 10,000 records (the watchers' few observations share it)
    taken = sum(c[3] or 0 for c in codes)
    assert [c[0] for c in codes[:4]] == [202] * 4 and all(c[2] == 1000 for c in codes[:4]), codes
    # the fifth fits whole or in part, by how many of the watchers' observations wait beside it
    assert [c[:2] for c in codes[5:]] == [(503, "spool_full")] * 6 and 4000 < taken <= 5000, codes
    assert answers[-1][2] == "1", "a 503 spool_full says when to retry"
    assert fresh[0] == 503 and fresh[1]["error"] == "spool_full", fresh  # not a false "duplicates: 1"
    assert (on_llama[0], on_llama[1].get("accepted"), on_llama[1].get("spooled")) == (202, 1, 1), on_llama
    assert (resent[0], resent[1].get("accepted"), resent[1].get("spooled")) == (202, 1000, 1000), resent[:2]
    # refused reports are not dropped observations: no "spool full" error, no relist of every watcher
    noted = [r["msg"] for r in proc.logs() if "spool full" in str(r.get("msg", "")) or "relisting every watcher" in str(r.get("msg", ""))]
    assert noted == [], noted
    wait_for(lambda: [e for _, e in of_type(log_events(pg.url, schema), "AttemptCancelled") if e.backfill == "bf"],
             timeout=20, what="the cancel of bf in the log")  # fmt: skip
    assert [e.reason for _, e in of_type(log_events(pg.url, schema), "AttemptCancelled") if e.backfill == "other"] == ["ForegroundDemand"]
    assert cluster_invariants(kube) == []
    assert_replay_clean(pg.url, schema)
