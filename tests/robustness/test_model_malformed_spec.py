"""A Model whose spec or status has the wrong shape still yields its foreground signal.

A translation that raised would make the watcher skip the object, and that Model's
``lastActiveTime`` would then never cancel a running backfill: malformed placement fields must
read as "unknown node", not fail the whole object.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from backfill.controller.translate import Translator, model_node, model_shared
from backfill.core import events as ev

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "spec, status",
    [
        ({"nodeSelector": True}, {}),
        ({"nodeSelector": ["a"]}, {"gpu": "n1"}),
        (5, "Ready"),
        ({"gpu": 3}, {"gpu": {"node": None}}),
        (None, None),
    ],
)
def test_malformed_placement_reads_as_unknown_and_demand_still_counts(spec, status):
    obj = {"metadata": {"name": "m", "namespace": "ns", "uid": "u", "resourceVersion": "2"}, "spec": spec}
    if isinstance(status, dict):
        obj["status"] = {**status, "phase": "Ready", "lastActiveTime": "2026-12-01T00:00:00Z"}
    else:
        obj["status"] = status
    assert model_node(obj) == "" and model_shared(obj) == ""
    events = [e for e, _ in Translator().model("MODIFIED", obj, NOW)]
    if isinstance(status, dict):
        assert [type(e) for e in events] == [ev.ModelReady, ev.ForegroundRequest]
