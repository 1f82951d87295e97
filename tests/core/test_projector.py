"""Scenario table for the projector: every phase and reason of the seed, values computed by hand."""

from __future__ import annotations

import pytest

from backfill.core import events as ev
from backfill.core.commands import Admit, Block, Cancel, CreateJob, DeleteJob, ReleaseFinalizer, Unblock, WakeAt
from backfill.core.projector import CONFIRM_RECHECK_SECONDS, RETRY_SECONDS
from backfill.core.projector import status_of
from backfill.core.timefmt import rfc3339

from .builders import NS, Log, t

KEY = (NS, "b")
GPU_TEMPLATE = {
    "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
}


def base(**spec) -> Log:
    return Log().ready(0).cronjob(0).apply(0, **spec)


def kinds(cmds):
    return [type(c).__name__ for c in cmds]


def phase(log: Log, at: float) -> tuple[str, str]:
    s = status_of(log.world, KEY, t(at))
    return s["phase"], s["reason"]


def running(log: Log, admit_at: float = 600) -> tuple[Log, Admit]:
    """Admit at ``admit_at`` and observe the Job: phase Running."""
    (cmd,) = [c for c in log.decide(admit_at) if isinstance(c, Admit)]
    log.admit(cmd, admit_at).job("JobCreated", cmd.job_name, admit_at)
    assert phase(log, admit_at) == ("Running", "JobActive")
    return log, cmd


# --------------------------------------------------------------------------- WaitingForIdle


def test_waits_for_the_full_idle_window_then_admits_at_idle_since_plus_idle_for():
    log = base()  # Ready at 0, idleFor 10m
    log.request(100, busy=130)  # busy until 130 -> due at 730
    assert kinds(log.decide(729)) == ["WakeAt"]
    assert log.decide(729)[0].at == t(730)
    assert phase(log, 729) == ("WaitingForIdle", "IdleWindow")
    assert status_of(log.world, KEY, t(729))["idleSince"] == rfc3339(t(130))
    (admit,) = log.decide(730)
    assert isinstance(admit, Admit)
    assert (admit.attempt, admit.model, admit.node, admit.cause) == (1, "m", "n1", 4)
    assert admit.job_name.startswith("b-") and admit.job_name.endswith("-1")


def test_any_foreground_request_resets_idle_since():
    log = base().request(100)
    log.request(500)  # inside the window: restarts it
    assert log.decide(700)[0] == WakeAt(KEY, t(1100))


def test_model_not_ready_waits_with_reason():
    log = Log().not_ready(0).cronjob(0).apply(0)
    assert kinds(log.decide(5000)) == []
    assert phase(log, 5000) == ("WaitingForIdle", "ModelNotReady")


def test_a_model_with_no_node_admits_nothing_until_its_node_is_known():
    # A trial: a Ready Model with neither status.gpu.node nor a hostname nodeSelector got a Job
    # that no GamingSession or GPULease could ever cancel. Fail-closed: it waits, saying why;
    # once the node is known, a full idle window runs from then (a Model on a new node is Ready
    # there since that moment): due at 5001 + 600.
    log = Log().ready(0, node="").cronjob(0).apply(0)
    assert [c for c in log.decide(5000) if isinstance(c, Admit)] == []
    assert phase(log, 5000) == ("WaitingForIdle", "ModelNodeUnknown")
    assert "names no node" in status_of(log.world, KEY, t(5000))["message"]
    log.ready(5001, node="n1")
    assert log.decide(5001) == [WakeAt(KEY, t(5601))]
    (admit,) = [c for c in log.decide(5601) if isinstance(c, Admit)]
    assert admit.node == "n1"


def test_idle_window_starts_when_the_model_becomes_ready():
    log = Log().not_ready(0).cronjob(0).apply(0).ready(1000)
    assert log.decide(1000)[0] == WakeAt(KEY, t(1600))


# --------------------------------------------------------------------------- Starting / Running


