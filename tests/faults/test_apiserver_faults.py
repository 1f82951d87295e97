"""kube-apiserver faults: a paused apiserver (silent connections), an expired resourceVersion
(410 Gone) on the watch call and inside the stream, a Job that changed while no watch was open.

The watch timeout of the controller under test is 5 s (``FAST_SETTINGS``).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest

from .harness import FAST_SETTINGS, JobPlayer, Kube, assert_replay_clean, demand, log_events, of_type, timed, wait_for
from .workload import CANCEL_BOUND_SECONDS, cluster_invariants, declare, log_invariants, settled_log_invariants, start_running

pytestmark = pytest.mark.kube

WATCH_TIMEOUT = float(FAST_SETTINGS["BACKFILL_WATCH_TIMEOUT_SECONDS"])
#: The apiserver stays stopped this long: past the watch timeout plus a margin.
PAUSE_SECONDS = WATCH_TIMEOUT * 2 + 2
#: After SIGCONT the controller must be ready again (relisted) within this.
RECOVER_SECONDS = WATCH_TIMEOUT + 5


def _no_duplicates(events: list) -> list[str]:
    """Each observed fact is stored once (idempotency keys): no two identical observations."""
    seen = Counter()
    for _, e in events:
        t = type(e).__name__
        if t in ("JobCreated", "JobRunning", "JobSucceeded", "JobFailed", "JobDeleted"):
            seen[(t, e.name)] += 1
        elif t == "ForegroundRequest":
            seen[(t, e.model, e.at)] += 1
        elif t in ("AttemptAdmitted", "AttemptCancelled"):
            seen[(t, e.backfill, e.attempt)] += 1
    return [f"{k} stored {n} times" for k, n in seen.items() if n > 1]


def _deleted_and_cancelled(url: str, schema: str, job: str | None = None) -> list:
    """The log once it holds both the deletion of ``job`` (any Job when None; from the watch)
    and a cancel decision: a cancel DELETEs first and is recorded after (fail-safe), so either
    can come first."""

    def both() -> list | None:
        events = log_events(url, schema)
        deleted = [e for _, e in of_type(events, "JobDeleted") if job is None or e.name == job]
        return events if deleted and of_type(events, "AttemptCancelled") else None

    return wait_for(both, timeout=10, what=f"JobDeleted {job or ''} and AttemptCancelled in the log")


def test_apiserver_paused_past_the_watch_timeout(fault_cluster, kube: Kube, player: JobPlayer, controllers):
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf", "gemma")])
    proc = controllers().start()
    proc.wait_ready()
    job = start_running(kube, player, "bf")

    fault_cluster.pause()
    try:
        # The controller must notice the silent connections: /readyz 503 before the pause ends.
        noticed = None
        t0 = time.monotonic()
        while time.monotonic() - t0 < PAUSE_SECONDS:
            if noticed is None and proc.http("/readyz")[0] == 503:
                noticed = time.monotonic() - t0
            time.sleep(0.25)
    finally:
        fault_cluster.resume()
    print(f"apiserver paused {PAUSE_SECONDS:.0f} s: /readyz 503 after {noticed if noticed is None else round(noticed, 2)} s")
    assert proc.alive, proc.tail()
    assert noticed is not None, f"/readyz stayed 200 through a {PAUSE_SECONDS:.0f} s apiserver pause (watch timeout {WATCH_TIMEOUT:.0f} s)"

    seconds = timed(proc.ready, timeout=RECOVER_SECONDS, what="/readyz 200 after the apiserver resumed")
    print(f"apiserver resumed: ready again after {seconds:.2f} s")
    demand(kube, "gemma")
    seconds = timed(lambda: kube.job(job) is None, timeout=CANCEL_BOUND_SECONDS, what=f"Job {job} deleted after the pause")
    print(f"apiserver resumed: demand -> Job gone {seconds:.2f} s")

    events = _deleted_and_cancelled(pg.url, schema)
    assert _no_duplicates(events) == []
    assert [e.reason for _, e in of_type(events, "AttemptCancelled")] == ["ForegroundDemand"]
    assert cluster_invariants(kube) == []
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []
    assert_replay_clean(pg.url, schema)


# --------------------------------------------------------------------------- 410 Gone


def _etcd(cluster, path: str, body: dict) -> dict:
    req = urllib.request.Request(cluster.etcd_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def compact_etcd(cluster) -> int:
    """Compact etcd at its current revision (every older resourceVersion is gone); returns it."""
    rev = int(_etcd(cluster, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    _etcd(cluster, "/v3/kv/compaction", {"revision": rev, "physical": True})
    return rev


def watch_answer(cluster, ns: str, rv: str) -> str:
    """How the apiserver answers a Job watch from ``rv``: ``"410"`` on the call, ``"ERROR 410"``
    as the first event in the stream, or ``"ok"``."""
    import ssl
    import urllib.error

    ctx = ssl.create_default_context(cafile=cluster.ca_file)
    url = f"{cluster.host}/apis/batch/v1/namespaces/{ns}/jobs?watch=1&resourceVersion={rv}&timeoutSeconds=1"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {cluster.token}"})
    try:
        with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
            line = resp.readline()
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    if not line:
        return "ok"
    e = json.loads(line)
    if e.get("type") == "ERROR":
        return f"ERROR {e['object'].get('code')}"
    return "ok"


def test_job_completed_while_no_watch_was_open_is_recorded_completed(fault_cluster, kube: Kube, player: JobPlayer, controllers):
    """The controller is stopped (SIGSTOP) until the apiserver has closed all its watches
    (server-side timeout); the Job completes; etcd is compacted so the controller's last
    resourceVersion is expired (410 Gone); the controller continues. It must relist and record
    the Job as succeeded -- not as deleted, and nothing twice."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf", "gemma")])
    proc = controllers().start()
    proc.wait_ready()
    job = start_running(kube, player, "bf")
    old_rv = kube.batch.read_namespaced_job(job, kube.ns).metadata.resource_version

    proc.pause()
    try:
        time.sleep(WATCH_TIMEOUT + 2)  # every watch of the paused process has been closed by the server
        player.succeed(job)
        kube.set_status("models", "gemma", {"phase": "Ready"})  # more writes past the old revision
        compact_etcd(fault_cluster)
        answer = watch_answer(fault_cluster, kube.ns, old_rv)
        print(f"a Job watch from the controller's old resourceVersion now answers: {answer}")
    finally:
        proc.resume()
    assert answer != "ok", "the fault was not injected: the old resourceVersion is still served"

    wait_for(
        lambda: [e for _, e in of_type(log_events(pg.url, schema), "JobSucceeded") if e.name == job],
        timeout=WATCH_TIMEOUT + 10, what=f"JobSucceeded {job} in the log",
    )  # fmt: skip
    wait_for(lambda: kube.status("bf").get("phase") == "Succeeded", timeout=10, what="bf Succeeded")
    events = log_events(pg.url, schema)
    assert [e for _, e in of_type(events, "JobDeleted") if e.name == job] == []
    assert _no_duplicates(events) == []
    assert cluster_invariants(kube) == []
    assert_replay_clean(pg.url, schema)


