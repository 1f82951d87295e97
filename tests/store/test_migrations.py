"""Alembic owns every table: the migrated database and ``backfill.store.schema`` must agree."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.pool import NullPool

from backfill.store import migrate
from backfill.store.engine import make_engine
from backfill.store.retention import include_name
from backfill.store.schema import VIEWS, metadata

pytestmark = pytest.mark.db

REPO = Path(__file__).resolve().parents[2]


def _diff(url: str, schema: str) -> list:
    engine = make_engine(url, schema, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "compare_server_default": True,
                    "include_name": include_name,
                },
            )
            return compare_metadata(ctx, metadata)
    finally:
        engine.dispose()


def _relations(url: str, schema: str) -> dict[str, str]:
    engine = make_engine(url, schema, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = :s"),
                {"s": schema},
            ).all()
    finally:
        engine.dispose()
    return {name: kind for name, kind in rows}


def test_models_and_migrations_agree(pg_schema: tuple[str, str]) -> None:
    url, schema = pg_schema
    assert _diff(url, schema) == []


def test_migrations_create_tables_and_views_in_the_schema(pg_schema: tuple[str, str]) -> None:
    url, schema = pg_schema
    relations = _relations(url, schema)
    for table in metadata.tables:
        assert relations.get(table) == "BASE TABLE"
    for view, _ in VIEWS:
        assert relations.get(view) == "VIEW"
    assert relations.get("alembic_version") == "BASE TABLE"
    assert migrate.current(url, schema) == migrate.head_revision()


def test_downgrade_to_base_and_upgrade_again(pg_schema: tuple[str, str]) -> None:
    url, schema = pg_schema
    migrate.downgrade(url, schema, "base")
    assert migrate.current(url, schema) is None
    assert set(_relations(url, schema)) == {"alembic_version"}
    migrate.upgrade(url, schema)
    assert migrate.current(url, schema) == migrate.head_revision()
    assert _diff(url, schema) == []
    migrate.upgrade(url, schema)  # a second upgrade is a no-op
    assert migrate.current(url, schema) == migrate.head_revision()


def test_reset_drops_data(pg_schema: tuple[str, str]) -> None:
    from backfill.store.eventlog import EventStore
    from tests.store.contract import record

    url, schema = pg_schema
    engine = make_engine(url, schema)
    try:
        EventStore(engine).append([record("x")])
        engine.dispose()
        migrate.reset(url, schema)
        assert EventStore(engine).head() == 0
    finally:
        engine.dispose()


def test_unmigrated_schema_has_no_revision(pg_url: str) -> None:
    assert migrate.current(pg_url, "t_never_created") is None


def test_alembic_directories_and_pyproject_configuration() -> None:
    script, versions = migrate.locations()
    assert script == REPO / "alembic" and versions == REPO / "migrations"
    assert (script / "env.py").is_file() and (script / "script.py.mako").is_file()
    assert (versions / "0001_initial.py").is_file()
    # No package named "alembic" at the repository root: it would shadow the library.
    assert not (script / "__init__.py").exists()

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    tool_alembic = pyproject["tool"]["alembic"]
    assert tool_alembic["script_location"] == "%(here)s/alembic"
    assert tool_alembic["version_locations"] == ["%(here)s/migrations"]

    # The wheel ships both directories as backfill._alembic / backfill._migrations, and its
    # explicit package list must name every package under backfill/.
    setuptools = pyproject["tool"]["setuptools"]
    assert setuptools["package-dir"]["backfill._alembic"] == "alembic"
    assert setuptools["package-dir"]["backfill._migrations"] == "migrations"
    packages = set(setuptools["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "backfill").rglob("__init__.py") if "__pycache__" not in p.parts
    }
    missing = on_disk - packages
    assert not missing, f"add these packages to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"
