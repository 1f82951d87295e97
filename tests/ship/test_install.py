"""The README's install block works as written against the real API server (kubectl), and
`kubectl delete -k deploy/base` then removes the controller but neither the namespace (with its
Secrets) nor the CRD (with every ModelBackfill).

The block is read from README.md (after the marker ``<!-- install -->``) and run line by line
in a scratch directory (``deploy`` linked in, so openssl's files stay out of the checkout), except
the two steps this cluster cannot do: waiting for the migration Job to complete (no Job
controller runs here) and the Prometheus Operator objects (no such CRDs).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .seed_example import SEED_SPEC

ROOT = Path(__file__).resolve().parents[2]
NS = "flexinfer-system"

pytestmark = [
    pytest.mark.kube,
    pytest.mark.skipif(shutil.which("kubectl") is None or shutil.which("openssl") is None,
                       reason="kubectl or openssl is not installed on this machine"),
]


def readme_install_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- install -->\n```\n(.*?)```", text, flags=re.S)
    assert block, "README.md: no ``` block after <!-- install -->"
    joined = block.group(1).replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def _run(cluster, cwd: Path, command: str) -> str:
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig_path))
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    return proc.stdout


def test_readme_install_then_delete_base_keeps_namespace_secrets_and_crd(kube_cluster, kube_api, tmp_path):
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    commands = readme_install_commands()
    skipped = [c for c in commands if "condition=complete" in c or "deploy/monitoring" in c]
    assert len(skipped) == 2, skipped
    for command in commands:
        if command not in skipped:
            _run(kube_cluster, tmp_path, command)
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    dep = apps.read_namespaced_deployment("modelbackfill-controller", NS)
    assert dep.spec.replicas == 2
    assert {s.metadata.name for s in core.list_namespaced_secret(NS).items} >= {"modelbackfill", "modelbackfill-tls"}
    # The seed's example on top (its own kustomization includes the base), then prune the base.
    _run(kube_cluster, tmp_path, "kubectl apply --server-side -k deploy/overlays/example")
    co = client.CustomObjectsApi(kube_api)
    mbf = co.get_namespaced_custom_object("ai.flexinfer", "v1alpha2", NS, "modelbackfills", "model-eval-gemma4-5930k")
    assert mbf["spec"] == SEED_SPEC
    _run(kube_cluster, tmp_path, "kubectl delete -k deploy/base --wait=false")
    with pytest.raises(ApiException) as gone:
        apps.read_namespaced_deployment("modelbackfill-controller", NS)
    assert gone.value.status == 404
    assert core.read_namespace(NS).status.phase == "Active"
    assert {s.metadata.name for s in core.list_namespaced_secret(NS).items} >= {"modelbackfill", "modelbackfill-tls"}
    client.ApiextensionsV1Api(kube_api).read_custom_resource_definition("modelbackfills.ai.flexinfer")
    assert co.get_namespaced_custom_object("ai.flexinfer", "v1alpha2", NS, "modelbackfills", "model-eval-gemma4-5930k")
    # The objects stay: no controller in this session watches flexinfer-system, and deleting the
    # namespace would leave it Terminating for good (no controller-manager runs here).
