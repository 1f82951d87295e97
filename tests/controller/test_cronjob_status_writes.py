"""CronJob status writes on the real apiserver (a hostile-input trial: every CronJob change, a
status-only one included, appended a full copy of its job template to the log; 20 status patches
of a CronJob with a 900 kB argument added 18.9 MB). A CronJob is recorded once per spec change
(its ``metadata.generation``), whatever its status does."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from backfill.core import events as ev
from backfill.core.events import decode_many

from .conftest import wait_for

pytestmark = pytest.mark.kube


def _seen(controller, name: str) -> list:
    rows = list(controller.events.read(0))
    return [e for e in decode_many([(r.type, r.version, r.data) for r in rows]) if isinstance(e, ev.CronJobSeen) and e.name == name]


def test_status_writes_of_a_cronjob_add_nothing_to_the_log(kube, start_controller):
    kube.cronjob("busy-schedule")
    controller = start_controller()
    wait_for(lambda: len(_seen(controller, "busy-schedule")) == 1, timeout=10, what="the CronJob recorded")
    t0 = datetime.now(timezone.utc).replace(microsecond=0)
    for i in range(10):  # what the CronJob controller writes at every run
        stamp = (t0 + timedelta(minutes=i)).isoformat().replace("+00:00", "Z")
        kube.batch.patch_namespaced_cron_job_status("busy-schedule", kube.ns, {"status": {"lastScheduleTime": stamp}})
    # a spec change after them: once it is recorded, the status writes before it were watched too
    kube.batch.patch_namespaced_cron_job("busy-schedule", kube.ns, {"spec": {"schedule": "0 1 1 1 *"}})
    wait_for(lambda: len(_seen(controller, "busy-schedule")) >= 2, timeout=10, what="the spec change recorded")
    generations = {kube.batch.read_namespaced_cron_job("busy-schedule", kube.ns).metadata.generation}
    assert generations == {2}
    assert len(_seen(controller, "busy-schedule")) == 2  # the creation and the spec change, not the 10 status writes
