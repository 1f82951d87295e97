"""RFC 3339 timestamps as the Kubernetes API writes them (``2024-11-15T08:30:00Z``)."""

from __future__ import annotations

from datetime import datetime, timezone


def rfc3339(value: datetime | None) -> str | None:
    """Format an aware datetime as UTC RFC 3339 with a ``Z`` (microseconds kept if nonzero).

    Returns None for None. Raises ValueError for a naive datetime.
    """
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetime: every time inside is timezone-aware UTC")
    v = value.astimezone(timezone.utc)
    if v.microsecond:
        return v.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return v.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 / ISO 8601 timestamp that carries a zone (``Z`` or ``+hh:mm``) into UTC.

    Raises:
        ValueError: malformed, or no time zone given.
    """
    value = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    if value.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no time zone")
    return value.astimezone(timezone.utc)