def test_expired_resource_version_then_demand_is_cancelled(fault_cluster, kube: Kube, player: JobPlayer, controllers):
    """As above, but the change made while no watch was open is foreground demand: after the
    410 and the relist the Job is deleted promptly."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf", "gemma")])
    proc = controllers().start()
    proc.wait_ready()
    job = start_running(kube, player, "bf")
    old_rv = kube.get("models", "gemma")["metadata"]["resourceVersion"]

    proc.pause()
    try:
        time.sleep(WATCH_TIMEOUT + 2)
        demand(kube, "gemma")
        compact_etcd(fault_cluster)
        answer = watch_answer(fault_cluster, kube.ns, old_rv)
        print(f"a Job watch from an old resourceVersion now answers: {answer}")
    finally:
        proc.resume()
    assert answer != "ok", "the fault was not injected: the old resourceVersion is still served"
    t0 = time.monotonic()
    seconds = timed(lambda: kube.job(job) is None, timeout=WATCH_TIMEOUT + CANCEL_BOUND_SECONDS, what=f"Job {job} deleted after the 410")
    print(f"410 Gone + relist: controller continued -> Job gone {seconds:.2f} s (from SIGCONT {time.monotonic() - t0:.2f} s)")
    events = _deleted_and_cancelled(pg.url, schema)
    assert _no_duplicates(events) == []
    assert [e.reason for _, e in of_type(events, "AttemptCancelled")] == ["ForegroundDemand"]
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []
    assert_replay_clean(pg.url, schema)


def test_apiserver_restarted_under_the_controller(fault_cluster, kube: Kube, player: JobPlayer, controllers):
    """Every watch ends with the apiserver; the controller reconnects (relists), records a Job
    that completed as the apiserver came back as succeeded, and cancels the next demand."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf-1", "m1"), ("bf-2", "m2")])
    proc = controllers().start()
    proc.wait_ready()
    job1 = start_running(kube, player, "bf-1")
    job2 = start_running(kube, player, "bf-2")
    down = fault_cluster.restart_apiserver()
    player.succeed(job1)  # the first thing the restarted apiserver sees
    print(f"apiserver restarted: unreachable {down:.2f} s")
    seconds = timed(proc.ready, timeout=RECOVER_SECONDS, what="/readyz 200 after the apiserver restart")
    print(f"apiserver restarted: controller ready {seconds:.2f} s after it came back")
    demand(kube, "m2")
    seconds = timed(lambda: kube.job(job2) is None, timeout=CANCEL_BOUND_SECONDS, what=f"{job2} deleted after the restart")
    print(f"apiserver restarted: demand -> Job gone {seconds:.2f} s")
    wait_for(lambda: [e for _, e in of_type(log_events(pg.url, schema), "JobSucceeded") if e.name == job1],
             timeout=10, what=f"JobSucceeded {job1}")  # fmt: skip
    events = log_events(pg.url, schema)
    assert [e for _, e in of_type(events, "JobDeleted") if e.name == job1] == []
    assert _no_duplicates(events) == []
    assert cluster_invariants(kube) == []
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []
    assert_replay_clean(pg.url, schema)



