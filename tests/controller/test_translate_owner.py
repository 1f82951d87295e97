"""A Job maps back to its ModelBackfill through the controller ownerReference (issue 13 item 1)."""

from __future__ import annotations

from datetime import datetime, timezone

from backfill.controller.translate import MODIFIED, Translator
from backfill.core import events as ev
from backfill.core.jobtemplate import build_job
from backfill.core.spec import parse_spec

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)
TEMPLATE = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}


def test_a_job_of_a_253_character_backfill_names_it_in_full():
    name = ".".join(["a" * 62] * 4) + "bb"  # 253 characters
    assert len(name) == 253
    job = build_job(TEMPLATE, namespace="ns", backfill=name, backfill_uid="u1", attempt=1, spec=parse_spec({"modelRef": "m", "templateRef": "t"}))
    job["metadata"].update(uid="job-uid", resourceVersion="7", creationTimestamp="2026-01-05T12:00:00Z")
    job["status"] = {"startTime": "2026-01-05T12:00:01Z"}
    events = [e for e, _ in Translator().job(MODIFIED, job, NOW)]
    assert [type(e) for e in events] == [ev.JobCreated, ev.JobRunning]
    assert {e.backfill for e in events} == {name}
    assert {e.name for e in events} == {job["metadata"]["name"]}


def test_a_relisted_job_of_a_long_named_backfill_matches_the_known_one():
    # The relist compares each listed Job with the live attempts it knows, as "backfill/job":
    # with the hashed label it would look vanished (a JobDeleted for a Job that still runs).
    from backfill.controller.kinds import _job_list_name

    name = ".".join(["a" * 62] * 4) + "bb"
    job = build_job(TEMPLATE, namespace="ns", backfill=name, backfill_uid="u1", attempt=3, spec=parse_spec({"modelRef": "m", "templateRef": "t"}))
    assert _job_list_name(job) == f"{name}/{job['metadata']['name']}"
