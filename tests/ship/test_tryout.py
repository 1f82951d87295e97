"""The README's local try-out block (after ``<!-- try-out -->``) works as written with kubectl
against the real API server: the platform CRD stand-ins, the ModelBackfill CRD, the seed's
example declaration with its CronJob, and a Model made Ready by hand; then the block after
``<!-- try-out-job -->`` (a shorter ``idleFor``, and a backfill Job marked succeeded by hand).

The session's API server already has every CRD (tests/conftest.py): applying them again must
succeed as on a fresh cluster. The block runs as written in a scratch copy of the checkout's
files with one change: the namespace ``flexinfer-system`` is a fresh one, in the commands and in
the example's manifests (tests/ship/test_install.py creates ``flexinfer-system`` itself, and
namespaces never finish terminating here).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest
from kubernetes import client

from .seed_example import SEED_SPEC

ROOT = Path(__file__).resolve().parents[2]
NS = "flexinfer-system"
MODEL = "gemma4-26b-a4b-gptq-5930k"

pytestmark = [pytest.mark.kube, pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")]


def readme_tryout_commands(marker: str = "try-out") -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(rf"<!-- {marker} -->\n```\n(.*?)```", text, flags=re.S)
    assert block, f"README.md: no ``` block after <!-- {marker} -->"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def _scratch(tmp_path: Path, ns: str) -> Path:
    """A directory with the files the block names: the CRDs linked, the example's manifests
    copied with the namespace replaced."""
    (tmp_path / "tests" / "envtest").mkdir(parents=True)
    (tmp_path / "tests" / "envtest" / "crds").symlink_to(ROOT / "tests" / "envtest" / "crds")
    (tmp_path / "deploy" / "overlays" / "example").mkdir(parents=True)
    (tmp_path / "deploy" / "crds").symlink_to(ROOT / "deploy" / "crds")
    for f in (ROOT / "deploy" / "overlays" / "example").glob("*.yaml"):
        (tmp_path / "deploy" / "overlays" / "example" / f.name).write_text(f.read_text().replace(NS, ns))
    return tmp_path


def test_readme_tryout_block_applies_the_crds_and_makes_the_example_model_ready(kube_cluster, kube_api, tmp_path):
    env = dict(os.environ, KUBECONFIG=str(kube_cluster.kubeconfig_path))
    ns = f"t-tryout-{secrets.token_hex(4)}"
    cwd = _scratch(tmp_path, ns)
    commands = readme_tryout_commands()
    assert any("tests/envtest/crds" in c for c in commands) and any("--subresource=status" in c for c in commands)
    assert sum(NS in c for c in commands) >= 3
    co = client.CustomObjectsApi(kube_api)
    try:
        for command in commands:
            command = command.replace(NS, ns)
            proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, f"{command}: {proc.stderr}"
        names = {c.metadata.name for c in client.ApiextensionsV1Api(kube_api).list_custom_resource_definition().items}
        assert {"models.ai.flexinfer", "gamingsessions.ai.flexinfer", "gpuleases.ai.flexinfer", "modelbackfills.ai.flexinfer"} <= names
        model = co.get_namespaced_custom_object("ai.flexinfer", "v1alpha2", ns, "models", MODEL)
        assert model["status"]["phase"] == "Ready"
        mbf = co.get_namespaced_custom_object("ai.flexinfer", "v1alpha2", ns, "modelbackfills", "model-eval-gemma4-5930k")
        assert mbf["spec"] == SEED_SPEC and mbf["spec"]["modelRef"] == MODEL
        assert client.BatchV1Api(kube_api).read_namespaced_cron_job("model-eval-gauntlet", ns).spec.suspend is True
        # the second block (a new user's trial asked how to mark a Job succeeded by hand): a
        # shorter window, and the backfill Job (made here, as the controller would) succeeded
        batch = client.BatchV1Api(kube_api)
        job = {
            "metadata": {"name": "model-eval-gemma4-5930k-1"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}},
        }
        batch.create_namespaced_job(ns, job)
        # ... and named in the ModelBackfill's status, as the controller does (the block reads
        # status.jobName: a trial's `get jobs | head -n 1` picked an older, completed Job)
        co.patch_namespaced_custom_object_status(
            "ai.flexinfer", "v1alpha2", ns, "modelbackfills", "model-eval-gemma4-5930k", {"status": {"jobName": "model-eval-gemma4-5930k-1"}}
        )
        batch.create_namespaced_job(ns, {**job, "metadata": {"name": "an-older-job"}})  # not the one the block marks
        for command in readme_tryout_commands("try-out-job"):
            command = command.replace(NS, ns)
            proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, f"{command}: {proc.stderr}"
        mbf = co.get_namespaced_custom_object("ai.flexinfer", "v1alpha2", ns, "modelbackfills", "model-eval-gemma4-5930k")
        assert mbf["spec"]["idleFor"] == "1m"
        status = batch.read_namespaced_job_status("model-eval-gemma4-5930k-1", ns).status
        assert status.succeeded == 1 and status.completion_time is not None
        assert {(c.type, c.status) for c in status.conditions} == {("SuccessCriteriaMet", "True"), ("Complete", "True")}
        assert batch.read_namespaced_job_status("an-older-job", ns).status.succeeded is None
    finally:  # a Ready Model would let another test's controller (all namespaces) act on the example
        for kind in ("modelbackfill", "model", "job"):
            subprocess.run(["kubectl", "-n", ns, "delete", kind, "--all", "--wait=false"], env=env, capture_output=True, timeout=60)