def test_half_open_connections_are_abandoned(fault_cluster, kube: Kube, player: JobPlayer, controllers, proxy):
    """Every connection of the controller to the apiserver goes half-open (data and FIN
    discarded for good, no RST) for longer than the watch timeout; new connections work again
    afterwards. Only client-side timeouts get it out: it must reconnect, relist, and cancel the
    next demand promptly."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf", "gemma")])
    proc = controllers(server=proxy.url).start()
    proc.wait_ready()
    job = start_running(kube, player, "bf")
    proxy.partition(drop=True)
    time.sleep(PAUSE_SECONDS)
    status, _ = proc.http("/readyz")
    proxy.heal()
    print(f"half-open for {PAUSE_SECONDS:.0f} s: /readyz {status} at the end")
    demand(kube, "gemma")
    seconds = timed(lambda: kube.job(job) is None, timeout=WATCH_TIMEOUT + CANCEL_BOUND_SECONDS,
                    what=f"Job {job} deleted after the connections went half-open")  # fmt: skip
    print(f"half-open: demand -> Job gone {seconds:.2f} s after the heal")
    assert status == 503, f"/readyz {status} with every watch stalled for {PAUSE_SECONDS:.0f} s"
    wait_for(lambda: of_type(log_events(pg.url, schema), "JobDeleted"), timeout=10, what="JobDeleted in the log")
    assert _no_duplicates(log_events(pg.url, schema)) == []
    assert_replay_clean(pg.url, schema)


# --------------------------------------------------------------------------- watches that end early

SHORT_WATCH_SECONDS = 1


def _lists(proc, kind: str) -> int:
    """How many times the controller listed ``kind`` (its ``<kind>: listed ...`` log lines)."""
    return sum(1 for r in proc.logs() if str(r.get("msg", "")).startswith(f"{kind}: listed "))


def test_watches_that_end_early_or_are_cut_lose_nothing(fault_cluster, kube: Kube, player: JobPlayer, controllers, proxy):
    """Two ways a watch ends before the controller expects it, on the real apiserver:

    - the server ends it cleanly (here every second: the controller asks for 1 s watches): the
      watcher watches again from the last resourceVersion, with no relist, and a Job that
      completes across those ends is recorded ``JobSucceeded`` exactly once;
    - every connection is cut mid-stream (the proxy closes them; the stream ends without its
      last chunk): a watcher whose watch was cut relists and watches again, and a demand right
      after the cut is cancelled promptly.

    Afterwards each fact is stored once, the cluster invariants hold and replay is clean."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf-a", "gemma"), ("bf-b", "llama")])
    proc = controllers(server=proxy.url, BACKFILL_WATCH_TIMEOUT_SECONDS=str(SHORT_WATCH_SECONDS)).start()
    proc.wait_ready()
    job_a = start_running(kube, player, "bf-a")
    job_b = start_running(kube, player, "bf-b")
    time.sleep(3 * SHORT_WATCH_SECONDS)  # a few clean ends of every watch
    player.succeed(job_a)
    wait_for(lambda: [e for _, e in of_type(log_events(pg.url, schema), "JobSucceeded") if e.name == job_a],
             timeout=10, what=f"JobSucceeded {job_a} across watches ending every {SHORT_WATCH_SECONDS} s")  # fmt: skip
    time.sleep(2 * SHORT_WATCH_SECONDS)
    kinds = ("model", "job", "backfill", "cronjob", "gamingsession", "gpulease")
    before = {k: _lists(proc, k) for k in kinds}
    print(f"watches ending every {SHORT_WATCH_SECONDS} s: lists per kind {before}")
    assert before == {k: 1 for k in kinds}, f"a clean end of a watch made the controller relist: {before}"

    cut = proxy.cut()
    demand(kube, "llama")
    seconds = timed(lambda: kube.job(job_b) is None, timeout=CANCEL_BOUND_SECONDS, what=f"Job {job_b} deleted after every connection was cut")
    time.sleep(2 * SHORT_WATCH_SECONDS)
    after = {k: _lists(proc, k) for k in kinds}
    print(f"{cut} connections cut: demand -> Job gone {seconds:.2f} s; lists per kind {after}")
    # A watcher between two watches at the cut reconnects without noticing; one cut mid-stream relists.
    assert cut >= 1 and sum(after.values()) > sum(before.values()), f"no cut watch was relisted: {after}"

    events = _deleted_and_cancelled(pg.url, schema, job_b)
    assert _no_duplicates(events) == []
    assert [e for _, e in of_type(events, "JobDeleted") if e.name == job_a] == [], f"{job_a} completed, not deleted"
    assert [(e.backfill, e.reason) for _, e in of_type(events, "AttemptCancelled")] == [("bf-b", "ForegroundDemand")]
    assert proc.alive, proc.tail()
    assert cluster_invariants(kube) == []
    assert settled_log_invariants(pg.url, schema, all_ended=False) == []
    assert_replay_clean(pg.url, schema)


