"""Smoke tests of the envtest cluster (tests/envtest) and of the CRDs in deploy/crds.

They also document what other tests rely on: the apiserver has no controller-manager, so a Job
deleted without a propagation policy is never removed (batch/v1 Jobs default to orphaning).
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.kube

GROUP, VERSION, PLURAL = "ai.flexinfer", "v1alpha2", "modelbackfills"


def _mbf(name: str, **spec_overrides: object) -> dict:
    spec: dict = {"modelRef": "gemma", "templateRef": "model-eval-gauntlet", "idleFor": "30m"}
    spec.update(spec_overrides)
    spec = {k: v for k, v in spec.items() if v is not None}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelBackfill", "metadata": {"name": name}, "spec": spec}


def _create_mbf(api: client.ApiClient, ns: str, body: dict) -> dict:
    return client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def _rejection(exc: ApiException) -> dict:
    """The Status of a rejection, without the field-less cause the server adds when the CRD's CEL
    rules were skipped because the plain schema already failed ("some validation rules were not
    checked")."""
    status = json.loads(exc.body)
    causes = (status.get("details") or {}).get("causes")
    if causes:
        status["details"]["causes"] = [c for c in causes if "rules were not checked" not in c.get("message", "")]
    return status


def test_apiserver_reports_stamped_version(kube_api, kube_cluster):
    info = client.VersionApi(kube_api).get_code()
    assert info.git_version == "v1.36.3"
    assert (info.major, info.minor) == ("1", "36")
    assert info.git_tree_state == "clean"
    assert kube_cluster.startup_seconds is not None and kube_cluster.startup_seconds < 60
    with open(kube_cluster.kubeconfig_path) as fh:
        kubeconfig = fh.read()
    assert kube_cluster.host in kubeconfig and kube_cluster.token in kubeconfig


def test_modelbackfill_discovery_short_names_and_columns(kube_cluster, kube_namespace):
    resources = kube_cluster.get_json(f"/apis/{GROUP}/{VERSION}")["resources"]
    mbf = next(r for r in resources if r["name"] == PLURAL)
    assert mbf["kind"] == "ModelBackfill"
    assert mbf["namespaced"] is True
    assert mbf["singularName"] == "modelbackfill"
    assert sorted(mbf["shortNames"]) == ["mbf", "modelbackfill"]
    assert f"{PLURAL}/status" in {r["name"] for r in resources}
    assert {"models", "gamingsessions", "gpuleases"} <= {r["name"] for r in resources}

    table = kube_cluster.get_json(
        f"/apis/{GROUP}/{VERSION}/namespaces/{kube_namespace}/{PLURAL}",
        accept="application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    columns = [(c["name"], c["priority"]) for c in table["columnDefinitions"]]
    assert columns == [
        ("Name", 0),
        ("Model", 0),
        ("Phase", 0),
        ("Reason", 0),
        ("Node", 0),
        ("Job", 0),
        ("Attempts", 0),
        ("Next Run", 1),
        ("Age", 0),
    ]


def test_env_limit_is_32_entries(kube_api, kube_namespace):
    ok = _create_mbf(kube_api, kube_namespace, _mbf("env-32", env={f"VAR_{i}": str(i) for i in range(32)}))
    assert len(ok["spec"]["env"]) == 32
    assert ok["spec"]["env"]["VAR_31"] == "31"

    with pytest.raises(ApiException) as exc_info:
        _create_mbf(kube_api, kube_namespace, _mbf("env-33", env={f"VAR_{i}": str(i) for i in range(33)}))
    assert exc_info.value.status == 422
    status = _rejection(exc_info.value)
    assert status["reason"] == "Invalid"
    causes = status["details"]["causes"]
    assert [c["field"] for c in causes] == ["spec.env"]
    assert "must have at most 32 items" in causes[0]["message"]

    names = [
        o["metadata"]["name"]
        for o in client.CustomObjectsApi(kube_api).list_namespaced_custom_object(
            GROUP, VERSION, kube_namespace, PLURAL
        )["items"]
    ]
    assert names == ["env-32"]


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"modelRef": None}, "spec.modelRef", "Required value"),
        ({"templateRef": None}, "spec.templateRef", "Required value"),
        ({"modelRef": ""}, "spec.modelRef", "should be at least 1 chars long"),
        ({"idleFor": "30 minutes"}, "spec.idleFor", "should match"),
        ({"env": {"A": 1}}, "spec.env.A", "must be of type string"),
    ],
)
def test_invalid_spec_is_rejected(kube_api, kube_namespace, overrides, field, fragment):
    with pytest.raises(ApiException) as exc_info:
        _create_mbf(kube_api, kube_namespace, _mbf("bad", **overrides))
    assert exc_info.value.status == 422
    causes = _rejection(exc_info.value)["details"]["causes"]
    assert [c["field"] for c in causes] == [field]
    assert fragment in causes[0]["message"]


