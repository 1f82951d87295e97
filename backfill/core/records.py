"""Storage-neutral shapes of one row of the event log.

The store (``backfill.store``) persists :class:`EventRecord` values and hands back
:class:`StoredEvent` values; ``backfill.core.events`` turns typed events into records and back.
Keeping these plain lets the store stay ignorant of event classes and the core ignorant of SQL.
"""

from __future__ import annotations

from datetime import datetime

import msgspec


class EventRecord(msgspec.Struct, frozen=True, gc=False):
    """One event ready to append.

    Attributes:
        type: the event type name, e.g. ``"ForegroundRequest"``.
        version: schema version of that type's payload (int >= 1).
        stream: the entity the event is about, e.g. ``"model/ns/name"`` or ``"backfill/ns/name"``;
            used for filtering only, ordering is global.
        idempotency_key: unique per fact; appending a record whose key is already stored is a
            no-op (e.g. a re-delivered watch event).
        at: when the fact happened, timezone-aware UTC.
        data: the JSON text of the whole event (including ``type``).
    """

    type: str
    version: int
    stream: str
    idempotency_key: str
    at: datetime
    data: str


class StoredEvent(msgspec.Struct, frozen=True, gc=False):
    """An event as read back from the log.

    Attributes:
        position: global, strictly increasing position in the log (int >= 1). Positions may
            have gaps (rolled-back appends) but a reader never sees position p+1 before p.
        recorded_at: when the store committed it, timezone-aware UTC.
        type, version, stream, idempotency_key, at, data: as in :class:`EventRecord`.
    """

    position: int
    recorded_at: datetime
    type: str
    version: int
    stream: str
    idempotency_key: str
    at: datetime
    data: str
