"""``status.nodeName`` names the Model's node only while the Model exists (a new user's trial:
``kubectl get mbf`` showed ``Blocked``/``ModelNotFound`` beside the deleted Model's node)."""

from __future__ import annotations

from backfill.core import events as ev
from backfill.core.projector import status_of

from .builders import NS, Log, t


def test_a_deleted_models_node_is_not_the_status_node():
    log = Log().ready(0, node="node-a").cronjob(0).apply(0)
    assert status_of(log.world, (NS, "b"), t(1))["nodeName"] == "node-a"
    log.add(ev.ModelDeleted(at=t(2), namespace=NS, model="m"))
    st = status_of(log.world, (NS, "b"), t(3))
    assert (st["phase"], st["reason"], st["nodeName"]) == ("Blocked", "ModelNotFound", None)
    log.ready(4, node="node-b")  # created again elsewhere
    assert status_of(log.world, (NS, "b"), t(5))["nodeName"] == "node-b"


def test_the_status_of_an_admission_names_the_attempt_being_admitted_and_its_job():
    """Trials read ``Starting``/``Admitted`` with the previous attempt count and no jobName while
    an admission was recorded (once for 10 s: the leader died before creating the Job)."""
    from backfill.core.commands import Admit

    from .builders import running

    log, first = running(600)
    log.job("JobSucceeded", first.job_name, 700)
    log.apply(800, gen=2, repeatAfter="1m")  # a new generation: admitted again after its window
    (admit,) = [c for c in log.decide(1500) if isinstance(c, Admit)]
    st = status_of(log.world, (NS, "b"), t(1500))
    assert (st["phase"], st["reason"]) == ("Starting", "Admitted")
    assert admit.attempt == 2 and admit.job_name != first.job_name
    assert (st["attempts"], st["jobName"], st["startedAt"], st["nodeName"]) == (2, admit.job_name, None, "n1")
    log.admit(admit, 1500)  # recorded: the same attempt and Job, before the Job is created
    after = status_of(log.world, (NS, "b"), t(1500))
    assert (after["attempts"], after["jobName"]) == (2, admit.job_name)
