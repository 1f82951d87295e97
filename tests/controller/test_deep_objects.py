"""Objects nested as deep as the API server takes never stop a watcher (an adversarial trial:
a Model whose free-form status held a value 1,000 levels deep, a GamingSession in another
namespace, or any object's ``metadata.managedFields`` made Python's JSON decoder raise
``RecursionError`` on every list and watch of that kind, for ever: nothing on another Model was
admitted, and a running Job was cancelled neither on its Model's ``lastActiveTime`` nor on
gaming intent).

On the real apiserver and PostgreSQL; the bodies go over raw HTTP (the Python client would
serialize them with the same decoder limits)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import pytest

from backfill.core import events as ev
from tests.conftest import temporary_namespace

from .conftest import GROUP, VERSION, log_of, now_s, ts, wait_for

pytestmark = pytest.mark.kube

#: Levels of the nested value: 9,000, close to the API server's 10,000 (``API_MAX_NESTING``) with
#: room for the object around it; nine times what stopped the watchers.
DEPTH = 9_000


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _raw(cluster, method: str, path: str, body: str, content_type: str = "application/json") -> tuple[int, str]:
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    req = urllib.request.Request(
        cluster.host + path, data=body.encode() if body else None, method=method,
        headers={"Authorization": f"Bearer {cluster.token}", "Content-Type": content_type},
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _deep_managed_fields(api_version: str) -> str:
    fields = '{"f:metadata":{"f:labels":' + '{"f:a":' * DEPTH + "{}" + "}" * DEPTH + "}}"
    return f'[{{"manager":"x","operation":"Update","apiVersion":"{api_version}","time":"2026-01-01T00:00:00Z","fieldsType":"FieldsV1","fieldsV1":{fields}}}]'


def test_deeply_nested_objects_of_every_kind_are_read_and_cancels_still_work(kube, kube_api, kube_cluster, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    kube.model("deep", node="node-b")
    controller = start_controller()
    ns = kube.ns
    # A Model's free-form status, a CronJob's and a ModelBackfill's managedFields, a
    # GamingSession (not gaming) in another namespace: each DEPTH levels deep.
    code, out = _raw(kube_cluster, "PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/models/deep/status",
                     '{"status":{"phase":"Ready","x":' + _nested(DEPTH) + "}}", "application/merge-patch+json")
    assert code == 200, out[:300]
    cronjob = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "deep-mf", "managedFields": []},
               "spec": {"schedule": "0 0 1 1 *", "suspend": True, "jobTemplate": {"spec": {"template": {"spec": {
                   "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}}
    body = json.dumps(cronjob).replace('"managedFields": []', '"managedFields": ' + _deep_managed_fields("batch/v1"))
    code, out = _raw(kube_cluster, "POST", f"/apis/batch/v1/namespaces/{ns}/cronjobs", body)
    assert code == 201, out[:300]
    mbf = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelBackfill", "metadata": {"name": "deep-mf", "managedFields": []},
           "spec": {"modelRef": "deep", "templateRef": "no-such-cronjob", "idleFor": "2s", "maxRunDuration": "15m"}}
    body = json.dumps(mbf).replace('"managedFields": []', '"managedFields": ' + _deep_managed_fields(f"{GROUP}/{VERSION}"))
    code, out = _raw(kube_cluster, "POST", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/modelbackfills", body)
    assert code == 201, out[:300]
    with temporary_namespace(kube_api, "deep") as other:
        session = ('{"apiVersion":"ai.flexinfer/v1alpha2","kind":"GamingSession","metadata":{"name":"deep"},'
                   '"spec":{"mode":"inference","nodeName":"node-zz","extra":' + _nested(DEPTH) + "}}")
        code, out = _raw(kube_cluster, "POST", f"/apis/{GROUP}/{VERSION}/namespaces/{other}/gamingsessions", session)
        assert code == 201, out[:300]

        # Every kind is still read: the declaration on the deep Model's neighbour is admitted...
        kube.backfill("good", model="gemma")
        (job,) = wait_for(lambda: [j.metadata.name for j in kube.jobs() if j.metadata.name.startswith("good-")], timeout=20, what="good's Job")
        assert [(w.kind.name, w.failing) for w in controller.watchers if w.failing] == []
        # ... the deep-managedFields declaration is judged (its template is missing) ...
        wait_for(lambda: kube.status("deep-mf").get("reason") == "TemplateNotFound", timeout=10, what="deep-mf Blocked TemplateNotFound")
        code, out = _raw(kube_cluster, "GET", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/modelbackfills/deep-mf", "")
        meta = json.loads(out)["metadata"]  # its updates left out managedFields: the API server kept them
        assert code == 200 and "x" in [m["manager"] for m in meta["managedFields"]] and meta["finalizers"]
        # ... and a demand on the running Job's Model cancels it (the Model watcher reads on).
        kube.run_job(job)
        wait_for(lambda: kube.status("good").get("phase") == "Running", timeout=10, what="good Running")
        kube.set_status("models", "gemma", {"lastActiveTime": ts(now_s())})
        wait_for(lambda: kube.job_going(job), timeout=5, what="the Job cancelled on lastActiveTime")
        # The GamingSession watcher, which read the deep one, sees gaming intent after it.
        kube.create("gamingsessions", "GamingSession", "play", {"nodeName": "node-zz", "mode": "gaming"})
        wait_for(
            lambda: [e.session for _, e in log_of(controller) if isinstance(e, ev.GamingIntentStarted)] == ["play"],
            timeout=10, what="GamingIntentStarted of play in the log",
        )
        assert [(w.kind.name, w.failing) for w in controller.watchers if w.failing] == []
        _raw(kube_cluster, "DELETE", f"/apis/{GROUP}/{VERSION}/namespaces/{other}/gamingsessions/deep", "{}")
