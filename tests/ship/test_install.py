"""The documented install sequence works as written against the real API server (kubectl)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from kubernetes import client

from .seed_example import SEED_SPEC

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed on this machine")


def kubectl(cluster, *args: str) -> str:
    proc = subprocess.run(
        ["kubectl", "--kubeconfig", str(cluster.kubeconfig_path), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def test_readme_install_sequence_applies(kube_cluster, kube_api):
    kubectl(kube_cluster, "apply", "--server-side", "-k", "deploy/crds")
    kubectl(kube_cluster, "wait", "--for", "condition=established", "crd/modelbackfills.ai.flexinfer", "--timeout=60s")
    kubectl(kube_cluster, "apply", "--server-side", "-k", "deploy/overlays/example")
    ns = "flexinfer-system"
    apps = client.AppsV1Api(kube_api)
    dep = apps.read_namespaced_deployment("modelbackfill-controller", ns)
    assert dep.spec.replicas == 2
    mbf = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        "ai.flexinfer", "v1alpha2", ns, "modelbackfills", "model-eval-gemma4-5930k"
    )
    assert mbf["spec"] == SEED_SPEC
    cron = client.BatchV1Api(kube_api).read_namespaced_cron_job("model-eval-gauntlet", ns)
    assert cron.spec.suspend is True
    # The objects stay: no controller in this session watches flexinfer-system, and deleting the
    # namespace would leave it Terminating for good (no controller-manager runs here).
