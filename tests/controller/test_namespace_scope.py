"""A namespaced controller decides and acts only for its namespace, although the schema's log may
hold other namespaces' declarations (written by another controller sharing the database)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from backfill.core import events as ev
from backfill.core.events import decode_many, encode

from ..core.builders import TEMPLATE
from .conftest import now_s, ts, wait_for

pytestmark = pytest.mark.kube


def test_declarations_of_another_namespace_in_the_log_are_left_alone(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", lastActiveTime=ts(now_s() - timedelta(minutes=5)))
    c = start_controller()
    long_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    foreign = [
        (ev.ModelReady(at=long_ago, namespace="elsewhere", model="m", node="node-z"), "x/ready"),
        (ev.CronJobSeen(at=long_ago, namespace="elsewhere", name="cj", job_template=TEMPLATE), "x/cj"),
        (ev.BackfillApplied(at=long_ago, namespace="elsewhere", name="theirs", uid="u-x", generation=1,
                            spec={"modelRef": "m", "templateRef": "cj", "idleFor": "1s"}), "x/applied"),
    ]  # fmt: skip
    c.events.append([encode(e, k) for e, k in foreign])  # another controller's declaration, idle for an hour
    kube.backfill("ours", idleFor="1s")
    wait_for(lambda: kube.jobs(), timeout=15, what="our Job")  # the positive control: ours is admitted
    time.sleep(2.0)  # a few passes more: theirs was due long ago
    decided = {
        (e.namespace, e.backfill)
        for e in decode_many([(r.type, r.version, r.data) for r in c.events.read(0)])
        if isinstance(e, ev.DECISIONS)
    }
    assert (kube.ns, "ours") in decided
    assert not [k for k in decided if k[0] == "elsewhere"], decided
