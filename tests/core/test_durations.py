"""Durations keep full precision through format -> parse (issue 13 item 7), and parse as Go does.

Property: for every value a Go duration can hold (a whole number of nanoseconds, 0 .. 2^63-1),
``parse_duration(format_duration(x)) == x`` exactly. Below a nanosecond the parser drops what Go's
``time.ParseDuration`` drops (``"0.0000000001s"`` is 0, the API server agrees), so a float with a
sub-nanosecond remainder comes back truncated to the nanosecond.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backfill.core.durations import MAX_SECONDS, format_duration, parse_duration

seconds = st.floats(min_value=0.0, max_value=MAX_SECONDS, allow_nan=False, allow_infinity=False)


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


@given(st.integers(min_value=1, max_value=10**15).map(lambda ns: ns / 10**9))
def test_the_simulated_spec_parses_back_to_the_simulated_durations(x):
    # simulate writes its parameters into a ModelBackfill spec as Go durations; the projector
    # parses them back. 1e-05 used to become "1e-05s", which the parser refused: no runs at all.
    # The parameters come from the CLI's Go durations, so they are whole nanoseconds.
    from backfill.core.spec import parse_spec
    from backfill.sim.cluster import SimParams

    spec = parse_spec(SimParams(idle_for=x, max_run=x).spec("m"))
    assert spec.idle_for == x and spec.max_run == x


# Expected values from Go's time.ParseDuration (go1.26, int64 nanoseconds), computed by hand
# from the Go source and checked with a Go program: the parts are summed in whole nanoseconds
# and a fraction's share below a nanosecond is dropped (truncated, never rounded).
@pytest.mark.parametrize(
    "text, nanoseconds",
    [
        ("1.9999999999s", 1_999_999_999),
        ("0.0000000001s", 0),
        ("0.0000000019s", 1),
        ("1ns", 1),
        ("1.5ns", 1),
        ("0.9ns", 0),
        ("1.0000000009s", 1_000_000_000),
        ("1h0.0000000001s", 3_600_000_000_000),
        ("0.5ns0.5ns", 0),  # each part is truncated before the sum, as in Go
        ("1.5us", 1_500),
        # Go scales a fraction with float64 arithmetic: 44.4853866562875 h is 160147391962635 ns
        # exactly, Go's answer is one less.
        ("44.48538665628750h", 160_147_391_962_634),
        ("2562047h47m16.854775807s", 2**63 - 1),
    ],
)
def test_parse_truncates_to_whole_nanoseconds_as_go_does(text, nanoseconds):
    assert parse_duration(text) == nanoseconds / 10**9


@settings(max_examples=3000)
@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_every_go_duration_round_trips(ns):
    # Every value a Go duration can hold (whole nanoseconds) survives format -> parse exactly.
    x = ns / 10**9
    assert parse_duration(format_duration(x)) == x


@settings(max_examples=1000)
@given(seconds)
def test_a_sub_nanosecond_remainder_is_dropped(x):
    # format_duration keeps every digit of any float; parsing drops what is below a nanosecond.
    y = parse_duration(format_duration(x))
    assert y <= x and x - y < 1.0000001e-9 + x * 1e-15
