"""Unit tests of backfill.controller.translate (pure: API JSON -> events with idempotency keys)."""

from __future__ import annotations

import pytest

import logging
from datetime import datetime, timedelta, timezone

from backfill.controller.translate import Translator, model_node, vanished
from backfill.core import events as ev

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def _meta(name: str, uid: str = "u1", rv: str = "10", **extra) -> dict:
    return {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv, **extra}


def _model(phase="Ready", rv="10", last_active=None, gpu_node=None, shared=None) -> dict:
    status: dict = {"phase": phase}
    if last_active:
        status["lastActiveTime"] = last_active
    if gpu_node:
        status["gpu"] = {"node": gpu_node}
    spec: dict = {"nodeSelector": {"kubernetes.io/hostname": "sel-node"}}
    if shared:
        spec["gpu"] = {"shared": shared}
    return {"metadata": _meta("gemma", rv=rv), "spec": spec, "status": status}


def test_model_ready_node_from_status_then_selector():
    t = Translator()
    [(e, key)] = t.model("ADDED", _model(gpu_node="gpu-node", shared="grp"), NOW)
    assert e == ev.ModelReady(at=NOW, namespace="ns", model="gemma", node="gpu-node", shared="grp", uid="u1")
    assert key == "model/u1/10/ready"
    assert model_node(_model()) == "sel-node"


def test_model_not_ready_and_deleted():
    t = Translator()
    [(e, key)] = t.model("MODIFIED", _model(phase="Loading", rv="11"), NOW)
    assert isinstance(e, ev.ModelNotReady) and e.phase == "Loading" and e.node == "sel-node" and e.uid == "u1"
    assert key == "model/u1/11/notready"
    [(d, dkey)] = t.model("DELETED", _model(), NOW)
    assert d == ev.ModelDeleted(at=NOW, namespace="ns", model="gemma") and dkey == "model/u1/deleted"


def test_last_active_time_only_moving_forward_is_foreground_demand():
    t = Translator()
    out = t.model("ADDED", _model(last_active="2026-01-02T03:00:00Z"), NOW)
    fg = [(e, k) for e, k in out if isinstance(e, ev.ForegroundRequest)]
    assert fg == [
        (
            ev.ForegroundRequest(
                at=datetime(2026, 1, 2, 3, tzinfo=timezone.utc),
                namespace="ns",
                model="gemma",
                busy_until=datetime(2026, 1, 2, 3, 1, tzinfo=timezone.utc),  # + the 60 s signal granularity
            ),
            "fg/u1/2026-01-02T03:00:00Z",
        )
    ]
    # Same value again (status rewrite, relist): no new demand.
    assert not [e for e, _ in t.model("MODIFIED", _model(rv="12", last_active="2026-01-02T03:00:00Z"), NOW) if isinstance(e, ev.ForegroundRequest)]
    # Older value: demand at its write (see the next test), not at the value.
    back = [e for e, _ in t.model("MODIFIED", _model(rv="13", last_active="2026-01-02T02:00:00Z"), NOW) if isinstance(e, ev.ForegroundRequest)]
    assert [(e.at, e.source) for e in back] == [(NOW, "lastActiveTime-moved-back")]
    later = t.model("MODIFIED", _model(rv="14", last_active="2026-01-02T03:01:00Z"), NOW)
    assert [k for e, k in later if isinstance(e, ev.ForegroundRequest)] == ["fg/u1/2026-01-02T03:01:00Z"]


def _written(obj: dict, when: str, manager: str = "proxy", fields: dict | None = None) -> dict:
    """``obj`` with a ``managedFields`` entry of ``manager`` stamped ``when`` owning ``fields``
    (default ``status.lastActiveTime``), as the API server writes one."""
    entry = {"manager": manager, "operation": "Update", "apiVersion": "ai.flexinfer/v1alpha1", "time": when,
             "fieldsType": "FieldsV1", "fieldsV1": fields or {"f:status": {"f:lastActiveTime": {}}}, "subresource": "status"}  # fmt: skip
    obj["metadata"].setdefault("managedFields", []).append(entry)
    return obj


