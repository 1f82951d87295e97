"""The PostgreSQL store: the event log, projector checkpoints and the ``runs`` table.

SQLAlchemy Core on psycopg 3. Every table lives in one PostgreSQL schema chosen at run time
(default ``backfill``); Alembic owns them (``alembic/`` + ``migrations/``, applied by
:func:`upgrade`). Without a configured URL, :func:`resolve_database_url` starts an embedded
server.
"""

from backfill.store.engine import (
    DEFAULT_SCHEMA,
    make_engine,
    normalize_url,
    resolve_database_url,
    start_embedded,
    validate_schema,
)
from backfill.store.eventlog import AppendTransaction, EventStore
from backfill.store.migrate import current, downgrade, drop_schema, reset, upgrade
from backfill.store.runs import RunStore
from backfill.store.schema import metadata

__all__ = [
    "EventStore",
    "AppendTransaction",
    "RunStore",
    "metadata",
    "DEFAULT_SCHEMA",
    "make_engine",
    "normalize_url",
    "resolve_database_url",
    "start_embedded",
    "validate_schema",
    "upgrade",
    "downgrade",
    "current",
    "drop_schema",
    "reset",
]
