"""Durations keep full precision through format -> parse (issue 13 item 7).

Property: for every float of seconds a Go duration can hold (0 .. 2^63-1 ns), including
sub-nanosecond and subnormal values, ``parse_duration(format_duration(x)) == x`` exactly.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from backfill.core.durations import MAX_SECONDS, format_duration, parse_duration

seconds = st.floats(min_value=0.0, max_value=MAX_SECONDS, allow_nan=False, allow_infinity=False)


@settings(max_examples=3000)
@given(seconds)
def test_round_trip_is_exact(x):
    assert parse_duration(format_duration(x)) == x


def test_sub_millisecond_values_use_go_units():
    assert format_duration(1e-05) == "10µs"
    assert format_duration(0.0005) == "500µs"
    assert format_duration(2.5e-07) == "250ns"
    assert format_duration(0.0015) == "1.5ms"
    assert parse_duration(format_duration(1e-05)) == 1e-05


def test_long_values_keep_every_digit():
    # ':g' used to round 1234567.891 to six significant digits.
    x = 1234567.891
    assert format_duration(x) == "342h56m7.891s"
    assert parse_duration(format_duration(x)) == x
    assert parse_duration(format_duration(MAX_SECONDS)) == MAX_SECONDS


def test_go_style_for_whole_values():
    assert [format_duration(v) for v in (0, 1.5, 90, 5400, 93784)] == ["0s", "1.5s", "1m30s", "1h30m0s", "26h3m4s"]


def test_parse_is_exact_not_a_float_sum():
    # 0.1s + 0.2s as floats is 0.30000000000000004; the exact sum is 0.3.
    assert parse_duration("0.1s200ms") == 0.3
    assert parse_duration("1h0.1s") == 3600.1


@given(st.floats(min_value=1e-9, max_value=1e6, allow_nan=False, allow_infinity=False))
def test_the_simulated_spec_parses_back_to_the_simulated_durations(x):
    # simulate writes its parameters into a ModelBackfill spec as Go durations; the projector
    # parses them back. 1e-05 used to become "1e-05s", which the parser refused: no runs at all.
    from backfill.core.spec import parse_spec
    from backfill.sim.cluster import SimParams

    spec = parse_spec(SimParams(idle_for=x, max_run=x).spec("m"))
    assert spec.idle_for == x and spec.max_run == x
