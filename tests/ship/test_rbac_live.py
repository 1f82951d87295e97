"""The base's RBAC is enough in practice, not only on paper: the README's controller command runs
as the Deployment's ServiceAccount (a bearer token from the TokenRequest API, so the apiserver
authorizes it exactly as in the cluster, under the ClusterRole and Role of ``kustomize build
deploy/base``), with leader election on, through a whole lifecycle: the Lease taken, a Job
admitted (with its Event and status), cancelled by foreground demand (the Job deleted), the
declaration deleted (the finalizer released), the Lease released on SIGTERM. Not one call is
refused (the controller logs every refused call; a refused Event or status write would not stop
the lifecycle, so the log is read for it).

test_rbac.py shows the RBAC is no more than the code calls; this shows it is not less.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from datetime import datetime, timezone

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.controller.conftest import Kube, wait_for

from .test_controller_command import BACKFILL, _env, _stop
from .test_rbac import DEPLOY, apply_rbac, delete_cluster_scoped

pytestmark = [pytest.mark.kube, pytest.mark.db]

SA = "modelbackfill-controller"


@pytest.fixture
def schema(pg_url):
    from backfill.store.migrate import drop_schema

    name = f"t_{secrets.token_hex(6)}"
    yield name
    drop_schema(pg_url, name)


@pytest.fixture
def controller_namespace(kube_api):
    core = client.CoreV1Api(kube_api)
    name = f"t-{secrets.token_hex(5)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def _service_account_kubeconfig(kube_cluster, kube_api, ns: str, tmp_path) -> str:
    """A kubeconfig whose bearer token is the ServiceAccount's own (TokenRequest, 1 h)."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=["https://localhost"], expiration_seconds=3600)
    )
    token = client.CoreV1Api(kube_api).create_namespaced_service_account_token(SA, ns, request).status.token
    path = tmp_path / "kubeconfig-sa"
    kube_cluster._write_kubeconfig(path, user=f"sa-{ns}", token=token)
    return str(path)


def test_the_controller_runs_a_whole_lifecycle_as_the_base_service_account(
    kube_cluster, kube_api, kube_namespace, controller_namespace, pg_url, schema, tmp_path
):
    objects = apply_rbac(kube_api, DEPLOY / "base", {"flexinfer-system": controller_namespace})
    try:
        kubeconfig = _service_account_kubeconfig(kube_cluster, kube_api, controller_namespace, tmp_path)
        # The token is the ServiceAccount, not an administrator: what the base does not grant is refused.
        from kubernetes import config as kconfig

        sa_api = kconfig.new_client_from_config(config_file=kubeconfig)
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(sa_api).list_namespaced_secret(kube_namespace)
        assert refused.value.status == 403
        sa_api.close()

        kube = Kube(kube_api, kube_namespace)
        kube.model("gemma", node=f"node-{secrets.token_hex(4)}")  # a node of its own (other tests' signals)
        kube.cronjob("model-eval-gauntlet")
        kube.backfill("mbf", idleFor="1s")
        identity = f"sa-{secrets.token_hex(3)}"
        leases = client.CoordinationV1Api(kube_api)
        proc = subprocess.Popen(
            [BACKFILL, "controller", "--kubeconfig", kubeconfig, "--leader-elect"],
            env=_env(pg_url, schema, BACKFILL_LEASE_NAMESPACE=controller_namespace, BACKFILL_IDENTITY=identity),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            jobs = wait_for(lambda: proc.poll() is None and kube.jobs(), timeout=90, interval=0.2, what="a Job admitted")
            assert leases.read_namespaced_lease(SA, controller_namespace).spec.holder_identity == identity
            wait_for(lambda: kube.status("mbf").get("phase") in ("Starting", "Running"), timeout=30, interval=0.2,
                     what="the status written")
            stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            kube.set_status("models", "gemma", {"lastActiveTime": stamp})  # foreground demand
            wait_for(lambda: kube.job(jobs[0].metadata.name) is None, timeout=30, interval=0.2,
                     what="the Job deleted on foreground demand")
            reasons = wait_for(
                lambda: {"Admitted", "ForegroundDemand"} <= (r := {e.reason for e in client.CoreV1Api(kube_api).list_namespaced_event(
                    kube_namespace, field_selector="involvedObject.name=mbf").items}) and r,
                timeout=30, interval=0.2, what="the Events recorded",
            )
            assert {"Admitted", "ForegroundDemand"} <= reasons
            assert "modelbackfill.ai.flexinfer/finalizer" in (kube.get("modelbackfills", "mbf")["metadata"].get("finalizers") or [])
            client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(
                "ai.flexinfer", "v1alpha2", kube_namespace, "modelbackfills", "mbf")
            wait_for(lambda: kube.get("modelbackfills", "mbf") is None, timeout=30, interval=0.2,
                     what="the finalizer released")
        finally:
            rc, err = _stop(proc)
        assert rc == 0, err[-3000:]
        assert not leases.read_namespaced_lease(SA, controller_namespace).spec.holder_identity, "released on SIGTERM"
        records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        refused_lines = [r["msg"] for r in records if "403" in r["msg"] or "forbidden" in r["msg"].lower()]
        assert not refused_lines, refused_lines
    finally:
        delete_cluster_scoped(kube_api, objects)