def test_starting_until_the_job_is_observed_and_create_is_reissued_at_once():
    # The re-issue is emitted on every decide until the Job is observed (the actor paces the
    # calls), so a controller restarted after recording the admission creates the Job at once.
    log = base()
    (cmd,) = log.decide(600)
    log.admit(cmd, 600)
    assert phase(log, 600) == ("Starting", "Admitted")
    assert log.decide(600) == [CreateJob(KEY, 1, cmd.job_name), WakeAt(KEY, t(600 + RETRY_SECONDS))]
    assert log.decide(600 + RETRY_SECONDS)[0] == CreateJob(KEY, 1, cmd.job_name)
    log.job("JobCreated", cmd.job_name, 601)
    assert phase(log, 601) == ("Running", "JobActive")
    assert status_of(log.world, KEY, t(601))["jobName"] == cmd.job_name
    assert status_of(log.world, KEY, t(601))["conditions"][0]["status"] == "True"


# --------------------------------------------------------------------------- Cancelling


def test_foreground_demand_cancels_and_retry_needs_a_fresh_window():
    log, admit = running(base())
    log.request(700)
    (cancel,) = log.decide(700)
    assert isinstance(cancel, Cancel)
    assert (cancel.reason, cancel.attempt, cancel.cause) == ("ForegroundDemand", 1, len(log.events))
    log.cancel(cancel, 700)
    assert phase(log, 700) == ("Cancelling", "ForegroundDemand")
    log.job("JobDeleted", admit.job_name, 702)
    a = log.world.backfills[KEY].attempt
    assert (a.result, a.end_reason) == ("preempted", "ForegroundDemand")
    assert phase(log, 702) == ("WaitingForIdle", "IdleWindow")
    # a fresh full window from the request at 700
    assert log.decide(1299)[0] == WakeAt(KEY, t(1300))
    assert log.decide(1300)[0].attempt == 2


def test_a_deletion_nothing_explains_needs_a_fresh_window_from_the_deletion():
    # The Job goes at 900 with no cancel condition and no cancel in the log (its preemption's
    # report and decision were lost with a leader, or someone deleted it by hand): the last
    # known busy time is the Ready at 0, whose window ended at 600, but the next attempt waits
    # a full idleFor (10m) from the deletion: due at 1500, not at once (fail-closed).
    log, admit = running(base())
    log.job("JobDeleted", admit.job_name, 900)
    a = log.world.backfills[KEY].attempt
    assert (a.result, a.end_reason) == ("cancelled", "JobDeleted")
    assert phase(log, 900) == ("WaitingForIdle", "IdleWindow")
    assert status_of(log.world, KEY, t(900))["idleSince"] == rfc3339(t(900))
    assert log.decide(901) == [WakeAt(KEY, t(1500))]
    assert log.decide(1499) == [WakeAt(KEY, t(1500))]
    assert log.decide(1500)[0].attempt == 2


def test_delete_is_reissued_while_cancelling():
    log, admit = running(base())
    log.request(700)
    (cancel,) = log.decide(700)
    log.cancel(cancel, 700)
    assert log.decide(710) == [DeleteJob(KEY, admit.job_name), WakeAt(KEY, t(710 + CONFIRM_RECHECK_SECONDS))]
    log.job("JobTerminating", admit.job_name, 710.5)  # a finalizer holds it: the status says so
    assert "still terminating" in status_of(log.world, KEY, t(711))["message"]
    log.job("JobDeleted", admit.job_name, 711)
    assert "DeleteJob" not in kinds(log.decide(712))


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda log: log.add(ev.GamingIntentStarted(at=t(700), namespace=NS, session="g", node="n1")), "GamingIntent"),
        (lambda log: log.add(ev.GPULeaseActive(at=t(700), namespace=NS, lease="l", node="n1")), "GPULeaseActive"),
        (lambda log: log.apply(700, gen=2, suspend=True), "Suspended"),
        (lambda log: log.apply(700, gen=2, idleFor="20m"), "SpecChanged"),
        (lambda log: log.add(ev.BackfillDeleting(at=t(700), namespace=NS, name="b", uid="u1")), "Deleted"),
        (lambda log: log.not_ready(700), "ModelNotReady"),
        (lambda log: log.ready(700, node="n2"), "NodeChanged"),
    ],
)
def test_each_cancel_condition_cancels_with_its_reason(make, reason):
    log, _ = running(base())
    make(log)
    cancels = [c for c in log.decide(700) if isinstance(c, Cancel)]
    assert [c.reason for c in cancels] == [reason]


