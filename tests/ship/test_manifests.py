"""Every manifest in deploy/ is valid: rendered with kustomize (the pinned binary that
tests/ship/install_tools.sh installs; `kubectl apply -k` embeds the same engine), then applied to
the real API server (envtest) with server-side dry run.

Namespaced objects are dry-run applied into the test's fresh namespace (the ``flexinfer-system``
and ``ml-models`` references are rewritten) so nothing leaks into the shared cluster. Kinds the
test cluster does not serve (ServiceMonitor, PrometheusRule, cert-manager's Issuer and
Certificate, the CloudNativePG Cluster in production.md) are skipped by kind, and asserted to be
exactly those, after checking they are YAML with apiVersion/kind/metadata.name.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from .seed_example import SEED_SPEC
from .tools import build

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE = "flexinfer-system"
WATCHED = "ml-models"  # the namespaced overlay's example
KUSTOMIZATIONS = ["crds", "base", "base/migration", "monitoring", "overlays/example", "overlays/namespaced",
                  "overlays/cert-manager"]
NOT_INSTALLED = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("postgresql.cnpg.io/v1", "Cluster"),
}


def render(directory: Path) -> list[dict]:
    """`kustomize build` of ``directory``, as objects."""
    return [doc for doc in yaml.safe_load_all(build(directory)) if doc]


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


def _by_kind(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


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
    assert kinds == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment",
                     "Service", "PodDisruptionBudget", "NetworkPolicy"}
    assert sorted(o["kind"] for o in sets["monitoring"]) == ["PrometheusRule", "ServiceMonitor"]
    assert [o["kind"] for o in sets["production.md"]] == ["Cluster"]
    assert [o["kind"] for o in sets["base/migration"]] == ["Job"]
    assert [o["kind"] for o in sets["crds"]] == ["CustomResourceDefinition"]
    assert {o["kind"] for o in sets["overlays/cert-manager"]} - kinds == {"Issuer", "Certificate"}


@pytest.mark.parametrize("name", [k for k in KUSTOMIZATIONS if k != "crds"])
def test_no_kustomization_but_crds_owns_the_namespace_or_the_crd(name):
    """`kubectl delete -k deploy/base` (or a GitOps prune) must not delete the namespace, with its
    Secrets and database, or the CRD, with every ModelBackfill."""
    kinds = {o["kind"] for o in render(DEPLOY / name)}
    assert not kinds & {"Namespace", "CustomResourceDefinition"}, name


def test_the_crd_kustomization_is_the_file_the_tests_apply():
    (crd,) = render(DEPLOY / "crds")
    assert crd == yaml.safe_load((DEPLOY / "crds/modelbackfills.ai.flexinfer.yaml").read_text())


def test_deployment_is_hardened():
    objects = _by_kind(render(DEPLOY / "base") + render(DEPLOY / "monitoring"))
    dep = objects[("Deployment", "modelbackfill-controller")]
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    # The controller's shutdown (threads and spool 5 s + Lease release <= 8 s) fits.
    assert pod["terminationGracePeriodSeconds"] == 30
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["args"] == ["controller"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    probes = {k: c[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["startupProbe"]["path"] == "/healthz" and probes["livenessProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert all(p["scheme"] == "HTTPS" and p["port"] == "https" for p in probes.values())
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 300
    env = {e["name"]: e for e in c["env"]}
    assert "BACKFILL_DATABASE_URL" not in env, "the URL comes from the mounted file, not the environment"
    assert env["BACKFILL_LEADER_ELECT"]["value"] == "true"
    assert env["BACKFILL_LEASE_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}

    def mounted(path: str, secret: str, key: str) -> None:
        (volume,) = [n for n, m in mounts.items() if path.startswith(m + "/")]
        assert volumes[volume]["secret"]["secretName"] == secret
        items = {i["key"]: i["path"] for i in volumes[volume]["secret"]["items"]}
        assert f"{mounts[volume]}/{items[key]}" == path

    mounted(env["BACKFILL_DATABASE_URL_FILE"]["value"], "modelbackfill", "database-url")
    mounted(env["BACKFILL_INGEST_TOKEN_FILE"]["value"], "modelbackfill", "ingest-token")
    mounted(env["BACKFILL_TLS_CERT_FILE"]["value"], "modelbackfill-tls", "tls.crt")
    mounted(env["BACKFILL_TLS_KEY_FILE"]["value"], "modelbackfill-tls", "tls.key")
    assert mounts["tmp"] == "/tmp" and "emptyDir" in volumes["tmp"]
    port = int(env["BACKFILL_METRICS_ADDRESS"]["value"].rpartition(":")[2])
    assert c["ports"] == [{"name": "https", "containerPort": port, "protocol": "TCP"}]
    # The ServiceAccount, Service, NetworkPolicy and ServiceMonitor line up with the Deployment.
    assert ("ServiceAccount", pod["serviceAccountName"]) in objects
    labels = dep["spec"]["template"]["metadata"]["labels"]
    svc = objects[("Service", "modelbackfill")]
    assert svc["spec"]["ports"] == [{"name": "https", "port": port, "targetPort": "https", "protocol": "TCP"}]
    assert svc["spec"]["selector"].items() <= labels.items()
    netpol = objects[("NetworkPolicy", "modelbackfill-controller")]
    assert netpol["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert netpol["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = netpol["spec"]["ingress"]
    assert rule["ports"] == [{"port": "https", "protocol": "TCP"}] and len(rule["from"]) == 2
    sm = objects[("ServiceMonitor", "modelbackfill")]
    assert sm["spec"]["endpoints"][0]["port"] == "https" and sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    rules = objects[("PrometheusRule", "modelbackfill")]["spec"]["groups"][0]["rules"]
    exprs = " ".join(r["expr"] for r in rules)
    assert 'absent(up{job="modelbackfill"}' in exprs


def test_migration_job_reads_the_url_from_the_secret_file():
    (job,) = render(DEPLOY / "base/migration")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    path = env["BACKFILL_DATABASE_URL_FILE"]
    (mount,) = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "modelbackfill"
    assert {i["key"] for i in volume["secret"]["items"]} == {"database-url"}


@pytest.mark.parametrize("kustomization", ["base", "base/migration"])
def test_every_pod_can_read_the_secret_files_it_mounts(kustomization):
    """A non-root pod reads a mounted Secret's file only if the file's mode lets it: files are
    owned by root, and group-owned by the pod's ``fsGroup`` when it has one, which every process
    of the pod is in (the kubelet's rule). A new
    user's trial: the migration Job ran as 65532 without ``fsGroup`` over 0440 files and could
    not read the database URL, so ``db upgrade`` failed and the install's wait timed out."""
    pods = [o["spec"]["template"]["spec"] for o in render(DEPLOY / kustomization) if o["kind"] in ("Deployment", "Job")]
    assert pods
    for pod in pods:
        ctx = pod.get("securityContext") or {}
        for volume in pod.get("volumes", []):
            secret = volume.get("secret")
            if secret is None:
                continue
            modes = [item.get("mode", secret.get("defaultMode", 0o644)) for item in secret.get("items", [])] or [secret.get("defaultMode", 0o644)]
            for mode in modes:
                readable = (
                    ctx.get("runAsUser", 0) == 0
                    or mode & 0o004
                    or ("fsGroup" in ctx and mode & 0o040)  # the pod's processes are in fsGroup
                )
                assert readable, f"{kustomization}: volume {volume['name']} mode {mode:o} is not readable by user {ctx.get('runAsUser')}"


def test_cert_manager_overlay_issues_the_tls_secret_the_deployment_mounts():
    objects = _by_kind(render(DEPLOY / "overlays/cert-manager"))
    cert = objects[("Certificate", "modelbackfill-tls")]
    dep = objects[("Deployment", "modelbackfill-controller")]
    secrets = {v["secret"]["secretName"] for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    assert cert["spec"]["secretName"] in secrets
    assert f"modelbackfill.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    assert ("Issuer", cert["spec"]["issuerRef"]["name"]) in objects


def _selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


def test_ingest_has_a_service_that_keeps_not_ready_replicas():
    """Readiness is 503 while PostgreSQL is down (by design), so an ordinary Service has no
    endpoints during exactly the outage in which only a direct report to the leader cancels at
    once: the ingest Service publishes not-ready addresses (deploy/README.md explains), the
    metrics Service does not, and the ServiceMonitor selects only the latter."""
    objects = _by_kind(render(DEPLOY / "base") + render(DEPLOY / "monitoring"))
    pod_labels = objects[("Deployment", "modelbackfill-controller")]["spec"]["template"]["metadata"]["labels"]
    services = {name: o for (kind, name), o in objects.items() if kind == "Service"}
    assert set(services) == {"modelbackfill", "modelbackfill-ingest"}
    ingest, metrics = services["modelbackfill-ingest"], services["modelbackfill"]
    assert ingest["spec"]["publishNotReadyAddresses"] is True
    assert metrics["spec"].get("publishNotReadyAddresses", False) is False
    assert _selects(ingest["spec"]["selector"], pod_labels) and _selects(metrics["spec"]["selector"], pod_labels)
    assert ingest["spec"]["ports"] == metrics["spec"]["ports"]
    sm = objects[("ServiceMonitor", "modelbackfill")]["spec"]["selector"]["matchLabels"]
    assert [name for name, o in services.items() if _selects(sm, o["metadata"]["labels"])] == ["modelbackfill"]
    # The serving certificate names both Services: the cert-manager one and the openssl commands.
    names = {f"{name}.{NAMESPACE}.svc" for name in services}
    dns = set(_by_kind(render(DEPLOY / "overlays/cert-manager"))[("Certificate", "modelbackfill-tls")]["spec"]["dnsNames"])
    assert names <= dns, names - dns
    for doc in (DEPLOY / "README.md", DEPLOY.parent / "README.md"):
        (san,) = re.findall(r"subjectAltName=(\S+)", doc.read_text())
        assert names <= {n.removeprefix("DNS:") for n in san.split(",")}, doc
    # The ingest API's documented URL is the ingest Service's.
    assert f"https://modelbackfill-ingest.{NAMESPACE}.svc:8443/v1/foreground" in (DEPLOY / "README.md").read_text()


def test_example_overlay_matches_the_seed():
    objects = _by_kind(render(DEPLOY / "overlays/example"))
    mbf = objects[("ModelBackfill", "model-eval-gemma4-5930k")]
    assert mbf["metadata"]["namespace"] == NAMESPACE
    assert mbf["spec"] == SEED_SPEC
    cron = objects[("CronJob", "model-eval-gauntlet")]
    assert cron["spec"]["suspend"] is True
    assert "gpu" not in json.dumps(cron["spec"]["jobTemplate"]).lower()


# ----------------------------------------------------------------------------- the real API server


def _into_namespace(obj: dict, namespace: str) -> dict:
    """A copy with every flexinfer-system / ml-models reference of a namespaced object moved to ``namespace``."""
    obj = copy.deepcopy(obj)
    text = json.dumps(obj).replace(f'"{NAMESPACE}"', f'"{namespace}"').replace(f'"{WATCHED}"', f'"{namespace}"')
    return json.loads(text)


@pytest.mark.kube
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
    assert skipped_kinds == ["Certificate", "Cluster", "Issuer", "PrometheusRule", "ServiceMonitor"], skipped
    kinds = {k for _, k, _ in applied}
    assert {"CustomResourceDefinition", "Deployment", "Job", "CronJob", "ModelBackfill", "Secret", "ClusterRole",
            "Role", "Service", "PodDisruptionBudget", "NetworkPolicy"} <= kinds, kinds
    # Dry run: nothing was created.
    assert dyn.resources.get(api_version="apps/v1", kind="Deployment").get(namespace=kube_namespace).items == []


@pytest.mark.kube
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
