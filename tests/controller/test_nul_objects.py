"""A NUL character (U+0000) in a watched object never stalls the controller (an adversarial
trial: PostgreSQL's jsonb refuses ``\\u0000``; one GamingSession whose ``spec.nodeName`` ended
in it, in any namespace, made every append fail, and no ModelBackfill anywhere was admitted
again until a restart, nor after it while the object existed).

On the real apiserver and PostgreSQL: the objects with a NUL are created while the controller
runs; a good ModelBackfill created after them is still admitted, the log holds the GamingSession
with U+FFFD for the NUL, and the content that would be copied into a Job (a ModelBackfill's env,
a CronJob's container args) is not changed silently: those declarations are Blocked.
"""

from __future__ import annotations

import pytest

from backfill.core import events as ev

from .conftest import log_of, wait_for

pytestmark = pytest.mark.kube


def test_objects_with_a_nul_never_stall_the_log_and_copied_content_is_blocked(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    kube.model("other", node="node-b")
    controller = start_controller()
    kube.create("gamingsessions", "GamingSession", "nul-node", {"nodeName": "node-zz\x00", "mode": "gaming"})
    kube.cronjob("nul-args", pod={"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox", "args": ["a\x00b"]}]})
    kube.backfill("nul-env", env={"X": "a\x00b"})
    kube.backfill("nul-template", model="other", template="nul-args")

    wait_for(lambda: kube.status("nul-env").get("reason") == "InvalidSpec", timeout=15, what="nul-env Blocked InvalidSpec")
    assert kube.status("nul-env")["phase"] == "Blocked"
    assert kube.status("nul-env")["message"].startswith("spec.env.X contains a NUL character (U+0000)")
    wait_for(lambda: kube.status("nul-template").get("reason") == "InvalidTemplate", timeout=15, what="nul-template Blocked")
    assert kube.status("nul-template")["message"].startswith(
        "CronJob nul-args: spec.jobTemplate.spec.template.spec.containers[0].args[0] contains a NUL character"
    )

    # The log still takes appends: a declaration created after all of them is admitted.
    kube.backfill("good", model="gemma")
    job = wait_for(lambda: next((j for j in kube.jobs() if j.metadata.name.startswith("good-")), None), timeout=20, what="good's Job")
    assert job.spec.template.spec.containers[0].name == "main"
    assert [j.metadata.name for j in kube.jobs() if not j.metadata.name.startswith("good-")] == []
    log = [e for _, e in log_of(controller)]
    assert [e.node for e in log if isinstance(e, ev.GamingIntentStarted)] == ["node-zz\ufffd"]
    (applied,) = [e for e in log if isinstance(e, ev.BackfillApplied) and e.name == "nul-env"]
    assert applied.spec["env"] == {"X": "a\ufffdb"} and applied.unstorable.startswith("spec.env.X contains a NUL")