def test_gaming_session_elsewhere_or_expired_does_not_cancel():
    log, _ = running(base())
    log.add(ev.GamingIntentStarted(at=t(700), namespace=NS, session="g", node="other"))
    log.add(ev.GamingIntentStarted(at=t(700), namespace=NS, session="h", node="n1", expires_at=t(650)))
    assert not [c for c in log.decide(701) if isinstance(c, Cancel)]


def test_lease_on_the_shared_group_cancels():
    log = Log().ready(0, shared="grp").cronjob(0).apply(0)
    log, _ = running(log)
    log.add(ev.GPULeaseActive(at=t(700), namespace=NS, lease="l", node="elsewhere", group="grp"))
    assert [c.reason for c in log.decide(700) if isinstance(c, Cancel)] == ["GPULeaseActive"]


def test_gate_end_restarts_the_idle_window_and_expiry_wakes():
    log = base()
    log.add(ev.GamingIntentStarted(at=t(100), namespace=NS, session="g", node="n1", expires_at=t(2000)))
    cmds = log.decide(1000)
    assert cmds == [WakeAt(KEY, t(2000))]
    assert phase(log, 1000) == ("WaitingForIdle", "GamingIntent")
    # expired at 2000 -> a full window from then
    assert log.decide(2000)[0] == WakeAt(KEY, t(2600))
    log.add(ev.GamingIntentEnded(at=t(2100), namespace=NS, session="g"))
    assert log.decide(2600)[0].attempt == 1


def test_contender_gate_one_active_backfill_per_model():
    log = base().apply(0, name="b2", uid="u2")
    cmds = log.decide(600)
    admits = [c for c in cmds if isinstance(c, Admit)]
    assert [c.key for c in admits] == [KEY]  # sorted keys, first wins
    log.admit(admits[0], 600)
    assert phase(log, 600) == ("Starting", "Admitted")
    s = status_of(log.world, (NS, "b2"), t(600))
    assert (s["phase"], s["reason"]) == ("WaitingForIdle", "ConcurrentBackfill")


def test_contender_gate_one_active_backfill_per_node():
    log = Log().ready(0, model="m", node="n1").ready(0, model="m2", node="n1").cronjob(0)
    log.apply(0, name="b", model="m").apply(0, name="b2", model="m2", uid="u2")
    admits = [c for c in log.decide(600) if isinstance(c, Admit)]
    assert [c.key for c in admits] == [KEY]


# --------------------------------------------------------------------------- Succeeded / Failed


def test_one_shot_success_is_terminal():
    log, admit = running(base())
    log.job("JobSucceeded", admit.job_name, 900)
    assert phase(log, 900) == ("Succeeded", "Completed")
    assert log.decide(100000) == []
    st = status_of(log.world, KEY, t(900))
    assert st["completionTime"] == rfc3339(t(900)) and st["conditions"][0]["status"] == "True"


def test_repeat_after_sets_next_run_time_then_readmits():
    log, admit = running(base(repeatAfter="1h"))
    log.job("JobSucceeded", admit.job_name, 900)
    st = status_of(log.world, KEY, t(1000))
    assert (st["phase"], st["reason"], st["nextRunTime"]) == ("Succeeded", "RepeatScheduled", rfc3339(t(4500)))
    assert log.decide(1000) == [WakeAt(KEY, t(4500))]
    assert log.decide(4500)[0].attempt == 2


def test_repeat_due_but_window_incomplete_waits_with_repeat_due():
    log, admit = running(base(repeatAfter="1h"))
    log.job("JobSucceeded", admit.job_name, 900)
    log.request(4400)
    assert phase(log, 4500) == ("WaitingForIdle", "RepeatDue")
    st = status_of(log.world, KEY, t(4500))
    assert st["message"] == f"the repeat is due after the cooldown; waiting for a continuous idle window; admission at {rfc3339(t(5000))} if the model stays idle"
    assert log.decide(4500) == [WakeAt(KEY, t(5000))]