# --------------------------------------------------------------------------- a signal that cannot be read

def test_nothing_is_admitted_while_a_watched_kind_cannot_be_read(fault_cluster, kube: Kube, player: JobPlayer, controllers):
    """The GamingSession CRD is removed under a running controller, then a declaration is made:
    gaming intent can no longer be read (the list answers 404), so nothing may
    start (fail-closed) even when the idle window ends; /readyz says which kind fails. Once the
    CRD is back the watcher relists and the declaration is admitted."""
    from kubernetes import client

    from tests.conftest import ENVTEST_CRD_PATHS

    gaming_crd = next(p for p in ENVTEST_CRD_PATHS if "gamingsessions" in str(p))
    pg, schema = controllers.pg, controllers.schema
    proc = controllers().start()
    proc.wait_ready()
    ext = client.ApiextensionsV1Api(kube.api)
    ext.delete_custom_resource_definition("gamingsessions.ai.flexinfer")
    try:
        wait_for(lambda: proc.http("/readyz")[0] == 503, timeout=10, what="/readyz 503 once GamingSessions cannot be listed")
        status, body = proc.http("/readyz")
        # declared once the kind is known unreadable (declared before, a slow start-up could let
        # the 4 s window end before the watcher noticed, and the test raced the controller)
        declare(kube, [("bf", "gemma")], idle_for="4s")
        time.sleep(6)  # well past the 4 s idle window
        jobs = [j.metadata.name for j in kube.jobs()]
        admitted = of_type(log_events(pg.url, schema), "AttemptAdmitted")
        held = [r for r in proc.logs() if "admissions held" in str(r.get("msg", ""))]
        # the status says why (a new user's trial: "admission at T if the model stays idle",
        # long past T); the status writer's thread may trail the pass by a moment
        st = wait_for(lambda: (s := kube.status("bf")).get("reason") == "SignalUnreadable" and s, timeout=5, what="status SignalUnreadable")
    finally:
        fault_cluster.apply_crds([gaming_crd])
    print(f"GamingSession CRD removed: /readyz {status} {body.strip()!r}; Jobs {jobs}; log: {[r['msg'] for r in held][:1]}")
    assert "watcher gamingsession: failing: CRD gamingsessions.ai.flexinfer is not installed" in body, body
    assert jobs == [] and admitted == [], f"admitted while gaming intent could not be read: {jobs}"
    assert held, "the controller did not say why nothing was admitted"
    assert st["phase"] == "WaitingForIdle" and "cannot read gamingsession" in st["message"], st
    seconds = timed(lambda: kube.jobs() != [], timeout=20, what="the Job created once GamingSessions can be read again")
    print(f"GamingSession CRD back: Job created {seconds:.2f} s later")
    assert cluster_invariants(kube) == []
    assert_replay_clean(pg.url, schema)


