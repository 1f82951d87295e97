"""The ModelBackfill spec: parsing and the seed's contract checks.

A spec that breaks a rule is never an exception at run time: :func:`parse_spec` returns a
:class:`SpecProblem` whose ``reason`` is stable (it becomes ``status.reason`` of phase
``Blocked``) and whose ``message`` is for humans.

Rules (seed 000 "Contract", cluster-contract.md "ModelBackfill"):
- ``modelRef`` and ``templateRef`` are required, non-empty strings of at most 253 and 52
  characters (the CRD's maxLength).
- ``idleFor``: Go duration; 0 or absent means 10 minutes.
- ``maxRunDuration``: Go duration; 0 or absent means 30 minutes. Becomes the Job's
  ``activeDeadlineSeconds``.
- ``repeatAfter``: Go duration; 0 or absent keeps the declaration one-shot; a nonzero value must
  be at least one minute (reason ``InvalidRepeatAfter``).
- ``env``: at most 32 literal variables; every name a valid environment variable name by
  Kubernetes' strict (portable) rule, :func:`is_env_var_name`, and never the reserved
  ``FLEXINFER_WORKLOAD_CLASS`` or ``NVIDIA_VISIBLE_DEVICES`` (reason ``InvalidEnvironment``). The strict rule, not the relaxed
  one a newer apiserver may apply, so a declaration behaves the same on every cluster.
- ``suspend``: bool, default false.
- ``preemption``: ``Delete`` (default; absent or null is ``Delete``) or ``Suspend`` (a preemption
  suspends the Indexed Job and the next admission resumes it, issue 11); anything else is
  ``InvalidSpec``. The CRD's enum rejects other values at admission already; this is the same
  rule for objects stored before the CRD had it. Whether the template is Indexed is the
  projector's check (reason ``PreemptionNotResumable``), as the template is a separate object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from .durations import DurationError, parse_duration, shown

DEFAULT_IDLE_FOR = 600.0  # seconds; cluster-contract: 0/absent idleFor = 10 minutes
DEFAULT_MAX_RUN = 1800.0  # seconds; seed: "The default is 30 minutes"
MIN_REPEAT_AFTER = 60.0  # seconds; seed: "nonzero values must be at least one minute"
MAX_ENV = 32  # seed: "env can override up to 32 literal environment variables"
RESERVED_ENV = "FLEXINFER_WORKLOAD_CLASS"  # seed: reserved so declarations cannot weaken safety
BACKGROUND_CLASS = "background"
#: The NVIDIA container runtime gives a container the GPUs this variable names, whether or not it
#: requests any (CUDA base images set it to ``all``): every container of a backfill Job gets
#: ``void`` (no GPU, no driver libraries), and a declaration may not set it. An adversarial
#: trial: ``spec.env: {NVIDIA_VISIBLE_DEVICES: all}`` was admitted and ran (seed: CPU-only, "must
#: not request ... another GPU resource").
GPU_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
NO_GPU_DEVICES = "void"
#: The AMD container runtime's counterpart of ``NVIDIA_VISIBLE_DEVICES`` (adversarial trials:
#: ``AMD_VISIBLE_DEVICES: all`` in a template, and through ``envFrom``, were admitted): every
#: container of a backfill Job gets ``none`` (the runtime reads a device index list or ``all``;
#: ``none`` is neither: no GPU, and an explicit ``env`` entry wins over ``envFrom``).
AMD_DEVICES_ENV = "AMD_VISIBLE_DEVICES"
NO_AMD_DEVICES = "none"
#: The names ``spec.env`` may not set: the controller sets them, or they give a container GPUs.
RESERVED_ENVS = (RESERVED_ENV, GPU_DEVICES_ENV, AMD_DEVICES_ENV)
#: ``spec.preemption`` values: what a preemption does to the running Job (issue 11).
PREEMPTION_DELETE = "Delete"
PREEMPTION_SUSPEND = "Suspend"
PREEMPTION_MODES = (PREEMPTION_DELETE, PREEMPTION_SUSPEND)
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
#: The longest ``modelRef``/``templateRef`` (the CRD's maxLength: an object name, a CronJob's at
#: most 52 characters); the same bound for objects stored before the CRD had it. The CRD's name
#: pattern is not repeated here: ``simulate`` names its Models after a trace's model ids.
_REF_MAX = {"modelRef": 253, "templateRef": 52}


def is_env_var_name(name: str) -> bool:
    """Kubernetes' strict ``IsEnvVarName`` (apimachinery ``pkg/util/validation``).

    A name matches ``[-._a-zA-Z][-._a-zA-Z0-9]*`` (ASCII; a C identifier with ``-`` and ``.``
    allowed) and is not ``.``, not ``..`` and does not start with ``..`` (``hasChDirPrefix``).
    """
    return bool(_ENV_NAME.fullmatch(name)) and name not in (".", "..") and not name.startswith("..")


# Stable Blocked reasons for spec problems (cluster-contract "Blocked reasons in use upstream",
# plus InvalidSpec for malformed required fields and durations).
INVALID_SPEC = "InvalidSpec"
INVALID_ENVIRONMENT = "InvalidEnvironment"
INVALID_REPEAT_AFTER = "InvalidRepeatAfter"


@dataclass(frozen=True, slots=True)
class Spec:
    """A valid ModelBackfill spec with durations in seconds.

    Attributes:
        model_ref: name of a Model in the same namespace.
        template_ref: name of a CronJob in the same namespace.
        idle_for: continuous foreground-idle window before admission, seconds (> 0).
        max_run: the Job's active deadline, seconds (> 0).
        repeat_after: successful-run cooldown, seconds; 0 = one-shot, else >= 60.
        env: sorted tuple of (name, value) literal overrides, at most 32.
        suspend: no attempt may run while true.
        preemption: ``Delete`` or ``Suspend`` (:data:`PREEMPTION_MODES`): whether a preemption
            deletes the Job or suspends it for a later resume.
    """

    model_ref: str
    template_ref: str
    idle_for: float = DEFAULT_IDLE_FOR
    max_run: float = DEFAULT_MAX_RUN
    repeat_after: float = 0.0
    env: tuple[tuple[str, str], ...] = ()
    suspend: bool = False
    preemption: str = PREEMPTION_DELETE

    @property
    def resumable(self) -> bool:
        """True when a preemption suspends the Job instead of deleting it."""
        return self.preemption == PREEMPTION_SUSPEND


@dataclass(frozen=True, slots=True)
class SpecProblem:
    """Why a spec is Blocked: ``reason`` (stable CamelCase) and ``message`` (for humans)."""

    reason: str
    message: str


def _duration(raw: Mapping[str, Any], field: str, default: float) -> float | SpecProblem:
    value = raw.get(field)
    if value is None or value == "":
        return default
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return SpecProblem(INVALID_SPEC, f"spec.{field} must be a duration string such as '30m'")
    if isinstance(value, (int, float)):
        # Only a literal 0 is meaningful without a unit (Go accepts "0").
        if value == 0:
            return default
        text = shown(value)
        return SpecProblem(INVALID_SPEC, f"spec.{field} {text} needs a unit, e.g. '{text}s'")
    try:
        seconds = parse_duration(value)
    except DurationError as exc:
        return SpecProblem(INVALID_SPEC, f"spec.{field}: {exc}")
    return default if seconds == 0 else seconds


def parse_spec(raw: Mapping[str, Any] | None) -> Spec | SpecProblem:
    """Check a raw ``spec`` mapping (as stored in the API object) against the seed's contract.

    Args:
        raw: the object's ``spec`` with camelCase keys; ``None`` or a non-mapping is invalid.

    Returns:
        A :class:`Spec` when every rule holds, else the first :class:`SpecProblem` found, in
        this order: required refs, idleFor, maxRunDuration, repeatAfter, suspend, preemption,
        env.
        Never raises.
    """
    if not isinstance(raw, Mapping):
        return SpecProblem(INVALID_SPEC, "spec must be an object")
    refs: dict[str, str] = {}
    for field in ("modelRef", "templateRef"):
        value = raw.get(field)
        if not isinstance(value, str) or not value.strip():
            return SpecProblem(INVALID_SPEC, f"spec.{field} is required and must be a non-empty string")
        if len(value) > _REF_MAX[field]:
            return SpecProblem(
                INVALID_SPEC,
                f"spec.{field} {value[:80]!r}... has {len(value)} characters; an object name has at most {_REF_MAX[field]}",
            )
        refs[field] = value
    idle_for = _duration(raw, "idleFor", DEFAULT_IDLE_FOR)
    if isinstance(idle_for, SpecProblem):
        return idle_for
    max_run = _duration(raw, "maxRunDuration", DEFAULT_MAX_RUN)
    if isinstance(max_run, SpecProblem):
        return max_run
    repeat_after = _duration(raw, "repeatAfter", 0.0)
    if isinstance(repeat_after, SpecProblem):
        return SpecProblem(INVALID_REPEAT_AFTER, repeat_after.message)
    if 0 < repeat_after < MIN_REPEAT_AFTER:
        return SpecProblem(
            INVALID_REPEAT_AFTER,
            f"spec.repeatAfter {raw.get('repeatAfter')!r} must be 0 (one-shot) or at least 1m",
        )
    suspend = raw.get("suspend", False)
    if suspend is None:
        suspend = False
    if not isinstance(suspend, bool):
        return SpecProblem(INVALID_SPEC, "spec.suspend must be true or false")
    preemption = raw.get("preemption")
    if preemption is None:
        preemption = PREEMPTION_DELETE
    if preemption not in PREEMPTION_MODES or not isinstance(preemption, str):
        return SpecProblem(INVALID_SPEC, f"spec.preemption {preemption!r} must be Delete or Suspend")
    env = raw.get("env") or {}
    if not isinstance(env, Mapping):
        return SpecProblem(INVALID_ENVIRONMENT, "spec.env must be a map of NAME: value")
    if len(env) > MAX_ENV:
        return SpecProblem(INVALID_ENVIRONMENT, f"spec.env has {len(env)} entries; at most {MAX_ENV} are allowed")
    pairs: list[tuple[str, str]] = []
    for name in sorted(env, key=str):
        value = env[name]
        if not isinstance(name, str) or not is_env_var_name(name):
            return SpecProblem(INVALID_ENVIRONMENT, f"spec.env key {name!r} is not a valid environment variable name")
        if name in RESERVED_ENVS:
            return SpecProblem(
                INVALID_ENVIRONMENT,
                f"spec.env may not set {name}: the controller reserves it for background safety",
            )
        if not isinstance(value, str):
            return SpecProblem(INVALID_ENVIRONMENT, f"spec.env {name} must be a literal string value")
        pairs.append((name, value))
    return Spec(
        model_ref=refs["modelRef"],
        template_ref=refs["templateRef"],
        idle_for=idle_for,
        max_run=max_run,
        repeat_after=repeat_after,
        env=tuple(pairs),
        suspend=suspend,
        preemption=preemption,
    )
