"""RBAC is exactly what the code calls: no verb the controller never uses, none it needs missing.

The needed permissions are derived from the source: every reference in backfill/ to a method of
a kubernetes client API class (found with ``ast``; the set of such method names comes from the
installed ``kubernetes.client`` itself) must be in :data:`CALLS`, which maps the method to the
(apiGroup, resource, verb) it needs. A new client call after a refactor fails
:func:`test_every_client_call_is_in_the_table` until it is added there, and then the equality
with deploy/base/rbac.yaml fails until RBAC grants it (or stops granting what is gone).

Custom-object methods need the plural: taken from the call's argument (a literal or a module
constant); where it is a variable (a watcher's list call for each watched kind), every
``ai.flexinfer`` plural of the CRDs (deploy/crds, tests/envtest/crds) that the same module names
as a string. List calls need ``watch`` as well when the code streams them (``watch.Watch`` or ``watch=True``). The Job's ownerReference with
``blockOwnerDeletion: true`` needs ``update`` on ``modelbackfills/finalizers``
(OwnerReferencesPermissionEnforcement).

A namespaced controller (``settings.namespace``) still lists and watches the node-level signals
in every namespace: the kinds whose :meth:`~backfill.controller.kinds.Kind.watch_namespace` is
None for a namespace (what the controller's wiring passes its watchers). Their derived rules,
which must be read-only, are the namespaced overlay's only ClusterRole; everything else is its
Role in the watched namespace.

Then the real API server's RBAC authorizer answers SubjectAccessReviews for the base's and the
namespaced overlay's ServiceAccount: everything derived is allowed, a sample of what is not is
denied (e.g. creating pods in kube-system); the namespaced overlay's node-level rules are allowed
in every namespace, its other rules in the watched namespace only.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import secrets
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from backfill.settings import Settings

from .tools import build

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CUSTOM = "<custom>"  # resource = the plural argument

# client method -> (apiGroup, resource, verb); resource CUSTOM: the custom-object plural.
CALLS: dict[str, tuple[str, str, str]] = {
    "list_namespaced_custom_object": ("ai.flexinfer", CUSTOM, "list"),
    "list_cluster_custom_object": ("ai.flexinfer", CUSTOM, "list"),
    "get_namespaced_custom_object": ("ai.flexinfer", CUSTOM, "get"),
    "replace_namespaced_custom_object": ("ai.flexinfer", CUSTOM, "update"),
    "patch_namespaced_custom_object": ("ai.flexinfer", CUSTOM, "patch"),
    "replace_namespaced_custom_object_status": ("ai.flexinfer", CUSTOM + "/status", "update"),
    "patch_namespaced_custom_object_status": ("ai.flexinfer", CUSTOM + "/status", "patch"),
    "get_namespaced_custom_object_status": ("ai.flexinfer", CUSTOM + "/status", "get"),
    "list_namespaced_cron_job": ("batch", "cronjobs", "list"),
    "list_cron_job_for_all_namespaces": ("batch", "cronjobs", "list"),
    "read_namespaced_cron_job": ("batch", "cronjobs", "get"),
    "list_namespaced_job": ("batch", "jobs", "list"),
    "list_job_for_all_namespaces": ("batch", "jobs", "list"),
    "read_namespaced_job": ("batch", "jobs", "get"),
    "create_namespaced_job": ("batch", "jobs", "create"),
    "delete_namespaced_job": ("batch", "jobs", "delete"),
    "patch_namespaced_job": ("batch", "jobs", "patch"),
    "create_namespaced_event": ("", "events", "create"),
    "patch_namespaced_event": ("", "events", "patch"),
    "read_namespaced_lease": ("coordination.k8s.io", "leases", "get"),
    "create_namespaced_lease": ("coordination.k8s.io", "leases", "create"),
    "replace_namespaced_lease": ("coordination.k8s.io", "leases", "update"),
    "patch_namespaced_lease": ("coordination.k8s.io", "leases", "patch"),
}
# Positional index of `plural` in the custom-object methods (namespaced: group, version, namespace, plural).
_PLURAL_INDEX = {name: (2 if "cluster" in name else 3) for name in CALLS if "custom_object" in name}


_REST = re.compile(r"(list|read|create|replace|patch|delete|get|connect)_[a-z0-9_]+$")


def _api_methods() -> set[str]:
    """Every public method name of the kubernetes client's API classes (CoreV1Api, ...)."""
    names: set[str] = set()
    for cls_name in dir(client):
        cls = getattr(client, cls_name)
        if inspect.isclass(cls) and cls_name.endswith("Api") and cls.__module__.startswith("kubernetes.client.api."):
            names |= {m.removesuffix("_with_http_info") for m in vars(cls) if _REST.match(m)}
    return names


