"""The shortcuts of the simulator's hot path give what the general code gives (issue 10)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from backfill.core import events as ev
from backfill.core.commands import Admit
from backfill.core.decisions import decision_record
from backfill.core.jobtemplate import _uid_hash, job_name

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("compiled", [False, True])
def test_an_admission_is_keyed_as_its_event_names_itself(compiled):
    """``decision_record`` keys an admission without ``key_of``: the same key."""
    cmd = Admit(("ns", "bf-a"), "uid-1", 12, 3, job_name("bf-a", "uid-1", 12), "m", "node-1", 7)
    e, key = decision_record(cmd, at=AT, basis=40, compiled=compiled)
    assert key == ev.key_of(e) == ev.key_of(ev.materialize(e)) == "decision/ns/bf-a/uid-1/admit/12"


@pytest.mark.parametrize("name", ["a", "bf-x.y", "b" * 60, "c" * 49 + "-" * 8 + "d", "a.b-" * 20])
@pytest.mark.parametrize("attempt", [1, 9, 10, 99, 100, 12345, 10**9])
def test_job_name_with_its_cached_head_is_the_rule(name, attempt):
    """``job_name`` caches the part before the attempt number: the name is still the rule's."""
    suffix = f"-{_uid_hash('uid-9')}-{attempt}"
    assert job_name(name, "uid-9", attempt) == name.replace(".", "-")[: 57 - len(suffix)].rstrip("-") + suffix
