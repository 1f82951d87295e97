"""Spec contract, Go durations and the Job copied from a CronJob template."""

from __future__ import annotations

import pytest

from backfill.core.durations import DurationError, format_duration, parse_duration
from backfill.core.jobtemplate import build_job, gpu_requests, job_name
from backfill.core.spec import Spec, SpecProblem, parse_spec


@pytest.mark.parametrize(
    "text, seconds",
    [("90s", 90), ("30m", 1800), ("1h30m", 5400), ("24h", 86400), ("0", 0), ("1.5h", 5400), ("500ms", 0.5), ("2h0m0s", 7200)],
)
def test_go_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "1d", "1w", "-5m", "1h 30m", "m", "abc", "1.2.3s", " 5m"])
def test_bad_durations(text):
    with pytest.raises(DurationError):
        parse_duration(text)


def test_format_duration_round_trips():
    for s in (0, 1, 59, 60, 90, 3600, 5400, 86400, 93784):
        assert parse_duration(format_duration(s)) == s
    assert format_duration(5400) == "1h30m0s"


def test_defaults_and_valid_spec():
    spec = parse_spec({"modelRef": "m", "templateRef": "t", "env": {"B": "2", "A": "1"}})
    assert spec == Spec("m", "t", idle_for=600, max_run=1800, repeat_after=0, env=(("A", "1"), ("B", "2")), suspend=False)
    zero = parse_spec({"modelRef": "m", "templateRef": "t", "idleFor": "0s", "maxRunDuration": "0", "repeatAfter": "0s"})
    assert (zero.idle_for, zero.max_run, zero.repeat_after) == (600, 1800, 0)
    assert parse_spec({"modelRef": "m", "templateRef": "t", "repeatAfter": "1m"}).repeat_after == 60


@pytest.mark.parametrize("zero", ["0s", "0", "0.0000000001s", "0.9ns", "0.5ns0.4ns"])
def test_a_duration_that_parses_to_zero_takes_the_zero_path(zero):
    # Go (and the API server's CEL rules) read "0.0000000001s" as 0: idleFor and maxRunDuration
    # get their defaults and repeatAfter stays one-shot, exactly as for "0s".
    spec = parse_spec({"modelRef": "m", "templateRef": "t", "idleFor": zero, "maxRunDuration": zero, "repeatAfter": zero})
    assert isinstance(spec, Spec), spec
    assert (spec.idle_for, spec.max_run, spec.repeat_after) == (600, 1800, 0)