# --------------------------------------------------------------------------- apiserver and store away


#: The apiserver comes back after this many failed DELETEs of the Job: the back-off between
#: calls (1, 2, 4, 8, 16 s ...) is 16 s by then (about 28 s into the outage).
FAILED_CALLS_BEFORE_HEAL = 5


def _running_behind_the_proxy(kube: Kube, player: JobPlayer, controllers, proxy, tmp_path, **settings: str):
    """A controller reaching the apiserver through ``proxy``, with an ingest token (``t0ken``),
    and the Job of ModelBackfill ``bf`` on Model ``gemma`` running: ``(process, job name)``."""
    token = tmp_path / "ingest-token"
    token.write_text("t0ken\n")
    declare(kube, [("bf", "gemma")])
    proc = controllers(server=proxy.url, BACKFILL_INGEST_TOKEN_FILE=str(token), **settings).start()
    proc.wait_ready()
    return proc, start_running(kube, player, "bf")


def _report_demand(proc, namespace: str, model: str) -> tuple[int, dict]:
    """POST one foreground report (now) for ``model`` to the controller's ingest endpoint:
    ``(HTTP status, JSON answer)``."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = json.dumps({"reports": [{"namespace": namespace, "model": model, "time": now, "count": 1}]}).encode()
    req = urllib.request.Request(f"http://{proc.address}/v1/foreground", data=body, method="POST", headers={
        "Authorization": "Bearer t0ken", "Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _gone(kube: Kube, proc, job: str, timeout: float, when: str) -> float:
    """Seconds until Job ``job`` is gone (at most ``timeout``); the controller still runs."""
    seconds = timed(lambda: kube.job(job) is None, timeout=timeout, what=f"Job {job} deleted {when}")
    assert proc.alive, proc.tail()
    return seconds


def _one_demand_cancel_logged(kube: Kube, url: str, schema: str, job: str) -> None:
    """The log holds the deletion of ``job`` and one cancel, for foreground demand; the cluster
    and the log keep their invariants; replay finds no divergence."""
    events = _deleted_and_cancelled(url, schema, job)
    assert [e.reason for _, e in of_type(events, "AttemptCancelled")] == ["ForegroundDemand"]
    assert cluster_invariants(kube) == []
    assert_replay_clean(url, schema)


def _failed_deletes(log_path, job: str) -> int:
    """How many DELETEs of ``job`` the controller's log says failed."""
    return sum(1 for line in log_path.read_text().splitlines() if f"deleting Job {job} failed" in line)


