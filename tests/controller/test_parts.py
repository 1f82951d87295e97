"""Unit tests of the controller's small parts: status merge, metrics, HTTP server, JSON logs."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from datetime import datetime, timezone

import pytest

from backfill.controller import JsonFormatter
from backfill.controller.actor import merge_status
from backfill.controller.http import make_server, serve_in_thread
from backfill.controller.metrics import Metrics
from backfill.core.runs import RunRow

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def _ready(status: str) -> dict:
    return {"type": "Ready", "status": status, "reason": "R", "message": "m", "observedGeneration": 1}


def test_merge_status_keeps_foreign_fields_and_transition_time():
    current = {
        "phase": "Running",
        "jobName": "j-1",
        "foreign": "kept",
        "conditions": [
            {**_ready("True"), "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Other", "status": "True", "reason": "X", "message": "y", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ],
    }
    same = merge_status(current, {"phase": "Running", "jobName": None, "conditions": [_ready("True")]}, NOW)
    assert same["foreign"] == "kept" and "jobName" not in same
    conds = {c["type"]: c for c in same["conditions"]}
    assert conds["Ready"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert conds["Other"]["reason"] == "X"
    flipped = merge_status(current, {"phase": "Cancelling", "conditions": [_ready("False")]}, NOW)
    ready = next(c for c in flipped["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == "2026-01-02T03:04:05Z" and ready["status"] == "False"


def _row(result=None, reason="", seconds=0.0) -> RunRow:
    return RunRow("ns", "mbf", "u", "gemma", "n", "j", "", 1, 1, NOW, None, None, result, reason, seconds, 1)


def test_metrics_exact_families_on_a_private_registry():
    m = Metrics()
    m.started(_row())
    m.ended(_row("preempted", "ForegroundDemand", 12.5))
    m.ended(_row("succeeded", "Completed", 2.5))
    names = {f.name for f in m.registry.collect()}
    assert names == {
        "flexinfer_model_backfill_starts",
        "flexinfer_model_backfill_completions",
        "flexinfer_model_backfill_preemptions",
        "flexinfer_model_backfill_useful_running_seconds",
        "flexinfer_model_backfill_leader",
        "flexinfer_model_backfill_foreign_event_log",
    }
    labels = {"backfill": "mbf", "namespace": "ns", "model": "gemma"}
    get = m.registry.get_sample_value
    assert get("flexinfer_model_backfill_starts_total", labels) == 1
    assert get("flexinfer_model_backfill_completions_total", {**labels, "result": "preempted"}) == 1
    assert get("flexinfer_model_backfill_completions_total", {**labels, "result": "succeeded"}) == 1
    assert get("flexinfer_model_backfill_preemptions_total", {**labels, "reason": "ForegroundDemand"}) == 1
    assert get("flexinfer_model_backfill_useful_running_seconds_total", labels) == 15.0
    assert Metrics().registry.get_sample_value("flexinfer_model_backfill_starts_total", labels) is None


def test_the_leader_gauge_reads_leadership_at_each_scrape():
    """A fault trial: both replicas stood by behind a Lease no replica held, and no series said
    so (deploy/monitoring: ModelBackfillNoLeader alerts on this gauge)."""
    m = Metrics()
    leads = [False]
    m.follow_leadership(lambda: leads[0])
    assert m.registry.get_sample_value("flexinfer_model_backfill_leader") == 0.0
    leads[0] = True
    assert m.registry.get_sample_value("flexinfer_model_backfill_leader") == 1.0
    assert m.registry.get_sample_value("flexinfer_model_backfill_foreign_event_log") == 0.0  # nothing to compare
    foreign = [True]
    m.follow_leadership(lambda: leads[0], lambda: foreign[0])
    assert m.registry.get_sample_value("flexinfer_model_backfill_foreign_event_log") == 1.0
    foreign[0] = False
    assert m.registry.get_sample_value("flexinfer_model_backfill_foreign_event_log") == 0.0


class _Ingest:
    def __init__(self) -> None:
        self.calls: list = []

    def precheck(self, method, headers, client):
        self.calls.append((method, headers.get("Authorization"), client))
        return None

    def accept(self, body, client=""):
        self.calls.append(body)
        return 202, {"accepted": 1}


def _get(url: str, data: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("with_ingest", [False, True])
def test_http_endpoints(with_ingest):
    m = Metrics()
    m.started(_row())
    ready = {"ok": False}
    ingest = _Ingest() if with_ingest else None
    server = make_server("127.0.0.1:0", m.registry, lambda: ready["ok"], ingest)
    serve_in_thread(server)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        code, body = _get(base + "/metrics")
        assert code == 200 and b"flexinfer_model_backfill_starts_total{" in body
        assert _get(base + "/healthz")[0] == 200
        assert _get(base + "/readyz")[0] == 503
        ready["ok"] = True
        assert _get(base + "/readyz")[0] == 200
        code, body = _get(base + "/v1/foreground", b'{"model":"m"}', {"Authorization": "Bearer t"})
        if ingest is None:
            assert code == 404 and json.loads(body)["error"] == "not_found" and "/readyz" in json.loads(body)["detail"]
        else:
            assert code == 202 and json.loads(body) == {"accepted": 1}
            assert ingest.calls == [("POST", "Bearer t", "127.0.0.1"), b'{"model":"m"}']
    finally:
        server.shutdown()
        server.server_close()


def test_json_log_lines():
    rec = logging.LogRecord("backfill.controller", logging.INFO, __file__, 1, "admitted %s", ("x",), None)
    rec.backfill, rec.position, rec.decision = "ns/mbf", 7, "AttemptAdmitted"
    line = json.loads(JsonFormatter().format(rec))
    assert line["msg"] == "admitted x" and line["level"] == "info"
    assert (line["backfill"], line["position"], line["decision"]) == ("ns/mbf", 7, "AttemptAdmitted")
    assert line["time"].endswith("Z")


def test_metrics_follow_a_run_re_attributed_by_a_cancel_recorded_after_its_deletion():
    """The rows of a log where another replica recorded the Job's deletion before the leader's
    cancel (demand the leader acted on from memory): one start, one completion (its first
    result, ``cancelled``) and, once the late decision makes the row ``preempted``, one
    ForegroundDemand preemption, the same total the rows give."""
    from backfill.core import events as ev
    from backfill.core.commands import Admit
    from backfill.core.projector import fold
    from backfill.core.runs import previous_row, run_rows
    from backfill.core.state import World

    from ..core.builders import NS, Log, t

    log = Log().ready(0).cronjob(0).apply(0, idleFor="10m")
    (admit,) = [c for c in log.decide(600.4) if isinstance(c, Admit)]
    log.admit(admit, 600.4).job("JobCreated", admit.job_name, 600.5).job("JobDeleted", admit.job_name, 700.2).request(700)
    log.add(ev.AttemptCancelled(
        at=t(700.1), namespace=NS, backfill="b", uid="u1", attempt=admit.attempt, job_name=admit.job_name,
        reason="ForegroundDemand", cause=7, basis=5,
    ))  # fmt: skip
    m, world, rows = Metrics(), World(), []
    for pos, e in log.events:
        before, world = world, fold(world, e, pos)
        for row in run_rows(before, world, e):
            rows.append(row)
            admitted = isinstance(e, (ev.AttemptAdmitted, ev.AttemptResumed))
            m.follow(row, None if row.result is None else previous_row(before, row), admitted=admitted)
    assert [(r.result, r.reason) for r in rows] == [(None, ""), (None, ""), ("cancelled", "JobDeleted"), ("preempted", "ForegroundDemand")]
    get = m.registry.get_sample_value
    base = {"backfill": "b", "namespace": NS, "model": "m"}
    assert get("flexinfer_model_backfill_starts_total", base) == 1
    assert get("flexinfer_model_backfill_completions_total", {**base, "result": "cancelled"}) == 1
    assert get("flexinfer_model_backfill_completions_total", {**base, "result": "preempted"}) is None
    assert get("flexinfer_model_backfill_preemptions_total", {**base, "reason": "ForegroundDemand"}) == 1