def test_a_last_active_time_moved_back_is_demand_at_its_write(caplog):
    """An adversarial trial: a proxy whose clock was 10 minutes behind wrote lastActiveTime every
    5 s; no write moved the value forward, so none was demand, and a Job was admitted and ran
    through them. A value moved back is a write all the same: demand at the write's time (its
    managedFields stamp, by the API server's clock), busy for the signal granularity after it.
    Each such write is demand once; the latest value stays the bar for dating by value."""
    caplog.set_level(logging.DEBUG, logger="backfill.controller.translate")
    t = Translator()
    t.model("ADDED", _written(_model(last_active="2026-01-02T03:00:00Z"), "2026-01-02T03:00:30Z"), NOW)
    obj = _written(_model(rv="13", last_active="2026-01-02T02:59:40Z"), "2026-01-02T03:00:40Z")  # 60 s behind its write: believed
    _written(obj, "2026-01-02T03:04:04Z", manager="operator", fields={"f:status": {"f:phase": {}}})  # a later write of another field
    out = t.model("MODIFIED", obj, NOW)
    fg = [(e, k) for e, k in out if isinstance(e, ev.ForegroundRequest)]
    w = datetime(2026, 1, 2, 3, 0, 40, tzinfo=timezone.utc)
    assert [(e.at, e.busy_until, e.source) for e, _ in fg] == [(w, w + timedelta(seconds=60), "lastActiveTime-moved-back")]
    # The same write delivered again: nothing; a restarted controller (the log's latest value
    # as its memory) takes a value not past it as seen: nothing either.
    assert not [e for e, _ in t.model("MODIFIED", obj, NOW + timedelta(seconds=9)) if isinstance(e, ev.ForegroundRequest)]
    fresh = Translator(lambda ns, name: datetime(2026, 1, 2, 3, tzinfo=timezone.utc))
    assert not [e for e, _ in fresh.model("ADDED", obj, NOW + timedelta(seconds=30)) if isinstance(e, ev.ForegroundRequest)]
    # A write of another field by the value's owner (its stamp moves, the value does not): nothing
    # (a re-trial: each such write counted as demand and restarted the window).
    other = _written(_model(rv="14", last_active="2026-01-02T02:59:40Z"), "2026-01-02T03:02:00Z",
                     fields={"f:status": {"f:lastActiveTime": {}, "f:requestsServed": {}}})  # fmt: skip
    assert not [e for e, _ in t.model("MODIFIED", other, NOW) if isinstance(e, ev.ForegroundRequest)]
    # The next write moved back too (its own stamp): demand again, under its own key.
    again = _written(_model(rv="15", last_active="2026-01-02T02:59:45Z"), "2026-01-02T03:00:45Z")
    fg2 = [(e, k) for e, k in t.model("MODIFIED", again, NOW) if isinstance(e, ev.ForegroundRequest)]
    assert [e.at for e, _ in fg2] == [w + timedelta(seconds=5)] and fg2[0][1] != fg[0][1]
    # one info line per Model, the rest debug: a lagging proxy writes for ever
    assert [r.levelname for r in caplog.records if "moved back" in r.getMessage()] == ["INFO", "DEBUG"]
    # A value past the latest one is dated by itself again.
    later = t.model("MODIFIED", _model(rv="16", last_active="2026-01-02T03:04:30Z"), NOW)
    assert [(e.at, e.source) for e, _ in later if isinstance(e, ev.ForegroundRequest)] == [(datetime(2026, 1, 2, 3, 4, 30, tzinfo=timezone.utc), "lastActiveTime")]