def _references() -> list[tuple[Path, ast.Attribute, ast.Call | None, str]]:
    """(file, attribute node, the Call it is the function of or None, module name) of every client method use."""
    api = _api_methods()
    found = []
    for path in sorted((ROOT / "backfill").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        called = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in api:
                found.append((path, node, called.get(id(node)), module))
    return found


def _streams_watches() -> bool:
    """True when a list call is also made as a watch: through ``watch.Watch().stream(list_call)``
    or with ``watch=True`` passed to the list call (the watchers read the stream themselves)."""
    text = "\n".join(p.read_text() for p in (ROOT / "backfill").rglob("*.py"))
    return ("watch.Watch(" in text and ".stream(" in text) or "watch=True" in text


def _crd_plurals() -> set[str]:
    """The ai.flexinfer plurals of every CRD the project knows (its own and the platform's)."""
    out = set()
    for path in list((ROOT / "deploy/crds").glob("*.yaml")) + list((ROOT / "tests/envtest/crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition" and doc["spec"]["group"] == "ai.flexinfer":
                out.add(doc["spec"]["names"]["plural"])
    return out


def _module_strings(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _plural(call: ast.Call | None, method: str, module: str) -> set[str] | None:
    if call is None:
        return None
    arg = next((k.value for k in call.keywords if k.arg == "plural"), None)
    if arg is None and len(call.args) > _PLURAL_INDEX[method]:
        arg = call.args[_PLURAL_INDEX[method]]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value}
    if isinstance(arg, ast.Name):
        value = getattr(importlib.import_module(module), arg.id, None)
        if isinstance(value, str):
            return {value}
    return None


def derived() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) the code needs, from its client calls."""
    needed: set[tuple[str, str, str]] = set()
    crds, streams = _crd_plurals(), _streams_watches()
    unresolved = []
    for path, node, call, module in _references():
        group, resource, verb = CALLS[node.attr]
        if CUSTOM in resource:
            plurals = _plural(call, node.attr, module)
            if plurals is None and verb == "list":
                plurals = crds & _module_strings(path)
            if not plurals:
                unresolved.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}")
                continue
            resources = {resource.replace(CUSTOM, p) for p in plurals}
        else:
            resources = {resource}
        verbs = {verb}
        if verb == "list" and streams:
            verbs.add("watch")
        needed |= {(group, r, v) for r in resources for v in verbs}
    assert not unresolved, f"custom-object calls whose plural the test cannot resolve: {unresolved}"
    source = "\n".join(p.read_text() for p in (ROOT / "backfill").rglob("*.py"))
    if ("batch", "jobs", "create") in needed and '"blockOwnerDeletion": True' in source:
        needed.add(("ai.flexinfer", "modelbackfills/finalizers", "update"))
    return needed


def node_signals() -> set[tuple[str, str, str]]:
    """The derived rules a namespaced controller needs in every namespace: those on the plurals of
    the kinds it watches cluster-wide although namespaced (``Kind.watch_namespace``, as the
    controller's loop calls it)."""
    from backfill.controller.kinds import KINDS

    plurals = {k.plural for k in KINDS if k.custom and k.watch_namespace("some-namespace") is None}
    assert not [k.name for k in KINDS if not k.custom and k.watch_namespace("some-namespace") is None], (
        "a batch/v1 kind watched cluster-wide: extend node_signals() to it"
    )
    return {r for r in derived() if r[0] == "ai.flexinfer" and r[1] in plurals}


READ_ONLY = {"get", "list", "watch"}


def _granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def _objects(directory: Path) -> list[dict]:
    return [o for o in yaml.safe_load_all(build(directory)) if o]


def _one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    (obj,) = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return obj


LEASE = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}


def test_every_client_call_is_in_the_table():
    refs = _references()
    assert refs, "no kubernetes client call found: the scan is broken"
    missing = sorted({f"{n.attr} ({p.relative_to(ROOT)}:{n.lineno})" for p, n, _, _ in refs if n.attr not in CALLS})
    assert not missing, f"add these client methods to CALLS with the permission they need: {missing}"


def test_the_derivation_sees_the_known_calls():
    """Sanity of the scanner itself (not of RBAC): calls that exist today are found."""
    needed = derived()
    assert ("batch", "jobs", "create") in needed and ("ai.flexinfer", "models", "watch") in needed
    assert LEASE <= needed


def test_cluster_role_is_exactly_what_the_code_calls():
    objects = _objects(DEPLOY / "base")
    rbac_text = json.dumps([o for o in objects if o["apiVersion"].startswith("rbac.")])
    assert '"*"' not in rbac_text, "no wildcards"
    needed = derived()
    cluster = _one(objects, "ClusterRole")
    granted = _granted(cluster["rules"])
    assert granted - (needed - LEASE) == set(), "granted but never used"
    assert (needed - LEASE) - granted == set(), "used but not granted"
    role = _one(objects, "Role")
    assert role["metadata"]["namespace"] == "flexinfer-system"
    assert _granted(role["rules"]) == LEASE & needed
    for rule in role["rules"]:
        if set(rule["verbs"]) & {"get", "update"}:
            assert rule["resourceNames"] == [Settings().lease_name]
    assert not [r for r in granted if r[1] == "secrets"], "the kubelet injects the Secret: no RBAC needed"


def test_the_node_signals_are_read_only_and_only_the_gaming_and_lease_kinds():
    """The derivation of the namespaced controller's cluster-wide rules sees what the code does:
    GamingSessions and GPULeases (cluster-contract: node-level), listed and watched, nothing else."""
    signals = node_signals()
    assert {r[1] for r in signals} == {"gamingsessions", "gpuleases"}
    assert {r[2] for r in signals} <= READ_ONLY and ("ai.flexinfer", "gpuleases", "watch") in signals


def test_namespaced_overlay_grants_the_rules_in_one_namespace_and_reads_node_signals_everywhere():
    objects = _objects(DEPLOY / "overlays/namespaced")
    rbac_text = json.dumps([o for o in objects if o["apiVersion"].startswith("rbac.")])
    assert '"*"' not in rbac_text, "no wildcards"
    subjects = [{"kind": "ServiceAccount", "name": "modelbackfill-controller", "namespace": "flexinfer-system"}]
    # cluster-wide: the node-level signals only, read-only
    (cluster,) = [o for o in objects if o["kind"] == "ClusterRole"]
    (cluster_binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert cluster_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster["metadata"]["name"]}
    assert cluster_binding["subjects"] == subjects
    granted_everywhere = _granted(cluster["rules"])
    assert granted_everywhere == node_signals()
    assert {v for _, _, v in granted_everywhere} <= READ_ONLY
    # everything else: in the watched namespace
    watch_role = _one(objects, "Role", "modelbackfill-controller-watch")
    binding = _one(objects, "RoleBinding", "modelbackfill-controller-watch")
    watched = watch_role["metadata"]["namespace"]
    assert binding["metadata"]["namespace"] == watched and binding["roleRef"]["name"] == "modelbackfill-controller-watch"
    assert binding["subjects"] == subjects
    assert _granted(watch_role["rules"]) == derived() - LEASE - node_signals()
    dep = _one(objects, "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["BACKFILL_NAMESPACE"] == watched


# ----------------------------------------------------------------------------- the real authorizer


def _rewrite(objects: list[dict], mapping: dict[str, str]) -> list[dict]:
    text = json.dumps(objects)
    for old, new in mapping.items():
        text = text.replace(f'"{old}"', f'"{new}"')
    return json.loads(text)


def _apply(kube_api, objects: list[dict]) -> None:
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(kube_api)
    for obj in objects:
        res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        res.server_side_apply(body=obj, namespace=obj["metadata"].get("namespace"), field_manager="rbac-test")


RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def apply_rbac(kube_api, directory: Path, namespaces: dict[str, str]) -> list[dict]:
    """Apply the ServiceAccount and RBAC objects of ``directory``'s build, its namespaces renamed
    (``namespaces``: old -> new) and its cluster-scoped names made unique (the apiserver is shared
    by the session); returns the objects applied."""
    suffix = secrets.token_hex(4)
    objects = _rewrite([o for o in _objects(directory) if o["kind"] in RBAC_KINDS], namespaces)
    for o in objects:
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            o["metadata"]["name"] += f"-{suffix}"
        if o["kind"] == "ClusterRoleBinding":
            o["roleRef"]["name"] += f"-{suffix}"
    _apply(kube_api, objects)
    return objects


def delete_cluster_scoped(kube_api, objects: list[dict]) -> None:
    """Delete the ClusterRoleBindings and ClusterRoles among ``objects`` (namespaces are per test)."""
    rbac = client.RbacAuthorizationV1Api(kube_api)
    for o in objects:
        if o["kind"] == "ClusterRoleBinding":
            rbac.delete_cluster_role_binding(o["metadata"]["name"])
    for o in objects:
        if o["kind"] == "ClusterRole":
            rbac.delete_cluster_role(o["metadata"]["name"])


def _allowed(kube_api, user: str, ns: str, group: str, resource: str, verb: str, name: str | None = None) -> bool:
    resource, _, sub = resource.partition("/")
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=["system:serviceaccounts", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(
            namespace=ns, group=group, resource=resource, subresource=sub or None, verb=verb, name=name),
    ))
    return client.AuthorizationV1Api(kube_api).create_subject_access_review(review).status.allowed


@pytest.fixture
def two_namespaces(kube_api):
    core = client.CoreV1Api(kube_api)
    names = [f"t-{secrets.token_hex(5)}" for _ in range(2)]
    for n in names:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=n)))
    yield names
    for n in names:
        try:
            core.delete_namespace(n)
        except ApiException:
            pass


