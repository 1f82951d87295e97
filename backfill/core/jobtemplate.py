"""The Job copied from a CronJob's ``spec.jobTemplate``, and the GPU guard.

Pure functions over API JSON (camelCase dicts). Rules (cluster-contract "Job copied from the
CronJob", which is what ``kubectl create job --from=cronjob/NAME`` does, plus the seed):

- labels and annotations of ``spec.jobTemplate.metadata`` and ``spec.jobTemplate.spec``
  verbatim; ``generateName``, ``uid``, ``resourceVersion`` and ``ownerReferences`` are not
  copied;
- the owner is the ModelBackfill (a controller ownerReference), not the CronJob;
- ``activeDeadlineSeconds = maxRunDuration`` in whole seconds;
- ``spec.managedBy`` is not copied (the built-in Job controller enforces the deadline), and the
  pod's ``terminationGracePeriodSeconds`` is at most :data:`MAX_GRACE_SECONDS`;
- ``spec.suspend`` is not copied: the controller creates the Job to run now and owns its
  suspension (``spec.preemption: Suspend``); a Job created suspended would run nothing while
  counted Running and holding its model and node, and its deadline never starts while
  suspended (a trial: a CronJob whose jobTemplate said ``suspend: true``);
- env overrides go to every regular container in sorted key order: an existing entry's value is
  replaced and its ``valueFrom`` removed; a missing one is appended;
- ``FLEXINFER_WORKLOAD_CLASS=background``, ``NVIDIA_VISIBLE_DEVICES=void`` and
  ``AMD_VISIBLE_DEVICES=none`` (no GPU through the NVIDIA or AMD container runtime, whatever the
  image or an ``envFrom`` sets) are forced into every init and regular container;
- a GPU request or limit (a resource name containing ``gpu`` or starting with
  ``nvidia.com/mig-``, nonzero quantity as Kubernetes parses it, :mod:`.quantity`) anywhere in
  the pod template is refused, and so is any dynamic resource claim (it may be a GPU) and a
  container whose env gives it GPUs through the NVIDIA container runtime
  (``NVIDIA_VISIBLE_DEVICES`` other than ``void`` or ``none``, or from ``valueFrom``), a pod
  template annotation under ``cdi.k8s.io/`` or a subdomain of it (devices a CDI-enabled runtime
  injects), a privileged container, any ``hostPath`` volume, ``hostPID``/``hostIPC``, a
  capability beyond Pod Security baseline, a resource of a GPU vendor's domain or a DRA extended
  resource, CRI-O's devices annotation, ``AMD_VISIBLE_DEVICES`` other than ``void``/``none``, and
  a volume mount at ``/var/run/nvidia-container-devices`` (the NVIDIA runtime's device list).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import posixpath
from collections.abc import Mapping
from typing import Any

from .quantity import is_zero
from .spec import AMD_DEVICES_ENV, BACKGROUND_CLASS, GPU_DEVICES_ENV, NO_AMD_DEVICES, NO_GPU_DEVICES, RESERVED_ENV, Spec

API_GROUP = "ai.flexinfer"
API_VERSION = "v1alpha2"
#: Label on every owned Job: the ModelBackfill's name, or for a name over 63 characters its
#: first characters and a hash (:func:`backfill_label_value`). The Job watcher selects on this key.
BACKFILL_LABEL = "modelbackfill.ai.flexinfer/name"
#: Label on every owned Job: the ModelBackfill's uid (36 characters, always a valid label value).
UID_LABEL = "modelbackfill.ai.flexinfer/uid"
ATTEMPT_LABEL = "modelbackfill.ai.flexinfer/attempt"
_MAX_NAME = 63  # label values (Kubernetes IsValidLabelValue: at most 63 characters)
_INDEX_ROOM = len("-99999")  # an Indexed Job's pods are named "<job>-<index>": completions up to 100,000
_MAX_JOB_NAME = _MAX_NAME - _INDEX_ROOM


@functools.lru_cache(maxsize=4096)
def _uid_hash(uid: str) -> str:
    return hashlib.sha256(uid.encode()).hexdigest()[:6]


def job_name(backfill: str, uid: str, attempt: int) -> str:
    """Deterministic Job name of an attempt: ``<backfill>-<6 hex of sha256(uid)>-<attempt>``.

    The same attempt always gets the same name, so a repeated create is AlreadyExists, never a
    second Job; the uid hash keeps a re-created ModelBackfill of the same name from adopting an
    old Job. The name is a DNS label (no dots: each ``.`` of the backfill name becomes ``-``)
    of at most 57 characters: the API server requires ``<job name>-<completions - 1>`` of an
    Indexed Job to be a DNS label (kubernetes ``pkg/apis/batch/validation`` ``ValidateJob``, the
    pods' hostname), so 6 characters are left for ``-99999`` (completions up to 100,000). The
    backfill name is cut to fit and stripped of a trailing ``-``.
    """
    number = str(attempt)
    return _job_name_head(backfill, uid, len(number)) + number


@functools.lru_cache(maxsize=4096)
def _job_name_head(backfill: str, uid: str, digits: int) -> str:
    """:func:`job_name` without the attempt number of ``digits`` digits (``<backfill cut>-<6 hex>-``):
    the same for every attempt of a ModelBackfill with as many digits, so cached (issue 10:
    ``simulate`` names about 90,000 attempts)."""
    return backfill.replace(".", "-")[: _MAX_JOB_NAME - (8 + digits)].rstrip("-") + f"-{_uid_hash(uid)}-"


def attempt_of_job_name(name: str, backfill: str, uid: str) -> int:
    """The attempt number ``n`` whose :func:`job_name` for ``backfill`` (uid ``uid``) is
    ``name``, or 0 when ``name`` is no attempt's name of that ModelBackfill."""
    tail = name.rpartition("-")[2]
    if not (0 < len(tail) <= 9 and tail.isascii() and tail.isdigit()):
        return 0
    n = int(tail)
    return n if n > 0 and job_name(backfill, uid, n) == name else 0


def backfill_label_value(backfill: str) -> str:
    """The value of :data:`BACKFILL_LABEL` for a ModelBackfill name (valid for any name the CRD takes).

    A name of at most 63 characters is used as is (a DNS subdomain is a valid label value). A
    longer one (up to 253) becomes its first characters, cut at 56 and stripped of a trailing
    ``-``/``.``, plus ``-`` and 6 hex of its sha256, so the value stays a valid label value and
    distinct names stay (almost surely) distinct. The controller never reads the name back from
    the label: :func:`backfill_of_job` uses the ownerReference.
    """
    if len(backfill) <= _MAX_NAME:
        return backfill
    digest = hashlib.sha256(backfill.encode()).hexdigest()[:6]
    return backfill[: _MAX_NAME - 7].rstrip("-.") + "-" + digest


def backfill_of_job(metadata: Mapping[str, Any]) -> str | None:
    """The name of the ModelBackfill that owns a Job (API JSON ``metadata``), or None.

    The controller ownerReference of kind ModelBackfill in group ``ai.flexinfer`` names it in
    full, whatever its length. A Job without one is not owned, whatever its labels (a
    hostile-input trial labelled a foreign Job with :data:`BACKFILL_LABEL` and the controller
    deleted it as unexplained and held that ModelBackfill's admissions; README: a Job without a
    controller ownerReference to the ModelBackfill is never adopted or deleted); its label
    (:func:`labelled_backfill`) still ties it to an attempt whose Job uid the log knows. Never
    raises on malformed metadata.
    """
    for ref in metadata.get("ownerReferences") or []:
        if (
            isinstance(ref, Mapping)
            and ref.get("controller")
            and ref.get("kind") == "ModelBackfill"
            and str(ref.get("apiVersion", "")).split("/")[0] == API_GROUP
            and ref.get("name")
        ):
            return str(ref["name"])
    return None


def labelled_backfill(metadata: Mapping[str, Any]) -> str | None:
    """The :data:`BACKFILL_LABEL` value of a Job (API JSON ``metadata``), or None: the
    ModelBackfill a Job without a controller ownerReference says it belongs to (its name, or
    past 63 characters its hashed form). Not ownership: see :func:`backfill_of_job`. Never raises."""
    labels = metadata.get("labels")
    value = labels.get(BACKFILL_LABEL) if isinstance(labels, Mapping) else None
    return str(value) if value else None


def _is_gpu_resource(name: str) -> bool:
    """A resource name containing ``gpu`` or starting with ``nvidia.com/mig-`` (cluster-contract),
    any resource of a GPU vendor's domain (:data:`GPU_VENDOR_DOMAINS`: AMD's GPU partitions are
    ``amd.com/cpx_nps4``, a renaming device plugin's ``nvidia.com/a100``) and a DRA extended
    resource, ``deviceclass.resource.kubernetes.io/<class>`` (a claim the scheduler makes; an
    adversarial trial: all three were admitted)."""
    n = name.lower()
    domain = n.partition("/")[0]
    return "gpu" in n or domain in GPU_VENDOR_DOMAINS or domain == DRA_EXTENDED_RESOURCE_DOMAIN


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _pod_template(job_template: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(_mapping(_mapping(job_template).get("spec")).get("template"))


def _pod_spec(job_template: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(_pod_template(job_template).get("spec"))


def _containers(pod: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    items = pod.get(kind)
    return [c for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []


def gpu_requests(job_template: Mapping[str, Any]) -> list[str]:
    """Every GPU request or limit in the template, as ``"<container>: <requests|limits> <name>=<qty>"``.

    Looks at init, regular and ephemeral containers and the pod-level ``resources``. A dynamic
    resource claim (``spec.resourceClaims`` of the pod, ``resources.claims`` of a container) is
    listed too, whatever it claims: its device class lives in another object, and it may be a
    GPU (seed: "or another GPU resource"; fail-closed, beyond cluster-contract's resource-name
    rule); so is a container's ``NVIDIA_VISIBLE_DEVICES`` other than ``void``/``none`` (the NVIDIA
    container runtime's GPUs, requested or not), a pod template annotation under
    ``cdi.k8s.io/`` or a subdomain (devices a CDI-enabled runtime injects), a privileged
    container, any ``hostPath`` volume (other volume kinds are not the node's), ``hostPID`` and
    ``hostIPC``, a capability outside :data:`BASELINE_CAPABILITIES`, CRI-O's devices annotation,
    ``AMD_VISIBLE_DEVICES`` as the NVIDIA one, and a volume mount at :data:`DEVICE_LIST_MOUNTS`:
    each reaches the node's devices. Resource names: :func:`_is_gpu_resource`. An empty list means the template is CPU-only.
    Never raises: malformed parts of the template are skipped (:func:`template_problem` names them).
    """
    found: list[str] = []
    pod = _pod_spec(job_template)
    # (label, object, its claims, what they are called): the pod's own resources (pod-level
    # resources, Kubernetes 1.32+) and spec.resourceClaims, then every container's
    owners = [("pod", pod, pod.get("resourceClaims"), "resourceClaims")] + [
        (str(c.get("name", "?")), c, _mapping(c.get("resources")).get("claims"), "resource claim")
        for kind in _CONTAINER_KINDS
        for c in _containers(pod, kind)
    ]
    annotations = _mapping(_mapping(_pod_template(job_template).get("metadata")).get("annotations"))
    for key, value in annotations.items():
        if _is_cdi_annotation(str(key)):  # a runtime with CDI enabled injects these devices
            found.append(f"pod: annotation {key}={value} (Container Device Interface: devices the runtime injects)")
        elif str(key) == CRIO_DEVICES_ANNOTATION:
            found.append(f"pod: annotation {key}={value} (CRI-O adds these host devices)")
    for volume in pod.get("volumes") if isinstance(pod.get("volumes"), list) else []:
        volume = _mapping(volume)
        if "hostPath" not in volume:  # emptyDir, configMap, secret, a claim ...: none is the node's (a trial)
            continue
        # Any path of the node: "/dev" and "/" hold its devices, and "/proc/1/root", a container
        # runtime's socket ... reach them as well (an adversarial trial): fail-closed, every one.
        path = _node_path(_mapping(volume.get("hostPath")).get("path"))  # no path: "/"
        found.append(f"pod: volume {volume.get('name', '?')} hostPath {path} (the node's files reach its devices, GPUs included)")
    for field in ("hostPID", "hostIPC"):
        if pod.get(field) is True:
            found.append(f"pod: {field} (the node's processes, the model server's GPU context included)")
    for who, owner, claims, called in owners:
        caps = _mapping(_mapping(owner.get("securityContext")).get("capabilities")).get("add") if owner is not pod else None
        for cap in caps if isinstance(caps, list) else []:
            name = str(cap).upper().removeprefix("CAP_")
            if name not in BASELINE_CAPABILITIES:
                found.append(f"{who}: securityContext.capabilities.add {cap} (beyond Pod Security baseline: reaches the node, GPUs included)")
        for mount in owner.get("volumeMounts") if isinstance(owner.get("volumeMounts"), list) else []:  # a container's
            where = _node_path(_mapping(mount).get("mountPath"))
            if any(where == d or where.startswith(d + "/") for d in DEVICE_LIST_MOUNTS):
                found.append(
                    f"{who}: volumeMount {where} (the NVIDIA container runtime reads mounts there as the GPUs to expose)"
                )
        if owner is not pod and _mapping(owner.get("securityContext")).get("privileged") is True:  # a container's
            found.append(f"{who}: securityContext.privileged (a privileged container sees every device of the node, GPUs included)")
        res = _mapping(owner.get("resources"))
        for section in ("requests", "limits"):
            for rname, qty in _mapping(res.get(section)).items():
                if _is_gpu_resource(str(rname)) and not is_zero(qty):
                    found.append(f"{who}: {section} {rname}={qty}")
        for claim in claims if isinstance(claims, list) else []:
            name = claim.get("name", "?") if isinstance(claim, Mapping) else "?"
            found.append(f"{who}: {called} {name} (dynamic resource allocation: may be a GPU)")
        for entry in owner.get("env") if isinstance(owner.get("env"), list) else []:  # a container's (a pod has none)
            env_name = entry.get("name") if isinstance(entry, Mapping) else None
            runtime = DEVICE_ENVS.get(env_name) if isinstance(env_name, str) else None
            if runtime is not None:
                value = entry.get("value")
                if entry.get("valueFrom") is not None or str(value or "").strip().lower() not in ("", "void", "none"):
                    shown = " from valueFrom" if entry.get("valueFrom") is not None else f"={value}"
                    found.append(f"{who}: env {env_name}{shown} (the {runtime} container runtime exposes these GPUs)")
    return found


def _node_path(path: Any) -> str:
    """``path`` as the node resolves it (absolute, normalised): the API server takes "//dev" and
    "/./dev/." (it refuses only ".."); an empty or missing path is "/"."""
    return posixpath.normpath("/" + str(path or "").lstrip("/"))


def _is_cdi_annotation(key: str) -> bool:
    """Whether pod annotation ``key`` is one a CDI-enabled runtime reads as devices to inject:
    its prefix ``cdi.k8s.io`` or a subdomain of it (the NVIDIA toolkit's ``nvidia.cdi.k8s.io/``,
    an adversarial trial)."""
    prefix, slash, _ = key.partition("/")
    return bool(slash) and (prefix == CDI_ANNOTATION_DOMAIN or prefix.endswith("." + CDI_ANNOTATION_DOMAIN))


_CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")
#: Resource-name domains whose every resource may be a GPU (fail-closed; "gpu" in a name is
#: refused anyway): NVIDIA's, AMD's and Intel's GPU device plugins.
GPU_VENDOR_DOMAINS = frozenset({"nvidia.com", "amd.com", "gpu.intel.com"})
#: Extended resources backed by a DRA DeviceClass (``deviceclass.resource.kubernetes.io/<class>``).
DRA_EXTENDED_RESOURCE_DOMAIN = "deviceclass.resource.kubernetes.io"
#: The capabilities Pod Security "baseline" allows a container to add; any other (SYS_ADMIN,
#: SYS_PTRACE, SYS_RAWIO ...) reaches the node and its GPUs (an adversarial trial).
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})  # fmt: skip
#: A pod annotation CRI-O reads as host devices to add, when its runtime handler allows it.
CRIO_DEVICES_ANNOTATION = "io.kubernetes.cri-o.Devices"
#: The longest termination grace period a backfill pod gets, seconds (cluster-contract: "a pod
#: termination grace period of under 5 s for background work"): a longer or unset one is this.
MAX_GRACE_SECONDS = 4
#: The prefix of pod annotations a container runtime with the Container Device Interface enabled
#: (containerd, CRI-O) reads as devices to inject, e.g. ``cdi.k8s.io/gpu: nvidia.com/gpu=all``,
#: and of its subdomains, e.g. ``nvidia.cdi.k8s.io/`` (the NVIDIA toolkit's; adversarial trials:
#: copied into the Job unchanged).
CDI_ANNOTATION_DOMAIN = "cdi.k8s.io"
#: Container env names a GPU container runtime reads as the GPUs to expose -> the runtime
#: (refused in a template or ``spec.env``, and forced in every container by :func:`build_job`:
#: ``void`` and ``none``, which win over an image's value or an ``envFrom``).
DEVICE_ENVS = {GPU_DEVICES_ENV: "NVIDIA", AMD_DEVICES_ENV: "AMD"}
#: Where the NVIDIA container runtime with ``accept-nvidia-visible-devices-as-volume-mounts``
#: reads mounts as the GPUs to expose (an adversarial trial: ``.../all`` was admitted).
DEVICE_LIST_MOUNTS = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")


def template_problem(job_template: Mapping[str, Any] | None) -> str | None:
    """Why a CronJob's jobTemplate cannot be copied (a message), or None when it can. Never raises."""
    if not isinstance(job_template, Mapping):
        return "the CronJob has no spec.jobTemplate"
    for path, value in (("metadata", job_template.get("metadata")), ("spec", job_template.get("spec"))):
        if value is not None and not isinstance(value, Mapping):
            return f"the CronJob's jobTemplate.{path} is not an object"
    pod = _pod_spec(job_template)
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        return "the CronJob's job template has no containers"
    for kind in ("initContainers", "containers"):
        items = pod.get(kind)
        if items is None:
            continue
        if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
            return f"the CronJob's job template {kind} is not a list of containers"
        for c in items:
            if c.get("env") is not None and not (
                isinstance(c.get("env"), list) and all(isinstance(e, Mapping) for e in c["env"])
            ):
                return f"container {c.get('name', '?')}: env is not a list of variables"
    meta = _mapping(job_template.get("metadata"))
    for field in ("labels", "annotations"):
        if meta.get(field) is not None and not isinstance(meta.get(field), Mapping):
            return f"the CronJob's jobTemplate.metadata.{field} is not an object"
    return None


def _set_env(container: dict[str, Any], pairs: list[tuple[str, str]]) -> None:
    env = [dict(e) for e in container.get("env") or [] if isinstance(e, Mapping)]
    index = {e.get("name"): i for i, e in enumerate(env)}
    for name, value in pairs:
        if name in index:
            entry = env[index[name]]
            entry.pop("valueFrom", None)
            entry["value"] = value
        else:
            index[name] = len(env)
            env.append({"name": name, "value": value})
    container["env"] = env


def build_job(
    job_template: Mapping[str, Any],
    *,
    namespace: str,
    backfill: str,
    backfill_uid: str,
    attempt: int,
    spec: Spec,
    name: str | None = None,
) -> dict[str, Any]:
    """Build the batch/v1 Job manifest (API JSON) for one attempt.

    Args:
        job_template: the CronJob's ``spec.jobTemplate`` (camelCase dict); not modified.
        namespace, backfill, backfill_uid: the owning ModelBackfill.
        attempt: the attempt number (names the Job, see :func:`job_name`).
        name: the Job name the attempt was admitted with (its ``AttemptAdmitted``); None:
            :func:`job_name` of ``attempt``.
        spec: the parsed ModelBackfill spec (env overrides, maxRunDuration).

    Returns:
        A new dict: ``{"apiVersion": "batch/v1", "kind": "Job", "metadata": ..., "spec": ...}``.

    Raises:
        ValueError: the template has GPU requests/limits or no containers (callers block first).
    """
    problem = template_problem(job_template)
    if problem:
        raise ValueError(problem)
    gpus = gpu_requests(job_template)
    if gpus:
        raise ValueError("GPU resources are forbidden: " + "; ".join(gpus))
    meta_in = job_template.get("metadata") or {}
    labels = dict(meta_in.get("labels") or {})
    labels[BACKFILL_LABEL] = backfill_label_value(backfill)
    labels[UID_LABEL] = backfill_uid
    labels[ATTEMPT_LABEL] = str(attempt)
    metadata: dict[str, Any] = {
        "name": name if name is not None else job_name(backfill, backfill_uid, attempt),
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [
            {
                "apiVersion": f"{API_GROUP}/{API_VERSION}",
                "kind": "ModelBackfill",
                "name": backfill,
                "uid": backfill_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    annotations = dict(meta_in.get("annotations") or {})
    if annotations:
        metadata["annotations"] = annotations
    job_spec = copy.deepcopy(dict(job_template.get("spec") or {}))
    job_spec["activeDeadlineSeconds"] = max(1, int(spec.max_run))
    job_spec.pop("suspend", None)  # created to run now; the controller owns spec.suspend
    # The built-in Job controller enforces activeDeadlineSeconds: a Job another controller
    # manages may never end (an adversarial trial: managedBy was copied).
    job_spec.pop("managedBy", None)
    pod = job_spec.setdefault("template", {}).setdefault("spec", {})
    # A cancel deletes the Job; its pods get this long after SIGTERM (preStop hooks included) to
    # go on calling the model (an adversarial trial: 86400 was copied; unset, Kubernetes gives
    # 30 s). cluster-contract: a grace period under 5 s for background work.
    grace = pod.get("terminationGracePeriodSeconds")
    if not isinstance(grace, int) or isinstance(grace, bool) or not 0 <= grace <= MAX_GRACE_SECONDS:
        pod["terminationGracePeriodSeconds"] = MAX_GRACE_SECONDS
    overrides = [(k, v) for k, v in sorted(spec.env)]
    background = [(RESERVED_ENV, BACKGROUND_CLASS), (GPU_DEVICES_ENV, NO_GPU_DEVICES), (AMD_DEVICES_ENV, NO_AMD_DEVICES)]
    for c in pod.get("containers") or []:
        _set_env(c, overrides + background)
    for c in pod.get("initContainers") or []:
        _set_env(c, background)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}