def test_a_restart_takes_a_value_not_past_the_logs_as_seen_whatever_its_stamp():
    """A re-trial: the field's owner wrote another status field after its last lastActiveTime
    (its managedFields stamp moved); a restarted controller read the unchanged value by that
    newer stamp, as a new write, and cancelled the running Job. On the first look after a start,
    a value not past the log's latest is taken as seen; one past it is demand as always."""
    logged = datetime(2026, 1, 2, 3, 0, 0, tzinfo=timezone.utc)  # the log's latest (an activity time)
    moved = _written(_model(last_active="2026-01-02T02:59:00Z"), "2026-01-02T03:04:00Z",
                     fields={"f:status": {"f:lastActiveTime": {}, "f:observedGeneration": {}}})  # fmt: skip
    fresh = Translator(lambda ns, name: logged, signal_granularity=2)
    assert not [e for e, _ in fresh.model("ADDED", moved, NOW) if isinstance(e, ev.ForegroundRequest)]
    past = _written(_model(last_active="2026-01-02T03:00:30Z"), "2026-01-02T03:00:31Z")
    fresh = Translator(lambda ns, name: logged, signal_granularity=2)
    assert [e.at for e, _ in fresh.model("ADDED", past, NOW) if isinstance(e, ev.ForegroundRequest)] == [logged + timedelta(seconds=30)]


def test_a_last_active_time_far_behind_its_write_is_read_as_the_write_allows():
    """A re-trial: a proxy 40 s behind (signal granularity 2 s) wrote every 2 s once its values
    had passed the latest one seen; each was dated 40 s back, none extended the busy span, and a
    Job was admitted and ran 20 s through the writes. A value further behind its write than the
    granularity (plus 5 s) is read as the write's time less the granularity, keyed by the write."""
    t = Translator(signal_granularity=2)
    t.model("ADDED", _written(_model(last_active="2026-01-02T03:00:00Z"), "2026-01-02T03:00:00Z"), NOW)
    stamps = ["2026-01-02T03:00:42Z", "2026-01-02T03:00:44Z", "2026-01-02T03:00:46Z"]
    values = ["2026-01-02T03:00:02Z", "2026-01-02T03:00:04Z", "2026-01-02T03:00:06Z"]  # 40 s behind each write
    got = []
    for rv, (value, stamp) in enumerate(zip(values, stamps), 20):
        out = t.model("MODIFIED", _written(_model(rv=str(rv), last_active=value), stamp), NOW)
        got += [(e.at, e.busy_until, k) for e, k in out if isinstance(e, ev.ForegroundRequest)]
    w = [datetime.fromisoformat(s.replace("Z", "+00:00")) for s in stamps]
    assert got == [(x - timedelta(seconds=2), x, f"fg/u1/{v}/{x.isoformat()}") for x, v in zip(w, values)]
    # within the granularity and the tolerance: the value itself, as always
    near = t.model("MODIFIED", _written(_model(rv="30", last_active="2026-01-02T03:00:45Z"), "2026-01-02T03:00:48Z"), NOW)
    assert [(e.at, k) for e, k in near if isinstance(e, ev.ForegroundRequest)] == [
        (datetime(2026, 1, 2, 3, 0, 45, tzinfo=timezone.utc), "fg/u1/2026-01-02T03:00:45Z")
    ]

def test_a_last_active_time_ahead_is_dated_at_its_write_the_same_after_a_restart():
    """An adversarial trial: a lastActiveTime two hours ahead, unchanged, was demand "now" at
    every restart: the running Job was cancelled each time, and replay found the cancels
    unexplained (the log had deduplicated the request the memory acted on). Dated at its
    write, a restart's look gives the same event and key."""
    obj = _written(_model(last_active="2026-01-02T06:00:00Z"), "2026-01-02T03:00:00Z")
    first = [(e, k) for e, k in Translator().model("ADDED", obj, NOW) if isinstance(e, ev.ForegroundRequest)]
    assert [(e.at, e.source) for e, _ in first] == [(datetime(2026, 1, 2, 3, tzinfo=timezone.utc), "lastActiveTime-unreadable")]
    later = NOW + timedelta(minutes=7)
    assert [(e, k) for e, k in Translator().model("ADDED", obj, later) if isinstance(e, ev.ForegroundRequest)] == first
    # A stamp ahead of the controller's clock is read as now.
    ahead = _written(_model(last_active="2026-01-02T06:00:00Z"), "2026-01-02T03:10:00Z")
    assert [e.at for e, _ in Translator().model("ADDED", ahead, NOW) if isinstance(e, ev.ForegroundRequest)] == [NOW]