DENIED_SAMPLE = [
    ("", "pods", "create"), ("", "secrets", "get"), ("", "secrets", "list"), ("ai.flexinfer", "modelbackfills", "patch"),
    ("ai.flexinfer", "modelbackfills/status", "patch"), ("ai.flexinfer", "models", "get"), ("ai.flexinfer", "models", "update"),
    ("batch", "cronjobs", "get"), ("", "events", "patch"), ("events.k8s.io", "events", "create"), ("batch", "jobs", "update"),
]


@pytest.mark.kube
def test_the_apiserver_authorizes_exactly_the_derived_permissions(kube_api, two_namespaces):
    controller_ns, other = two_namespaces
    objects = apply_rbac(kube_api, DEPLOY / "base", {"flexinfer-system": controller_ns})
    user = f"system:serviceaccount:{controller_ns}:modelbackfill-controller"
    try:
        needed = derived()
        for group, resource, verb in sorted(needed - LEASE):
            for ns in (controller_ns, other):
                assert _allowed(kube_api, user, ns, group, resource, verb), (ns, group, resource, verb)
        lease = Settings().lease_name
        assert _allowed(kube_api, user, controller_ns, "coordination.k8s.io", "leases", "create")
        for verb in ("get", "update"):
            assert _allowed(kube_api, user, controller_ns, "coordination.k8s.io", "leases", verb, lease)
            assert not _allowed(kube_api, user, controller_ns, "coordination.k8s.io", "leases", verb, "someone-elses")
            assert not _allowed(kube_api, user, other, "coordination.k8s.io", "leases", verb, lease)
        for group, resource, verb in DENIED_SAMPLE:
            assert (group, resource, verb) not in needed
            assert not _allowed(kube_api, user, "kube-system", group, resource, verb), (group, resource, verb)
    finally:
        delete_cluster_scoped(kube_api, objects)


