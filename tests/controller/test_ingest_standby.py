"""POST /v1/foreground on a standby while the event log refuses appends (a fault-injection finding).

Only the leader cancels, and it learns of a standby's reports through the log alone: a standby
that spooled a report it could not append answered ``202 {"spooled": 1}`` and nothing was
cancelled until the store returned. Now it answers 503 ``not_leader`` with ``Retry-After: 1``, and
the same report sent to the leader cancels the running Job from memory, store or no store.
Two controllers on the real API server and one PostgreSQL schema; leadership is a switch (as in
test_controller.py), the outage a store whose appends raise while ``down`` is set.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from backfill.controller.http import make_server
from backfill.controller.ingest import IngestEndpoint, ModelsNotLoadedError
from backfill.core import events as ev
from backfill.settings import Settings

from .conftest import LeaderSwitch, RefusingStore, log_of, wait_for

TOKEN = "secret"


def _serve(controller):
    """The controller's ingest endpoint on an HTTP server, wired as backfill.controller.run does."""

    endpoint = IngestEndpoint(
        TOKEN, controller.ingest_append, controller.model_known, controller.signal.set, Settings(), lambda: datetime.now(timezone.utc)
    )
    server = make_server("127.0.0.1:0", controller.metrics.registry, ready=lambda: True, ingest=endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, controller.model_known


def _post(server, body: bytes) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    try:
        conn.request("POST", "/v1/foreground", body=body,
                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(resp.read())
    finally:
        conn.close()


def test_a_standby_answers_503_retry_after_while_the_log_refuses_and_the_leader_cancels(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    down = threading.Event()
    leader = start_controller(leader=LeaderSwitch(True), wrap_events=lambda s: RefusingStore(s, down))
    standby = start_controller(leader=LeaderSwitch(False), wrap_events=lambda s: RefusingStore(s, down))
    kube.backfill("busy")
    job = wait_for(kube.jobs, what="Job created by the leader")[0]
    kube.run_job(job.metadata.name)
    wait_for(lambda: kube.status("busy").get("phase") == "Running", what="phase Running")
    servers = [_serve(leader), _serve(standby)]
    try:
        (leader_http, _), (standby_http, standby_knows) = servers
        wait_for(lambda: standby_knows(kube.ns, "gemma"), what="the standby folded the Model")
        report = {"namespace": kube.ns, "model": "gemma", "time": datetime.now(timezone.utc).isoformat(), "id": "router-a/1"}
        body = json.dumps({"reports": [report]}).encode()

        down.set()  # the outage: every append fails from now on
        status, headers, payload = _post(standby_http, body)
        assert status == 503, payload
        assert headers["retry-after"] == "1" and headers["content-type"] == "application/json"
        assert payload["error"] == "not_leader" and payload["spooled"] == 1
        assert "not the leader" in payload["detail"] and "event log" in payload["detail"]
        assert kube.job(job.metadata.name) is not None  # the standby cancels nothing

        status, headers, payload = _post(leader_http, body)  # the client's retry reaches the leader
        assert (status, payload) == (202, {"accepted": 1, "duplicates": 0, "spooled": 1})
        assert "retry-after" not in headers
        wait_for(lambda: kube.job(job.metadata.name) is None, timeout=5, what="Job deleted by the leader, store down")

        down.clear()  # the store is back: both spools drain; a standby whose append commits answers 202
        wait_for(lambda: standby.spool.healthy and standby.spool.backlog == 0, timeout=15, what="standby spool drained")
        wait_for(lambda: leader.spool.healthy and leader.spool.backlog == 0, timeout=15, what="leader spool drained")
        status, headers, payload = _post(standby_http, body)  # the same report again: a harmless duplicate
        assert (status, payload) == (202, {"accepted": 0, "duplicates": 1}), payload
    finally:
        down.clear()
        for server, _ in servers:
            server.shutdown()
            server.server_close()


def test_a_re_sent_report_cancels_nothing_and_the_retry_waits_a_window_from_the_cancel(kube, start_controller):
    """A router re-sends a report it already delivered (a retry after a lost answer): the
    preemptor folds it in memory before the log drops the duplicate, and it cancelled the next
    attempt (its cancel naming a JobCreated as the cause, ``backfill replay`` then diverging).
    Now the re-sent report cancels nothing; a report later than anything known still does."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    ctl = start_controller(leader=LeaderSwitch(True))
    kube.backfill("busy", idleFor="3s")
    first = wait_for(kube.jobs, what="the first Job")[0].metadata.name
    kube.run_job(first)
    server, _ = _serve(ctl)
    try:
        # a report 60 s behind (its router's clock): before the Model became Ready, yet demand
        stale = (datetime.now(timezone.utc) - timedelta(seconds=60)).isoformat()
        report = {"namespace": kube.ns, "model": "gemma", "time": stale, "id": "router-a/7"}
        body = json.dumps({"reports": [report]}).encode()
        assert _post(server, body)[0] == 202
        wait_for(lambda: kube.job(first) is None, timeout=5, what="the first Job deleted for the report")
        second = wait_for(lambda: [j.metadata.name for j in kube.jobs() if j.metadata.name != first], timeout=30, what="the retry's Job")[0]
        (cancel,) = wait_for(lambda: _logged(ctl, ev.AttemptCancelled), what="the cancel recorded")
        admits = wait_for(lambda: _logged(ctl, ev.AttemptAdmitted)[1:], what="the retry recorded")
        # a full idleFor from the cancel decision (the window from the report's time had long passed)
        assert (admits[0].at - cancel.at).total_seconds() >= 3.0, (cancel.at, admits[0].at)
        kube.run_job(second)
        wait_for(lambda: kube.status("busy").get("phase") == "Running", what="the retry Running")

        status, _, payload = _post(server, body)  # the same report again
        assert (status, payload["duplicates"]) == (202, 1), payload
        time.sleep(1.0)  # the cancel path acts in milliseconds; a second is ample to see one
        assert kube.job(second) is not None and kube.status("busy").get("phase") == "Running"

        later = {**report, "time": datetime.now(timezone.utc).isoformat(), "id": "router-a/8"}
        assert _post(server, json.dumps({"reports": [later]}).encode())[0] == 202
        wait_for(lambda: kube.job(second) is None, timeout=5, what="the second Job deleted for the new report")
    finally:
        server.shutdown()
        server.server_close()


def _logged(controller, cls) -> list:
    """The events of type ``cls`` in the controller's log, in order."""
    return [e for _, e in log_of(controller) if isinstance(e, cls)]


def test_a_replica_tells_a_models_existence_only_once_it_knows_it(kube, kube_cluster, pg_schema, start_controller):
    """An adversarial trial: a starting replica (the ingest Service sends to replicas that are
    not ready) answered 422 ``unknown_model`` for a Model that existed, so the router dropped the
    demand. Before the log is folded and the Models listed, :meth:`Controller.model_known`
    raises (the endpoint answers 503 ``starting``, Retry-After); after, it answers from the
    durable projection or the preemptor's, so a Model first seen while the store refuses
    appends is known too; a batch with an unknown Model beside a known one is taken in part."""
    from backfill.controller.loop import Controller
    from backfill.controller.metrics import Metrics
    from backfill.store import EventStore, RunStore, make_engine

    kube.model("gemma")
    url, schema = pg_schema
    engine = make_engine(url, schema)
    api = kube_cluster.api_client()
    try:
        unstarted = Controller(Settings(namespace=kube.ns), api, EventStore(engine), RunStore(engine), Metrics(), identity="unstarted")
        with pytest.raises(ModelsNotLoadedError, match="starting"):
            unstarted.model_known(kube.ns, "gemma")
        server, _ = _serve(unstarted)
        try:
            report = {"namespace": kube.ns, "model": "gemma", "time": datetime.now(timezone.utc).isoformat(), "id": "r/1"}
            status, headers, payload = _post(server, json.dumps({"reports": [report]}).encode())
            assert (status, payload["error"], headers["retry-after"]) == (503, "starting", "1"), payload
        finally:
            server.shutdown()
            server.server_close()
    finally:
        api.close()
        engine.dispose()

    down = threading.Event()
    ctl = start_controller(leader=LeaderSwitch(True), wrap_events=lambda s: RefusingStore(s, down))
    assert ctl.model_known(kube.ns, "gemma") is True
    assert ctl.model_known(kube.ns, "nope") is False
    down.set()  # appends refused: a Model created now reaches the preemptor's projection only
    kube.model("llama")
    wait_for(lambda: ctl.model_known(kube.ns, "llama"), timeout=5, what="the new Model known from memory")
    assert ctl.world.models.get((kube.ns, "llama")) is None  # not in the durable projection: the store took nothing
    server, _ = _serve(ctl)
    try:
        now = datetime.now(timezone.utc).isoformat()
        reports = [{"namespace": kube.ns, "model": m, "time": now, "id": f"r/{m}"} for m in ("llama", "nope")]
        status, _, payload = _post(server, json.dumps({"reports": reports}).encode())
        assert status == 202, payload
        assert payload["accepted"] == 1 and payload["spooled"] == 1
        assert [(r["index"], r["error"]) for r in payload["rejected"]] == [(1, "unknown_model")]
    finally:
        down.clear()
        server.shutdown()
        server.server_close()
