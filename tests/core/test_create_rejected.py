"""A refused Job create is not a Job failure (issue 13 item 2).

Permanent (422 Invalid, 400): Blocked with reason ``JobRejected`` and the API server's message,
until the spec or the CronJob template changes. Transient (403 quota, 5xx, 429, webhook
unavailable, no response): the attempt stays Starting, the create is retried with back-off
(10 s, 20 s, ... at most 300 s, never before Retry-After) and the status says so. Neither
counts as a completion nor starts a repeatAfter cooldown.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from backfill.core import events as ev
from backfill.core.commands import Admit, Block, Cancel, CreateJob, Unblock, WakeAt
from backfill.core.runs import row_of
from backfill.core.projector import status_of

from .builders import NS, TEMPLATE, Log, t

KEY = (NS, "b")
QUOTA = 'jobs "b-1" is forbidden: exceeded quota: q, requested: count/jobs.batch=1, used: count/jobs.batch=1, limited: count/jobs.batch=1'
INVALID = 'Job.batch "b-1" is invalid: spec.template.spec.containers[0].image: Required value'


def admitted(**spec):
    log = Log().ready(0).cronjob(0).apply(0, repeatAfter="1h", **spec)
    (cmd,) = [c for c in log.decide(600) if isinstance(c, Admit)]
    log.admit(cmd, 600)
    return log, cmd


def reject(log, cmd, at, n, code, reason, message, permanent, retry_after=None):
    template_pos = log.world.templates[(NS, "cj")].pos
    return log.add(
        ev.JobCreateRejected(
            at=t(at), namespace=NS, backfill="b", name=cmd.job_name, attempt=cmd.attempt, rejection=n, code=code,
            reason=reason, message=message, permanent=permanent, template_pos=template_pos, retry_after=retry_after,
        )
    )


def status(log, at):
    return status_of(log.world, KEY, t(at))


@pytest.mark.parametrize("code", [400, 422])
def test_a_permanent_refusal_blocks_with_the_api_servers_message(code):
    log, cmd = admitted()
    reject(log, cmd, 601, 1, code, "Invalid", INVALID, ev.create_rejection_is_permanent(code))
    st = status(log, 602)
    assert (st["phase"], st["reason"]) == ("Blocked", "JobRejected")
    assert INVALID in st["message"] and f"HTTP {code}" in st["message"]
    cmds = log.decide(602)
    assert [type(c) for c in cmds] == [Block] and cmds[0].reason == "JobRejected"
    b = log.world.backfills[KEY]
    row = row_of(b, b.attempt)
    assert (row.result, row.reason, row.running_seconds) == ("cancelled", "JobRejected", 0.0)
    assert b.failed_generation == -1 and b.succeeded_at is None  # not Failed, no cooldown
    assert not log.world.live  # the slot is free for a contender


def test_the_block_holds_until_the_template_or_the_spec_changes():
    log, cmd = admitted()
    reject(log, cmd, 601, 1, 422, "Invalid", INVALID, True)
    (block,) = log.decide(602)
    log.add(ev.BackfillBlocked(at=t(602), namespace=NS, backfill="b", cause=block.cause, reason=block.reason, message=block.message))
    assert log.decide(5000) == []  # still blocked, nothing to do
    log.cronjob(5000)  # the same template seen again (e.g. a CronJob status update)
    assert log.decide(5001) == []
    fixed = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "fixed"}]}}}}
    log.cronjob(5002, template=fixed)
    cmds = log.decide(5003)
    assert [type(c) for c in cmds] == [Unblock, Admit] and cmds[1].attempt == 2


def test_a_spec_change_clears_a_permanent_refusal():
    log, cmd = admitted()
    reject(log, cmd, 601, 1, 422, "Invalid", INVALID, True)
    log.apply(700, gen=2, repeatAfter="2h")
    assert status(log, 1400)["phase"] != "Blocked"
    assert any(isinstance(c, Admit) for c in log.decide(1400))


def test_a_refusal_of_an_older_template_is_retried_not_blocked():
    log, cmd = admitted()
    log.cronjob(601, template={"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "v2"}]}}}})
    log.add(ev.JobCreateRejected(at=t(602), namespace=NS, backfill="b", name=cmd.job_name, attempt=1, rejection=1,
                                 code=422, reason="Invalid", message=INVALID, permanent=True, template_pos=2))
    st = status(log, 603)
    assert (st["phase"], st["reason"]) == ("Starting", "CreateRetrying")


def test_a_transient_refusal_backs_off_and_is_shown():
    log, cmd = admitted()
    reject(log, cmd, 601, 1, 403, "Forbidden", QUOTA, False)
    st = status(log, 605)
    assert (st["phase"], st["reason"]) == ("Starting", "CreateRetrying")
    assert "HTTP 403 Forbidden" in st["message"] and "exceeded quota" in st["message"]
    assert log.decide(605) == [WakeAt(KEY, t(611))]  # 10 s after the refusal
    assert log.decide(611) == [CreateJob(KEY, 1, cmd.job_name), WakeAt(KEY, t(641))]
    reject(log, cmd, 611, 2, 403, "Forbidden", QUOTA, False)
    assert log.decide(612) == [WakeAt(KEY, t(631))]  # then 20 s
    reject(log, cmd, 631, 3, 500, "InternalError", 'failed calling webhook "w": connection refused', False)
    assert log.decide(632) == [WakeAt(KEY, t(671))]  # then 40 s
    b = log.world.backfills[KEY]
    assert b.attempt.lifecycle == "Starting" and b.attempts == 1 and b.succeeded_at is None
    log.job("JobCreated", cmd.job_name, 671)
    assert status(log, 672)["phase"] == "Running"


def test_back_off_is_capped_and_honours_retry_after():
    log, cmd = admitted()
    reject(log, cmd, 601, 1, 429, "TooManyRequests", "slow down", False, retry_after=45)
    assert log.decide(602) == [WakeAt(KEY, t(646))]
    for n in range(2, 12):
        reject(log, cmd, 1000 * n, n, 503, "ServiceUnavailable", "busy", False)
    assert log.decide(11001) == [WakeAt(KEY, t(11000 + 300))]


def test_a_late_or_repeated_refusal_is_ignored():
    log, cmd = admitted()
    reject(log, cmd, 601, 1, 403, "Forbidden", QUOTA, False)
    reject(log, cmd, 611, 2, 403, "Forbidden", QUOTA, False)
    before = log.world.backfills[KEY].rejection
    reject(log, cmd, 612, 1, 422, "Invalid", INVALID, True)  # an older refusal, late
    assert log.world.backfills[KEY].rejection == before
    log.job("JobCreated", cmd.job_name, 640)
    reject(log, cmd, 641, 3, 422, "Invalid", INVALID, True)  # the Job exists: nothing to refuse
    assert status(log, 642)["phase"] == "Running"


def test_foreground_demand_still_cancels_a_retrying_attempt():
    log, cmd = admitted()
    reject(log, cmd, 601, 1, 403, "Forbidden", QUOTA, False)
    log.request(605)
    assert [c.reason for c in log.decide(605) if isinstance(c, Cancel)] == ["ForegroundDemand"]


def test_classification():
    permanent = [c for c in (0, 400, 403, 404, 409, 422, 429, 500, 502, 503, 504) if ev.create_rejection_is_permanent(c)]
    assert permanent == [400, 422]


def test_the_event_round_trips_with_a_key_per_refusal():
    e = ev.JobCreateRejected(at=t(1), namespace=NS, backfill="b", name="b-x-1", attempt=1, rejection=2, code=403)
    assert ev.decode(e.type, 1, ev.encode(e).data) == e
    assert e.natural_key() == f"job/{NS}/b-x-1/JobCreateRejected/2"
