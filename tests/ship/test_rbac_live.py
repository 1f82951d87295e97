"""The base's RBAC is enough in practice, not only on paper: the README's controller command runs
as the Deployment's ServiceAccount (a bearer token from the TokenRequest API, so the apiserver
authorizes it exactly as in the cluster, under the ClusterRole and Role of ``kustomize build
deploy/base``), with leader election on, through a whole lifecycle: the Lease taken, a Job
admitted (with its Event and status), cancelled by foreground demand (the Job deleted), the
declaration deleted (the finalizer released), the Lease released on SIGTERM. Not one call is
refused (the controller logs every refused call; a refused Event or status write would not stop
the lifecycle, so the log is read for it), except in namespaces being deleted.

test_rbac.py shows the RBAC is no more than the code calls; this shows it is not less.
"""

from __future__ import annotations

import json
import re
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
        refused_lines = [r["msg"] for r in records if re.search(r"(?<!\d)403(?!\d)|\bforbidden\b", r["msg"], flags=re.I)]
        # It watches every namespace, so it also acts on what earlier tests left in namespaces
        # that stay Terminating here (no controller-manager): the API server refuses new content
        # there with a 403 whatever the RBAC. Those are not refusals of the base's RBAC.
        terminating = {n.metadata.name for n in client.CoreV1Api(kube_api).list_namespace().items
                       if n.status.phase == "Terminating"} - {kube_namespace, controller_namespace}
        # The API server says so itself ("unable to create new content in namespace N because it
        # is being terminated"); other lines name the object as N/name.
        refused_lines = [
            m for m in refused_lines
            if "because it is being terminated" not in m and not any(f" {ns}/" in m for ns in terminating)
        ]
        assert not refused_lines, refused_lines
    finally:
        delete_cluster_scoped(kube_api, objects)


def test_a_refused_lease_is_one_warning_with_the_fix_until_it_is_granted(
    kube_cluster, kube_api, kube_namespace, controller_namespace, pg_url, schema, tmp_path
):
    """--leader-elect with a Lease namespace the ServiceAccount has no Role in: the controller
    logged "leader election: ForbiddenException: (403)" every second, naming neither the verb nor
    the namespace nor the fix (the same silent loop as the missing namespace had). Now: one
    warning with the API server's message and the fix, /readyz says so, and once the Role is
    applied there the Lease is taken and that is logged."""
    import urllib.error
    import urllib.request

    objects = apply_rbac(kube_api, DEPLOY / "base", {"flexinfer-system": controller_namespace})
    try:
        kubeconfig = _service_account_kubeconfig(kube_cluster, kube_api, controller_namespace, tmp_path)
        env = _env(pg_url, schema, BACKFILL_LEASE_NAMESPACE=kube_namespace, BACKFILL_IDENTITY="refused")
        readyz = f"http://{env['BACKFILL_METRICS_ADDRESS']}/readyz"

        def ready_body() -> str:
            try:
                with urllib.request.urlopen(readyz, timeout=5) as resp:
                    return resp.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.read().decode()
            except OSError:
                return ""

        proc = subprocess.Popen([BACKFILL, "controller", "--kubeconfig", kubeconfig, "--leader-elect"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        leases = client.CoordinationV1Api(kube_api)
        try:
            wait_for(lambda: proc.poll() is None and "leader election: the Lease cannot be read" in ready_body(),
                     timeout=90, interval=0.2, what="/readyz names leader election")
            import time

            time.sleep(4)  # four more rounds (a standby retries every second)
            # the Role of the base, in the Lease's namespace: the next round takes the Lease
            (role,) = [o for o in objects if o["kind"] == "Role"]
            rbac = client.RbacAuthorizationV1Api(kube_api)
            rbac.create_namespaced_role(kube_namespace, {**role, "metadata": {"name": SA, "namespace": kube_namespace}})
            rbac.create_namespaced_role_binding(kube_namespace, {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": SA, "namespace": kube_namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SA},
                "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": controller_namespace}],
            })

            def holder() -> str | None:
                try:
                    return leases.read_namespaced_lease(SA, kube_namespace).spec.holder_identity
                except ApiException:
                    return None

            wait_for(lambda: holder() == "refused", timeout=30, interval=0.2, what="the Lease taken once granted")
        finally:
            rc, err = _stop(proc)
        assert rc == 0, err[-3000:]
        msgs = [json.loads(line)["msg"] for line in err.splitlines() if line.startswith("{")]
        refused = [m for m in msgs if m.startswith("leader election: 403")]
        assert len(refused) == 1, refused  # once, not once a round
        (line,) = refused
        assert 'cannot get resource "leases"' in line and f'in the namespace "{kube_namespace}"' in line, line
        assert f"leases in the namespace {kube_namespace}" in line and "--lease-namespace" in line, line
        assert any(m.startswith(f"leader election: the Lease {kube_namespace}/{SA} answers again") for m in msgs), msgs
    finally:
        delete_cluster_scoped(kube_api, objects)