def test_after_a_later_attempt_was_preempted_the_wait_is_a_plain_idle_window():
    """A trial: every wait after the first success said RepeatDue with the old nextRunTime."""
    log, admit = running(base(repeatAfter="1h"))
    log.job("JobSucceeded", admit.job_name, 900)
    (admit2,) = [c for c in log.decide(4500) if isinstance(c, Admit)]
    log.admit(admit2, 4500)
    log.job("JobCreated", admit2.job_name, 4500)
    log.request(4600)
    (cancel,) = [c for c in log.decide(4600) if isinstance(c, Cancel)]
    log.cancel(cancel, 4600)
    log.job("JobDeleted", admit2.job_name, 4601)
    st = status_of(log.world, KEY, t(4700))
    assert (st["phase"], st["reason"], st["nextRunTime"]) == ("WaitingForIdle", "IdleWindow", None)
    assert log.decide(4700) == [WakeAt(KEY, t(4600 + 600))]  # idleFor 10m from the cancel


def test_failure_is_terminal_until_the_spec_changes():
    log, admit = running(base(repeatAfter="1h"))
    log.job("JobFailed", admit.job_name, 800, reason="BackoffLimitExceeded")
    assert phase(log, 800) == ("Failed", "BackoffLimitExceeded")
    assert log.decide(100000) == []
    log.apply(100000, gen=2, repeatAfter="1h", idleFor="11m")
    assert log.decide(100000)[0].attempt == 2


def test_deadline_exceeded_is_a_failure():
    log, admit = running(base())
    log.job("JobFailed", admit.job_name, 1500, reason="DeadlineExceeded")
    assert log.world.backfills[KEY].attempt.result == "deadline_exceeded"
    assert phase(log, 1500) == ("Failed", "DeadlineExceeded")


# --------------------------------------------------------------------------- Suspended / Blocked / deletion


def test_suspended():
    log = base(suspend=True)
    assert log.decide(5000) == []
    assert phase(log, 5000) == ("Suspended", "Suspended")


@pytest.mark.parametrize(
    "spec, reason",
    [
        ({"env": {"1BAD": "x"}}, "InvalidEnvironment"),
        ({"env": {"FLEXINFER_WORKLOAD_CLASS": "foreground"}}, "InvalidEnvironment"),
        ({"env": {f"V{i}": "x" for i in range(33)}}, "InvalidEnvironment"),
        ({"repeatAfter": "30s"}, "InvalidRepeatAfter"),
        ({"idleFor": "1d"}, "InvalidSpec"),
        ({"modelRef": ""}, "InvalidSpec"),
    ],
)
def test_invalid_spec_blocks(spec, reason):
    log = base(**spec)
    (block,) = log.decide(5000)
    assert isinstance(block, Block) and block.reason == reason
    log.add(ev.BackfillBlocked(at=t(5000), namespace=NS, backfill="b", reason=block.reason, message=block.message))
    assert log.decide(5001) == []  # recorded once
    assert phase(log, 5001) == ("Blocked", reason)


def test_template_not_found_then_unblocked_when_the_cronjob_appears():
    log = Log().ready(0).apply(0)
    (block,) = log.decide(10)
    assert block.reason == "TemplateNotFound"
    log.add(ev.BackfillBlocked(at=t(10), namespace=NS, backfill="b", reason=block.reason, message=block.message))
    log.cronjob(20)
    cmds = log.decide(600)
    assert kinds(cmds) == ["Unblock", "Admit"]


def test_gpu_template_and_missing_model_block():
    log = Log().cronjob(0, template=GPU_TEMPLATE).ready(0).apply(0)
    (block,) = log.decide(10)
    assert block.reason == "GPURequestForbidden" and "nvidia.com/gpu=1" in block.message
    log2 = Log().cronjob(0).apply(0)
    assert log2.decide(10)[0].reason == "ModelNotFound"


def test_a_huge_block_message_is_cut_to_fit_the_status():
    """60 containers each requesting a GPU resource with a 317-character name: the Blocked
    message lists them all (about 23,000 characters), the status carries a bounded prefix (the
    CRD refuses a condition message over 32768, and the whole status write with it)."""
    from backfill.core.status import MAX_MESSAGE

    names = [f"{'g' * 240}.gpu.example.com/{'r%02d' % i}{'x' * 60}" for i in range(60)]
    containers = [{"name": f"c{i}", "image": "x", "resources": {"limits": {n: "1"}}} for i, n in enumerate(names)]
    log = Log().cronjob(0, template={"spec": {"template": {"spec": {"containers": containers}}}}).ready(0).apply(0)
    (block,) = log.decide(10)
    assert block.reason == "GPURequestForbidden" and len(block.message) > 32768 // 2
    st = status_of(log.world, KEY, t(10))
    cut = len(block.message) - (MAX_MESSAGE - 48)
    assert st["phase"] == "Blocked" and len(st["message"]) <= MAX_MESSAGE
    assert st["message"] == f"{block.message[:MAX_MESSAGE - 48]} ... ({cut} more characters)"
    assert st["conditions"][0]["message"] == st["message"]


