"""RFC 3339 formatting of every time the controller writes or prints (status, CLI)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from backfill.core.timefmt import parse_rfc3339, rfc3339


@pytest.mark.parametrize(
    "value, text",
    [
        # a trial: glibc's strftime("%Y") wrote the year 1 as "1" (replay --since 0001-01-01)
        (datetime(1, 1, 1, tzinfo=timezone.utc), "0001-01-01T00:00:00Z"),
        (datetime(999, 12, 31, 23, 59, 59, tzinfo=timezone.utc), "0999-12-31T23:59:59Z"),
        (datetime(2026, 12, 3, 4, 5, 6, tzinfo=timezone.utc), "2026-12-03T04:05:06Z"),
        (datetime(2026, 12, 3, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=2))), "2026-12-03T02:05:06.000007Z"),
        (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc), "9999-12-31T23:59:59.999999Z"),
    ],
)
def test_rfc3339_is_four_digit_years_in_utc_with_z(value, text):
    assert rfc3339(value) == text
    assert parse_rfc3339(text) == value


def test_rfc3339_refuses_a_naive_time_and_passes_none():
    assert rfc3339(None) is None
    with pytest.raises(ValueError):
        rfc3339(datetime(2026, 1, 1))
