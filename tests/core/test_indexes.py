"""Completed-index sets (``backfill.core.indexes``) against the plain set of integers they mean."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from backfill.core import indexes

index_sets = st.sets(st.integers(min_value=0, max_value=60), max_size=40)


def _ranges(values: set[int]) -> indexes.Ranges:
    return indexes.parse(",".join(map(str, values))) or ()


def _values(ranges: indexes.Ranges) -> set[int]:
    return {i for lo, hi in ranges for i in range(lo, hi + 1)}


@given(index_sets, index_sets)
def test_minus_union_and_count_are_the_set_operations(a: set[int], b: set[int]) -> None:
    ra, rb = _ranges(a), _ranges(b)
    assert _values(ra) == a and indexes.count(ra) == len(a)
    diff = indexes.minus(ra, rb)
    assert _values(diff) == a - b
    assert diff == _ranges(a - b)  # normalised: sorted, disjoint, not adjacent
    assert _values(indexes.union(ra, rb)) == a | b
    assert indexes.grew(indexes.format_ranges(ra), indexes.format_ranges(rb)) == bool(a - b)


def test_minus_is_linear_in_the_ranges():
    """50,000 ranges on each side (every even index of 100,000, the largest Indexed Job), one
    more on the new side: the single index that grew, found in one pass (20 s before, an
    adversarial trial; no timing asserted here, the size is what a quadratic pass cannot do
    within the suite's budget)."""
    old = ",".join(str(2 * i) for i in range(50_000))
    new = old + ",100001"
    assert indexes.minus_text(new, old) == "100001"
    assert indexes.minus_text(old, new) == ""
    odd = ",".join(str(2 * i + 1) for i in range(50_000))
    assert indexes.count_text(indexes.minus_text(odd, old)) == 50_000
