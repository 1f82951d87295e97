"""Names and labels the controller writes on a Job are valid for every name the CRD accepts."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from backfill.core.jobtemplate import (
    BACKFILL_LABEL,
    UID_LABEL,
    backfill_label_value,
    backfill_of_job,
    build_job,
    job_name,
)
from backfill.core.spec import parse_spec

from .builders import TEMPLATE

# apimachinery IsDNS1123Subdomain (what the CRD's metadata.name must be) and IsValidLabelValue.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = st.from_regex(rf"\A{_LABEL}(\.{_LABEL})*\Z", fullmatch=True).filter(lambda s: len(s) <= 253)
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
UID = "0b3d8a5e-6c1f-4d7a-9e2b-8f4c1a7d3e90"


def _long(n: int) -> str:
    """A valid DNS subdomain of exactly n characters (segments of 62 a and a dot, then b)."""
    return ("a" * 62 + ".") * (n // 63) + "b" * (n % 63) if n % 63 else ("a" * 62 + ".") * (n // 63 - 1) + "a" * 63


def _valid_label(value: str) -> bool:
    return len(value) <= 63 and bool(LABEL_VALUE.fullmatch(value))


@given(DNS_SUBDOMAIN | st.integers(64, 253).map(_long))
def test_every_label_value_and_the_job_name_are_valid(name):
    spec = parse_spec({"modelRef": "m", "templateRef": "t"})
    job = build_job(TEMPLATE, namespace="ns", backfill=name, backfill_uid=UID, attempt=12345, spec=spec)
    meta = job["metadata"]
    assert all(_valid_label(v) for v in meta["labels"].values()), meta["labels"]
    assert _valid_label(meta["name"]) and meta["name"] == job_name(name, UID, 12345)
    assert meta["labels"][UID_LABEL] == UID
    assert backfill_of_job(meta) == name  # the full name comes back from the ownerReference


def test_short_names_are_kept_long_ones_hashed():
    assert backfill_label_value("model-eval-gemma") == "model-eval-gemma"
    a, b = _long(253), _long(252)
    assert backfill_label_value(a) != backfill_label_value(b) and len(backfill_label_value(a)) <= 63
    assert backfill_label_value("x" * 63) == "x" * 63


def test_backfill_of_job_is_its_controller_owner_reference_only():
    """A hostile-input trial: a foreign Job carrying only the name label was taken for the
    ModelBackfill's, deleted as unexplained, and held its admissions meanwhile."""
    foreign = {"kind": "CronJob", "apiVersion": "batch/v1", "name": "cj", "controller": True}
    ours = {"kind": "ModelBackfill", "apiVersion": "ai.flexinfer/v1alpha2", "name": "b", "controller": True}
    assert backfill_of_job({"ownerReferences": [foreign], "labels": {BACKFILL_LABEL: "old"}}) is None
    assert backfill_of_job({"labels": {BACKFILL_LABEL: "b"}}) is None
    assert backfill_of_job({"ownerReferences": [foreign, ours]}) == "b"
    assert backfill_of_job({"ownerReferences": [{**ours, "controller": False}]}) is None
    assert backfill_of_job({}) is None


# apimachinery IsDNS1123Label: what the API server requires of "<job name>-<index>" for an
# Indexed Job (kubernetes pkg/apis/batch/validation ValidateJob: the pods' hostname).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@given(DNS_SUBDOMAIN | st.integers(64, 253).map(_long), st.integers(1, 10**6))
def test_the_job_name_leaves_room_for_an_indexed_pods_hostname(name, attempt):
    # The largest index of an Indexed Job with completions up to 100,000 is 99999.
    hostname = f"{job_name(name, UID, attempt)}-99999"
    assert len(hostname) <= 63 and DNS_LABEL.fullmatch(hostname), hostname


def test_a_dotted_name_gets_a_dotless_job_name_and_distinct_backfills_stay_distinct():
    assert job_name("model.eval.gemma", UID, 1) == "model-eval-gemma-" + job_name("x", UID, 1)[2:]
    # "a.b" and "a-b" are different ModelBackfills (different uids): their Jobs never collide.
    assert job_name("a.b", UID, 1) != job_name("a-b", "another-uid", 1)


def test_build_job_uses_the_name_the_attempt_was_admitted_with():
    spec = parse_spec({"modelRef": "m", "templateRef": "t"})
    job = build_job(TEMPLATE, namespace="ns", backfill="b", backfill_uid=UID, attempt=1, spec=spec, name="b-old-1")
    assert job["metadata"]["name"] == "b-old-1"
