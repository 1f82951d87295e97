"""Durations in the Kubernetes/Go syntax (``90s``, ``30m``, ``1h30m``) <-> seconds.

Kubernetes ``metav1.Duration`` fields are parsed by Go's ``time.ParseDuration``: a possibly
signed sequence of decimal numbers, each with an optional fraction and a unit suffix among
``ns``, ``us`` (or ``µs``/``μs``), ``ms``, ``s``, ``m``, ``h``; the bare string ``0`` is zero.
Days (``d``), weeks and spaces are not accepted. Inside this project durations are float seconds.

A Go duration is a whole number of nanoseconds (int64): ParseDuration scales each part's fraction
to nanoseconds with float64 arithmetic and truncates it (``uint64(float64(f) * (float64(unit) /
scale))`` in Go's ``time/format.go``), so ``"1.5ns"`` is 1 ns and ``"0.0000000001s"`` is 0, which
a ModelBackfill reads as "the default", as the API server's CEL validation does.
:func:`parse_duration` does the same, step by step.
"""

from __future__ import annotations

import re
import reprlib
from decimal import Decimal
from functools import lru_cache

_SHOWN = reprlib.Repr()
_SHOWN.maxstring, _SHOWN.maxlong = 64, 40


def shown(value: object) -> str:
    """``repr(value)`` clipped for a message (strings past 64 characters and integers past 40
    digits elided in the middle, by :mod:`reprlib`): a hostile-input trial's 309-digit
    ``idleFor`` came back whole in the ModelBackfill's status."""
    return _SHOWN.repr(value)


_UNITS = {  # nanoseconds per unit (Go's unitMap)
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,  # U+00B5 micro sign
    "μs": 10**3,  # U+03BC greek mu
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|µs|μs|ms|s|m|h)")
_WHOLE = re.compile(r"(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+")
#: Go's largest time.Duration (2^63-1 ns, "2562047h47m16.854775807s"): ParseDuration rejects more.
MAX_SECONDS = (2**63 - 1) / 1e9
_MAX_NS = 2**63 - 1
_MAX_DIGITS = 4_000  # longer digit strings are refused (Python's int() refuses them too)


class DurationError(ValueError):
    """A string that is not a non-negative Go duration. The message quotes the input."""


def parse_duration(text: str) -> float:
    """Parse a Go duration string into seconds.

    Args:
        text: e.g. ``"90s"``, ``"1h30m"``, ``"1.5h"``, ``"0"``, ``"0s"``.

    Returns:
        The duration in seconds (float, >= 0): the whole nanoseconds Go's ``time.ParseDuration``
        reads (each part's fraction scaled as Go scales it and truncated, so ``"1.5ns"`` is
        1e-09 and ``"0.0000000001s"`` is 0), divided by 10^9 and rounded once to the nearest
        float. ``parse_duration(format_duration(x)) == x`` for every whole number of
        nanoseconds ``x`` up to Go's maximum.

    Raises:
        DurationError: empty, malformed (ASCII digits only), unknown unit (``"1d"``), negative
            (``"-5m"``: Go accepts it but no ModelBackfill field may be negative), or longer
            than Go's maximum duration (about 292 years).
    """
    if not isinstance(text, str):
        raise DurationError(f"duration must be a string like '30m', got {type(text).__name__}")
    return _parse(text)