@pytest.mark.kube
def test_a_namespaced_controller_cannot_act_outside_its_namespace(kube_api, two_namespaces):
    controller_ns, watched = two_namespaces
    objects = apply_rbac(kube_api, DEPLOY / "overlays/namespaced", {"flexinfer-system": controller_ns, "ml-models": watched})
    user = f"system:serviceaccount:{controller_ns}:modelbackfill-controller"
    try:
        signals = node_signals()
        assert signals
        for group, resource, verb in sorted(derived() - LEASE - signals):
            assert _allowed(kube_api, user, watched, group, resource, verb), (group, resource, verb)
            for ns in ("kube-system", controller_ns, None):
                assert not _allowed(kube_api, user, ns, group, resource, verb), (ns, group, resource, verb)
        for group, resource, verb in sorted(signals):  # read in every namespace, and cluster-wide
            for ns in (watched, "kube-system", controller_ns, None):
                assert _allowed(kube_api, user, ns, group, resource, verb), (ns, group, resource, verb)
        for resource in sorted({r for _, r, _ in signals}):  # and never written
            for verb in ("create", "update", "patch", "delete", "deletecollection"):
                for ns in (watched, "kube-system"):
                    assert not _allowed(kube_api, user, ns, "ai.flexinfer", resource, verb), (ns, resource, verb)
        assert not _allowed(kube_api, user, "kube-system", "", "pods", "create")
        assert not _allowed(kube_api, user, None, "batch", "jobs", "list")  # not cluster-wide
        assert not _allowed(kube_api, user, None, "ai.flexinfer", "models", "list")
    finally:
        delete_cluster_scoped(kube_api, objects)
