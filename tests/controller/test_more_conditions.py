"""More cancel and gate conditions on the real kube-apiserver (tests/envtest).

Each test runs the controller on a fresh namespace and event-log schema and asserts concrete
objects: the Job gone (or present), the ModelBackfill's phase and status.reason, the run row's
result and reason (through the run store), the AttemptCancelled/AttemptAdmitted decisions in the
log and the Kubernetes Event on the ModelBackfill.

No controller-manager runs: the tests play the Job controller (they write Job status), and a Job
deleted with propagationPolicy Background disappears at once.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from backfill.core import events as ev
from backfill.core.events import decode_many
from backfill.core.timefmt import parse_rfc3339

from .conftest import PhaseRecorder, now_s, ts, wait_for

pytestmark = pytest.mark.kube


# ============================================================================ helpers


def _decisions(controller, cls) -> list:
    rows = list(controller.events.read(0))
    return [e for e in decode_many([(r.type, r.version, r.data) for r in rows]) if isinstance(e, cls)]


def _cancels(controller, name: str, timeout: float = 5.0) -> list[tuple[int, str]]:
    """The recorded cancels of ``name``; waits up to ``timeout`` for the first one, because a cancel
    is made durable beside the Job DELETE, not before it (the test may see the Job gone first)."""
    def read():
        return [(x.attempt, x.reason) for x in _decisions(controller, ev.AttemptCancelled) if x.backfill == name]

    deadline = time.monotonic() + timeout
    while not (found := read()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _admits(controller, name: str) -> list:
    return [x for x in _decisions(controller, ev.AttemptAdmitted) if x.backfill == name]


def _ended_runs(controller, ns: str, name: str) -> list[tuple[int, str, str]]:
    return [(r.attempt, r.result, r.reason) for r in controller.runs.query(namespace=ns, backfill=name) if r.result]


def _event_reasons(kube, name: str) -> list[str]:
    return [
        e.reason
        for e in kube.core.list_namespaced_event(kube.ns).items
        if e.involved_object.kind == "ModelBackfill" and e.involved_object.name == name
    ]


def _event_types(kube, name: str, reason: str) -> list[str]:
    """Types of the Events with ``reason`` on ``name`` (waits for one: Events are sent from a side thread)."""
    return wait_for(
        lambda: [
            e.type
            for e in kube.core.list_namespaced_event(kube.ns).items
            if e.involved_object.kind == "ModelBackfill" and e.involved_object.name == name and e.reason == reason
        ],
        what=f"an Event {reason} on {name}",
    )


def _jobs_of(kube, name: str) -> list:
    return [j for j in kube.jobs() if j.metadata.labels.get("modelbackfill.ai.flexinfer/name") == name]


def _running(kube, name: str):
    """Wait for ``name``'s Job, play the Job controller (startTime, active) and wait for Running."""
    job = wait_for(lambda: _jobs_of(kube, name), timeout=10, what=f"{name}: Job created")[0]
    kube.run_job(job.metadata.name)
    wait_for(lambda: kube.status(name).get("phase") == "Running", what=f"{name}: phase Running")
    return job


def _waiting(kube, name: str, reason: str) -> dict:
    return wait_for(
        lambda: (st := kube.status(name)).get("phase") == "WaitingForIdle" and st.get("reason") == reason and st,
        what=f"{name}: WaitingForIdle/{reason}",
    )


def _folded(c) -> bool:
    """The controller folded everything the log holds (so it has decided on it)."""
    return c.position == c.events.head()


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _lease(kube, name: str, **spec: Any) -> dict:
    return kube.create("gpuleases", "GPULease", name, {"owner": "someone", "priority": 10, **spec})


def _no_job_for(kube, name: str, seconds: float) -> None:
    with pytest.raises(AssertionError):
        wait_for(lambda: _jobs_of(kube, name), timeout=seconds, what=f"{name}: no Job")


# ============================================================================ 1. GPU leases


