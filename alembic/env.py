"""Alembic environment of the modelbackfill store.

Every table lives in one PostgreSQL schema chosen at run time. This environment creates that
schema when missing, puts it (alone) on the ``search_path`` so the revision files' unqualified
tables land in it, and keeps ``alembic_version`` there too.

Where the URL and schema come from (first found wins):

- URL: ``config.attributes["url"]`` (set by :func:`backfill.store.migrate.upgrade`),
  ``-x url=...``, the ``sqlalchemy.url`` option, ``BACKFILL_DATABASE_URL``; else the embedded
  server in ``BACKFILL_DATA_DIR`` (default ``.backfill``).
- schema: ``config.attributes["schema"]``, ``-x schema=...``, ``BACKFILL_DATABASE_SCHEMA``,
  else ``backfill``.

So from the repository root, ``alembic upgrade head`` (configured by ``[tool.alembic]`` in
pyproject.toml) and ``alembic -x schema=other upgrade head`` work as well as
``backfill db upgrade``.
"""

from __future__ import annotations

import logging
import os

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from alembic import context
from backfill.store.engine import DEFAULT_SCHEMA, make_engine, normalize_url, resolve_database_url, validate_schema
from backfill.store.retention import include_name
from backfill.store.schema import metadata

config = context.config
x_args = context.get_x_argument(as_dictionary=True)

if config.cmd_opts is not None and not logging.getLogger().handlers:
    # Run by the `alembic` command line: show what it does. (Silent when run from code.)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)-5.5s [%(name)s] %(message)s")
    logging.getLogger("alembic").setLevel(logging.INFO)


def _schema() -> str:
    schema = (
        config.attributes.get("schema")
        or x_args.get("schema")
        or os.environ.get("BACKFILL_DATABASE_SCHEMA")
        or DEFAULT_SCHEMA
    )
    return validate_schema(schema)


def _url() -> str:
    url = config.attributes.get("url") or x_args.get("url") or config.get_main_option("sqlalchemy.url")
    if url:
        return normalize_url(url)
    from backfill.settings import Settings

    url, note = resolve_database_url(Settings())
    if note:
        print(note)
    return url


def run_migrations_offline() -> None:
    """Emit the SQL instead of running it (``alembic upgrade head --sql``)."""
    schema = _schema()
    context.configure(
        url=_url(),
        target_metadata=metadata,
        literal_binds=True,
        version_table_schema=schema,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        context.execute(f'SET search_path TO "{schema}"')
        context.run_migrations()


def run_migrations_online() -> None:
    schema = _schema()
    # No statement timeout: a revision may copy a large table (see 0002).
    engine = make_engine(_url(), schema, poolclass=NullPool, timeouts=False)
    try:
        with engine.connect() as connection:
            # Serialize concurrent upgrades of the same schema (e.g. two controller replicas
            # starting at once). A session lock: released when this NullPool connection closes.
            connection.execute(sa.text("SELECT pg_advisory_lock(hashtext(:key))"), {"key": f"backfill.migrate.{schema}"})
            connection.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            connection.execute(sa.text(f'SET search_path TO "{schema}"'))
            connection.commit()
            # The dialect cached current_schema() at first connect, maybe before the schema existed.
            connection.dialect.default_schema_name = schema
            context.configure(
                connection=connection,
                target_metadata=metadata,
                version_table_schema=schema,
                compare_type=True,
                include_name=include_name,
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