@pytest.mark.parametrize(
    "raw, reason, fragment",
    [
        ({"templateRef": "t"}, "InvalidSpec", "modelRef is required"),
        ({"modelRef": "m", "templateRef": 5}, "InvalidSpec", "templateRef"),
        ({"modelRef": "m", "templateRef": "t", "idleFor": "-1m"}, "InvalidSpec", "negative"),
        ({"modelRef": "m", "templateRef": "t", "maxRunDuration": 30}, "InvalidSpec", "needs a unit"),
        ({"modelRef": "m", "templateRef": "t", "repeatAfter": "59s"}, "InvalidRepeatAfter", "at least 1m"),
        ({"modelRef": "m", "templateRef": "t", "suspend": "yes"}, "InvalidSpec", "suspend"),
        ({"modelRef": "m", "templateRef": "t", "env": {"A=B": "x"}}, "InvalidEnvironment", "'A=B'"),
        ({"modelRef": "m", "templateRef": "t", "env": {"X": 1}}, "InvalidEnvironment", "literal string"),
        ({"modelRef": "m", "templateRef": "t", "env": {"FLEXINFER_WORKLOAD_CLASS": "background"}}, "InvalidEnvironment", "reserves"),
        # an adversarial trial: admitted, and on an NVIDIA-runtime node every GPU in a "CPU-only" Job
        ({"modelRef": "m", "templateRef": "t", "env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "InvalidEnvironment", "may not set NVIDIA_VISIBLE_DEVICES"),
        ({"modelRef": "m", "templateRef": "t", "env": {f"V{i}": "" for i in range(33)}}, "InvalidEnvironment", "33 entries"),
        (None, "InvalidSpec", "object"),
    ],
)
def test_spec_problems(raw, reason, fragment):
    p = parse_spec(raw)
    assert isinstance(p, SpecProblem) and p.reason == reason and fragment in p.message


def test_32_env_entries_are_fine():
    assert isinstance(parse_spec({"modelRef": "m", "templateRef": "t", "env": {f"V{i}": "" for i in range(32)}}), Spec)


TEMPLATE = {
    "metadata": {"labels": {"app": "gauntlet"}, "annotations": {"a": "b"}, "generateName": "x-", "uid": "u", "resourceVersion": "9"},
    "spec": {
        "backoffLimit": 0,
        "template": {
            "spec": {
                "initContainers": [{"name": "init", "image": "i"}],
                "containers": [
                    {
                        "name": "one",
                        "image": "x",
                        "env": [
                            {"name": "MODELS", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
                            {"name": "KEEP", "value": "k"},
                        ],
                    },
                    {"name": "two", "image": "y"},
                ],
            }
        },
    },
}


def test_build_job_copies_the_template_and_applies_the_contract():
    spec = parse_spec({"modelRef": "m", "templateRef": "t", "maxRunDuration": "15m", "env": {"MODELS": "gemma=vllm", "GAUNTLET_API": "chat"}})
    job = build_job(TEMPLATE, namespace="ns", backfill="bf", backfill_uid="uid-1", attempt=3, spec=spec)
    meta = job["metadata"]
    assert meta["name"] == job_name("bf", "uid-1", 3) and meta["name"].endswith("-3")
    assert meta["labels"]["app"] == "gauntlet" and meta["annotations"] == {"a": "b"}
    assert not {"generateName", "uid", "resourceVersion"} & set(meta)
    assert meta["ownerReferences"] == [
        {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "ModelBackfill", "name": "bf", "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}
    ]
    assert job["spec"]["activeDeadlineSeconds"] == 900 and job["spec"]["backoffLimit"] == 0
    one, two = job["spec"]["template"]["spec"]["containers"]
    assert one["env"] == [
        {"name": "MODELS", "value": "gemma=vllm"},
        {"name": "KEEP", "value": "k"},
        {"name": "GAUNTLET_API", "value": "chat"},
        {"name": "FLEXINFER_WORKLOAD_CLASS", "value": "background"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "AMD_VISIBLE_DEVICES", "value": "none"},
    ]
    assert two["env"] == [
        {"name": "GAUNTLET_API", "value": "chat"},
        {"name": "MODELS", "value": "gemma=vllm"},
        {"name": "FLEXINFER_WORKLOAD_CLASS", "value": "background"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "AMD_VISIBLE_DEVICES", "value": "none"},
    ]
    (init,) = job["spec"]["template"]["spec"]["initContainers"]
    assert init["env"] == [
        {"name": "FLEXINFER_WORKLOAD_CLASS", "value": "background"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "AMD_VISIBLE_DEVICES", "value": "none"},
    ]
    # the template itself is untouched
    assert TEMPLATE["spec"]["template"]["spec"]["containers"][0]["env"][0] == {"name": "MODELS", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}


def test_job_names_are_deterministic_and_bounded():
    long = "x" * 80
    assert job_name(long, "u", 12) == job_name(long, "u", 12)
    assert len(job_name(long, "u", 12)) <= 63
    assert job_name("b", "u1", 1) != job_name("b", "u2", 1)


@pytest.mark.parametrize(
    "resources, found",
    [
        ({"limits": {"nvidia.com/gpu": "1"}}, ["c: limits nvidia.com/gpu=1"]),
        ({"requests": {"amd.com/gpu": 2}}, ["c: requests amd.com/gpu=2"]),
        ({"requests": {"gpu.intel.com/i915": "1"}}, ["c: requests gpu.intel.com/i915=1"]),
        ({"limits": {"nvidia.com/mig-1g.5gb": "1"}}, ["c: limits nvidia.com/mig-1g.5gb=1"]),
        ({"limits": {"nvidia.com/gpu": "0"}}, []),
        ({"requests": {"cpu": "2", "memory": "1Gi"}}, []),
    ],
)
def test_gpu_guard(resources, found):
    tpl = {"spec": {"template": {"spec": {"containers": [{"name": "c", "resources": resources}]}}}}
    assert gpu_requests(tpl) == found
    if found:
        with pytest.raises(ValueError, match="GPU resources are forbidden"):
            build_job(tpl, namespace="n", backfill="b", backfill_uid="u", attempt=1, spec=Spec("m", "t"))


def test_gpu_in_an_init_container_counts():
    tpl = {"spec": {"template": {"spec": {"initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}], "containers": [{"name": "c"}]}}}}
    assert gpu_requests(tpl) == ["i: limits nvidia.com/gpu=1"]


def test_dynamic_resource_claims_and_pod_level_gpus_are_refused():
    """A DRA claim names a ResourceClaimTemplate whose device class this controller cannot read
    from the template (a tester ran a GPU-claiming Job through the guard): refused, fail-closed;
    pod-level ``resources`` (Kubernetes 1.32+) are checked like a container's."""
    claimed = {"spec": {"template": {"spec": {
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
        "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
    }}}}  # fmt: skip
    assert gpu_requests(claimed) == [
        "pod: resourceClaims gpu (dynamic resource allocation: may be a GPU)",
        "c: resource claim gpu (dynamic resource allocation: may be a GPU)",
    ]
    pod_level = {"spec": {"template": {"spec": {"resources": {"limits": {"nvidia.com/gpu": "1"}}, "containers": [{"name": "c"}]}}}}
    assert gpu_requests(pod_level) == ["pod: limits nvidia.com/gpu=1"]
    cpu_only = {"spec": {"template": {"spec": {"resources": {"requests": {"cpu": "1"}}, "containers": [{"name": "c"}]}}}}
    assert gpu_requests(cpu_only) == []
    with pytest.raises(ValueError, match="GPU resources are forbidden"):
        build_job(claimed, namespace="n", backfill="b", backfill_uid="u", attempt=1, spec=Spec("m", "t"))
    # a container named "pod" is a container (its claims are read where a container keeps them)
    named_pod = {"spec": {"template": {"spec": {"containers": [{"name": "pod", "resources": {"claims": [{"name": "g"}]}}]}}}}
    assert gpu_requests(named_pod) == ["pod: resource claim g (dynamic resource allocation: may be a GPU)"]


def test_a_ref_longer_than_an_object_name_is_invalid_spec():
    """An object stored before the CRD's maxLength (a 200,000-character modelRef) was Blocked
    ModelNotFound with the whole name in its message; it is InvalidSpec, the name cut."""
    long_model = parse_spec({"modelRef": "m" * 200_000, "templateRef": "t"})
    assert isinstance(long_model, SpecProblem) and long_model.reason == "InvalidSpec"
    assert long_model.message == f"spec.modelRef {'m' * 80!r}... has 200000 characters; an object name has at most 253"
    assert isinstance(parse_spec({"modelRef": "m" * 253, "templateRef": "t" * 52}), Spec)
    long_template = parse_spec({"modelRef": "m", "templateRef": "t" * 53})
    assert isinstance(long_template, SpecProblem) and "at most 52" in long_template.message


@pytest.mark.parametrize(
    "env, found",
    [
        ([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], ["c: env NVIDIA_VISIBLE_DEVICES=all (the NVIDIA container runtime exposes these GPUs)"]),
        ([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}], ["c: env NVIDIA_VISIBLE_DEVICES=0,1 (the NVIDIA container runtime exposes these GPUs)"]),
        ([{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "k"}}}],
         ["c: env NVIDIA_VISIBLE_DEVICES from valueFrom (the NVIDIA container runtime exposes these GPUs)"]),
        ([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}], []),
        ([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}], []),
        ([{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}], []),  # selects among visible GPUs: none are
    ],
)
def test_a_template_giving_gpus_through_the_nvidia_runtime_is_refused(env, found):
    """An adversarial trial: a CronJob whose container set ``NVIDIA_VISIBLE_DEVICES=all`` (with
    ``runtimeClassName: nvidia``) was admitted: on a node with the NVIDIA container runtime the
    "CPU-only" Job sees every GPU without requesting one."""
    tpl = {"spec": {"template": {"spec": {"runtimeClassName": "nvidia", "containers": [{"name": "c", "env": env}]}}}}
    assert gpu_requests(tpl) == found
    if not found:
        job = build_job(tpl, namespace="n", backfill="b", backfill_uid="u", attempt=1, spec=Spec("m", "t"))
        (c,) = job["spec"]["template"]["spec"]["containers"]
        assert [e for e in c["env"] if e["name"] == "NVIDIA_VISIBLE_DEVICES"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def test_every_container_of_a_job_gets_no_gpu_through_the_nvidia_runtime():
    """A CUDA base image sets ``NVIDIA_VISIBLE_DEVICES=all`` in the image: a container's env
    overrides the image's, so every init and regular container gets ``void``."""
    tpl = {"spec": {"template": {"spec": {
        "initContainers": [{"name": "i", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04"}],
        "containers": [{"name": "a", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04"}, {"name": "b", "env": [{"name": "X", "value": "1"}]}],
    }}}}  # fmt: skip
    pod = build_job(tpl, namespace="n", backfill="b", backfill_uid="u", attempt=1, spec=Spec("m", "t"))["spec"]["template"]["spec"]
    for c in pod["initContainers"] + pod["containers"]:
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in c["env"], c


def test_a_cdi_device_annotation_on_the_pod_template_is_refused():
    """An adversarial trial: ``cdi.k8s.io/gpu: nvidia.com/gpu=all`` on the CronJob's pod template
    was copied into the Job unchanged: a runtime with the Container Device Interface enabled
    (containerd, CRI-O) injects those devices into a container that requests none."""
    def tpl(annotations):
        return {"spec": {"template": {"metadata": {"annotations": annotations}, "spec": {"containers": [{"name": "c"}]}}}}

    assert gpu_requests(tpl({"cdi.k8s.io/gpu": "nvidia.com/gpu=all"})) == [
        "pod: annotation cdi.k8s.io/gpu=nvidia.com/gpu=all (Container Device Interface: devices the runtime injects)"
    ]
    assert gpu_requests(tpl({"example.com/cdi.k8s.io": "x", "team": "eval"})) == []
    with pytest.raises(ValueError, match="GPU resources are forbidden"):
        build_job(tpl({"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}), namespace="n", backfill="b", backfill_uid="u", attempt=1, spec=Spec("m", "t"))


def test_privileged_containers_and_host_device_mounts_are_refused():
    """Left undone by the first GPU-guard round (the adversarial trial's list): a privileged
    container sees every device node of the host, ``/dev/nvidia*`` included, and so does a
    ``hostPath`` mount of ``/dev`` (or of ``/``): a "CPU-only" Job with the node's GPUs."""
    def tpl(pod):
        return {"spec": {"template": {"spec": {"containers": [{"name": "c"}], **pod}}}}

    privileged = tpl({"initContainers": [{"name": "i", "securityContext": {"privileged": True}}]})
    assert gpu_requests(privileged) == ["i: securityContext.privileged (a privileged container sees every device of the node, GPUs included)"]
    # the spellings the API server accepts for the same directories ("//dev", "/./dev/.": it
    # refuses only ".."), found open by a re-read of the guard (2026-12-05)
    for path, shown in (("/dev", "/dev"), ("/dev/", "/dev"), ("/dev/nvidia0", "/dev/nvidia0"), ("/", "/"), ("//dev", "/dev"),
                        ("/./dev/.", "/dev"), ("///dev//nvidia0", "/dev/nvidia0"), ("//", "/"), ("dev", "/dev")):  # fmt: skip
        mounted = tpl({"volumes": [{"name": "d", "hostPath": {"path": path}}]})
        assert gpu_requests(mounted) == [f"pod: volume d hostPath {shown} (the node's files reach its devices, GPUs included)"], path
    fine = tpl({"volumes": [{"name": "data", "emptyDir": {}}], "securityContext": {"runAsNonRoot": True}})
    fine["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": False, "allowPrivilegeEscalation": False}
    assert gpu_requests(fine) == []
    with pytest.raises(ValueError, match="GPU resources are forbidden"):
        build_job(privileged, namespace="n", backfill="b", backfill_uid="u", attempt=1, spec=Spec("m", "t"))


def test_volumes_that_are_not_the_nodes_are_no_device_mount():
    """A hostile-input trial: an ``emptyDir`` at ``/tmp`` and a mounted ConfigMap were read as
    ``hostPath /`` (no ``hostPath``: an empty path), so an ordinary template was Blocked
    ``GPURequestForbidden`` and could never run."""
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cfg", "mountPath": "/etc/cfg"}, {"name": "s", "mountPath": "/s"}, {"name": "p", "mountPath": "/p"}]
    tpl = {"spec": {"template": {"spec": {
        "containers": [{"name": "c", "volumeMounts": mounts}],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}, {"name": "cfg", "configMap": {"name": "x"}},
                    {"name": "s", "secret": {"secretName": "y"}}, {"name": "p", "persistentVolumeClaim": {"claimName": "z"}}],
    }}}}  # fmt: skip
    assert gpu_requests(tpl) == []
    build_job(tpl, namespace="n", backfill="b", backfill_uid="u", attempt=1, spec=Spec("m", "t"))
    # a hostPath without a path is still the node's root (fail-closed)
    tpl["spec"]["template"]["spec"]["volumes"].append({"name": "h", "hostPath": {}})
    assert gpu_requests(tpl) == ["pod: volume h hostPath / (the node's files reach its devices, GPUs included)"]


@pytest.mark.parametrize(
    "key, refused",
    [("nvidia.cdi.k8s.io/gpu", True), ("nvidia.cdi.k8s.io/container.c", True), ("cdi.k8s.io/x", True),
     ("cdi.k8s.io", False), ("notcdi.k8s.io/x", False), ("cdi.k8s.io.example.com/x", False), ("example.com/cdi.k8s.io", False)],
)  # fmt: skip
def test_a_cdi_annotation_under_a_subdomain_is_refused(key, refused):
    """A hostile-input trial: the NVIDIA GPU Operator's toolkit reads ``nvidia.cdi.k8s.io/`` (its
    CDI annotation prefix) and ``nvidia.cdi.k8s.io/container.c: management.nvidia.com/gpu=all``
    ran, unrefused; a subdomain of ``cdi.k8s.io`` is the same kind of annotation."""
    tpl = {"spec": {"template": {"metadata": {"annotations": {key: "nvidia.com/gpu=all"}}, "spec": {"containers": [{"name": "c"}]}}}}
    expected = [f"pod: annotation {key}=nvidia.com/gpu=all (Container Device Interface: devices the runtime injects)"]
    assert gpu_requests(tpl) == (expected if refused else [])


@pytest.mark.parametrize("path", ["/var/run/nvidia-container-devices/all", "/var/run/nvidia-container-devices", "//run/nvidia-container-devices/0/"])
def test_a_mount_at_the_nvidia_runtimes_device_list_is_refused(path):
    """A hostile-input trial: a volume mounted at ``/var/run/nvidia-container-devices/all`` was
    admitted; a runtime set to read visible devices as volume mounts (Bottlerocket's default)
    gives that container every GPU, whatever ``NVIDIA_VISIBLE_DEVICES`` says."""
    tpl = {"spec": {"template": {"spec": {
        "initContainers": [{"name": "i", "volumeMounts": [{"name": "v", "mountPath": path}]}],
        "containers": [{"name": "c", "volumeMounts": [{"name": "v", "mountPath": "/var/run/nvidia-container-devices-cache"}]}],
        "volumes": [{"name": "v", "emptyDir": {}}],
    }}}}  # fmt: skip
    shown = "/" + path.strip("/").replace("//", "/")
    assert gpu_requests(tpl) == [f"i: volumeMount {shown} (the NVIDIA container runtime reads mounts there as the GPUs to expose)"]


def test_amd_visible_devices_is_refused_in_a_template_and_in_spec_env():
    """A hostile-input trial: ``AMD_VISIBLE_DEVICES: all`` (the AMD container runtime's GPUs) was
    admitted; it is refused as ``NVIDIA_VISIBLE_DEVICES`` is, in the template and in ``spec.env``."""
    from backfill.core.spec import parse_spec

    def tpl(value):
        return {"spec": {"template": {"spec": {"runtimeClassName": "amd", "containers": [{"name": "c", "env": [{"name": "AMD_VISIBLE_DEVICES", "value": value}]}]}}}}

    assert gpu_requests(tpl("all")) == ["c: env AMD_VISIBLE_DEVICES=all (the AMD container runtime exposes these GPUs)"]
    assert gpu_requests(tpl("none")) == []
    problem = parse_spec({"modelRef": "m", "templateRef": "t", "idleFor": "30m", "maxRunDuration": "15m", "env": {"AMD_VISIBLE_DEVICES": "all"}})
    assert (problem.reason, problem.message) == ("InvalidEnvironment", "spec.env may not set AMD_VISIBLE_DEVICES: the controller reserves it for background safety")


def test_a_huge_value_is_clipped_in_the_blocked_message():
    """A hostile-input trial: ``idleFor: 1e308`` under a looser CRD (a 309-digit integer) came back
    whole in the status message; so did a 500-character string. Clipped in the middle."""
    from backfill.core.spec import parse_spec

    base = {"modelRef": "m", "templateRef": "t", "maxRunDuration": "15m"}
    huge = parse_spec({**base, "idleFor": 10**308})
    assert huge.reason == "InvalidSpec" and "..." in huge.message and len(huge.message) < 200
    assert huge.message.startswith("spec.idleFor 1000") and "needs a unit" in huge.message
    long = parse_spec({**base, "idleFor": "x" * 500})
    assert long.reason == "InvalidSpec" and "..." in long.message and len(long.message) < 200
    assert parse_spec({**base, "idleFor": 30}).message == "spec.idleFor 30 needs a unit, e.g. '30s'"  # short values whole



def test_node_access_gpu_vendor_resources_and_runtime_device_annotations_are_refused():
    """An adversarial trial (round 2): every one of these was admitted and copied into the Job.
    Any hostPath (``/proc/1/root`` is the node's root, a container runtime's socket is root on
    the node), ``hostPID``/``hostIPC``, a capability beyond Pod Security baseline, a resource of
    a GPU vendor's domain without "gpu" in its name (AMD's GPU partitions, a renaming device
    plugin), a DRA extended resource, CRI-O's devices annotation."""
    def tpl(pod=None, container=None, annotations=None):
        c = {"name": "c", **(container or {})}
        return {"spec": {"template": {"metadata": {"annotations": annotations or {}}, "spec": {"containers": [c], **(pod or {})}}}}

    cases = [
        (tpl(pod={"volumes": [{"name": "r", "hostPath": {"path": "/proc/1/root"}}]}), "pod: volume r hostPath /proc/1/root"),
        (tpl(pod={"volumes": [{"name": "s", "hostPath": {"path": "/run/containerd/containerd.sock"}}]}), "pod: volume s hostPath /run/containerd/containerd.sock"),
        (tpl(pod={"hostPID": True}), "pod: hostPID"),
        (tpl(pod={"hostIPC": True}), "pod: hostIPC"),
        (tpl(container={"securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}), "c: securityContext.capabilities.add SYS_PTRACE"),
        (tpl(container={"securityContext": {"capabilities": {"add": ["cap_sys_admin"]}}}), "c: securityContext.capabilities.add cap_sys_admin"),
        (tpl(container={"resources": {"limits": {"amd.com/cpx_nps4": "1"}}}), "c: limits amd.com/cpx_nps4=1"),
        (tpl(container={"resources": {"limits": {"nvidia.com/a100": "1"}}}), "c: limits nvidia.com/a100=1"),
        (tpl(container={"resources": {"limits": {"deviceclass.resource.kubernetes.io/mig.nvidia.com": "1"}}}),
         "c: limits deviceclass.resource.kubernetes.io/mig.nvidia.com=1"),
        (tpl(annotations={"io.kubernetes.cri-o.Devices": "/dev/kfd"}), "pod: annotation io.kubernetes.cri-o.Devices=/dev/kfd"),
    ]  # fmt: skip
    for template, start in cases:
        found = gpu_requests(template)
        assert len(found) == 1 and found[0].startswith(start), (start, found)
    # what baseline allows, and what reaches no device, stays admitted
    fine = tpl(pod={"hostNetwork": False, "hostPID": False}, container={
        "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"], "drop": ["ALL"]}},
        "resources": {"limits": {"cpu": "2", "memory": "1Gi", "example.com/foo": "1"}},
        "env": [{"name": ["not", "a", "string"], "value": "x"}],  # a malformed entry: skipped, never a TypeError
    })  # fmt: skip
    assert gpu_requests(fine) == []


@pytest.mark.parametrize("grace, expected", [(None, 4), (86400, 4), (5, 4), (4, 4), (0, 0), (2, 2), ("30", 4), (True, 4), (-1, 4)])
def test_the_pods_termination_grace_period_is_at_most_4_seconds_and_managed_by_is_dropped(grace, expected):
    """An adversarial trial: ``terminationGracePeriodSeconds: 86400`` was copied, so a cancelled
    pod that ignores SIGTERM could go on calling the model for a day (unset, Kubernetes gives
    30 s); cluster-contract: "a pod termination grace period of under 5 s for background work".
    ``spec.managedBy`` was copied too: the built-in Job controller then ignores the Job and
    nobody enforces its deadline."""
    pod = {"containers": [{"name": "c"}]}
    if grace is not None:
        pod["terminationGracePeriodSeconds"] = grace
    tpl = {"spec": {"managedBy": "example.com/not-the-job-controller", "template": {"spec": pod}}}
    job = build_job(tpl, namespace="n", backfill="b", backfill_uid="u", attempt=1, spec=Spec("m", "t"))
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == expected
    assert "managedBy" not in job["spec"]


def test_amd_visible_devices_from_env_from_is_overridden_in_every_container():
    """Adversarial trials: ``envFrom`` a ConfigMap holding ``AMD_VISIBLE_DEVICES=all`` was
    admitted and the pod would get the AMD runtime's GPUs (the guard reads ``env`` only). An
    explicit ``env`` entry wins over ``envFrom``: every init and regular container gets ``none``,
    which the runtime reads as no device (neither ``all`` nor an index)."""
    tpl = {"spec": {"template": {"spec": {
        "initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "gpu-env"}}]}],
        "containers": [{"name": "c", "envFrom": [{"prefix": "AMD_", "secretRef": {"name": "s"}}]}],
    }}}}  # fmt: skip
    assert gpu_requests(tpl) == []  # nothing to see in the template itself
    pod = build_job(tpl, namespace="n", backfill="b", backfill_uid="u", attempt=1, spec=Spec("m", "t"))["spec"]["template"]["spec"]
    for c in pod["initContainers"] + pod["containers"]:
        assert [e for e in c["env"] if e["name"] == "AMD_VISIBLE_DEVICES"] == [{"name": "AMD_VISIBLE_DEVICES", "value": "none"}], c