def test_gpu_lease_on_node_or_shared_group_cancels_expired_lease_does_not(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-a")
    kube.model("llama", node="node-b", shared="pool-1")
    c = start_controller()
    kube.backfill("on-node", model="gemma")
    kube.backfill("on-group", model="llama")
    node_job = _running(kube, "on-node")
    group_job = _running(kube, "on-group")

    # Leases whose expiresAt is in the past hold nothing: neither Job is touched.
    past = ts(now_s() - timedelta(hours=1))
    _lease(kube, "old-node", node="node-a", expiresAt=past)
    _lease(kube, "old-group", group="pool-1", node="node-z", expiresAt=past)
    # (seen as ended: an expiry already past is no gate at all)
    wait_for(lambda: {"old-node", "old-group"} <= {e.lease for e in _decisions(c, ev.GPULeaseEnded)}, what="expired leases logged")
    wait_for(lambda: _folded(c), what="log folded")
    time.sleep(0.5)
    assert kube.job(node_job.metadata.name) is not None and kube.job(group_job.metadata.name) is not None
    assert kube.status("on-node")["phase"] == kube.status("on-group")["phase"] == "Running"
    assert _decisions(c, ev.AttemptCancelled) == []

    # An unexpired lease on the model's node cancels that backfill only.
    _lease(kube, "live-node", node="node-a", expiresAt=ts(now_s() + timedelta(hours=1)))
    wait_for(lambda: kube.job(node_job.metadata.name) is None, timeout=5, what="on-node Job deleted")
    st = _waiting(kube, "on-node", "GPULeaseActive")
    assert st["attempts"] == 1 and st.get("jobName") is None
    assert kube.job(group_job.metadata.name) is not None and kube.status("on-group")["phase"] == "Running"

    # A lease on the model's shared group (another node, no expiresAt) cancels too.
    _lease(kube, "live-group", group="pool-1", node="node-z")
    wait_for(lambda: kube.job(group_job.metadata.name) is None, timeout=5, what="on-group Job deleted")
    st = _waiting(kube, "on-group", "GPULeaseActive")
    assert st["attempts"] == 1

    assert _cancels(c, "on-node") == [(1, "GPULeaseActive")]
    assert _cancels(c, "on-group") == [(1, "GPULeaseActive")]
    for name in ("on-node", "on-group"):
        rows = wait_for(lambda: _ended_runs(c, kube.ns, name), what=f"{name}: run row ended")
        assert rows == [(1, "preempted", "GPULeaseActive")], name
        wait_for(lambda: "GPULeaseActive" in _event_reasons(kube, name), what=f"{name}: Event GPULeaseActive")
        assert _event_types(kube, name, "GPULeaseActive") == ["Warning"], name
        labels = {"backfill": name, "namespace": kube.ns, "model": "gemma" if name == "on-node" else "llama"}
        assert c.metrics.registry.get_sample_value(
            "flexinfer_model_backfill_preemptions_total", {**labels, "reason": "GPULeaseActive"}
        ) == 1, name
    # While the leases hold, no new attempt.
    assert kube.jobs() == []
    _no_job_for(kube, "on-node", 2.5)
    assert kube.jobs() == []


def test_gpu_lease_expiry_wakes_the_controller_and_restarts_the_idle_window(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("llama", node="node-b", shared="pool-1")
    c = start_controller()
    kube.backfill("expiring", model="llama")
    job = _running(kube, "expiring")
    # 6 s: the cancel and the GPULeaseActive status are seen before the lease expires (with 3 s a
    # loaded machine could fold the expiry first, and the reason was IdleWindow already)
    expires = now_s() + timedelta(seconds=6)
    _lease(kube, "short", group="pool-1", expiresAt=ts(expires))
    wait_for(lambda: kube.job(job.metadata.name) is None, timeout=5, what="Job deleted")
    _waiting(kube, "expiring", "GPULeaseActive")
    # The lease object stays; it simply expires. The next attempt comes a full idleFor after.
    second = wait_for(lambda: _jobs_of(kube, "expiring"), timeout=15, what="second attempt after the lease expired")[0]
    assert second.metadata.name.endswith("-2")
    admitted = _admits(c, "expiring")
    assert [a.attempt for a in admitted] == [1, 2]
    assert admitted[1].at >= expires + timedelta(seconds=2)
    assert kube.get("gpuleases", "short") is not None


def test_a_lease_edited_to_an_expiry_in_the_past_ends_now_and_the_window_restarts(kube, start_controller):
    """A fault trial: a blocking GPULease patched to ``expiresAt`` 10 minutes back was taken as
    ended then, and the Job was admitted 0.25 s after the edit (``idleFor`` 20s); deleting the
    lease gave the full window. The edit ends the gate when it is seen now."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-a")
    c = start_controller()
    _lease(kube, "held", node="node-a")
    kube.backfill("behind", idleFor="4s")
    _waiting(kube, "behind", "GPULeaseActive")
    time.sleep(4.5)  # longer than idleFor behind the lease: the old gate's "end" lies before it
    edited = now_s()
    kube.patch("gpuleases", "held", {"spec": {"expiresAt": ts(edited - timedelta(minutes=10))}})
    job = wait_for(lambda: _jobs_of(kube, "behind"), timeout=15, what="the Job after the lease ended")[0]
    (admitted,) = _admits(c, "behind")
    assert admitted.at >= edited + timedelta(seconds=4), (admitted.at, edited)
    assert job.metadata.creation_timestamp >= edited + timedelta(seconds=4)


# ============================================================================ 2. spec change


def test_spec_change_cancels_and_the_new_generation_waits_a_full_window(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    c = start_controller()
    kube.backfill("edited", idleFor="2s")
    job = _running(kube, "edited")
    assert kube.status("edited")["observedGeneration"] == 1

    kube.patch("modelbackfills", "edited", {"spec": {"idleFor": "5s"}})
    assert kube.get("modelbackfills", "edited")["metadata"]["generation"] == 2
    wait_for(lambda: kube.job(job.metadata.name) is None, timeout=5, what="Job deleted")
    st = wait_for(
        lambda: (s := kube.status("edited")).get("phase") == "WaitingForIdle" and s.get("observedGeneration") == 2 and s,
        what="WaitingForIdle for generation 2",
    )
    assert st["reason"] == "IdleWindow" and st["attempts"] == 1 and st.get("jobName") is None
    idle_since = parse_rfc3339(st["idleSince"])
    assert _cancels(c, "edited") == [(1, "SpecChanged")]
    rows = wait_for(lambda: _ended_runs(c, kube.ns, "edited"), what="run row ended")
    assert rows == [(1, "cancelled", "SpecChanged")]
    assert _event_types(kube, "edited", "SpecChanged") == ["Warning"]

    second = wait_for(lambda: _jobs_of(kube, "edited"), timeout=10, what="attempt 2")[0]
    assert second.metadata.name.endswith("-2")
    admitted = _admits(c, "edited")
    assert [(a.attempt, a.generation) for a in admitted] == [(1, 1), (2, 2)]
    # Not right after the cancel: only once the new generation's idleFor (5 s) has fully elapsed
    # (the window is the model's foreground idleness: a spec change is not foreground demand).
    assert admitted[1].at >= idle_since + timedelta(seconds=5)
    assert second.spec.active_deadline_seconds == 900


# ============================================================================ 3. model not Ready


def test_model_not_ready_cancels_and_waits_with_model_not_ready(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    c = start_controller()
    kube.backfill("loading")
    job = _running(kube, "loading")
    recorder = PhaseRecorder(kube.api, kube.ns, "loading")
    try:
        wait_for(lambda: recorder.phases == ["Running"], what="recorder sees Running")
        kube.hold_job(job.metadata.name)  # the Job stays terminating: Cancelling must show
        kube.set_status("models", "gemma", {"phase": "Loading"})
        wait_for(lambda: kube.job(job.metadata.name).metadata.deletion_timestamp, timeout=5, what="Job deleted")
        cancelling = wait_for(lambda: (s := kube.status("loading")).get("phase") == "Cancelling" and s, what="Cancelling")
        assert (cancelling["reason"], cancelling["jobName"]) == ("ModelNotReady", job.metadata.name)
        kube.release_job(job.metadata.name)
        wait_for(lambda: kube.job(job.metadata.name) is None, timeout=5, what="Job gone")
        st = _waiting(kube, "loading", "ModelNotReady")
    finally:
        recorder.stop()
    assert recorder.phases[:3] == ["Running", "Cancelling", "WaitingForIdle"]
    assert st["attempts"] == 1 and [x["status"] for x in st["conditions"] if x["type"] == "Ready"] == ["False"]
    assert _cancels(c, "loading") == [(1, "ModelNotReady")]
    assert wait_for(lambda: _ended_runs(c, kube.ns, "loading"), what="run row") == [(1, "cancelled", "ModelNotReady")]
    assert _event_types(kube, "loading", "ModelNotReady") == ["Warning"]
    _no_job_for(kube, "loading", 2.5)  # well past idleFor: a not-Ready model is never used
    assert kube.status("loading")["reason"] == "ModelNotReady"

    ready_at = _utcnow()
    kube.set_status("models", "gemma", {"phase": "Ready"})
    second = wait_for(lambda: _jobs_of(kube, "loading"), timeout=10, what="attempt 2 once Ready again")[0]
    assert second.metadata.name.endswith("-2")
    assert _admits(c, "loading")[1].at >= ready_at + timedelta(seconds=2)


# ============================================================================ 4. node change


def test_model_moving_to_another_node_cancels_with_node_changed(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma", node="node-a")
    c = start_controller()
    kube.backfill("mover")
    job = _running(kube, "mover")
    assert kube.status("mover")["nodeName"] == "node-a"

    moved_at = _utcnow()
    kube.set_status("models", "gemma", {"gpu": {"node": "node-b"}})
    wait_for(lambda: kube.job(job.metadata.name) is None, timeout=5, what="Job deleted")
    assert _cancels(c, "mover") == [(1, "NodeChanged")]
    assert wait_for(lambda: _ended_runs(c, kube.ns, "mover"), what="run row") == [(1, "cancelled", "NodeChanged")]
    assert _event_types(kube, "mover", "NodeChanged") == ["Warning"]
    st = wait_for(
        lambda: (s := kube.status("mover")).get("phase") in ("WaitingForIdle", "Starting", "Running") and s.get("nodeName") == "node-b" and s,
        what="status on node-b",
    )
    assert st["attempts"] in (1, 2)
    # On the new node the model has just become Ready there: a full new idle window first.
    second = wait_for(lambda: _jobs_of(kube, "mover"), timeout=10, what="attempt 2 on node-b")[0]
    admitted = _admits(c, "mover")
    assert [(a.attempt, a.node) for a in admitted] == [(1, "node-a"), (2, "node-b")]
    assert admitted[1].at >= moved_at + timedelta(seconds=2)
    assert second.metadata.name.endswith("-2")


# ============================================================================ 5. GPU in requests


def test_gpu_in_requests_is_blocked(kube, start_controller):
    # The API server itself refuses requests-only for an extended resource such as amd.com/gpu
    # ("Limit must be set for non overcommitable resources"), so the init-container template
    # carries the equal limit the API demands, and a second template puts a GPU resource in
    # requests only (a "*.kubernetes.io/" name is overcommittable, so the API accepts it).
    init_pod = {
        "restartPolicy": "Never",
        "initContainers": [{"name": "prep", "image": "busybox", "resources": {"requests": {"amd.com/gpu": "1"}}}],
        "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
    }
    with pytest.raises(ApiException) as refused:
        kube.cronjob("gpu-init", pod=init_pod)
    assert refused.value.status == 422 and "non overcommitable" in refused.value.body
    init_pod["initContainers"][0]["resources"]["limits"] = {"amd.com/gpu": "1"}
    kube.cronjob("gpu-init", pod=init_pod)
    only = {"requests": {"cpu": "100m", "gpu.kubernetes.io/shared": "1"}}
    kube.cronjob("gpu-requests-only", pod={"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox", "resources": only}]})
    stored = kube.batch.read_namespaced_cron_job("gpu-requests-only", kube.ns).spec.job_template.spec.template.spec
    assert stored.containers[0].resources.requests == {"cpu": "100m", "gpu.kubernetes.io/shared": "1"}
    assert not stored.containers[0].resources.limits
    zero = {"requests": {"gpu.kubernetes.io/shared": "0"}}
    kube.cronjob("gpu-zero", pod={"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox", "resources": zero}]})
    kube.model("gemma", node="node-a")
    kube.model("llama", node="node-b")
    kube.model("qwen", node="node-c")
    c = start_controller()
    kube.backfill("gpu-init", model="gemma", template="gpu-init")
    kube.backfill("gpu-req", model="llama", template="gpu-requests-only")
    kube.backfill("gpu-zero", model="qwen", template="gpu-zero")
    expected = {"gpu-init": "prep: requests amd.com/gpu=1", "gpu-req": "main: requests gpu.kubernetes.io/shared=1"}
    for name, fragment in expected.items():
        st = wait_for(lambda: (s := kube.status(name)).get("phase") == "Blocked" and s, what=f"{name} Blocked")
        assert st["reason"] == "GPURequestForbidden", name
        assert fragment in st["message"], (name, st["message"])
        assert [x["status"] for x in st["conditions"] if x["type"] == "Ready"] == ["False"]
        wait_for(lambda: "GPURequestForbidden" in _event_reasons(kube, name), what=f"{name}: Event GPURequestForbidden")
        assert _event_types(kube, name, "GPURequestForbidden") == ["Warning"]
    # A zero quantity is not a GPU request: that one runs.
    wait_for(lambda: _jobs_of(kube, "gpu-zero"), timeout=10, what="gpu-zero Job")
    assert sorted(b.backfill for b in _decisions(c, ev.BackfillBlocked)) == ["gpu-init", "gpu-req"]
    assert _jobs_of(kube, "gpu-init") == [] and _jobs_of(kube, "gpu-req") == []
    assert _admits(c, "gpu-init") == [] and _admits(c, "gpu-req") == []
    rows = wait_for(lambda: c.runs.query(namespace=kube.ns), what="run row of gpu-zero")
    assert [(r.backfill, r.attempt, r.result) for r in rows] == [("gpu-zero", 1, None)]


# ============================================================================ 6. watch resilience


def test_backfill_created_after_watch_reconnects_and_demand_while_down_cancels_after_restart(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    first = start_controller(watch_timeout_seconds=1)
    time.sleep(2.5)  # the 1 s server-side watches have ended and been re-established
    assert all(w.is_alive() for w in first.watchers)
    kube.backfill("late")
    wait_for(
        lambda: "modelbackfill.ai.flexinfer/finalizer" in (kube.get("modelbackfills", "late")["metadata"].get("finalizers") or []),
        what="finalizer added to the late ModelBackfill",
    )
    job = _running(kube, "late")
    assert [a.attempt for a in _admits(first, "late")] == [1]

    first.stop()
    assert not [t.name for t in first.watchers if t.is_alive()]
    last_active = now_s()
    kube.set_status("models", "gemma", {"lastActiveTime": ts(last_active)})
    time.sleep(0.5)
    assert kube.job(job.metadata.name) is not None  # nobody is watching

    second = start_controller(watch_timeout_seconds=1)
    wait_for(lambda: kube.job(job.metadata.name) is None, timeout=5, what="Job deleted after restart")
    st = wait_for(lambda: (s := kube.status("late")).get("phase") == "WaitingForIdle" and s, what="WaitingForIdle")
    assert st["attempts"] == 1
    assert _cancels(second, "late") == [(1, "ForegroundDemand")]
    fg = [e for e in _decisions(second, ev.ForegroundRequest) if e.model == "gemma"]
    assert [e.at for e in fg] == [last_active]
    assert wait_for(lambda: _ended_runs(second, kube.ns, "late"), what="run row") == [(1, "preempted", "ForegroundDemand")]
    assert _event_types(kube, "late", "ForegroundDemand") == ["Warning"]
    labels = {"backfill": "late", "namespace": kube.ns, "model": "gemma", "reason": "ForegroundDemand"}
    assert second.metrics.registry.get_sample_value("flexinfer_model_backfill_preemptions_total", labels) == 1


# ============================================================================ 7. env overrides


def _env_list(kube, container) -> list[dict]:
    return kube.api.sanitize_for_serialization(container.env or [])


def test_env_overrides_sorted_and_value_from_removed_exactly(kube, start_controller):
    cm = {"configMapKeyRef": {"name": "models", "key": "list"}}
    secret = {"secretKeyRef": {"name": "creds", "key": "token"}}
    field = {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}
    pod = {
        "restartPolicy": "Never",
        "initContainers": [
            {"name": "prep", "image": "busybox", "env": [{"name": "A", "value": "1"}, {"name": "MODELS", "valueFrom": cm}]},
        ],
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "env": [
                    {"name": "MODELS", "valueFrom": cm},
                    {"name": "KEEP", "value": "literal"},
                    {"name": "ZED", "valueFrom": field},
                    {"name": "TOKEN", "valueFrom": secret},
                ],
            },
            {"name": "side", "image": "busybox", "env": [{"name": "TOKEN", "valueFrom": secret}]},
            {"name": "bare", "image": "busybox"},
        ],
    }
    kube.cronjob("env-template", pod=pod)
    kube.model("gemma")
    start_controller()
    kube.backfill(
        "envy",
        template="env-template",
        env={"ZED": "z", "MODELS": "gemma=vllm", "GAUNTLET_API": "chat", "ALPHA": "a"},
    )
    job = wait_for(lambda: _jobs_of(kube, "envy"), timeout=10, what="Job created")[0]
    spec = job.spec.template.spec
    class_, no_gpu = {"name": "FLEXINFER_WORKLOAD_CLASS", "value": "background"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    no_amd = {"name": "AMD_VISIBLE_DEVICES", "value": "none"}
    main, side, bare = spec.containers
    assert _env_list(kube, main) == [
        {"name": "MODELS", "value": "gemma=vllm"},
        {"name": "KEEP", "value": "literal"},
        {"name": "ZED", "value": "z"},
        {"name": "TOKEN", "valueFrom": secret},
        {"name": "ALPHA", "value": "a"},
        {"name": "GAUNTLET_API", "value": "chat"},
        class_,
        no_gpu,
        no_amd,
    ]
    assert _env_list(kube, side) == [
        {"name": "TOKEN", "valueFrom": secret},
        {"name": "ALPHA", "value": "a"},
        {"name": "GAUNTLET_API", "value": "chat"},
        {"name": "MODELS", "value": "gemma=vllm"},
        {"name": "ZED", "value": "z"},
        class_,
        no_gpu,
        no_amd,
    ]
    assert _env_list(kube, bare) == [
        {"name": "ALPHA", "value": "a"},
        {"name": "GAUNTLET_API", "value": "chat"},
        {"name": "MODELS", "value": "gemma=vllm"},
        {"name": "ZED", "value": "z"},
        class_,
        no_gpu,
        no_amd,
    ]
    # Init containers get the controller's variables only: overrides are for regular containers.
    assert _env_list(kube, spec.init_containers[0]) == [{"name": "A", "value": "1"}, {"name": "MODELS", "valueFrom": cm}, class_, no_gpu, no_amd]
    for c_ in spec.containers:
        names = [e["name"] for e in _env_list(kube, c_)]
        assert len(names) == len(set(names)), c_.name
    # The CronJob itself is never written.
    stored = kube.batch.read_namespaced_cron_job("env-template", kube.ns)
    assert _env_list(kube, stored.spec.job_template.spec.template.spec.containers[0])[0] == {"name": "MODELS", "valueFrom": cm}


# ============================================================================ a Model replaced unseen


def test_a_model_deleted_and_created_again_while_no_controller_watched_is_another_model(kube, start_controller):
    """A fault trial: the Model deleted, created again and Ready while both replicas were down;
    the restarted controller admitted 1.9 s after the new Model's Ready on the old object's idle
    window, and left a running Job on the new Model. Its uid now tells the objects apart: the
    Job is cancelled, and the next admission waits a full idleFor from the new Model's first
    observation."""
    kube.cronjob("model-eval-gauntlet")
    old_uid = kube.model("gemma")["metadata"]["uid"]
    first = start_controller()
    kube.backfill("swap", idleFor="3s")
    job = _running(kube, "swap")
    first.stop()
    assert not [t.name for t in first.watchers if t.is_alive()]

    kube.custom.delete_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube.ns, "models", "gemma")
    wait_for(lambda: kube.get("models", "gemma") is None, what="Model gone")
    new_uid = kube.model("gemma")["metadata"]["uid"]
    assert new_uid != old_uid
    assert kube.job(job.metadata.name) is not None  # nobody is watching

    second = start_controller()
    wait_for(lambda: kube.job(job.metadata.name) is None, timeout=5, what="the old Model's Job deleted after the restart")
    cancels = [c for c in _decisions(second, ev.AttemptCancelled) if c.backfill == "swap"]
    assert [(c.attempt, c.reason, c.message) for c in cancels] == [
        (1, "ModelNotReady", "Model gemma was deleted and created again after the Job was admitted")
    ]
    second_job = wait_for(lambda: [j for j in _jobs_of(kube, "swap") if j.metadata.name != job.metadata.name], timeout=15, what="the next Job")[0]
    assert second_job is not None
    readies = [e for e in _decisions(second, ev.ModelReady) if e.model == "gemma" and e.uid == new_uid]
    admits = _admits(second, "swap")
    assert [a.attempt for a in admits] == [1, 2]
    # the window of the second attempt began at the new object's first observation, not before
    assert admits[1].at >= readies[0].at + timedelta(seconds=3)
    assert readies[0].at > admits[0].at


# ============================================================================ Events of ended attempts


def _event_messages(kube, name: str, reason: str) -> list[tuple[str, str]]:
    return wait_for(
        lambda: [
            (e.type, e.message)
            for e in kube.core.list_namespaced_event(kube.ns).items
            if e.involved_object.kind == "ModelBackfill" and e.involved_object.name == name and e.reason == reason
        ],
        what=f"an Event {reason} on {name}",
    )


def test_an_attempt_that_ends_by_itself_has_an_event(kube, start_controller, caplog):
    """A new user's trial: a Job failed or deleted by hand left only ``Admitted`` in ``kubectl
    describe mbf``. Each end the controller did not decide is an Event on the ModelBackfill, and
    a log line (another trial: a completed Job logged nothing)."""
    caplog.set_level(logging.INFO, logger="backfill.controller.actor")
    kube.cronjob("model-eval-gauntlet")
    for i, m in enumerate(("m-ok", "m-fail", "m-late", "m-gone")):
        kube.model(m, node=f"node-{i}")
    c = start_controller()
    for name, m in (("ok", "m-ok"), ("fail", "m-fail"), ("late", "m-late"), ("gone", "m-gone")):
        kube.backfill(name, model=m)
    jobs = {n: wait_for(lambda: _jobs_of(kube, n), timeout=10, what=f"{n}: Job created")[0].metadata.name for n in ("ok", "fail", "late", "gone")}
    done = now_s()
    kube.job_status(jobs["ok"], {
        "startTime": ts(done - timedelta(seconds=1)), "completionTime": ts(done), "succeeded": 1,
        "conditions": [{"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": ts(done)},
                       {"type": "Complete", "status": "True", "lastTransitionTime": ts(done)}],
    })  # fmt: skip
    for name, reason in (("fail", "BackoffLimitExceeded"), ("late", "DeadlineExceeded")):
        kube.job_status(jobs[name], {
            "startTime": ts(done - timedelta(seconds=1)), "failed": 1,
            "conditions": [{"type": "FailureTarget", "status": "True", "reason": reason, "lastTransitionTime": ts(done)},
                           {"type": "Failed", "status": "True", "reason": reason, "lastTransitionTime": ts(done)}],
        })  # fmt: skip
    kube.batch.delete_namespaced_job(jobs["gone"], kube.ns, propagation_policy="Background")
    assert _event_messages(kube, "ok", "Completed") == [("Normal", f"Job {jobs['ok']} completed (attempt 1)")]
    assert _event_messages(kube, "fail", "JobFailed") == [("Warning", f"Job {jobs['fail']} failed (attempt 1): BackoffLimitExceeded")]
    assert _event_messages(kube, "late", "DeadlineExceeded") == [("Warning", f"Job {jobs['late']} ran past spec.maxRunDuration (attempt 1)")]
    assert _event_messages(kube, "gone", "JobDeleted") == [
        ("Warning", f"Job {jobs['gone']} was deleted before it ended, by no cancel of this controller's log (attempt 1)")
    ]
    ended = {
        r.backfill: (r.levelname, r.getMessage().split(", Job ")[0], r.getMessage().split(", ")[1], r.position)
        for r in caplog.records
        if r.getMessage().startswith("attempt 1 ended:")
    }
    assert {k: v[:3] for k, v in ended.items()} == {
        f"{kube.ns}/ok": ("INFO", "attempt 1 ended: succeeded (Completed)", f"Job {jobs['ok']}"),
        f"{kube.ns}/fail": ("WARNING", "attempt 1 ended: failed (BackoffLimitExceeded)", f"Job {jobs['fail']}"),
        f"{kube.ns}/late": ("WARNING", "attempt 1 ended: deadline_exceeded (DeadlineExceeded)", f"Job {jobs['late']}"),
        f"{kube.ns}/gone": ("WARNING", "attempt 1 ended: cancelled (JobDeleted)", f"Job {jobs['gone']}"),
    }
    # each line names the position of the Job's end in the log
    ends = {(ev.JobSucceeded, "ok"), (ev.JobFailed, "fail"), (ev.JobFailed, "late"), (ev.JobDeleted, "gone")}
    rows = list(c.events.read(0))
    logged = {
        (type(e), e.backfill): r.position for r, e in zip(rows, decode_many([(r.type, r.version, r.data) for r in rows])) if (type(e), getattr(e, "backfill", None)) in ends
    }
    assert {n: ended[f"{kube.ns}/{n}"][3] for _, n in ends} == {n: logged[(t, n)] for t, n in ends}


def test_a_model_that_goes_twice_is_blocked_twice(kube, start_controller):
    """A trial: the second deletion of a Model in one spec generation had no BackfillBlocked
    decision, no log line and no Event (its idempotency key was the first block's)."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    c = start_controller()
    kube.backfill("twice", idleFor="1h")
    _waiting(kube, "twice", "IdleWindow")
    for round_ in (1, 2):
        kube.custom.delete_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube.ns, "models", "gemma")
        wait_for(lambda: kube.status("twice").get("reason") == "ModelNotFound", what=f"Blocked ModelNotFound ({round_})")
        wait_for(lambda: len([b for b in _decisions(c, ev.BackfillBlocked) if b.backfill == "twice"]) == round_,
                 what=f"block {round_} recorded")  # fmt: skip
        wait_for(lambda: len(_event_types_now(kube, "twice", "ModelNotFound")) == round_, what=f"Event {round_}")
        kube.model("gemma")
        _waiting(kube, "twice", "IdleWindow")
    blocks = [b for b in _decisions(c, ev.BackfillBlocked) if b.backfill == "twice"]
    deletions = [p for p, e in _positions(c) if isinstance(e, ev.ModelDeleted) and e.model == "gemma"]
    assert [b.cause for b in blocks] == deletions and len(deletions) == 2


def _event_types_now(kube, name: str, reason: str) -> list[str]:
    return [
        e.type
        for e in kube.core.list_namespaced_event(kube.ns).items
        if e.involved_object.kind == "ModelBackfill" and e.involved_object.name == name and e.reason == reason
    ]


def _positions(controller) -> list:
    rows = list(controller.events.read(0))
    return list(zip([r.position for r in rows], decode_many([(r.type, r.version, r.data) for r in rows])))
