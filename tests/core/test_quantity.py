"""Quantities parsed as Kubernetes does: a table taken from apimachinery's
``pkg/api/resource/quantity_test.go`` (``TestQuantityParse``), plus the zero spellings of issue 13.

Each expected value is written as apimachinery writes it, ``decQuantity(i, exponent)`` = i * 10^exponent.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from backfill.core.jobtemplate import gpu_requests
from backfill.core.quantity import QuantityError, is_zero, parse_quantity


def dec(i: int, exponent: int) -> Fraction:
    return Fraction(i) * Fraction(10) ** exponent


MAX_ALLOWED = Fraction(2**63 - 1)

# (input, expected) from TestQuantityParse.
TABLE = [
    ("0", dec(0, 0)), ("0n", dec(0, 0)), ("0u", dec(0, 0)), ("0m", dec(0, 0)), ("0Ki", dec(0, 0)),
    ("0k", dec(0, 0)), ("0Mi", dec(0, 0)), ("0M", dec(0, 0)), ("0Gi", dec(0, 0)), ("0G", dec(0, 0)),
    ("0Ti", dec(0, 0)), ("0T", dec(0, 0)),
    ("1", dec(1, 0)),
    ("1Ki", dec(1024, 0)), ("8Ki", dec(8 * 1024, 0)), ("7Mi", dec(7 * 1024**2, 0)), ("6Gi", dec(6 * 1024**3, 0)),
    ("5Ti", dec(5 * 1024**4, 0)), ("4Pi", dec(4 * 1024**5, 0)), ("3Ei", dec(3 * 1024**6, 0)),
    ("10Ti", dec(10 * 1024**4, 0)), ("100Ti", dec(100 * 1024**4, 0)),
    ("5n", dec(5, -9)), ("4u", dec(4, -6)), ("3m", dec(3, -3)), ("9", dec(9, 0)), ("8k", dec(8, 3)),
    ("50k", dec(5, 4)), ("7M", dec(7, 6)), ("6G", dec(6, 9)), ("5T", dec(5, 12)), ("40T", dec(4, 13)),
    ("300T", dec(3, 14)), ("2P", dec(2, 15)), ("1E", dec(1, 18)),
    ("1E-3", dec(1, -3)), ("1e3", dec(1, 3)), ("1E6", dec(1, 6)), ("1e9", dec(1, 9)), ("1E12", dec(1, 12)),
    ("1e15", dec(1, 15)), ("1E18", dec(1, 18)),
    ("1e14", dec(1, 14)), ("1e13", dec(1, 13)), ("100.035k", dec(100035, 0)),
    ("0.001", dec(1, -3)), ("0.0005k", dec(5, -1)), ("0.005", dec(5, -3)), ("0.05", dec(5, -2)),
    ("0.5", dec(5, -1)), ("0.00050k", dec(5, -1)), ("0.00500", dec(5, -3)), ("0.05000", dec(5, -2)),
    ("0.50000", dec(5, -1)), ("0.5e0", dec(5, -1)), ("0.5e-1", dec(5, -2)), ("0.5e-2", dec(5, -3)),
    ("10.035M", dec(10035, 3)),
    ("1.2e3", dec(12, 2)), ("1.3E+6", dec(13, 5)), ("1.40e9", dec(14, 8)), ("1.53E12", dec(153, 10)),
    ("1.6e15", dec(16, 14)), ("1.7E18", dec(17, 17)),
    ("9.01", dec(901, -2)), ("8.1k", dec(81, 2)), ("7.123456M", dec(7123456, 0)),
    ("6.987654321G", dec(6987654321, 0)), ("5.444T", dec(5444, 9)), ("40.1T", dec(401, 11)),
    ("300.2T", dec(3002, 11)), ("2.5P", dec(25, 14)), ("1.01E", dec(101, 16)),
    # things that saturate/round
    ("3.001n", dec(4, -9)), ("1.1E-9", dec(2, -9)), ("0.0000000001", dec(1, -9)), ("0.0000000005", dec(1, -9)),
    ("0.00000000050", dec(1, -9)), ("0.5e-9", dec(1, -9)), ("0.9n", dec(1, -9)), ("0.00000012345", dec(124, -9)),
    ("0.00000012354", dec(124, -9)), ("9Ei", MAX_ALLOWED), ("9223372036854775807Ki", MAX_ALLOWED), ("12E", dec(12, 18)),
    # fractional binary
    ("100.035Ki", dec(10243584, -2)), ("0.5Mi", dec(512 * 1024, 0)), ("0.05Gi", dec(536870912, -1)),
    ("0.025Ti", dec(274877906944, -1)),
    # "things written by trolls"
    ("0.000000000001Ki", dec(2, -9)), (".001", dec(1, -3)), (".0001k", dec(100, -3)), ("1.", dec(1, 0)),
    ("1.G", dec(1, 9)),
]

# From the same test's ``invalid`` list.
INVALID = ["1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-", "1e4294967297", " 1", "1 ", ""]


@pytest.mark.parametrize("text,expected", TABLE)
def test_apimachinery_parse_table(text, expected):
    assert parse_quantity(text) == expected
    # apimachinery runs the table again with an explicit sign: "-x" is the negation, "+x" the same.
    assert parse_quantity("-" + text) == -expected
    assert parse_quantity("+" + text) == expected


@pytest.mark.parametrize("text", INVALID)
def test_apimachinery_invalid_table(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)
    assert not is_zero(text)  # the GPU guard fails closed on a string it cannot read


def test_exponent_bounds_are_int32():
    # TestInterpretExponentInt32Bounds: [-MaxInt32, MaxInt32] accepted, past it rejected.
    assert parse_quantity("1E-2147483647") == dec(1, -9)  # rounded up to 1n
    assert is_zero("0E2147483647")
    for bad in ("1E2147483648", "1E-2147483648", "1E9223372036854775808"):
        with pytest.raises(QuantityError):
            parse_quantity(bad)


@pytest.mark.parametrize("text", ["0e3", "0E0", "-0", "0.0", "0m", "0Ki", "+0", "-0.000", ".", "-.", "00", "0e-3", "0.0Gi"])
def test_every_zero_spelling_is_zero(text):
    assert is_zero(text)


def test_numbers_and_nonzero():
    assert is_zero(0) and is_zero(0.0) and not is_zero(1) and not is_zero(0.5)
    assert not is_zero("1n") and not is_zero("0.0000000001") and not is_zero("-1")


@pytest.mark.parametrize("qty", ["0e3", "0E0", "-0", "0.0", "0m", "0Ki"])
def test_a_zero_gpu_quantity_is_not_a_gpu_request(qty):
    template = {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": qty}, "requests": {"amd.com/gpu": qty}}}
    ]}}}}
    assert gpu_requests(template) == []


def test_a_tiny_gpu_quantity_is_a_gpu_request():
    # Kubernetes rounds 0.0000000001 up to 1n: some GPU was asked for.
    template = {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "0.0000000001"}}}
    ]}}}}
    assert gpu_requests(template) == ["c: limits nvidia.com/gpu=0.0000000001"]
