"""Durations in the Kubernetes/Go syntax (``90s``, ``30m``, ``1h30m``) <-> seconds.

Kubernetes ``metav1.Duration`` fields are parsed by Go's ``time.ParseDuration``: a possibly
signed sequence of decimal numbers, each with an optional fraction and a unit suffix among
``ns``, ``us`` (or ``µs``/``μs``), ``ms``, ``s``, ``m``, ``h``; the bare string ``0`` is zero.
Days (``d``), weeks and spaces are not accepted. Inside this project durations are float seconds.
"""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 micro sign
    "μs": 1e-6,  # U+03BC greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_WHOLE = re.compile(r"(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+")
#: Go's largest time.Duration (2^63-1 ns, "2562047h47m16.854775807s"): ParseDuration rejects more.
MAX_SECONDS = (2**63 - 1) / 1e9


class DurationError(ValueError):
    """A string that is not a non-negative Go duration. The message quotes the input."""


def parse_duration(text: str) -> float:
    """Parse a Go duration string into seconds.

    Args:
        text: e.g. ``"90s"``, ``"1h30m"``, ``"1.5h"``, ``"0"``, ``"0s"``.

    Returns:
        The duration in seconds (float, >= 0).

    Raises:
        DurationError: empty, malformed (ASCII digits only), unknown unit (``"1d"``), negative
            (``"-5m"``: Go accepts it but no ModelBackfill field may be negative), or longer
            than Go's maximum duration (about 292 years).
    """
    if not isinstance(text, str):
        raise DurationError(f"duration must be a string like '30m', got {type(text).__name__}")
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
    seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(s))
    if not seconds <= MAX_SECONDS:  # also catches inf/nan from absurdly long digit strings
        raise DurationError(f"duration {text!r} is out of range (Go's maximum is 2562047h47m16s)")
    return seconds


def format_duration(seconds: float) -> str:
    """Format seconds the way Go's ``time.Duration.String`` does for whole seconds.

    Examples: ``0 -> "0s"``, ``90 -> "1m30s"``, ``5400 -> "1h30m0s"``, ``1.5 -> "1.5s"``.

    Raises:
        ValueError: negative input.
    """
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"duration {seconds} is negative or not finite")
    if seconds == 0:
        return "0s"
    whole = int(seconds)
    frac = seconds - whole
    h, rem = divmod(whole, 3600)
    m, s = divmod(rem, 60)
    sec = f"{s + frac:g}" if frac else str(s)
    if h:
        return f"{h}h{m}m{sec}s"
    if m:
        return f"{m}m{sec}s"
    return f"{sec}s"