@lru_cache(maxsize=4096)
def _parse(text: str) -> float:
    """:func:`parse_duration` of a string, memoised: a spec is parsed on every fold of its
    ModelBackfill (each relist and status write re-delivers it) and a declaration uses a few
    distinct durations, while the parse costs a few microseconds. Errors are not cached (raised
    again each time)."""
    s = text
    if s in ("0", "+0", "-0"):
        return 0.0
    if s.startswith("-"):
        raise DurationError(f"duration {shown(text)} is negative")
    if s.startswith("+"):
        s = s[1:]
    if not s or not _WHOLE.fullmatch(s):
        raise DurationError(
            f"invalid duration {shown(text)}: use Go syntax such as '90s', '30m' or '1h30m' "
            "(units ns, us, ms, s, m, h)"
        )
    if len(s) > _MAX_DIGITS:
        raise DurationError(f"duration {shown(text)} is too long")
    ns = sum(_part_ns(text, whole, frac, unit) for whole, frac, unit in _PART.findall(s))
    # Beyond Go's maximum, except what rounds to the float MAX_SECONDS (so it round-trips).
    if ns > _MAX_NS and (ns > 2 * _MAX_NS or ns / 10**9 > MAX_SECONDS):
        raise DurationError(f"duration {shown(text)} is out of range (Go's maximum is 2562047h47m16s)")
    return ns / 10**9  # int / int: correctly rounded to the nearest float


def _part_ns(text: str, whole: str, frac: str, unit: str) -> int:
    """One part (``"1.5"``, ``"h"``) of a duration in whole nanoseconds, as Go's ParseDuration
    computes it (``time/format.go``): the integer part times the unit, plus the fraction's
    digits read while they fit in a uint64 (``leadingFraction``) and scaled by
    ``float64(f) * (float64(unit) / scale)``, truncated. Python floats are IEEE doubles rounded
    to nearest like Go's float64, so the result is Go's to the nanosecond.

    Raises:
        DurationError: the integer part times the unit exceeds 2^63 ns (Go: "invalid duration");
            the message quotes ``text``, the whole duration.
    """
    v = int(whole) if whole else 0
    per = _UNITS[unit]
    if v > 2**63 // per:
        raise DurationError(f"duration {shown(text)} is out of range (Go's maximum is 2562047h47m16s)")
    v *= per
    f, scale = 0, 1.0
    for c in frac:  # leadingFraction: stop accumulating once the next digit would overflow
        if f > _MAX_NS // 10:
            break
        y = f * 10 + ord(c) - 48
        if y > 2**63:
            break
        f, scale = y, scale * 10.0  # overflows to inf past 308 digits, as float64 does in Go
    if f > 0:
        v += int(float(f) * (float(per) / scale))
    return v


_SUBSECOND = ((Decimal("1e-6"), "ns", Decimal("1e9")), (Decimal("1e-3"), "µs", Decimal("1e6")), (Decimal(1), "ms", Decimal("1e3")))


def _plain(d: Decimal) -> str:
    """A decimal in positional notation with no trailing zeros (``Decimal("1.50") -> "1.5"``)."""
    return format(d.normalize(), "f")


def format_duration(seconds: float) -> str:
    """Format seconds as Go's ``time.Duration.String`` does, keeping every digit.

    Examples: ``0 -> "0s"``, ``90 -> "1m30s"``, ``5400 -> "1h30m0s"``, ``1.5 -> "1.5s"``,
    ``1e-05 -> "10µs"``, ``0.0015 -> "1.5ms"``. Below one second the unit is ``ns``, ``µs`` or
    ``ms`` as in Go; the number is the shortest decimal that reads back as the same float
    (:func:`repr`), never rounded, so ``parse_duration(format_duration(x)) == x`` for every
    whole number of nanoseconds from 0 to Go's maximum (what a Go duration can hold); a
    sub-nanosecond remainder is printed but dropped when parsed back, as Go drops it.

    Raises:
        ValueError: negative, infinite or NaN input.
    """
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"duration {seconds} is negative or not finite")
    if seconds == 0:
        return "0s"
    d = Decimal(repr(float(seconds)))  # shortest decimal with float(d) == seconds
    if d < 1:
        for limit, unit, scale in _SUBSECOND:
            if d < limit:
                return f"{_plain(d * scale)}{unit}"
    h, rem = divmod(d, 3600)
    m, sec = divmod(rem, 60)
    sec_text = _plain(sec) if sec else "0"
    if h:
        return f"{int(h)}h{int(m)}m{sec_text}s"
    if m:
        return f"{int(m)}m{sec_text}s"
    return f"{sec_text}s"
