"""RFC 3339 timestamps as the Kubernetes API writes them (``2024-11-15T08:30:00Z``)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from functools import lru_cache


def rfc3339(value: datetime | None) -> str | None:
    """Format an aware datetime as UTC RFC 3339 with a ``Z`` (microseconds kept if nonzero).

    Returns None for None. Raises ValueError for a naive datetime.
    """
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetime: every time inside is timezone-aware UTC")
    # isoformat, not strftime("%Y"): glibc writes the year 1 as "1", not "0001" (a trial:
    # ``replay --since 0001-01-01T00:00:00Z`` printed "1-01-01T00:00:00Z", not RFC 3339).
    return value.astimezone(timezone.utc).replace(tzinfo=None).isoformat() + "Z"


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 / ISO 8601 timestamp that carries a zone (``Z`` or ``+hh:mm``) into UTC.

    Raises:
        ValueError: malformed, no time zone given, or not representable in UTC (year 1..9999).
    """
    if not isinstance(text, str):
        raise ValueError(f"timestamp must be a string, got {type(text).__name__}")
    value = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
    if value.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no time zone")
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:  # e.g. 9999-12-31T23:59:59-23:59: valid RFC 3339, not a UTC datetime
        raise ValueError(f"timestamp {text!r} is out of range in UTC") from None


#: The latest representable instant (UTC): a time past it saturates here instead of raising.
LATEST = datetime.max.replace(tzinfo=timezone.utc)
EARLIEST = datetime.min.replace(tzinfo=timezone.utc)


def plus_seconds(t: datetime, seconds: float) -> datetime:
    """``t + seconds`` saturated to [:data:`EARLIEST`, :data:`LATEST`]: never OverflowError.

    A hostile but valid input (``lastActiveTime: 9999-12-31T23:59:59Z`` plus an idle window,
    a success at 9999 plus ``repeatAfter``) then means "not before the end of time", which every
    comparison handles, instead of an exception that stalls the backfill on every pass.
    """
    try:
        return t + _delta(seconds)
    except OverflowError:
        return LATEST if seconds > 0 else EARLIEST


#: ``timedelta(seconds=s)`` of the few durations the projector adds (a spec's idleFor and
#: repeatAfter, the re-check periods): built once each, about 2.5x cheaper a call than a new
#: timedelta from a float (``simulate`` adds one about 300,000 times, issue 10).
_delta = lru_cache(maxsize=1024)(lambda seconds: timedelta(seconds=seconds))
