"""Hostile input end to end through the pure path the controller runs: API object -> Translator
-> fold -> decide (issue 9, "Hostile input").

Objects are shaped as the apiserver stores them (the CRDs accept any JSON under Model status and
ModelBackfill env values up to their schema's limits): odd durations, 32 env values of 10 kB,
unicode and 253-character names, missing fields; CronJob templates with no containers, odd
quantities, init and sidecar containers; Model statuses whose ``lastActiveTime`` is not a time or
is 9999-12-31T23:59:59Z, and 300-character node names.

What must hold: nothing raises; a good ModelBackfill next to the bad one is still admitted (one
bad object never stalls the others); every bad declaration ends Blocked with a reason.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backfill.controller.translate import Translator
from backfill.core import events as ev
from backfill.core.commands import Admit, Block, Cancel, WriteStatus
from backfill.core.projector import decide, fold
from backfill.core.state import World

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=timezone.utc)
NS = "hostile"
GOOD_TEMPLATE = {"spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}
BLOCK_REASONS = {"InvalidSpec", "InvalidEnvironment", "InvalidRepeatAfter", "TemplateNotFound", "InvalidTemplate",
                 "GPURequestForbidden", "ModelNotFound"}  # fmt: skip


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def meta(name: str, uid: str, rv: int = 1, generation: int = 1) -> dict[str, Any]:
    return {"namespace": NS, "name": name, "uid": uid, "resourceVersion": str(rv), "generation": generation}


class Cluster:
    """Feeds API objects through one Translator into a World, as the watchers and loop do."""

    def __init__(self) -> None:
        self.tr = Translator()
        self.world = World()
        self.pos = 0

    def _feed(self, pairs: list) -> None:
        for event, _key in pairs:
            self.pos += 1
            self.world = fold(self.world, event, self.pos)

    def model(self, obj: dict, now: datetime) -> None:
        self._feed(self.tr.model("MODIFIED", obj, now))

    def cronjob(self, obj: dict, now: datetime) -> None:
        self._feed(self.tr.cronjob("ADDED", obj, now))

    def backfill(self, obj: dict, now: datetime) -> None:
        self._feed(self.tr.backfill("ADDED", obj, now))

    def decide(self, now: datetime) -> list:
        return decide(self.world, now, None, status=True)

    def record(self, event: Any) -> None:
        self.pos += 1
        self.world = fold(self.world, event, self.pos)


def good_setup(c: Cluster) -> None:
    c.model({"metadata": meta("good-model", "gm"), "spec": {"nodeSelector": {"kubernetes.io/hostname": "good-node"}},
             "status": {"phase": "Ready"}}, at(0))  # fmt: skip
    c.cronjob({"metadata": meta("good-cj", "gcj"), "spec": {"jobTemplate": GOOD_TEMPLATE}}, at(0))
    c.backfill({"metadata": meta("good", "gb"), "spec": {"modelRef": "good-model", "templateRef": "good-cj", "idleFor": "1m"}}, at(0))


def good_admitted(cmds: list) -> bool:
    return any(isinstance(x, Admit) and x.key == (NS, "good") for x in cmds)


def blocked(cmds: list, name: str) -> list[str]:
    return [x.reason for x in cmds if isinstance(x, Block) and x.key == (NS, name)]


def phase(cmds: list, name: str) -> str | None:
    st_ = [x.status for x in cmds if isinstance(x, WriteStatus) and x.key == (NS, name)]
    return st_[-1].get("phase") if st_ else None


# --------------------------------------------------------------------------- strategies

NAME_253 = "a" * 253
DURATIONS = st.one_of(
    st.sampled_from(["0s", "1ns", "0.5s", "1h30m", "99999999999h", "2562047h47m16.854775807s", "9" * 400 + "h",
                     "-1s", "", " 1m", "1m ", "1 m", "1d", "١m", "1e3s", "PT1H", "NaN"]),
    st.integers(-10, 10**12), st.floats(allow_nan=True), st.none(), st.booleans(), st.lists(st.text(max_size=3), max_size=2),
    st.text(max_size=12),
)  # fmt: skip
NAMES = st.one_of(st.just(NAME_253), st.text(min_size=1, max_size=40), st.sampled_from(["模型", "ümlaut-ß", "e\u0301", "\U0001F600"]))
ENV_VALUE = st.one_of(st.just("x" * 10_240), st.text(max_size=20), st.integers(), st.none(), st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2))
ENV = st.one_of(
    st.just({f"VAR_{i}": "v" * 10_240 for i in range(32)}),
    st.just({f"VAR_{i}": "v" for i in range(33)}),
    st.dictionaries(st.one_of(NAMES, st.sampled_from(["OK_NAME", "BAD NAME", "FLEXINFER_WORKLOAD_CLASS", "1X", ""])), ENV_VALUE, max_size=5),
    st.lists(st.text(max_size=3), max_size=2), st.text(max_size=5), st.none(),
)  # fmt: skip
SPEC_FIELDS = {
    "modelRef": st.one_of(st.just("bad-model"), NAMES, st.none(), st.integers()),
    "templateRef": st.one_of(st.just("bad-cj"), NAMES, st.none(), st.integers()),
    "idleFor": DURATIONS,
    "maxRunDuration": DURATIONS,
    "repeatAfter": DURATIONS,
    "suspend": st.one_of(st.booleans(), st.none(), st.text(max_size=3)),
    "env": ENV,
}
SPECS = st.fixed_dictionaries({}, optional=SPEC_FIELDS)  # any subset: missing fields included

QUANTITY = st.one_of(st.sampled_from(["1", "0", "-1", "1e309", "1Ei", "0.000001m", "abc", "", "١"]), st.integers(), st.floats(allow_nan=True), st.none())
RESOURCES = st.dictionaries(
    st.sampled_from(["requests", "limits", "claims"]),
    st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "amd.com/gpu", "example.com/x"]), QUANTITY, max_size=3),
    max_size=2,
)  # fmt: skip
CONTAINER = st.fixed_dictionaries(
    {"name": st.one_of(NAMES, st.none())},
    optional={"image": st.text(max_size=5), "resources": RESOURCES,
              "env": st.lists(st.fixed_dictionaries({"name": NAMES}, optional={"value": ENV_VALUE}), max_size=3),
              "restartPolicy": st.sampled_from(["Always", "Never", None])},
)  # fmt: skip
POD = st.fixed_dictionaries(
    {},
    optional={"containers": st.one_of(st.lists(CONTAINER, max_size=3), st.none(), st.text(max_size=3)),
              "initContainers": st.lists(CONTAINER, max_size=2),  # restartPolicy Always = a sidecar
              "ephemeralContainers": st.lists(CONTAINER, max_size=1),
              "restartPolicy": st.sampled_from(["Never", "OnFailure", "Always"])},
)  # fmt: skip
TEMPLATES = st.one_of(
    st.builds(lambda pod: {"spec": {"template": {"spec": pod}}}, POD),
    st.just({}), st.just({"spec": {}}), st.just({"spec": {"template": {}}}),
)
LAST_ACTIVE = st.one_of(
    st.sampled_from(["9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "not a time", "2026-13-40T99:00:00Z", "", "2026-11-30",
                     "2026-11-30T10:00:00", "9999-12-31T23:59:59-23:59"]),
    st.integers(), st.floats(allow_nan=True), st.none(), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.text(max_size=30),
)  # fmt: skip
NODE = st.one_of(st.just("n" * 300), NAMES, st.integers(), st.none(), st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=1))


# --------------------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example])
@given(name=NAMES, spec=SPECS)
def test_hostile_modelbackfill_never_stalls_the_good_one(name, spec):
    c = Cluster()
    good_setup(c)
    c.model({"metadata": meta("bad-model", "bm"), "spec": {}, "status": {"phase": "Ready"}}, at(0))
    c.cronjob({"metadata": meta("bad-cj", "bcj"), "spec": {"jobTemplate": GOOD_TEMPLATE}}, at(0))
    if name == "good":
        name = "good-2"
    c.backfill({"metadata": meta(name, "bad-uid"), "spec": spec}, at(0))
    for s in (0, 30, 61, 10**6):
        cmds = c.decide(at(s))  # never raises
    cmds = c.decide(at(61))
    assert good_admitted(cmds), "the good ModelBackfill was stalled by a bad one"
    reasons = blocked(cmds, name)
    assert all(r in BLOCK_REASONS for r in reasons), reasons
    assert len(reasons) <= 1


@pytest.mark.parametrize(
    "spec, reason",
    [
        ({"templateRef": "bad-cj", "idleFor": "1m"}, "InvalidSpec"),  # no modelRef
        ({"modelRef": "bad-model", "idleFor": "1m"}, "InvalidSpec"),  # no templateRef
        ({"modelRef": "bad-model", "templateRef": "bad-cj", "idleFor": "1d"}, "InvalidSpec"),
        ({"modelRef": "bad-model", "templateRef": "bad-cj", "idleFor": "99999999999h"}, "InvalidSpec"),
        ({"modelRef": "bad-model", "templateRef": "bad-cj", "idleFor": "1m", "repeatAfter": "30s"}, "InvalidRepeatAfter"),
        ({"modelRef": "bad-model", "templateRef": "bad-cj", "idleFor": "1m", "env": {f"V{i}": "v" for i in range(33)}}, "InvalidEnvironment"),
        ({"modelRef": "bad-model", "templateRef": "bad-cj", "idleFor": "1m", "env": {"BAD NAME": "x"}}, "InvalidEnvironment"),
        ({"modelRef": "ghost", "templateRef": "bad-cj", "idleFor": "1m"}, "ModelNotFound"),
        ({"modelRef": "bad-model", "templateRef": "ghost", "idleFor": "1m"}, "TemplateNotFound"),
    ],
)
def test_invalid_declarations_end_blocked_with_a_reason(spec, reason):
    c = Cluster()
    good_setup(c)
    c.model({"metadata": meta("bad-model", "bm"), "spec": {}, "status": {"phase": "Ready"}}, at(0))
    c.cronjob({"metadata": meta("bad-cj", "bcj"), "spec": {"jobTemplate": GOOD_TEMPLATE}}, at(0))
    c.backfill({"metadata": meta(NAME_253, "bad-uid"), "spec": spec}, at(0))
    cmds = c.decide(at(61))
    assert blocked(cmds, NAME_253) == [reason]
    assert phase(cmds, NAME_253) == "Blocked"
    assert good_admitted(cmds)


def test_32_env_values_of_10_kb_are_a_valid_declaration():
    c = Cluster()
    good_setup(c)
    env = {f"VAR_{i}": chr(0x4E00 + i) * 10_240 for i in range(32)}
    c.backfill({"metadata": meta("big-env", "be"), "spec": {"modelRef": "good-model", "templateRef": "good-cj",
                                                             "idleFor": "1m", "env": env}}, at(0))  # fmt: skip
    cmds = c.decide(at(61))
    admitted = [x.key[1] for x in cmds if isinstance(x, Admit)]
    assert len(admitted) == 1 and admitted[0] in ("good", "big-env")  # one model: one at a time
    assert blocked(cmds, "big-env") == []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=TEMPLATES)
def test_hostile_cronjob_template_never_stalls_the_good_one(template):
    c = Cluster()
    good_setup(c)
    c.model({"metadata": meta("bad-model", "bm"), "spec": {"nodeSelector": {"kubernetes.io/hostname": "bad-node"}},
             "status": {"phase": "Ready"}}, at(0))  # fmt: skip
    c.cronjob({"metadata": meta("bad-cj", "bcj"), "spec": {"jobTemplate": template}}, at(0))
    c.backfill({"metadata": meta("bad", "bb"), "spec": {"modelRef": "bad-model", "templateRef": "bad-cj", "idleFor": "1m"}}, at(0))
    for s in (0, 61, 10**6):
        cmds = c.decide(at(s))
    cmds = c.decide(at(61))
    assert good_admitted(cmds)
    reasons = blocked(cmds, "bad")
    assert all(r in BLOCK_REASONS for r in reasons), reasons
    if not reasons:  # accepted: then it is admitted like the good one
        assert any(isinstance(x, Admit) and x.key == (NS, "bad") for x in cmds)


@pytest.mark.parametrize(
    "pod, reason",
    [
        ({"restartPolicy": "Never"}, "InvalidTemplate"),
        ({"restartPolicy": "Never", "containers": []}, "InvalidTemplate"),
        ({"restartPolicy": "Never", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, "GPURequestForbidden"),
        ({"restartPolicy": "Never", "containers": [{"name": "c"}],
          "initContainers": [{"name": "side", "restartPolicy": "Always", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
         "GPURequestForbidden"),
    ],
)  # fmt: skip
def test_bad_templates_block_with_a_reason(pod, reason):
    c = Cluster()
    good_setup(c)
    c.model({"metadata": meta("bad-model", "bm"), "spec": {}, "status": {"phase": "Ready"}}, at(0))
    c.cronjob({"metadata": meta("bad-cj", "bcj"), "spec": {"jobTemplate": {"spec": {"template": {"spec": pod}}}}}, at(0))
    c.backfill({"metadata": meta("bad", "bb"), "spec": {"modelRef": "bad-model", "templateRef": "bad-cj", "idleFor": "1m"}}, at(0))
    cmds = c.decide(at(61))
    assert blocked(cmds, "bad") == [reason]
    assert good_admitted(cmds)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(last_active=LAST_ACTIVE, node=NODE, later=LAST_ACTIVE)
def test_hostile_model_status_never_stalls_the_good_one(last_active, node, later):
    c = Cluster()
    good_setup(c)
    c.cronjob({"metadata": meta("bad-cj", "bcj"), "spec": {"jobTemplate": GOOD_TEMPLATE}}, at(0))
    c.backfill({"metadata": meta("bad", "bb"), "spec": {"modelRef": "bad-model", "templateRef": "bad-cj", "idleFor": "1m"}}, at(0))
    for i, (value, s) in enumerate([(last_active, 0), (later, 30)]):
        c.model({"metadata": meta("bad-model", "bm", rv=2 + i), "spec": {"nodeSelector": {"kubernetes.io/hostname": node}},
                 "status": {"phase": "Ready", "lastActiveTime": value, "gpu": {"node": node}}}, at(s))  # fmt: skip
    for s in (0, 61, 10**6, 10**9):
        c.decide(at(s))  # never raises
    assert good_admitted(c.decide(at(61)))


# --------------------------------------------------------------------------- the two measured bugs


def _running(c: Cluster, name: str = "good") -> str:
    cmd = [x for x in c.decide(at(61)) if isinstance(x, Admit) and x.key == (NS, name)][0]
    c.record(ev.AttemptAdmitted(at=at(61), namespace=NS, backfill=name, cause=cmd.cause, basis=c.pos, uid=cmd.uid,
                                attempt=cmd.attempt, generation=cmd.generation, job_name=cmd.job_name, model=cmd.model, node=cmd.node))  # fmt: skip
    c.record(ev.JobCreated(at=at(62), namespace=NS, backfill=name, name=cmd.job_name, uid="job-uid"))
    c.record(ev.JobRunning(at=at(63), namespace=NS, backfill=name, name=cmd.job_name, uid="job-uid"))
    return cmd.job_name


def test_last_active_time_at_the_end_of_the_calendar_is_demand_now_not_the_end_of_time():
    """Measured (issue 9): ``lastActiveTime: 9999-12-31T23:59:59Z`` made decide raise
    OverflowError (idleSince + idleFor) for that backfill on every pass. Then (a trial): it put
    the admission in year 9999 for good, whatever the Model said later. Now the value is not
    believed (more than an hour ahead of the controller's clock): it is demand at the moment it
    is observed (70), so the Job is cancelled, and the next attempt is admitted after a full
    idle window from then (idleFor 1m: at 131 after the deletion at 72 - the window runs from
    the demand at 70 or the cancel at 71, whichever is later)."""
    c = Cluster()
    good_setup(c)
    job = _running(c)
    c.model({"metadata": meta("good-model", "gm", rv=5), "spec": {"nodeSelector": {"kubernetes.io/hostname": "good-node"}},
             "status": {"phase": "Ready", "lastActiveTime": "9999-12-31T23:59:59Z"}}, at(70))  # fmt: skip
    cancel = [x for x in c.decide(at(71)) if isinstance(x, Cancel)]
    assert [(x.key[1], x.reason) for x in cancel] == [("good", "ForegroundDemand")]
    c.record(ev.AttemptCancelled(at=at(71), namespace=NS, backfill="good", cause=cancel[0].cause, basis=c.pos, uid="gb",
                                 attempt=1, job_name=job, reason="ForegroundDemand", message=cancel[0].message))  # fmt: skip
    c.record(ev.JobDeleted(at=at(72), namespace=NS, backfill="good", name=job, uid="job-uid"))
    for s in (73, 130.9):
        cmds = c.decide(at(s))
        assert phase(cmds, "good") == "WaitingForIdle" and not good_admitted(cmds)
    assert good_admitted(c.decide(at(131)))


def test_a_busy_time_at_the_end_of_the_calendar_in_an_older_log_never_raises():
    """A log written before the bound above can hold such a request: decide must not raise
    (OverflowError, issue 9) and admits nothing before the end of time."""
    c = Cluster()
    good_setup(c)
    c.record(ev.ForegroundRequest(at=datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc), namespace=NS,
                                  model="good-model", source="lastActiveTime"))  # fmt: skip
    for s in (73, 10**6, 10**9):
        cmds = c.decide(at(s))
        assert phase(cmds, "good") == "WaitingForIdle"
        assert not any(isinstance(x, Admit) for x in cmds)


@pytest.mark.parametrize("unreadable", ["not a time", "2026-13-40T99:00:00Z", 12345, {"a": 1}, "2026-11-30T10:00:00"])
def test_unreadable_last_active_time_while_a_job_runs_is_demand(unreadable):
    """Measured (issue 9): a lastActiveTime changed to something that is not a time while a Job
    runs cancelled nothing. Fail safe: it counts as demand now, and the log says so."""
    c = Cluster()
    good_setup(c)
    _running(c)
    pairs = c.tr.model("MODIFIED", {"metadata": meta("good-model", "gm", rv=5),
                                    "spec": {"nodeSelector": {"kubernetes.io/hostname": "good-node"}},
                                    "status": {"phase": "Ready", "lastActiveTime": unreadable}}, at(70))  # fmt: skip
    fg = [e for e, _ in pairs if isinstance(e, ev.ForegroundRequest)]
    assert [(e.at, e.source) for e in fg] == [(at(70), "lastActiveTime-unreadable")]
    for e, _ in pairs:
        c.record(e)
    cancel = [x for x in c.decide(at(70.5)) if isinstance(x, Cancel)]
    assert [(x.key[1], x.reason) for x in cancel] == [("good", "ForegroundDemand")]
    # The same unreadable value delivered again (relist, re-delivery) is not demand again...
    again = c.tr.model("MODIFIED", {"metadata": meta("good-model", "gm", rv=6),
                                    "status": {"phase": "Ready", "lastActiveTime": unreadable}}, at(80))  # fmt: skip
    assert [e for e, _ in again if isinstance(e, ev.ForegroundRequest)] == []
    # ...and its idempotency key is stable (a restarted controller's translator stores it once).
    keys = {k for e, k in pairs if isinstance(e, ev.ForegroundRequest)}
    fresh = Translator().model("MODIFIED", {"metadata": meta("good-model", "gm", rv=6),
                                            "status": {"phase": "Ready", "lastActiveTime": unreadable}}, at(90))  # fmt: skip
    assert {k for e, k in fresh if isinstance(e, ev.ForegroundRequest)} == keys
