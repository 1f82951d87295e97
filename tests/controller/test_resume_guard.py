"""A resume is never sent while a cancel of its attempt is in flight (a new user's trial with
``preemption: Suspend``: the reconcile loop's re-sent ``ResumeJob`` cleared ``spec.suspend`` in
the same second the preemptor's cancel set it, and the Job ran on resumed for 31 s while its
status said ``WaitingForIdle``). The guard is the one the create path has
(``Actor.cancelled_in_memory``); no API call is made here: the Job calls are recorded."""

from __future__ import annotations

from datetime import datetime, timezone

from kubernetes import client

from backfill.controller.actor import Actor
from backfill.core import events as ev
from backfill.core.commands import ResumeJob
from backfill.core.fold import fold
from backfill.core.state import World

AT = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
KEY = ("ns", "bf")
SPEC = {"modelRef": "m", "templateRef": "t", "idleFor": "1m", "maxRunDuration": "30m", "preemption": "Suspend"}


def _world() -> World:
    world = World()
    for pos, e in enumerate(
        [
            ev.BackfillApplied(at=AT, namespace="ns", name="bf", uid="u1", generation=1, spec=SPEC),
            ev.AttemptAdmitted(at=AT, namespace="ns", backfill="bf", uid="u1", attempt=3, generation=1, job_name="bf-job-3", model="m"),
        ],
        1,
    ):
        world = fold(world, e, pos)
    assert world.backfills[KEY].attempt.number == 3
    return world


def _resumes_sent(cancelling: set[tuple[tuple[str, str], int]]) -> list[tuple]:
    api = client.ApiClient()  # never called: suspend_job is replaced below
    actor = Actor(api, append=lambda records: [], clock=lambda: AT)
    sent: list[tuple] = []
    actor.suspend_job = lambda key, job, suspend, uid, owner: sent.append((key, job, suspend))  # type: ignore[method-assign]
    actor.cancelled_in_memory = lambda key, attempt: (key, attempt) in cancelling
    try:
        actor.execute([ResumeJob(KEY, "bf-job-3")], _world(), AT)
    finally:
        actor.close()
        api.close()
    return sent


def test_a_resume_is_re_sent_when_no_cancel_is_in_flight():
    assert _resumes_sent(set()) == [(KEY, "bf-job-3", False)]
    assert _resumes_sent({(KEY, 2)}) == [(KEY, "bf-job-3", False)]  # an earlier attempt's cancel: not this one's


def test_a_resume_is_held_while_its_attempts_cancel_is_in_flight():
    assert _resumes_sent({(KEY, 3)}) == []
