"""Time: idle windows and cooldowns across a daylight-saving change of the host's local time zone
are exact (issue 9, "Time"). Europe/Berlin falls back on 2025-10-26 at 01:00 UTC (03:00 CEST ->
02:00 CET) and springs forward on 2025-03-30 at 01:00 UTC (02:00 CET -> 03:00 CEST): local
wall-clock arithmetic would be an hour off on either side; UTC arithmetic is exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime, timedelta, timezone

import pytest

from backfill.core import events as ev
from backfill.core.commands import Admit, WakeAt, WriteStatus
from backfill.core.projector import decide, fold
from backfill.core.state import World

from .harness import BIN, JobPlayer, Kube, log_events, of_type, wait_for
from .workload import declare, wait_job

UTC = timezone.utc
TEMPLATE = {"spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}
FALL_BACK = datetime(2025, 10, 26, 1, 0, tzinfo=UTC)
SPRING_FORWARD = datetime(2025, 3, 30, 1, 0, tzinfo=UTC)
US = timedelta(microseconds=1)


@pytest.fixture
def berlin():
    """The process's local time zone is Europe/Berlin for the test (restored afterwards)."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Europe/Berlin"
    time.tzset()
    assert time.localtime(FALL_BACK.timestamp() - 1).tm_isdst == 1 and time.localtime(FALL_BACK.timestamp()).tm_isdst == 0
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


def _world(events: list) -> World:
    w = World()
    for i, e in enumerate(events, 1):
        w = fold(w, e, i)
    return w


def _setup(t0: datetime, **spec) -> list:
    return [
        ev.ModelReady(at=t0 - timedelta(hours=3), namespace="ns", model="m", node="n", shared=""),
        ev.CronJobSeen(at=t0 - timedelta(hours=3), namespace="ns", name="cj", job_template=TEMPLATE),
        ev.BackfillApplied(at=t0 - timedelta(hours=3), namespace="ns", name="b", uid="u", generation=1,
                           spec={"modelRef": "m", "templateRef": "cj", **spec}),  # fmt: skip
    ]


@pytest.mark.parametrize("change", [FALL_BACK, SPRING_FORWARD], ids=["fall-back", "spring-forward"])
@pytest.mark.parametrize("offset_minutes", [-30, 0, 30])
def test_idle_window_across_a_dst_change_is_exact(berlin, change, offset_minutes):
    """Demand ends 30 min before/at/after the change; idleFor 1h: admission exactly 3600 s later."""
    busy_end = change + timedelta(minutes=offset_minutes) - timedelta(minutes=30)
    w = _world(_setup(busy_end, idleFor="1h") + [ev.ForegroundRequest(at=busy_end, namespace="ns", model="m")])
    due = busy_end + timedelta(seconds=3600)
    before = decide(w, due - US, None, status=True)
    assert not any(isinstance(c, Admit) for c in before)
    assert [c.at for c in before if isinstance(c, WakeAt)] == [due]
    assert any(isinstance(c, Admit) for c in decide(w, due, None))


@pytest.mark.parametrize("change", [FALL_BACK, SPRING_FORWARD], ids=["fall-back", "spring-forward"])
def test_cooldown_across_a_dst_change_is_exact(berlin, change):
    """A success 15 min before the change, repeatAfter 1h: nextRunTime exactly 3600 s later (UTC)."""
    t_ok = change - timedelta(minutes=15)
    events = _setup(t_ok - timedelta(hours=1), idleFor="1m", repeatAfter="1h")
    events += [
        ev.AttemptAdmitted(at=t_ok - timedelta(minutes=30), namespace="ns", backfill="b", cause=1, basis=3, uid="u", attempt=1,
                           generation=1, job_name="b-x-1", model="m", node="n"),  # fmt: skip
        ev.JobCreated(at=t_ok - timedelta(minutes=30), namespace="ns", backfill="b", name="b-x-1", uid="j"),
        ev.JobSucceeded(at=t_ok, namespace="ns", backfill="b", name="b-x-1", uid="j"),
    ]
    w = _world(events)
    next_run = t_ok + timedelta(hours=1)
    statuses = [c.status for c in decide(w, t_ok + timedelta(seconds=1), None, status=True) if isinstance(c, WriteStatus)]
    assert statuses[-1]["nextRunTime"] == next_run.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert not any(isinstance(c, Admit) for c in decide(w, next_run - US, None))
    assert any(isinstance(c, Admit) for c in decide(w, next_run, None))


def test_simulate_across_the_fall_back_is_exact_and_zone_independent(tmp_path):
    """The same trace under TZ=UTC and TZ=Europe/Berlin gives the same report, and the figures
    computed by hand: gaps of 3 h (23:00Z -> 02:00Z, across the change) and 2 h; idleFor 30m,
    job 15m, repeatAfter 1m: admissions at 30 + 16k min while before the next arrival.
    Gap 180 min: k = 0..9 -> 10 attempts, 9 end by 180 (45 + 16k <= 180), 1 preempted;
    gap 120 min: k = 0..5 -> 6 attempts, 5 succeeded, 1 preempted."""
    trace = tmp_path / "dst.csv"
    trace.write_text("model,timestamp\nm1,2025-10-25T23:00:00Z\nm1,2025-10-26T02:00:00Z\nm1,2025-10-26T04:00:00Z\n")
    out = {}
    for tz in ("UTC", "Europe/Berlin"):
        proc = subprocess.run(
            [str(BIN), "simulate", "--trace", str(trace), "--format", "csv", "--idle-for", "30m", "--job", "15m",
             "--repeat-after", "1m", "--max-run", "30m", "--no-store", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120, env=dict(os.environ, TZ=tz),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        out[tz] = json.loads(proc.stdout)
    assert out["UTC"] == out["Europe/Berlin"]
    m1 = [r for r in out["UTC"] if r["model"] == "m1"][0]
    assert (m1["attempts"], m1["succeeded"], m1["preempted"]) == (16, 14, 2)
    assert m1["wasted"] == (180 - 174) * 60 + (120 - 110) * 60


@pytest.mark.kube
def test_controller_with_a_local_time_zone(kube: Kube, player: JobPlayer, controllers):
    """The controller process runs with TZ=Europe/Berlin: the log's times are UTC and the
    admission comes no earlier than idleFor after the Model became idle."""
    pg, schema = controllers.pg, controllers.schema
    declare(kube, [("bf", "gemma")], idle_for="3s")
    proc = controllers(TZ="Europe/Berlin").start()
    proc.wait_ready()
    wait_job(kube, "bf")
    events = log_events(pg.url, schema)
    (_, admit), = of_type(events, "AttemptAdmitted")
    ready = [e.at for _, e in of_type(events, "ModelReady")]
    assert admit.at.utcoffset() == timedelta(0)
    assert (admit.at - min(ready)).total_seconds() >= 3.0
    status = wait_for(lambda: kube.status("bf").get("startedAt") and kube.status("bf"), timeout=10, what="status.startedAt")
    times = [v for k, v in status.items() if (k.endswith("Time") or k in ("idleSince", "startedAt")) and v]
    assert times and all(isinstance(v, str) and v.endswith("Z") for v in times), status
    for line in proc.logs():
        if "time" in line:
            assert line["time"].endswith("Z"), line
