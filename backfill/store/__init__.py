"""The store: the event log, checkpoints, snapshots and the ``runs`` table.

The interface (:mod:`backfill.store.interface`: ``EventLog``, ``Snapshots``, ``RunRows``) has two
backends built by :func:`open_store` from the settings: PostgreSQL (SQLAlchemy Core on psycopg 3;
:class:`EventStore`, :class:`RunStore`) and in-memory (:mod:`backfill.store.memory`, for
``memory://`` URLs and fast tests). On PostgreSQL every table lives in one schema chosen at run
time (default ``backfill``); Alembic owns them (``alembic/`` + ``migrations/``, applied by
:func:`upgrade`). Without a configured URL, :func:`resolve_database_url` starts an embedded
server. Retention (partitions, ``db prune``): :mod:`backfill.store.retention`.
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
from backfill.store.interface import AppendTx, EventLog, RecordRefusedError, RunRows, Snapshots, Store, open_store
from backfill.store.migrate import current, downgrade, drop_schema, reset, upgrade
from backfill.store.runs import RunStore
from backfill.store.schema import metadata

__all__ = [
    "open_store",
    "Store",
    "EventLog",
    "Snapshots",
    "RunRows",
    "AppendTx",
    "RecordRefusedError",
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
