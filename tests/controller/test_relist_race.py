"""The relist race (issue 8): a Job created while a relist's list call is in flight must not be
recorded as deleted.

The interleaving is injected deterministically: the fake list call returns the cluster as it was
when the list was served (no Job yet) and, while "in flight", the actor's ``JobCreated`` is folded
into the log's projection. The old watcher read the log's belief *after* the list and reported
the brand-new Job as ``JobDeleted`` (ending the attempt and letting a second one start while the
first Job kept running).
"""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from types import SimpleNamespace

from backfill.controller.kinds import KINDS
from backfill.controller.translate import Translator
from backfill.controller.watchers import Watcher
from backfill.core import events as ev
from backfill.core.projector import fold
from backfill.core.state import World
from backfill.settings import Settings

from ..core.builders import TEMPLATE

NS = "ns"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
JOB_KIND = next(k for k in KINDS if k.name == "job")


def _world_with_admitted_attempt() -> World:
    w = World()
    for pos, e in enumerate(
        [
            ev.ModelReady(at=NOW, namespace=NS, model="m", node="n1"),
            ev.CronJobSeen(at=NOW, namespace=NS, name="cj", job_template=TEMPLATE),
            ev.BackfillApplied(at=NOW, namespace=NS, name="b", uid="u1", generation=1, spec={"modelRef": "m", "templateRef": "cj"}),
            ev.AttemptAdmitted(at=NOW, namespace=NS, backfill="b", uid="u1", attempt=1, generation=1, job_name="b-1", model="m", node="n1", basis=3),
        ],
        start=1,
    ):
        w = fold(w, e, pos)
    return w


def _watcher(known, list_call, observed: list) -> Watcher:
    """A job Watcher on fakes: ``known()`` is the log's belief, ``list_call`` the API's answer."""
    return Watcher(
        JOB_KIND,
        None,
        namespace=NS,
        translate=JOB_KIND.translate(Translator()),
        known=known,
        observe=lambda pairs: observed.extend(pairs) or [],
        clock=lambda: NOW,
        settings=Settings(),
        stop=threading.Event(),
        list_call=list_call,
    )


def _empty_list(rv: str):
    return SimpleNamespace(data=json.dumps({"items": [], "metadata": {"resourceVersion": rv}}))


def test_job_created_during_the_list_is_not_reported_deleted():
    state = {"world": _world_with_admitted_attempt()}

    def list_call(**_kw):
        # Served before the Job existed; meanwhile the actor created it and its JobCreated is folded.
        state["world"] = fold(state["world"], ev.JobCreated(at=NOW, namespace=NS, backfill="b", name="b-1", uid="job-uid"), 5)
        return _empty_list("7")

    observed: list = []
    w = _watcher(lambda: JOB_KIND.known(state["world"]), list_call, observed)
    assert w.relist() == "7"
    assert [type(e).__name__ for e, _ in observed] == []


def test_job_known_before_the_list_and_missing_from_it_is_reported_deleted():
    world = fold(_world_with_admitted_attempt(), ev.JobCreated(at=NOW, namespace=NS, backfill="b", name="b-1", uid="job-uid"), 5)
    observed: list = []
    _watcher(lambda: JOB_KIND.known(world), lambda **_kw: _empty_list("8"), observed).relist()
    assert [(type(e).__name__, e.backfill, e.name, e.uid) for e, _ in observed] == [("JobDeleted", "b", "b-1", "job-uid")]
