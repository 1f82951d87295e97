"""Robustness against a real kube-apiserver: a Model whose ``status.lastActiveTime`` is a valid
``date-time`` (the API server accepts it) at the edge of the calendar must not make the Model
translator raise: a raising translator keeps the Model watcher relisting forever, so no Model
event (readiness, foreground demand) of ANY model is recorded again.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from kubernetes import client

from backfill.controller.translate import Translator

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("when", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"])
def test_extreme_last_active_time_is_translated(kube_api, kube_namespace, when):
    co = client.CustomObjectsApi(kube_api)
    body = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": "m"}, "spec": {}}
    co.create_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube_namespace, "models", body)
    co.patch_namespaced_custom_object_status(
        "ai.flexinfer", "v1alpha2", kube_namespace, "models", "m",
        {"status": {"phase": "Ready", "lastActiveTime": when}},
    )
    obj = co.get_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube_namespace, "models", "m")
    assert obj["status"]["lastActiveTime"] == when  # the API server stored it
    pairs = Translator().model("MODIFIED", obj, NOW)  # must not raise
    assert pairs
