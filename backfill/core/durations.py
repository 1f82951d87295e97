"""Durations in the Kubernetes/Go syntax (``90s``, ``30m``, ``1h30m``) <-> seconds.

Kubernetes ``metav1.Duration`` fields are parsed by Go's ``time.ParseDuration``: a possibly
signed sequence of decimal numbers, each with an optional fraction and a unit suffix among
``ns``, ``us`` (or ``µs``/``μs``), ``ms``, ``s``, ``m``, ``h``; the bare string ``0`` is zero.
Days (``d``), weeks and spaces are not accepted. Inside this project durations are float seconds.
"""

from __future__ import annotations

import re
from decimal import Decimal
from functools import lru_cache
from fractions import Fraction

_UNITS = {
    "ns": Fraction(1, 10**9),
    "us": Fraction(1, 10**6),
    "µs": Fraction(1, 10**6),  # U+00B5 micro sign
    "μs": Fraction(1, 10**6),  # U+03BC greek mu
    "ms": Fraction(1, 10**3),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
}
_PART = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_WHOLE = re.compile(r"(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+")
#: Go's largest time.Duration (2^63-1 ns, "2562047h47m16.854775807s"): ParseDuration rejects more.
MAX_SECONDS = (2**63 - 1) / 1e9
_MAX_EXACT = Fraction(2**63 - 1, 10**9)
_MAX_DIGITS = 4_000  # longer digit strings are refused (Python's int() refuses them too)


class DurationError(ValueError):
    """A string that is not a non-negative Go duration. The message quotes the input."""


def parse_duration(text: str) -> float:
    """Parse a Go duration string into seconds.

    Args:
        text: e.g. ``"90s"``, ``"1h30m"``, ``"1.5h"``, ``"0"``, ``"0s"``.

    Returns:
        The duration in seconds (float, >= 0): the exact decimal sum of the parts, rounded
        once to the nearest float (so ``parse_duration(format_duration(x)) == x``).

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
    distinct durations, while the exact parse (fractions) costs about 5 us. Errors are not
    cached (raised again each time)."""
    s = text
    if s in ("0", "+0", "-0"):
        return 0.0
    if s.startswith("-"):
        raise DurationError(f"duration {text!r} is negative")
    if s.startswith("+"):
        s = s[1:]
    if not s or not _WHOLE.fullmatch(s):
        raise DurationError(
            f"invalid duration {text!r}: use Go syntax such as '90s', '30m' or '1h30m' "
            "(units ns, us, ms, s, m, h)"
        )
    if len(s) > _MAX_DIGITS:
        raise DurationError(f"duration {text!r} is too long")
    exact = sum((Fraction(n) * _UNITS[u] for n, u in _PART.findall(s)), Fraction(0))
    # Beyond Go's maximum, except what rounds to the float MAX_SECONDS (so it round-trips).
    if exact > _MAX_EXACT and (exact > 2 * _MAX_EXACT or float(exact) > MAX_SECONDS):
        raise DurationError(f"duration {text!r} is out of range (Go's maximum is 2562047h47m16s)")
    return float(exact)  # the exact sum, rounded once (correctly) to the nearest float


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
    float from 0 to Go's maximum (sub-nanosecond values too, which Go itself cannot hold).

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