def test_readiness_is_emitted_when_it_changes_not_per_status_rewrite():
    """A trial: every lastActiveTime bump (a status rewrite, new resourceVersion) appended a
    ModelReady besides its ForegroundRequest."""
    t = Translator()
    kinds = []
    for rv, phase, node, minute in [("10", "Ready", None, 0), ("11", "Ready", None, 1), ("12", "Ready", None, 2),
                                    ("13", "Loading", None, 2), ("14", "Loading", None, 3), ("15", "Ready", None, 3),
                                    ("16", "Ready", "other", 4), ("17", "Ready", "other", 5)]:
        out = t.model("MODIFIED", _model(phase=phase, rv=rv, gpu_node=node, last_active=f"2026-01-02T03:0{minute}:00Z"), NOW)
        kinds.append([type(e).__name__ for e, _ in out if not isinstance(e, ev.ForegroundRequest)])
    assert kinds == [["ModelReady"], [], [], ["ModelNotReady"], [], ["ModelReady"], ["ModelReady"], []]
    t.forget_seen()  # after dropped observations: offered again
    assert [type(e).__name__ for e, _ in t.model("MODIFIED", _model(rv="18", gpu_node="other"), NOW)] == ["ModelReady"]
    t.model("DELETED", _model(rv="19"), NOW)
    assert [type(e).__name__ for e, _ in t.model("ADDED", _model(rv="20", gpu_node="other"), NOW)] == ["ModelReady"]


def test_relist_gives_the_same_keys():
    obj = _model(last_active="2026-01-02T03:00:00Z")
    a = [k for _, k in Translator().model("ADDED", obj, NOW)]
    b = [k for _, k in Translator().model("ADDED", obj, NOW + timedelta(minutes=5))]
    assert a == b