def test_a_cancel_that_failed_while_the_apiserver_was_away_goes_out_when_it_answers(
    kube: Kube, player: JobPlayer, controllers, proxy, tmp_path
):
    """An adversarial trial: PostgreSQL and the apiserver paused, a demand reported to the ingest
    endpoint (accepted, spooled), the apiserver resumed 45 s later with PostgreSQL still
    paused: the DELETE went out on its back-off timer (up to 30 s), 23 s after the apiserver
    answered again. Now a watcher's successful list after failing re-sends failed cancels at
    once. The apiserver is cut off by a partition that drops the open connections (a paused
    apiserver may run a DELETE queued in its socket when it resumes, hiding the back-off).
    Single replica (no leader election), as in the trial."""
    pg, schema = controllers.pg, controllers.schema
    proc, job = _running_behind_the_proxy(kube, player, controllers, proxy, tmp_path, BACKFILL_LEADER_ELECT="false")

    pg.pause()
    try:
        proxy.partition(drop=True)
        try:
            answer = _report_demand(proc, kube.ns, "gemma")
            # spooled and acted on from memory, but its cancel unanswered: the router is asked to
            # retry (tests/faults/test_cut_off_leader.py: with two replicas, another may act)
            assert answer[0] == 503 and answer[1]["error"] == "cancel_unanswered" and answer[1]["spooled"] == 1, answer
            # Heal just after a failed call, when the next one is 16 s away on the back-off (each
            # call takes ~5 s here: two tries of the 2 s timeout): none is in flight to succeed.
            wait_for(lambda: _failed_deletes(proc.log_path, job) >= FAILED_CALLS_BEFORE_HEAL or None, timeout=60,
                     what=f"{FAILED_CALLS_BEFORE_HEAL} failed DELETEs of {job} in the controller's log")  # fmt: skip
            assert kube.job(job) is not None  # nothing reached the apiserver meanwhile
        finally:
            proxy.heal()
        seconds = _gone(kube, proc, job, CANCEL_BOUND_SECONDS, "after the apiserver answered again, PostgreSQL still paused")
        print(f"apiserver reachable again (PostgreSQL paused): Job gone {seconds:.2f} s later")
    finally:
        pg.resume()
    _one_demand_cancel_logged(kube, pg.url, schema, job)


def test_a_failed_cancel_is_sent_again_when_the_leader_regains_its_lease_with_the_store_away(
    kube: Kube, player: JobPlayer, controllers, proxy, tmp_path
):
    """A fault trial: PostgreSQL paused, the leader cut off from the apiserver just after a
    renew, a demand reported to it: its DELETE failed, its lease lapsed, the re-send fell due
    while it did not lead and was dropped; healed, the replica took its lease again and the Job
    ran on (80 s) until PostgreSQL returned. One replica with leader election (FAST_SETTINGS:
    lease 3 s, renew 1 s): the partition outlasts the lease, not the replica."""
    pg, schema = controllers.pg, controllers.schema
    proc, job = _running_behind_the_proxy(kube, player, controllers, proxy, tmp_path)

    pg.pause()
    try:
        proxy.partition(drop=True)
        try:
            answer = _report_demand(proc, kube.ns, "gemma")
            assert answer[0] == 503, answer  # spooled, its cancel unanswered (or the lease already lapsed)
            wait_for(lambda: _failed_deletes(proc.log_path, job) >= 1 or None, timeout=30, what=f"a failed DELETE of {job}")
            # The failed call took two tries of the 2 s timeout: the replica stopped leading 2 s
            # after its last renew (lease 3 s - renew 1 s); its re-send falls due 1 s after the
            # failure, while it does not lead.
            time.sleep(3)
            assert kube.job(job) is not None  # nothing reached the apiserver meanwhile
        finally:
            proxy.heal()
        seconds = _gone(kube, proc, job, CANCEL_BOUND_SECONDS + 5, "once the replica leads again, PostgreSQL still paused")
        print(f"lease regained (PostgreSQL paused): Job gone {seconds:.2f} s after the heal")
    finally:
        pg.resume()
    _one_demand_cancel_logged(kube, pg.url, schema, job)
