"""Every manifest in deploy/ is valid: rendered, then applied to the real API server (envtest)
with server-side dry run.

Test helper: :func:`render` is a tiny Kustomize renderer (``resources`` recursively, files or
directories, plus ``namespace`` and ``labels``) so the test needs no ``kustomize`` binary. It refuses
any other kustomization field so it cannot silently diverge from Kustomize; when ``kubectl`` is on
PATH its output is also compared with ``kubectl kustomize``.

Namespaced objects are dry-run applied into the test's fresh namespace (the ``flexinfer-system``
references are rewritten) so nothing leaks into the shared cluster. Kinds the test cluster does
not serve (ServiceMonitor, PrometheusRule, the CloudNativePG Cluster in production.md) are skipped
by kind, and asserted to be exactly those, after checking they are YAML with
apiVersion/kind/metadata.name.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from .seed_example import SEED_SPEC

pytestmark = pytest.mark.kube

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE = "flexinfer-system"
KUSTOMIZATIONS = ["base", "base/migration", "monitoring", "overlays/example"]
CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "StorageClass",
}
NOT_INSTALLED = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("postgresql.cnpg.io/v1", "Cluster"),
}
_SUPPORTED_FIELDS = {"apiVersion", "kind", "namespace", "resources", "labels"}


# ----------------------------------------------------------------------------- test helper: renderer


def render(directory: Path) -> list[dict]:
    """Render the kustomization in ``directory`` (a small subset of Kustomize; see module doc)."""
    kfile = directory / "kustomization.yaml"
    spec = yaml.safe_load(kfile.read_text()) or {}
    unsupported = set(spec) - _SUPPORTED_FIELDS
    assert not unsupported, f"{kfile}: the test renderer does not support {sorted(unsupported)}"
    objects: list[dict] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects.extend(render(path))
        else:
            objects.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    for label_set in spec.get("labels", []):
        assert not label_set.get("includeSelectors"), "renderer: includeSelectors not supported"
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(label_set["pairs"])
    ns = spec.get("namespace")
    if ns:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = ns
            if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
                for subject in obj.get("subjects", []):
                    if subject.get("kind") == "ServiceAccount":
                        subject["namespace"] = ns
    return objects


def _key(obj: dict) -> tuple[str, str, str, str]:
    md = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], md.get("namespace", ""), md["name"])


def _doc_yaml_blocks(path: Path) -> list[dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", path.read_text(), flags=re.S)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]


def _all_manifests() -> dict[str, list[dict]]:
    sets = {name: render(DEPLOY / name) for name in KUSTOMIZATIONS}
    sets["base/secret.example.yaml"] = list(yaml.safe_load_all((DEPLOY / "base/secret.example.yaml").read_text()))
    sets["production.md"] = _doc_yaml_blocks(DEPLOY / "production.md")
    return sets


# ----------------------------------------------------------------------------- static checks


def test_every_manifest_has_identity_and_no_duplicates():
    sets = _all_manifests()
    for name, objects in sets.items():
        assert objects, name
        for obj in objects:
            assert obj.get("apiVersion") and obj.get("kind") and obj.get("metadata", {}).get("name"), (name, obj)
        keys = [_key(o) for o in objects]
        assert len(keys) == len(set(keys)), f"{name}: duplicate objects"
    kinds = {o["kind"] for o in sets["base"]}
    assert {"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
            "RoleBinding", "Deployment", "Service", "PodDisruptionBudget"} <= kinds
    assert "ServiceMonitor" not in kinds, "the base must apply where the Prometheus Operator is absent"
    assert sorted(o["kind"] for o in sets["monitoring"]) == ["PrometheusRule", "ServiceMonitor"]
    assert "Secret" not in kinds, "the Secret template must not be in the kustomization"
    assert [o["kind"] for o in sets["production.md"]] == ["Cluster"]
    assert [o["kind"] for o in sets["base/migration"]] == ["Job"]


def test_the_crd_is_the_one_in_deploy_crds():
    (crd,) = [o for o in render(DEPLOY / "base") if o["kind"] == "CustomResourceDefinition"]
    assert crd["metadata"].pop("labels") == {"app.kubernetes.io/part-of": "modelbackfill"}  # the base's `labels`
    assert crd == yaml.safe_load((DEPLOY / "crds/modelbackfills.ai.flexinfer.yaml").read_text())


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl: the renderer is the only check")
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_renderer_matches_kubectl_kustomize(name):
    out = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / name)],  # plain: what `kubectl apply -k` renders
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    theirs = {_key(o): o for o in yaml.safe_load_all(out) if o}
    ours = {_key(o): o for o in render(DEPLOY / name)}
    assert theirs == ours


def test_rbac_has_no_wildcards_and_only_the_needed_rules():
    objects = render(DEPLOY / "base")
    rbac = [o for o in objects if o["apiVersion"].startswith("rbac.authorization.k8s.io")]
    assert "*" not in json.dumps(rbac)
    for role in (o for o in rbac if o["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
    (cluster_role,) = [o for o in rbac if o["kind"] == "ClusterRole"]
    (role,) = [o for o in rbac if o["kind"] == "Role"]
    granted = {
        (g, r, v)
        for rule in cluster_role["rules"]
        for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert ("", "secrets", "get") not in granted and not any(r == "secrets" for _, r, _ in granted)
    assert not any(r == "leases" for _, r, _ in granted), "the Lease is namespaced only"
    writes = {(g, r) for g, r, v in granted if v in ("create", "update", "patch", "delete")}
    assert writes == {
        ("ai.flexinfer", "modelbackfills"),  # the finalizer
        ("ai.flexinfer", "modelbackfills/status"),
        ("ai.flexinfer", "modelbackfills/finalizers"),
        ("batch", "jobs"),
        ("", "events"),
        ("events.k8s.io", "events"),
    }
    for g, r in [("ai.flexinfer", "models"), ("ai.flexinfer", "gamingsessions"), ("ai.flexinfer", "gpuleases"),
                 ("batch", "cronjobs")]:
        assert {v for gg, rr, v in granted if (gg, rr) == (g, r)} == {"get", "list", "watch"}
    assert not [r for r in role["rules"] if "secrets" in r["resources"]], "the kubelet injects the Secret: no RBAC needed"
    lease_verbs = {v for r in role["rules"] if "leases" in r["resources"] for v in r["verbs"]}
    assert lease_verbs == {"get", "create", "update"}
    assert role["metadata"]["namespace"] == NAMESPACE


def test_deployment_is_hardened():
    (dep,) = [o for o in render(DEPLOY / "base") if o["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    assert pod["terminationGracePeriodSeconds"] == 10
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["args"] == ["controller"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e for e in c["env"]}
    assert env["BACKFILL_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "modelbackfill", "key": "database-url"}
    assert env["BACKFILL_METRICS_ADDRESS"]["value"] == "0.0.0.0:8080"
    token_file = env["BACKFILL_INGEST_TOKEN_FILE"]["value"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert token_file == f"{mounts['ingest-token']}/ingest-token"
    assert volumes["ingest-token"]["secret"]["secretName"] == "modelbackfill"
    assert mounts["tmp"] == "/tmp" and "emptyDir" in volumes["tmp"]
    # The ServiceAccount, Service and alerts line up with the Deployment.
    objects = {(_key(o)[1], _key(o)[3]): o for o in render(DEPLOY / "base") + render(DEPLOY / "monitoring")}
    assert ("ServiceAccount", pod["serviceAccountName"]) in objects
    svc = objects[("Service", "modelbackfill")]
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    rules = objects[("PrometheusRule", "modelbackfill")]["spec"]["groups"][0]["rules"]
    exprs = " ".join(r["expr"] for r in rules)
    assert 'absent(up{job="modelbackfill"}' in exprs
    assert "flexinfer_model_backfill_preemptions_total" in exprs
    assert 'result=~"failed' in exprs


def test_example_overlay_matches_the_seed():
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(DEPLOY / "overlays/example")}
    mbf = objects[("ModelBackfill", "model-eval-gemma4-5930k")]
    assert mbf["metadata"]["namespace"] == NAMESPACE
    assert mbf["spec"] == SEED_SPEC
    cron = objects[("CronJob", "model-eval-gauntlet")]
    assert cron["spec"]["suspend"] is True
    assert "gpu" not in json.dumps(cron["spec"]["jobTemplate"]).lower()


# ----------------------------------------------------------------------------- the real API server


def _into_namespace(obj: dict, namespace: str) -> dict:
    """A copy with every flexinfer-system reference of a namespaced object moved to ``namespace``."""
    obj = copy.deepcopy(obj)
    text = json.dumps(obj).replace(f'"{NAMESPACE}"', f'"{namespace}"')
    return json.loads(text)


def test_every_manifest_passes_server_side_dry_run(kube_api, kube_namespace):
    dyn = DynamicClient(kube_api)
    applied: list[tuple] = []
    skipped: list[str] = []
    failures: list[str] = []
    for source, objects in _all_manifests().items():
        for obj in objects:
            try:
                resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            except ResourceNotFoundError:
                skipped.append(f"{source}: {obj['apiVersion']} {obj['kind']} {obj['metadata']['name']} (kind not installed)")
                assert (obj["apiVersion"], obj["kind"]) in NOT_INSTALLED, obj["kind"]
                continue
            body = obj if not resource.namespaced else _into_namespace(obj, kube_namespace)
            try:
                resource.server_side_apply(
                    body=body,
                    namespace=body["metadata"].get("namespace"),
                    field_manager="modelbackfill-manifest-test",
                    dry_run="All",
                )
                applied.append((source, obj["kind"], obj["metadata"]["name"]))
            except ApiException as exc:
                failures.append(f"{source}: {obj['kind']} {obj['metadata']['name']}: {exc.status} {exc.body}")
    assert not failures, "\n".join(failures)
    skipped_kinds = sorted({s.split(" (")[0].split(" ")[2] for s in skipped})
    assert skipped_kinds == ["Cluster", "PrometheusRule", "ServiceMonitor"], skipped
    kinds = {k for _, k, _ in applied}
    assert {"Namespace", "CustomResourceDefinition", "Deployment", "Job", "CronJob", "ModelBackfill", "Secret",
            "ClusterRole", "Role", "Service", "PodDisruptionBudget"} <= kinds, kinds
    # Dry run: nothing was created.
    assert dyn.resources.get(api_version="apps/v1", kind="Deployment").get(namespace=kube_namespace).items == []


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d["spec"].__setitem__("replicas", -1),
        lambda d: d["spec"]["template"]["spec"]["containers"][0].__setitem__("imagePullPolicy", "Sometimes"),
        lambda d: d["spec"]["template"]["spec"]["containers"][0].__setitem__("livenessProbe", {"httpGet": {"path": "/x"}}),
        lambda d: d["spec"]["template"]["spec"].__setitem__("unknownField", True),
    ],
    ids=["negative-replicas", "bad-enum", "probe-without-port", "unknown-field"],
)
def test_dry_run_catches_a_broken_manifest(kube_api, kube_namespace, breakage):
    """Negative control: the dry-run path above really rejects a broken object."""
    (dep,) = [o for o in render(DEPLOY / "base") if o["kind"] == "Deployment"]
    body = _into_namespace(dep, kube_namespace)
    breakage(body)
    resource = DynamicClient(kube_api).resources.get(api_version="apps/v1", kind="Deployment")
    with pytest.raises(ApiException) as exc_info:
        resource.server_side_apply(
            body=body, namespace=kube_namespace, field_manager="modelbackfill-manifest-test", dry_run="All"
        )
    # Invalid values: 422. An unknown field: server-side apply answers 500 "field not declared in schema".
    assert exc_info.value.status in (400, 422, 500), exc_info.value.body
    if exc_info.value.status == 500:
        assert "not declared in schema" in exc_info.value.body


def test_grafana_dashboard_covers_the_four_metric_families():
    dash = json.loads((DEPLOY / "grafana/modelbackfill-dashboard.json").read_text())
    assert dash["uid"] and dash["title"] and dash["panels"]
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    text = "\n".join(exprs)
    for family in ("starts_total", "completions_total", "preemptions_total", "useful_running_seconds_total"):
        assert f"flexinfer_model_backfill_{family}" in text, family
    assert any("by (result)" in e and "completions_total" in e for e in exprs)
    assert any("by (reason)" in e and "preemptions_total" in e for e in exprs)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "backfill", "model"} <= variables
    assert all("$namespace" in e or "flexinfer" not in e for e in exprs)
