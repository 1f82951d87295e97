"""The wording of a holding gate and of a refused template (a new user's trial: a GPULease by
group alone said "an active GPU lease on node ? / group g14"; a template with hostPID said
"requests GPU resources: pod: hostPID")."""

from __future__ import annotations

from backfill.core import events as ev
from backfill.core.projector import status_of

from .builders import NS, Log, t

KEY = (NS, "b")


def _lease(log: Log, node: str, group: str) -> dict:
    log.add(ev.GPULeaseActive(at=t(1), namespace=NS, lease="l", node=node, group=group))
    return status_of(log.world, KEY, t(2))


def test_a_gpu_lease_names_what_it_holds():
    assert _lease(Log().ready(0, shared="g14").cronjob(0).apply(0), "", "g14")["message"] == "an active GPU lease on shared group g14"
    assert _lease(Log().ready(0).cronjob(0).apply(0), "n1", "")["message"] == "an active GPU lease on node n1"
    both = _lease(Log().ready(0, shared="g14").cronjob(0).apply(0), "n1", "g14")["message"]
    assert both == "an active GPU lease on node n1 / shared group g14"


def test_a_template_refused_for_host_access_does_not_say_it_requests_gpu_resources():
    template = {"spec": {"template": {"spec": {"hostPID": True, "containers": [{"name": "c", "image": "i"}]}}}}
    log = Log().ready(0).cronjob(0, template=template).apply(0)
    st = status_of(log.world, KEY, t(1))
    assert (st["phase"], st["reason"]) == ("Blocked", "GPURequestForbidden")
    assert st["message"].startswith("CronJob cj's Job template could reach a GPU: pod: hostPID"), st["message"]


def test_a_running_attempts_model_deleted_is_cancelled_saying_so():
    from backfill.core.commands import Cancel

    from .builders import running

    log, admit = running()
    log.add(ev.ModelDeleted(at=t(700), namespace=NS, model="m"))
    (cancel,) = [c for c in log.decide(701) if isinstance(c, Cancel)]
    assert (cancel.reason, cancel.message) == ("ModelNotReady", "Model m is not Ready (deleted)")