def test_deletion_without_a_job_releases_the_finalizer_and_deleted_object_disappears():
    log = base().add(ev.BackfillDeleting(at=t(5), namespace=NS, name="b", uid="u1"))
    # re-issued each second until released (the actor paces the calls)
    assert log.decide(5) == [ReleaseFinalizer(KEY, "u1"), WakeAt(KEY, t(6))]
    log.add(ev.FinalizerReleased(at=t(5.5), namespace=NS, backfill="b", uid="u1"))
    assert log.decide(5.5) == []
    log.add(ev.BackfillDeleted(at=t(6), namespace=NS, name="b", uid="u1"))
    assert KEY not in log.world.backfills and log.decide(7) == []


def test_job_events_of_other_jobs_are_ignored():
    log, admit = running(base())
    before = log.world.backfills[KEY]
    log.job("JobSucceeded", "someone-elses-job", 700)
    assert log.world.backfills[KEY] == before


def test_unblock_is_emitted_once_blocking_clears():
    log = Log().ready(0).apply(0, env={"BAD NAME": "x"})
    (block,) = log.decide(1)
    log.add(ev.BackfillBlocked(at=t(1), namespace=NS, backfill="b", reason=block.reason, message=block.message))
    log.cronjob(2).apply(3, gen=2)
    assert kinds(log.decide(4)) == ["Unblock", "WakeAt"]
    assert isinstance(log.decide(4)[0], Unblock)


def test_generation_zero_is_not_mistaken_for_a_failed_or_succeeded_generation():
    # an object without metadata.generation: no attempt ever ended, so nothing is terminal
    log = Log().ready(0).cronjob(0).apply(0, gen=0)
    (admit,) = log.decide(600)
    assert isinstance(admit, Admit) and admit.generation == 0
    assert phase(log, 599) == ("WaitingForIdle", "IdleWindow")


def test_a_cancelled_attempt_clears_job_name_and_started_at():
    log, admit = running(base())
    assert status_of(log.world, KEY, t(650))["startedAt"] is not None
    log.request(700)
    (cancel,) = [c for c in log.decide(700) if isinstance(c, Cancel)]
    log.cancel(cancel, 700)
    log.job("JobDeleted", admit.job_name, 701)
    st = status_of(log.world, KEY, t(702))
    assert (st["phase"], st["jobName"], st["startedAt"]) == ("WaitingForIdle", None, None)


def test_a_deletion_nothing_explains_restarts_the_window_of_every_declaration_on_the_model():
    # Two declarations on Model m (a new user's trial): "a" runs, "b" waits behind it
    # (ConcurrentBackfill) with its idle window long complete. a's Job is deleted at 900 with
    # nothing in the log saying why: the doubt is about m's demand, so b too waits a full
    # idleFor (10m) from the deletion, due at 1500, not at once; a's own retry likewise.
    log = Log().ready(0).cronjob(0).apply(0, name="a", uid="ua").apply(0, name="b", uid="ub")
    admits = [c for c in log.decide(600) if isinstance(c, Admit)]
    assert [c.key[1] for c in admits] == ["a"]
    log.admit(admits[0], 600).job("JobCreated", admits[0].job_name, 601, backfill="a")
    assert not [c for c in log.decide(800) if isinstance(c, Admit)]  # b waits behind a
    log.job("JobDeleted", admits[0].job_name, 900, backfill="a")
    deleted_at = log.world.position
    for name in ("a", "b"):
        assert log.decide(900, [(NS, name)]) == [WakeAt((NS, name), t(1500))]
        st = status_of(log.world, (NS, name), t(900))
        assert st["idleSince"] == rfc3339(t(900)), (name, st)
    assert log.world.backfills[(NS, "a")].attempt.end_pos == deleted_at
    assert [c.key[1] for c in log.decide(1500) if isinstance(c, Admit)] in (["a"], ["b"])
