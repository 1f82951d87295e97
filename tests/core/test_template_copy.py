"""What of a CronJob's jobTemplate is not copied into the Job (cluster-contract "Job copied from
the CronJob", and the controller's own rules)."""

from __future__ import annotations

import copy

from backfill.core.jobtemplate import build_job
from backfill.core.spec import parse_spec

TEMPLATE = {
    "spec": {
        "suspend": True,
        "backoffLimit": 2,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}},
    }
}


def test_a_suspended_job_template_gives_a_job_that_runs():
    """A trial: a jobTemplate with ``suspend: true`` was copied as is; the Job ran nothing while
    the ModelBackfill said Running/JobActive for ever and held its model (its deadline never
    starts while suspended). The copy leaves ``suspend`` out; the rest of the spec is kept, and
    the CronJob's template is not changed."""
    before = copy.deepcopy(TEMPLATE)
    spec = parse_spec({"modelRef": "m", "templateRef": "t", "maxRunDuration": "15m", "preemption": "Suspend"})
    job = build_job(TEMPLATE, namespace="ns", backfill="bf", backfill_uid="u", attempt=1, spec=spec)
    assert "suspend" not in job["spec"]
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (2, 900)
    assert TEMPLATE == before
