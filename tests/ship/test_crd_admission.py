"""The ModelBackfill CRD on the real API server: admission answers 422 to the declarations the
controller could only block later (CEL x-kubernetes-validations), admits valid ones, and every
schema field carries a description (for `kubectl explain`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.kube

CRD = Path(__file__).resolve().parents[2] / "deploy/crds/modelbackfills.ai.flexinfer.yaml"
GROUP, VERSION, PLURAL = "ai.flexinfer", "v1alpha2", "modelbackfills"
BASE = {"modelRef": "gemma", "templateRef": "model-eval-gauntlet"}


def _create(kube_api, ns: str, name: str, spec: dict) -> dict:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelBackfill", "metadata": {"name": name}, "spec": spec}
    return client.CustomObjectsApi(kube_api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body, dry_run="All")


BAD = {
    "env-key-digit-first": ({"env": {"1ABC": "x"}}, "spec.env"),
    "env-key-space": ({"env": {"BAD NAME": "x"}}, "spec.env"),
    "env-key-equals": ({"env": {"A=B": "x"}}, "spec.env"),
    "env-key-dot": ({"env": {".": "x"}}, "spec.env"),
    "env-key-dotdot-prefix": ({"env": {"..x": "x"}}, "spec.env"),
    "env-key-empty": ({"env": {"": "x"}}, "spec.env"),
    "env-reserved": ({"env": {"FLEXINFER_WORKLOAD_CLASS": "foreground"}}, "spec.env"),
    "env-nvidia-devices": ({"env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "spec.env"),
    "env-amd-devices": ({"env": {"AMD_VISIBLE_DEVICES": "all"}}, "spec.env"),
    "env-33": ({"env": {f"V_{i}": "1" for i in range(33)}}, "spec.env"),
    "repeat-10s": ({"repeatAfter": "10s"}, "spec.repeatAfter"),
    "repeat-59s": ({"repeatAfter": "59s"}, "spec.repeatAfter"),
    "repeat-59.9s": ({"repeatAfter": "59.9s"}, "spec.repeatAfter"),
    "repeat-1ms": ({"repeatAfter": "1ms"}, "spec.repeatAfter"),
    "repeat-not-go": ({"repeatAfter": "1 minute"}, "spec.repeatAfter"),
    # beyond Go's largest duration (2562047h47m16s): the pattern matches, the controller blocks it
    "repeat-overflow": ({"repeatAfter": "2562048h"}, "spec.repeatAfter"),
    "idle-overflow": ({"idleFor": "2562048h"}, "spec.idleFor"),
    "maxrun-overflow": ({"maxRunDuration": "99999999999h"}, "spec.maxRunDuration"),
    "model-uppercase": ({"modelRef": "Gemma"}, "spec.modelRef"),
    "model-underscore": ({"modelRef": "gemma_4"}, "spec.modelRef"),
    "model-254": ({"modelRef": "a" * 254}, "spec.modelRef"),
    "template-53": ({"templateRef": "t" * 53}, "spec.templateRef"),
    "template-trailing-dash": ({"templateRef": "eval-"}, "spec.templateRef"),
}
GOOD = {
    "repeat-0": {"repeatAfter": "0"},
    "repeat-0s": {"repeatAfter": "0s"},
    "repeat-1m": {"repeatAfter": "1m"},
    "repeat-60s": {"repeatAfter": "60s"},
    "repeat-0.5h": {"repeatAfter": "0.5h"},
    "repeat-24h": {"repeatAfter": "24h"},
    "durations-at-go-maximum": {"idleFor": "2562047h47m16s", "maxRunDuration": "2562047h", "repeatAfter": "2562047h47m16s"},
    "env-kubernetes-names": {"env": {"a.b-c": "1", "_X": "2", "-dash": "3", ".hidden": "4", "GAUNTLET_API": "chat"}},
    "env-32": {"env": {f"V_{i}": "1" for i in range(32)}},
    "model-dotted-253": {"modelRef": ("a" * 63 + ".") * 3 + "b" * 61},
    "template-52": {"templateRef": "t" * 52},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_declarations_are_answered_422(kube_api, kube_namespace, case):
    spec, field = BAD[case]
    with pytest.raises(ApiException) as info:
        _create(kube_api, kube_namespace, "bad", {**BASE, **spec})
    assert info.value.status == 422, info.value.body
    status = json.loads(info.value.body)
    # With CEL rules present the server adds a field-less cause "some validation rules were not
    # checked because the object was invalid" when the plain schema already failed.
    fields = [c.get("field") for c in status["details"]["causes"] if "rules were not checked" not in c["message"]]
    assert fields == [field], status  # one cause: a value the pattern refuses is not reported again by a rule


@pytest.mark.parametrize("case", sorted(GOOD))
def test_valid_declarations_are_admitted(kube_api, kube_namespace, case):
    spec = {**BASE, **GOOD[case]}
    assert len(spec.get("modelRef")) <= 253
    created = _create(kube_api, kube_namespace, "good", spec)
    assert created["spec"] == spec


def _walk(schema: dict, path: str):
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_every_field_is_described_and_the_crd_is_discoverable():
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    missing = [p for p, s in _walk(version["schema"]["openAPIV3Schema"], "") if p not in (".metadata",)
               and not s.get("description") and not p.endswith("{}")]
    assert not missing, f"fields without a description: {missing}"
    assert "flexinfer" in crd["spec"]["names"]["categories"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Reason"] == ".status.reason"


def test_the_served_crd_has_the_rules_and_the_category(kube_api):
    """The CRD the test cluster serves is this file (tests/conftest.py applies deploy/crds)."""
    served = client.ApiextensionsV1Api(kube_api).read_custom_resource_definition(f"{PLURAL}.{GROUP}")
    assert "flexinfer" in served.spec.names.categories
    spec = served.spec.versions[0].schema.open_apiv3_schema.properties["spec"]
    assert spec.properties["env"].x_kubernetes_validations and spec.properties["repeatAfter"].x_kubernetes_validations


@pytest.mark.parametrize("case", sorted(c for c in BAD if "overflow" in c) + ["durations-at-go-maximum"])
def test_admission_and_the_controller_agree_on_durations(case):
    """What admission rejects the controller would block (and what it admits, it accepts)."""
    from backfill.core.spec import Spec, SpecProblem, parse_spec

    spec = {**BASE, **(BAD[case][0] if case in BAD else GOOD[case])}
    assert isinstance(parse_spec(spec), SpecProblem if case in BAD else Spec), case


def _renamed_crd(schema_of, group: str) -> dict:
    """The shipped CRD under another API group (a test's own: the session's real CRD is left
    alone), its schema passed through ``schema_of``."""
    crd = yaml.safe_load(CRD.read_text())
    crd["metadata"]["name"] = f"{PLURAL}.{group}"
    crd["spec"]["group"] = group
    for v in crd["spec"]["versions"]:
        v["schema"]["openAPIV3Schema"] = schema_of(v["schema"]["openAPIV3Schema"])
    return crd


def _without_rules(schema):
    if isinstance(schema, dict):
        return {k: _without_rules(v) for k, v in schema.items() if k not in ("x-kubernetes-validations", "pattern")}
    if isinstance(schema, list):
        return [_without_rules(v) for v in schema]
    return schema


def test_an_object_stored_before_the_duration_rules_can_still_release_its_finalizer(kube_api, kube_namespace):
    """A trial: ``idleFor: 9999999999999999h`` stored under an older CRD (no rules), then the
    CRD upgraded: the duration rule *errors* on it (``type conversion error``), an error is not
    ratcheted, and the API server refused every change of the object, even the removal of its
    finalizer: Terminating for ever. The rules skip an unchanged value (``optionalOldSelf``);
    a new or changed value past Go's largest is still refused."""
    import time

    group = "crdupgrade.flexinfer"
    ext = client.ApiextensionsV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)

    def apply(crd: dict) -> None:
        try:
            current = ext.read_custom_resource_definition(crd["metadata"]["name"])
            crd["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)
        except ApiException as exc:
            if exc.status != 404:
                raise
            ext.create_custom_resource_definition(crd)
        time.sleep(1.5)  # established, and the new schema served

    body = {"apiVersion": f"{group}/{VERSION}", "kind": "ModelBackfill",
            "metadata": {"name": "huge", "finalizers": ["test.flexinfer/hold"]},
            "spec": {**BASE, "idleFor": "9999999999999999h"}}  # fmt: skip
    try:
        apply(_renamed_crd(_without_rules, group))
        custom.create_namespaced_custom_object(group, VERSION, kube_namespace, PLURAL, body)
        apply(_renamed_crd(lambda s: s, group))
        custom.delete_namespaced_custom_object(group, VERSION, kube_namespace, PLURAL, "huge")
        custom.patch_namespaced_custom_object(group, VERSION, kube_namespace, PLURAL, "huge", {"metadata": {"finalizers": None}})
        with pytest.raises(ApiException) as gone:
            custom.get_namespaced_custom_object(group, VERSION, kube_namespace, PLURAL, "huge")
        assert gone.value.status == 404
        # the rule still refuses the value in a new object
        with pytest.raises(ApiException) as refused:
            custom.create_namespaced_custom_object(group, VERSION, kube_namespace, PLURAL, {**body, "metadata": {"name": "huge2"}})
        assert refused.value.status == 422 and "spec.idleFor" in refused.value.body
    finally:
        try:
            ext.delete_custom_resource_definition(f"{PLURAL}.{group}")
        except ApiException:
            pass