def test_backfill_applied_deleting_deleted():
    t = Translator()
    obj = {"metadata": _meta("mbf", generation=3), "spec": {"modelRef": "gemma", "templateRef": "t"}}
    [(e, key)] = t.backfill("ADDED", obj, NOW)
    assert e == ev.BackfillApplied(at=NOW, namespace="ns", name="mbf", uid="u1", generation=3, spec=obj["spec"])
    assert key == "mbf/u1/gen/3"
    obj["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    out = t.backfill("MODIFIED", obj, NOW)
    assert [type(e) for e, _ in out] == [ev.BackfillApplied, ev.BackfillDeleting]
    assert out[1][1] == "mbf/u1/deleting"
    [(d, dkey)] = t.backfill("DELETED", obj, NOW)
    assert d == ev.BackfillDeleted(at=NOW, namespace="ns", name="mbf", uid="u1") and dkey == "mbf/u1/deleted"


@pytest.mark.parametrize("spec, kind", [("just a string", "a string"), (["modelRef", "m"], "an array"), (7, "a number"), (True, "a boolean")])
def test_a_spec_that_is_not_an_object_is_blocked_and_its_deletion_released(spec, kind):
    """A hostile-input trial (a ModelBackfill stored under a looser CRD with ``spec: "just a
    string"``): the translator raised, the watcher skipped the object, so it had no status and,
    once deleted, stayed Terminating with the controller's finalizer for ever."""
    from backfill.core.commands import Block, ReleaseFinalizer
    from backfill.core.projector import decide, fold
    from backfill.core.state import World

    t = Translator()
    obj = {"metadata": _meta("mbf", generation=1), "spec": spec}
    [(e, key)] = t.backfill("ADDED", obj, NOW)
    assert (e.spec, e.unstorable, key) == ({}, f"spec must be an object, not {kind}", "mbf/u1/gen/1")
    w = fold(World(), e, 1)
    assert [(c.reason, c.message) for c in decide(w, NOW, None) if isinstance(c, Block)] == [("InvalidSpec", f"spec must be an object, not {kind}")]
    obj["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    for i, (e, _) in enumerate(t.backfill("MODIFIED", obj, NOW), start=2):
        w = fold(w, e, i)
    assert any(isinstance(c, ReleaseFinalizer) for c in decide(w, NOW, None))


def _session(mode=None, expires=None, deleting=False) -> dict:
    spec: dict = {"nodeName": "node-a"}
    if mode:
        spec["mode"] = mode
    if expires:
        spec["expiresAt"] = expires
    meta = _meta("play")
    if deleting:
        meta["deletionTimestamp"] = "2026-01-02T03:04:00Z"
        meta["finalizers"] = ["x"]
    return {"metadata": meta, "spec": spec}


def test_gaming_session_intent():
    t = Translator()
    [(e, _)] = t.gaming_session("ADDED", _session(), NOW)
    assert e == ev.GamingIntentStarted(at=NOW, namespace="ns", session="play", node="node-a")
    [(e, _)] = t.gaming_session("ADDED", _session(expires="2026-01-02T04:00:00Z"), NOW)
    assert isinstance(e, ev.GamingIntentStarted) and e.expires_at == datetime(2026, 1, 2, 4, tzinfo=timezone.utc)
    # Being deleted (finalizer held): still intent.
    [(e, _)] = t.gaming_session("MODIFIED", _session(deleting=True), NOW)
    assert isinstance(e, ev.GamingIntentStarted)
    for obj in (_session(mode="inference"), _session(expires="2026-01-02T03:00:00Z")):
        [(e, _)] = t.gaming_session("MODIFIED", obj, NOW)
        assert e == ev.GamingIntentEnded(at=NOW, namespace="ns", session="play")
    [(e, key)] = t.gaming_session("DELETED", _session(), NOW)
    assert isinstance(e, ev.GamingIntentEnded) and key == "gaming/u1/deleted"



def _mode_session(uid: str, rv: str = "10", **spec) -> dict:
    return {"metadata": _meta("play", uid=uid, rv=rv), "spec": {"nodeName": "node-a", **spec}}


def test_gaming_session_mode_is_fail_closed_only_inference_is_no_intent(caplog):
    """cluster-contract: mode is gaming (default) or inference; seed: a signal that cannot be
    read -> do not start. Every mode but exactly "inference" is intent; an odd one is warned
    about once per session."""
    t = Translator()
    started = ev.GamingIntentStarted(at=NOW, namespace="ns", session="play", node="node-a")
    with caplog.at_level(logging.WARNING, logger="backfill.controller.translate"):
        for i, spec in enumerate([{}, {"mode": None}, {"mode": ""}, {"mode": "gaming"}]):
            [(e, _)] = t.gaming_session("ADDED", _mode_session(f"ok-{i}", **spec), NOW)
            assert e == started, spec
        assert caplog.records == []  # the contract's own values: nothing to warn about
        for i, mode in enumerate(["Gaming", "GAMING", " gaming", "gaming ", "Inference", "INFERENCE", "typo", 1, ["gaming"], {"a": 1}]):
            uid = f"odd-{i}"
            [(e, key)] = t.gaming_session("ADDED", _mode_session(uid, mode=mode), NOW)
            assert e == started and key == f"gaming/{uid}/10/started", mode
            [(e, _)] = t.gaming_session("MODIFIED", _mode_session(uid, rv="11", mode=mode), NOW)  # a re-delivery
            assert e == started, mode
            warned = [r.getMessage() for r in caplog.records if f"spec.mode {mode!r}" in r.getMessage()]
            assert len(warned) == 1 and "taken as gaming intent" in warned[0], (mode, warned)
            assert caplog.records[-1].levelno == logging.WARNING
        [(e, _)] = t.gaming_session("ADDED", _mode_session("inf", mode="inference"), NOW)
        assert e == ev.GamingIntentEnded(at=NOW, namespace="ns", session="play")
        # an odd mode that changes is warned about again; a deleted session forgets its warning
        caplog.clear()
        t.gaming_session("MODIFIED", _mode_session("odd-0", rv="12", mode="GaMiNg"), NOW)
        t.gaming_session("DELETED", _mode_session("odd-0", rv="13", mode="GaMiNg"), NOW)
        t.gaming_session("ADDED", _mode_session("odd-0", rv="14", mode="GaMiNg"), NOW)
        assert [r.getMessage().count("'GaMiNg'") for r in caplog.records] == [1, 1]
        # an odd mode does not override an expiry: an expired session is no intent
        [(e, _)] = t.gaming_session("ADDED", _mode_session("old", mode="Gaming", expiresAt="2026-01-02T03:00:00Z"), NOW)
        assert e == ev.GamingIntentEnded(at=NOW, namespace="ns", session="play")

def test_gpu_lease_and_cronjob():
    t = Translator()
    lease = {"metadata": _meta("l"), "spec": {"node": "n", "group": "g", "expiresAt": "2026-01-02T05:00:00Z"}}
    [(e, _)] = t.gpu_lease("ADDED", lease, NOW)
    assert e == ev.GPULeaseActive(
        at=NOW, namespace="ns", lease="l", node="n", group="g", expires_at=datetime(2026, 1, 2, 5, tzinfo=timezone.utc)
    )
    [(e, _)] = t.gpu_lease("DELETED", lease, NOW)
    assert e == ev.GPULeaseEnded(at=NOW, namespace="ns", lease="l")
    # an expiresAt already past when seen (an edit shortening the lease): ended now, as a
    # GamingSession's, not a gate that ended at that past time (a fault trial: admitted 0.25 s
    # after the edit, idleFor 20s)
    for past in ("2026-01-02T02:54:05Z", "2026-01-02T03:04:05Z"):
        [(e, key)] = t.gpu_lease("MODIFIED", {"metadata": _meta("l", generation=2), "spec": {**lease["spec"], "expiresAt": past}}, NOW)
        assert (e, key) == (ev.GPULeaseEnded(at=NOW, namespace="ns", lease="l"), "gpulease/u1/gen/2/ended")
    cj = {"metadata": _meta("tpl"), "spec": {"jobTemplate": {"spec": {"template": {}}}}}
    [(e, key)] = t.cronjob("ADDED", cj, NOW)
    assert e == ev.CronJobSeen(at=NOW, namespace="ns", name="tpl", job_template={"spec": {"template": {}}})
    assert key == "cronjob/u1/10"  # no generation (never from an API server): the resourceVersion
    # a status write (a new resourceVersion, the same generation) has the spec change's key: the
    # log keeps one copy of the template per spec change (a hostile-input trial)
    keys = [t.cronjob("MODIFIED", {**cj, "metadata": _meta("tpl", rv=rv, generation=g)}, NOW)[0][1] for rv, g in (("11", 1), ("12", 1), ("13", 2))]
    assert keys == ["cronjob/u1/gen/1", "cronjob/u1/gen/1", "cronjob/u1/gen/2"]
    [(e, _)] = t.cronjob("DELETED", cj, NOW)
    assert e == ev.CronJobMissing(at=NOW, namespace="ns", name="tpl")


def _job(status=None, owned=True) -> dict:
    meta = _meta("mbf-abcdef-1", uid="j1", creationTimestamp="2026-01-02T03:00:00Z")
    meta["labels"] = {"modelbackfill.ai.flexinfer/name": "mbf"}
    if owned:
        meta["ownerReferences"] = [{"apiVersion": "ai.flexinfer/v1alpha2", "kind": "ModelBackfill", "name": "mbf", "uid": "u1", "controller": True}]
    return {"metadata": meta, "status": status or {}}


def test_jobs():
    t = Translator()
    # a Job is the ModelBackfill's by its controller ownerReference; one with only the label gives
    # its facts with owned=False (the fold takes them only for the attempt's Job of that uid: a
    # hostile-input trial's foreign Job with the label was deleted as unexplained)
    created = datetime(2026, 1, 2, 3, tzinfo=timezone.utc)
    assert t.job("ADDED", _job(owned=False), NOW) == [
        (ev.JobCreated(at=created, namespace="ns", backfill="mbf", name="mbf-abcdef-1", uid="j1", owned=False), "job/ns/mbf-abcdef-1/JobCreated/j1")
    ]
    bare = _job(owned=False)
    del bare["metadata"]["labels"]
    assert t.job("ADDED", bare, NOW) == []
    common = dict(namespace="ns", backfill="mbf", name="mbf-abcdef-1", uid="j1")
    created = datetime(2026, 1, 2, 3, tzinfo=timezone.utc)
    assert t.job("ADDED", _job(), NOW) == [(ev.JobCreated(at=created, **common), "job/ns/mbf-abcdef-1/JobCreated/j1")]
    running = t.job("MODIFIED", _job({"startTime": "2026-01-02T03:00:01Z", "active": 1}), NOW)
    assert running[1] == (
        ev.JobRunning(at=created + timedelta(seconds=1), **common),
        "job/ns/mbf-abcdef-1/JobRunning/j1",
    )
    done = t.job(
        "MODIFIED",
        _job({"startTime": "2026-01-02T03:00:01Z", "completionTime": "2026-01-02T03:00:09Z",
              "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-02T03:00:09Z"}]}),
        NOW,
    )
    assert done[-1][0] == ev.JobSucceeded(at=created + timedelta(seconds=9), **common)
    failed = t.job(
        "MODIFIED",
        _job({"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "lastTransitionTime": "2026-01-02T03:00:09Z"}]}),
        NOW,
    )
    assert failed[-1][0] == ev.JobFailed(at=created + timedelta(seconds=9), reason="DeadlineExceeded", **common)
    assert t.job("DELETED", _job(), NOW) == [(ev.JobDeleted(at=NOW, **common), "job/ns/mbf-abcdef-1/JobDeleted/j1")]


def test_job_times_ahead_of_the_controllers_clock_are_read_as_when_seen():
    """An adversarial trial: a Job's ``completionTime`` in 2030 counted 96,821,425 s of work
    (``useful_running_seconds_total``, ``backfill runs``), and one a day ahead held a
    ``repeatAfter: 1m`` backfill's next run a day. A Job's time more than a minute ahead of the
    moment it is seen is read as that moment; others are kept as they are."""
    common = dict(namespace="ns", backfill="mbf", name="mbf-abcdef-1", uid="j1")
    obj = _job({"startTime": "2026-01-02T03:00:01Z", "completionTime": "2030-01-01T00:00:00Z",
                "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": "2030-01-01T00:00:00Z"}]})  # fmt: skip
    out = [e for e, _ in Translator().job("MODIFIED", obj, NOW)]
    assert out == [
        ev.JobCreated(at=datetime(2026, 1, 2, 3, tzinfo=timezone.utc), **common),
        ev.JobRunning(at=datetime(2026, 1, 2, 3, 0, 1, tzinfo=timezone.utc), **common),
        ev.JobSucceeded(at=NOW, **common),
    ]
    obj["metadata"]["creationTimestamp"] = "2026-01-02T03:05:05Z"  # a minute ahead of NOW: kept (and the rest not before it)
    out = [e for e, _ in Translator().job("MODIFIED", obj, NOW)]
    assert [e.at for e in out] == [NOW + timedelta(minutes=1)] * 3
    failed = _job({"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": "2027-01-01T00:00:00Z"}]})
    assert Translator().job("MODIFIED", failed, NOW)[-1][0] == ev.JobFailed(at=NOW, reason="BackoffLimitExceeded", **common)
    # A re-trial: times a day back ended the run before its admission, and the next attempt was
    # admitted at once (repeatAfter 1m). Nothing of a Job happens before it was created.
    back = _job({"startTime": "2026-01-01T03:00:00Z", "completionTime": "2026-01-01T04:00:00Z",
                 "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T04:00:00Z"}]})  # fmt: skip
    created = datetime(2026, 1, 2, 3, tzinfo=timezone.utc)  # _job's creationTimestamp
    assert [e.at for e, _ in Translator().job("MODIFIED", back, NOW)] == [created, created, created]


