"""Robustness: parse_spec / parse_duration never raise and never yield an unusable Spec.

A Spec that parse_spec accepts must be usable by the projector: every duration must be finite
and addable to any realistic time (the live controller computes ``since + timedelta(idleFor)``).
Go's ``time.ParseDuration`` caps durations at about 2562047h; anything above must be Blocked.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill.core.durations import DurationError, parse_duration
from backfill.core.spec import Spec, SpecProblem, parse_spec

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
DURATION_TEXT = st.one_of(
    st.text(max_size=12),
    st.from_regex(r"\A[+-]?([0-9]{1,25}(\.[0-9]{0,4})?(ns|us|µs|ms|s|m|h)){1,3}\Z"),
)
FIELDS = ("modelRef", "templateRef", "idleFor", "maxRunDuration", "repeatAfter", "env", "suspend")
SPECLIKE = st.fixed_dictionaries(
    {"modelRef": st.just("m"), "templateRef": st.just("cj")},
    optional={
        "idleFor": DURATION_TEXT | JSON,
        "maxRunDuration": DURATION_TEXT | JSON,
        "repeatAfter": DURATION_TEXT | JSON,
        "env": st.dictionaries(st.text(max_size=10), JSON, max_size=5) | JSON,
        "suspend": JSON,
    },
)
NOW = datetime(2026, 11, 30, 10, 0, tzinfo=timezone.utc)


def _usable(spec: Spec) -> None:
    for v in (spec.idle_for, spec.max_run, spec.repeat_after):
        assert v == v and v not in (float("inf"), float("-inf")) and v >= 0
        NOW + timedelta(seconds=v) + timedelta(seconds=v)  # must not overflow


@settings(max_examples=400, deadline=None)
@given(JSON)
def test_parse_spec_any_json_never_raises(raw):
    result = parse_spec(raw)
    assert isinstance(result, (Spec, SpecProblem))


@settings(max_examples=600, deadline=None)
@given(SPECLIKE)
def test_parse_spec_accepted_specs_are_usable(raw):
    result = parse_spec(raw)
    assert isinstance(result, (Spec, SpecProblem))
    if isinstance(result, Spec):
        _usable(result)
    else:
        assert result.reason and result.message


@pytest.mark.parametrize("field", ["idleFor", "maxRunDuration", "repeatAfter"])
@pytest.mark.parametrize("value", ["99999999999h", "9" * 400 + "h", "2562048h", "80000000h"])
def test_duration_beyond_go_range_is_blocked(field, value):
    """Go rejects durations over 2562047h47m16.854775807s; the controller must Block, not overflow."""
    result = parse_spec({"modelRef": "m", "templateRef": "cj", field: value})
    assert isinstance(result, SpecProblem), result


@pytest.mark.parametrize("text", ["５m", "١s", "٣٠m", "1h٣٠m", "𝟗s"])
def test_non_ascii_digits_are_not_go_durations(text):
    with pytest.raises(DurationError):
        parse_duration(text)


@settings(max_examples=500, deadline=None)
@given(DURATION_TEXT)
def test_parse_duration_raises_only_duration_error(text):
    try:
        v = parse_duration(text)
    except DurationError:
        return
    assert 0 <= v < float("inf")
