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
