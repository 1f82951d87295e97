"""The actor's own ``JobCreated`` carries the Job's ``creationTimestamp`` (whole seconds), as the
watcher's does: whichever reaches the log first (same idempotency key), ``status.startedAt`` has
one precision (a new user's trial saw whole seconds and microseconds)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from backfill.controller.actor import Actor
from backfill.core import events as ev
from backfill.core.fold import fold
from backfill.core.state import World

pytestmark = pytest.mark.kube

CLOCK = datetime(2026, 12, 5, 12, 0, 0, 123456, tzinfo=timezone.utc)  # microseconds, unlike any API time


def test_the_actors_jobcreated_carries_the_jobs_creation_timestamp(kube):
    kube.cronjob("model-eval-gauntlet")
    cronjob = kube.batch.read_namespaced_cron_job("model-eval-gauntlet", kube.ns)
    template = kube.api.sanitize_for_serialization(cronjob.spec.job_template)
    mbf = kube.backfill("bf")
    uid = mbf["metadata"]["uid"]
    world = World()
    for pos, e in enumerate(
        [
            ev.CronJobSeen(at=CLOCK, namespace=kube.ns, name="model-eval-gauntlet", job_template=template),
            ev.BackfillApplied(at=CLOCK, namespace=kube.ns, name="bf", uid=uid, generation=1, spec=mbf["spec"]),
        ],
        1,
    ):
        world = fold(world, e, pos)
    observed: list = []
    actor = Actor(kube.api, append=lambda records: [], clock=lambda: CLOCK, observe=observed.extend)
    try:
        actor.create_job((kube.ns, "bf"), uid, 1, "bf-job-1", world)
    finally:
        actor.close()
    job = kube.job("bf-job-1")
    assert job is not None
    (created,) = [e for e, _ in observed if isinstance(e, ev.JobCreated)]
    assert created.uid == job.metadata.uid
    assert created.at == job.metadata.creation_timestamp and created.at.microsecond == 0 and created.at != CLOCK