def test_vanished_objects_map_to_gone_events():
    e, key = vanished("cronjob", "ns", "tpl", "", NOW, "99")
    assert e == ev.CronJobMissing(at=NOW, namespace="ns", name="tpl") and key == "relist/cronjob/ns/tpl/99"
    e, key = vanished("backfill", "ns", "mbf", "u1", NOW, "99")
    assert e == ev.BackfillDeleted(at=NOW, namespace="ns", name="mbf", uid="u1") and key == "mbf/u1/deleted"
    assert isinstance(vanished("model", "ns", "m", "", NOW, "1")[0], ev.ModelDeleted)
    assert isinstance(vanished("gaming", "ns", "s", "", NOW, "1")[0], ev.GamingIntentEnded)
    assert isinstance(vanished("lease", "ns", "l", "", NOW, "1")[0], ev.GPULeaseEnded)


def test_gaming_session_and_gpu_lease_are_stored_once_per_spec_change_not_per_resource_version():
    """A fault trial: 30 label patches of a GamingSession (a 900 kB spec.nodeName) stored 30
    copies of it, 28 MB; with the store away each held change cost 1.8 MB of memory. Keys now
    follow metadata.generation (a label or status write changes none). A session switched to
    inference and back is intent again (a new generation: not taken for a duplicate)."""
    t = Translator()

    def session(rv: str, generation: int, **spec) -> dict:
        return {"metadata": _meta("play", uid="g1", rv=rv, generation=generation), "spec": {"nodeName": "node-a", **spec}}

    keys = [t.gaming_session("MODIFIED", session(str(10 + i), 1), NOW)[0][1] for i in range(30)]  # labels only
    assert set(keys) == {"gaming/g1/gen/1/started"}
    [(ended, k2)] = t.gaming_session("MODIFIED", session("50", 2, mode="inference"), NOW)
    [(again, k3)] = t.gaming_session("MODIFIED", session("51", 3, mode="gaming"), NOW)
    assert isinstance(ended, ev.GamingIntentEnded) and isinstance(again, ev.GamingIntentStarted)
    assert (k2, k3) == ("gaming/g1/gen/2/ended", "gaming/g1/gen/3/started")
    lease = {"metadata": _meta("l", uid="l1", rv="7", generation=4), "spec": {"node": "n"}}
    relabelled = {**lease, "metadata": {**lease["metadata"], "resourceVersion": "8", "labels": {"x": "1"}}}
    assert t.gpu_lease("ADDED", lease, NOW)[0][1] == t.gpu_lease("MODIFIED", relabelled, NOW)[0][1] == "gpulease/l1/gen/4/active"


