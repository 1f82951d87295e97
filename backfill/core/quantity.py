"""Kubernetes resource quantities (``500m``, ``1Gi``, ``0e3``), parsed as apimachinery does.

A port of ``k8s.io/apimachinery/pkg/api/resource`` ``ParseQuantity`` (``parseQuantityString`` +
the suffix table + the rounding), kept exact with :class:`fractions.Fraction`; no float is
involved, so ``0.0000000001`` is not zero (Kubernetes rounds it *up* to ``1n``) and ``-0``,
``0e3``, ``0E0``, ``0.0``, ``0m``, ``0Ki``, ``.`` are all zero.

Grammar (apimachinery ``quantity.go``)::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= <number> | ("+" | "-") <number>
    <number>          ::= <digits> | <digits> "." <digits> | <digits> "." | "." <digits> | ""
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= ("e" | "E") <signedNumber>   (an int32-range integer)

Digits are ASCII only, no whitespace anywhere. After the suffix is applied, a nonzero value is
rounded away from zero to a multiple of 10^-9, and a binary-SI value is capped at 2^63-1.
"""

from __future__ import annotations

from fractions import Fraction

_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
_INT32_MAX = 2**31 - 1
_MAX_ALLOWED = 2**63 - 1  # apimachinery maxAllowed: the cap of a binary-SI value
_NANO = Fraction(1, 10**9)
_MAX_EVALUATED_EXPONENT = 10_000  # larger values are refused, not computed (no resource is that big)
_MAX_EVALUATED_DIGITS = 4_000  # Python refuses int() of longer digit strings
_MAX_INT64_DIGITS = 18  # apimachinery maxInt64Factors: digits that surely fit an int64


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity. The message quotes the input."""


def _split(text: str) -> tuple[bool, str, str, str, bool]:
    """``parseQuantityString``: (positive, numerator, denominator, suffix, has_digits)."""
    positive, pos, end = True, 0, len(text)
    if pos < end and text[0] in "+-":
        positive = text[0] == "+"
        pos += 1
    start = pos
    while pos < end and text[pos] == "0":
        pos += 1
    if pos == end:
        return positive, "0", "", "", pos > start
    num_start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[num_start:pos] or "0"
    has_digits = pos > start
    denom = ""
    if pos < end and text[pos] == ".":
        pos += 1
        d_start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[d_start:pos]
        has_digits = has_digits or bool(denom)
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos != end:
        raise QuantityError(f"quantity {text!r} must match the regular expression "
                            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    return positive, num, denom, text[suffix_start:], has_digits


def _suffix(text: str, suffix: str) -> tuple[int, int, bool]:
    """``quantitySuffixer.interpret``: (base, exponent, binary)."""
    if suffix in _DECIMAL_SI:
        return 10, _DECIMAL_SI[suffix], False
    if suffix in _BINARY_SI:
        return 2, _BINARY_SI[suffix], True
    if len(suffix) > 1 and suffix[0] in "eE":
        rest = suffix[1:]
        body = rest[1:] if rest[0] in "+-" else rest  # Go strconv.ParseInt: optional sign, ASCII digits
        if body and set(body) <= _DIGITS:
            exponent = int(rest)
            if -_INT32_MAX <= exponent <= _INT32_MAX:
                return 10, exponent, False
    raise QuantityError(f"quantity {text!r} has an unknown suffix {suffix!r}")


def _round_up_nano(value: Fraction) -> Fraction:
    """Round away from zero to a multiple of 10^-9 (apimachinery: ``Round(Nano, RoundUp)``)."""
    scaled = value / _NANO
    if scaled.denominator == 1:
        return value
    whole = -(-scaled.numerator // scaled.denominator) if scaled > 0 else scaled.numerator // scaled.denominator
    return whole * _NANO


def parse_quantity(text: str) -> Fraction:
    """The value of a Kubernetes quantity string, exactly as ``resource.ParseQuantity`` gives it.

    Args:
        text: e.g. ``"500m"``, ``"1Gi"``, ``"1e3"``, ``"-0"``, ``"0.5"``.

    Returns:
        The value as a :class:`~fractions.Fraction` (``1Ki`` -> 1024, ``3.001n`` -> 4/10^9).

    Raises:
        QuantityError: empty, whitespace, a malformed number, an unknown suffix (``"1i"``,
            ``"0.1mi"``), an exponent outside the int32 range, or a nonzero value above
            10^10000 or with over 4,000 digits (Kubernetes takes those; this parser refuses
            to compute them, and :func:`is_zero` calls them nonzero, which they are).
    """
    if not isinstance(text, str) or not text:
        raise QuantityError(f"quantity {text!r} is empty or not a string")
    if text == "0":
        return Fraction(0)
    positive, num, denom, suffix, has_digits = _split(text)
    base, exponent, binary = _suffix(text, suffix)
    digits = len(num) + len(denom)
    fast = (not binary and _MAX_INT64_DIGITS - digits >= 0 and exponent - len(denom) >= -9) or (
        binary and not denom and 15 - len(num) - int(exponent * 3 / 10) - 1 >= 0
    )
    if not fast and not has_digits:
        raise QuantityError(f"quantity {text!r} has no digits")  # inf.Dec.SetString refuses it
    if not (num + denom).strip("0"):
        return Fraction(0)
    if digits > _MAX_EVALUATED_DIGITS:
        raise QuantityError(f"quantity {text!r} has more than {_MAX_EVALUATED_DIGITS} digits")
    mantissa = int(num + denom)
    if binary:
        magnitude = min(_round_up_nano(Fraction(mantissa, 10 ** len(denom)) * 2**exponent), Fraction(_MAX_ALLOWED))
    else:
        shift = exponent - len(denom)  # value = mantissa * 10**shift, mantissa < 10**digits
        if shift + digits <= -9:
            magnitude = _NANO  # below 1n: rounded up to 1n
        elif shift > _MAX_EVALUATED_EXPONENT:
            raise QuantityError(f"quantity {text!r} is too large to evaluate (over 10^{_MAX_EVALUATED_EXPONENT})")
        else:
            magnitude = _round_up_nano(mantissa * Fraction(10) ** shift)
    return magnitude if positive else -magnitude


def is_zero(quantity: object) -> bool:
    """True when ``quantity`` (a string, or a JSON number) is a valid Kubernetes quantity equal to 0.

    Anything that is not a valid quantity is *not* zero (a guard built on this fails closed).
    """
    if isinstance(quantity, bool):
        return False
    if isinstance(quantity, (int, float)):
        return quantity == 0
    try:
        return parse_quantity(str(quantity)) == 0
    except QuantityError:
        return False