def test_durations_in_go_syntax_are_accepted(kube_api, kube_namespace):
    obj = _create_mbf(
        kube_api, kube_namespace, _mbf("durations", idleFor="1h30m", maxRunDuration="0", repeatAfter="90s")
    )
    assert (obj["spec"]["idleFor"], obj["spec"]["maxRunDuration"], obj["spec"]["repeatAfter"]) == (
        "1h30m",
        "0",
        "90s",
    )


def test_status_subresource(kube_api, kube_namespace):
    api = client.CustomObjectsApi(kube_api)
    created = _create_mbf(kube_api, kube_namespace, {**_mbf("st"), "status": {"phase": "Running"}})
    assert "status" not in created  # status is ignored on create with a status subresource
    assert created["metadata"]["generation"] == 1

    patched = api.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        kube_namespace,
        PLURAL,
        "st",
        {
            "status": {
                "phase": "Running",
                "observedGeneration": 1,
                "nodeName": "node-a",
                "jobName": "st-1",
                "attempts": 1,
                "startedAt": "2026-01-02T03:04:05Z",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Running",
                        "message": "job st-1 is running",
                        "lastTransitionTime": "2026-01-02T03:04:05Z",
                        "observedGeneration": 1,
                    }
                ],
            }
        },
    )
    assert patched["metadata"]["generation"] == 1  # status writes do not bump generation

    got = api.get_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, "st")
    assert got["status"]["phase"] == "Running"
    assert got["status"]["nodeName"] == "node-a"
    assert got["status"]["attempts"] == 1
    assert got["status"]["conditions"][0]["type"] == "Ready"

    # A status change through the main resource is ignored; a spec change bumps generation.
    after = api.patch_namespaced_custom_object(
        GROUP, VERSION, kube_namespace, PLURAL, "st", {"spec": {"suspend": True}, "status": {"phase": "Failed"}}
    )
    assert after["status"]["phase"] == "Running"
    assert after["spec"]["suspend"] is True
    assert after["metadata"]["generation"] == 2

    with pytest.raises(ApiException) as exc_info:
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, kube_namespace, PLURAL, "st", {"status": {"phase": "Sleeping"}}
        )
    assert exc_info.value.status == 422
    causes = _rejection(exc_info.value)["details"]["causes"]
    assert [c["field"] for c in causes] == ["status.phase"]
    assert "Unsupported value" in causes[0]["message"]


def _job(name: str) -> client.V1Job:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    containers=[client.V1Container(name="main", image="busybox", command=["true"])],
                )
            )
        ),
    )


def test_job_deletion_without_controller_manager(kube_api, kube_namespace):
    """Background: gone at once. Foreground / no policy: stays with a finalizer nothing removes."""
    batch = client.BatchV1Api(kube_api)
    for name in ("bg", "fg", "nopolicy"):
        batch.create_namespaced_job(kube_namespace, _job(name))

    batch.delete_namespaced_job("bg", kube_namespace, propagation_policy="Background")
    with pytest.raises(ApiException) as exc_info:
        batch.read_namespaced_job("bg", kube_namespace)
    assert exc_info.value.status == 404

    batch.delete_namespaced_job("fg", kube_namespace, propagation_policy="Foreground")
    fg = batch.read_namespaced_job("fg", kube_namespace)
    assert fg.metadata.deletion_timestamp is not None
    assert fg.metadata.finalizers == ["foregroundDeletion"]

    batch.delete_namespaced_job("nopolicy", kube_namespace)
    orphaned = batch.read_namespaced_job("nopolicy", kube_namespace)
    assert orphaned.metadata.deletion_timestamp is not None
    assert orphaned.metadata.finalizers == ["orphan"]

    remaining = sorted(j.metadata.name for j in batch.list_namespaced_job(kube_namespace).items)
    assert remaining == ["fg", "nopolicy"]


def test_the_envtest_command_serves_a_cluster_until_sigterm(tmp_path):
    """``python -m tests.envtest.cluster --kubeconfig F`` (README, a try-out without kind): the
    kubeconfig it writes answers, and SIGTERM stops kube-apiserver and etcd."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from kubernetes import config

    root = Path(__file__).resolve().parents[1]
    kubeconfig = tmp_path / "kc"
    proc = subprocess.Popen([sys.executable, "-m", "tests.envtest.cluster", "--kubeconfig", str(kubeconfig)], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the apiserver is ready
        assert line.startswith("envtest: kube-apiserver at https://127.0.0.1:") and str(kubeconfig) in line, (line, proc.stderr)
        api = config.new_client_from_config(config_file=str(kubeconfig))
        names = {n.metadata.name for n in client.CoreV1Api(api).list_namespace(_request_timeout=10).items}
        assert {"default", "kube-system"} <= names
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        server = line.split(" at ", 1)[1].split(";", 1)[0]
        while time.monotonic() < deadline:
            try:
                client.CoreV1Api(api).list_namespace(_request_timeout=1)
            except Exception:  # noqa: BLE001 - refused: the apiserver is gone
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"{server} still answers after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