def test_a_node_name_no_node_can_have_is_bounded_and_still_matches_its_model():
    """A 900 kB spec.nodeName (a fault trial) is carried as 253 characters; a Model naming the
    same node still matches it, one naming another node does not."""
    huge = "n" * 900_000
    t = Translator()
    [(e, _)] = t.gaming_session("ADDED", {"metadata": _meta("play", uid="g2"), "spec": {"nodeName": huge}}, NOW)
    same = {"metadata": _meta("m"), "spec": {"nodeSelector": {"kubernetes.io/hostname": huge}}}
    other = {"metadata": _meta("m"), "spec": {"nodeSelector": {"kubernetes.io/hostname": huge[:-1] + "x"}}}
    assert len(e.node) == 253 and e.node == model_node(same) != model_node(other)


def test_a_suspended_job_says_when_it_was_observed_beside_its_conditions_time():
    """A resume and a re-suspend before the Job controller flips ``Suspended`` leave the
    condition's time at the earlier suspension: ``observed_at`` is the watcher's clock."""
    owner = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "ModelBackfill", "name": "b", "uid": "bu", "controller": True}
    stale = "2026-01-02T03:00:00Z"
    job = {
        "metadata": _meta("b-abcdef-1", uid="ju", rv="42", ownerReferences=[owner]),
        "spec": {"suspend": True},
        "status": {"active": 0, "conditions": [{"type": "Suspended", "status": "True", "lastTransitionTime": stale}]},
    }
    (suspended,) = [e for e, _ in Translator().job("MODIFIED", job, NOW) if isinstance(e, ev.JobSuspended)]
    assert (suspended.at, suspended.observed_at, suspended.episode) == (datetime(2026, 1, 2, 3, 0, tzinfo=timezone.utc), NOW, "42")
