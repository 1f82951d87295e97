"""A refused finalizer release is re-sent (paced 1, 2, 4 ... s), not left to the resync.

An adversarial trial deleted a ModelBackfill while an admission policy refused updates of
ModelBackfills: the release of the controller's finalizer was refused once and tried again only
at the next resync (60 s by default), so the object stayed Terminating that long after the policy
was lifted. Here a ValidatingAdmissionPolicy (in-process CEL: no webhook server) refuses the
update; once it is removed the object must be gone in seconds, with the resync far away.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from backfill.controller.actor import FINALIZER
from backfill.core import events as ev

from .conftest import GROUP, VERSION, log_of, wait_for

pytestmark = pytest.mark.kube


class UpdatePolicy:
    """Refuses every UPDATE of a ModelBackfill (not its status subresource) in one namespace."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.ar, self.name = client.AdmissionregistrationV1Api(api), f"refuse-mb-updates-{ns}"
        self.ar.create_validating_admission_policy({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": self.name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [
                    {"apiGroups": [GROUP], "apiVersions": [VERSION], "operations": ["UPDATE"], "resources": ["modelbackfills"]}
                ]},
                "validations": [{"expression": "false", "message": "updates of ModelBackfills are frozen", "reason": "Forbidden"}],
            },
        })  # fmt: skip
        self.ar.create_validating_admission_policy_binding({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": self.name},
            "spec": {"policyName": self.name, "validationActions": ["Deny"], "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}},
        })  # fmt: skip

    def remove(self) -> None:
        for delete in (self.ar.delete_validating_admission_policy_binding, self.ar.delete_validating_admission_policy):
            try:
                delete(self.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def _refused(kube, name: str) -> bool:
    """True once a labels-only update of ``name`` is refused (the policy is loaded)."""
    obj = kube.get("modelbackfills", name)
    obj["metadata"].setdefault("labels", {})["probe"] = str(time.monotonic_ns())
    try:
        kube.custom.replace_namespaced_custom_object(GROUP, VERSION, kube.ns, "modelbackfills", name, obj)
        return False
    except ApiException as exc:
        return exc.status in (403, 422)


def test_a_refused_finalizer_release_is_re_sent_once_the_refusals_end(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    c = start_controller(resync_seconds=600)  # the resync cannot be what releases it
    kube.backfill("held", idleFor="1h")  # waits: no Job, only the finalizer to release
    wait_for(lambda: FINALIZER in (kube.get("modelbackfills", "held")["metadata"].get("finalizers") or []), what="finalizer added")
    policy = UpdatePolicy(kube.api, kube.ns)
    try:
        wait_for(lambda: _refused(kube, "held"), timeout=15, what="the policy refuses updates")
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, kube.ns, "modelbackfills", "held")
        # at least one release is refused: the object stays, Terminating
        time.sleep(2)
        held = kube.get("modelbackfills", "held")
        assert held is not None and held["metadata"].get("deletionTimestamp")
        assert not [e for _, e in log_of(c) if isinstance(e, ev.FinalizerReleased)]
    finally:
        policy.remove()
    lifted = time.monotonic()
    # the re-sends are at most 30 s apart (8 s or less this early); the resync is 600 s away
    wait_for(lambda: kube.get("modelbackfills", "held") is None, timeout=20, what="the ModelBackfill gone after the policy is lifted")
    assert time.monotonic() - lifted < 20
    wait_for(lambda: [e for _, e in log_of(c) if isinstance(e, ev.FinalizerReleased)], timeout=5, what="FinalizerReleased in the log")
