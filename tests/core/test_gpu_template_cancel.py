"""A live attempt whose CronJob's template the GPU guard refuses now is cancelled (a trial
upgrading to a release with a stricter guard found the Jobs the older one had admitted under
``nvidia.cdi.k8s.io/`` and ``AMD_VISIBLE_DEVICES=all`` templates running on, their status still
"background Job ... is active"). The same when the template changes to a refused one mid-run."""

from __future__ import annotations

from backfill.core.commands import Cancel
from backfill.core.projector import affected

from .builders import NS, TEMPLATE, running

KEY = (NS, "b")
IDLE = 600.0  # the builders' declaration: idleFor 10m


def test_a_running_attempt_whose_template_is_refused_now_is_cancelled():
    log, admit = running(IDLE)
    gpu = {**TEMPLATE, "spec": {"template": {"metadata": {"annotations": {"nvidia.cdi.k8s.io/gpu": "nvidia.com/gpu=all"}},
                                              "spec": {"containers": [{"name": "c"}]}}}}  # fmt: skip
    log.cronjob(IDLE + 5, template=gpu)
    pos = log.world.position
    assert KEY in affected(log.world, log.events[-1][1])  # woken by the CronJob, not only at the resync
    (cancel,) = [c for c in log.decide(IDLE + 6) if isinstance(c, Cancel)]
    assert (cancel.attempt, cancel.reason, cancel.cause, cancel.suspend) == (admit.attempt, "GPURequestForbidden", pos, False)
    assert "nvidia.cdi.k8s.io/gpu" in cancel.message


def test_a_template_the_guard_accepts_cancels_nothing():
    log, _ = running(IDLE)
    fine = {**TEMPLATE, "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}}}
    log.cronjob(IDLE + 5, template=fine)
    assert not [c for c in log.decide(IDLE + 6) if isinstance(c, Cancel)]
