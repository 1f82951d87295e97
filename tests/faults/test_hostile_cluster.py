"""Hostile objects as the real apiserver stores them, under the controller subprocess: it never
crashes, one bad object never stalls the others, every invalid declaration ends Blocked with a
reason, and a Model whose ``lastActiveTime`` is 9999-12-31T23:59:59Z or becomes unreadable
while its Job runs has that Job cancelled."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from .harness import JobPlayer, Kube, assert_replay_clean, log_events, of_type, timed, wait_for
from .workload import CANCEL_BOUND_SECONDS, TEMPLATE, start_running

pytestmark = pytest.mark.kube

NAME_253 = ("b" * 62 + ".") * 4 + "b"  # a 253-character DNS subdomain
assert len(NAME_253) == 253


def test_hostile_objects_do_not_stall_the_good_one(kube: Kube, player: JobPlayer, controllers):
    kube.cronjob(TEMPLATE)
    kube.model("good-model", node="good-node")
    kube.model("long-node", node="n" * 63, gpu={"node": "x" * 300})  # a 300-character node name
    kube.model("far-future", node="node-ff", lastActiveTime="9999-12-31T23:59:59Z")
    proc = controllers().start()
    proc.wait_ready()
    bad = {
        NAME_253: ({"template": "no-such-cronjob-2"}, "TemplateNotFound"),
        "repeat": ({"repeatAfter": "30s"}, "InvalidRepeatAfter"),
        "env-x": ({"env": {"BAD NAME": "x"}}, "InvalidEnvironment"),
        "ghost": ({"model": "no-such-model"}, "ModelNotFound"),
        "no-template": ({"template": "no-such-cronjob"}, "TemplateNotFound"),
    }
    refused = []  # invalid declarations the CRD's schema already refuses never reach the controller
    for name, (spec, _) in bad.items():
        try:
            kube.backfill(name, **{"model": "far-future", "template": TEMPLATE, **spec})
        except ApiException as exc:
            assert exc.status == 422, exc
            refused.append(name)
    print(f"refused by the CRD: {[n[:20] for n in refused]}")
    kube.backfill("plain", model="long-node", template=TEMPLATE, env={f"VAR_{i}": "v" * 10_240 for i in range(32)})
    kube.backfill("far", model="far-future", template=TEMPLATE)
    kube.backfill("good", model="good-model", template=TEMPLATE)

    job = start_running(kube, player, "good")
    for name, (_, reason) in bad.items():
        if name in refused:
            continue
        st = wait_for(lambda: kube.status(name).get("phase") == "Blocked" and kube.status(name), timeout=10, what=f"{name[:20]} Blocked")
        assert st["reason"] == reason, (name[:20], st)
    # A lastActiveTime in year 9999 is not believed (more than an hour ahead of the clock): it is
    # demand when observed, so "far" is admitted after its idle window, not in year 9999.
    wait_for(lambda: kube.status("far").get("phase") in ("Starting", "Running"), timeout=15, what="far admitted")
    assert proc.alive, proc.tail()

    # lastActiveTime at the end of the calendar while a Job runs: demand, cancelled.
    kube.set_status("models", "good-model", {"lastActiveTime": "9999-12-31T23:59:59Z"})
    timed(lambda: kube.job(job) is None, timeout=CANCEL_BOUND_SECONDS, what="Job cancelled by a 9999 lastActiveTime")
    wait_for(lambda: kube.status("good").get("phase") == "WaitingForIdle", timeout=10, what="good WaitingForIdle (not stuck Cancelling)")
    # lastActiveTime becomes unreadable while a Job runs: a valid RFC 3339 date-time (the CRD's
    # format check passes) that is no representable instant in UTC (year 10000 there).
    plain = start_running(kube, player, "plain")
    env = {e.name: e.value for e in kube.job(plain).spec.template.spec.containers[0].env}
    assert all(env[f"VAR_{i}"] == "v" * 10_240 for i in range(32))
    kube.set_status("models", "long-node", {"lastActiveTime": "9999-12-31T23:59:59-23:59"})
    timed(lambda: kube.job(plain) is None, timeout=CANCEL_BOUND_SECONDS, what="Job cancelled by an unreadable lastActiveTime")
    assert proc.alive, proc.tail()
    pg, schema = controllers.pg, controllers.schema
    # The demand reaches the log beside (after) the cancel, never before it: wait for it there.
    wait_for(
        lambda: "lastActiveTime-unreadable" in {e.source for _, e in of_type(log_events(pg.url, schema), "ForegroundRequest")},
        timeout=10, what="the unreadable lastActiveTime recorded as foreground demand in the log",
    )
    assert_replay_clean(pg.url, schema)


def test_oversized_job_does_not_stay_starting(kube: Kube, controllers):
    kube.cronjob(TEMPLATE)
    kube.model("m", node="node-m")
    proc = controllers().start()
    proc.wait_ready()
    big_env = {f"VAR_{i}": "é" * 10_240 for i in range(32)}
    kube.backfill("big-env", model="m", template=TEMPLATE, env=big_env)
    # 32 values of 10 kB of a non-ASCII letter, copied into both containers: the Job body is
    # ~3.9 MB as JSON (each letter escaped), past the apiserver's 3 MiB request limit (413).
    # It must not stay Starting for ever: created, or Blocked/Failed with a reason.
    def settled() -> bool:
        st = kube.status("big-env")
        return bool([j for j in kube.jobs() if j.metadata.name.startswith("big-env-")]) or (
            st.get("phase") in ("Blocked", "Failed") and bool(st.get("reason"))
        )

    wait_for(settled, timeout=15, what="big-env created, or Blocked/Failed with a reason")
    print(f"oversized Job: status {kube.status('big-env').get('phase')} {kube.status('big-env').get('reason')}")
    assert proc.alive, proc.tail()


def _stamp(seconds_from_now: float) -> str:
    from datetime import datetime, timedelta, timezone

    return (datetime.now(timezone.utc) + timedelta(seconds=seconds_from_now)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_last_active_time_moved_back_cancels_and_one_ahead_cancels_once_across_a_restart(kube: Kube, player: JobPlayer, controllers):
    """An adversarial trial, two defects of ``lastActiveTime``:

    - a proxy whose clock was 10 minutes behind wrote it every 5 s; no write moved the value
      forward, none was demand, and a Job was admitted and ran through them. Each such write is
      demand now, dated by the write (its ``managedFields`` stamp, the API server's clock): a
      value further behind it than the signal granularity is read as the write allows;
    - a value 2 h ahead, left unchanged, cancelled the running Job again at every restart ("demand
      now" each time, deduplicated in the log: replay then found the cancels unexplained). Dated
      at its write, a restart's look at the same write is nothing new."""
    import time

    pg, schema = controllers.pg, controllers.schema
    kube.cronjob(TEMPLATE)
    kube.model("m", node="node-m", lastActiveTime=_stamp(-3600))
    kube.backfill("bf", model="m", template=TEMPLATE, idleFor="2s")
    proc = controllers().start()
    proc.wait_ready()
    job = start_running(kube, player, "bf")
    written = time.time()
    kube.set_status("models", "m", {"lastActiveTime": _stamp(-7200)})  # moved back an hour
    timed(lambda: kube.job(job) is None, timeout=CANCEL_BOUND_SECONDS, what="Job cancelled by a lastActiveTime moved back")
    # dated at the write's stamp (to the second; granularity 0 here), not at the value 2 h back
    # (it reaches the log beside the cancel, not before it: waited for)
    wait_for(
        lambda: [e for _, e in of_type(log_events(pg.url, schema), "ForegroundRequest") if abs(e.at.timestamp() - written) <= 2.0],
        timeout=10, what="the write's demand in the log",
    )  # fmt: skip

    job = start_running(kube, player, "bf")
    kube.set_status("models", "m", {"lastActiveTime": _stamp(7200)})  # 2 h ahead: not believed
    timed(lambda: kube.job(job) is None, timeout=CANCEL_BOUND_SECONDS, what="Job cancelled by a lastActiveTime 2 h ahead")
    job = start_running(kube, player, "bf")
    assert proc.terminate() == 0
    proc.start()
    proc.wait_ready()
    time.sleep(3.0)  # the relists are in (ready) and the loop has decided on them
    assert kube.job(job) is not None, "the unchanged lastActiveTime cancelled the running Job again after the restart"
    assert kube.status("bf").get("phase") == "Running", kube.status("bf")
    ahead = [e for _, e in of_type(log_events(pg.url, schema), "ForegroundRequest") if e.source == "lastActiveTime-unreadable"]
    assert len(ahead) == 1, ahead
    assert_replay_clean(pg.url, schema)
