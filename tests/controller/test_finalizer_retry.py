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
from kubernetes.client.exceptions import ApiException

from backfill.controller.actor import FINALIZER
from backfill.core import events as ev

from .conftest import GROUP, VERSION, AdmissionPolicy, log_of, wait_for

pytestmark = pytest.mark.kube


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
    policy = AdmissionPolicy(kube.api, kube.ns, f"refuse-mb-updates-{kube.ns}", GROUP, VERSION, "modelbackfills", ["UPDATE"],
                             "false", "updates of ModelBackfills are frozen", "Forbidden")  # not the status subresource
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
