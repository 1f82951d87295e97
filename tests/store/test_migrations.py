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


def test_upgrade_from_0001_with_data_keeps_every_event_run_and_checkpoint(pg_url: str) -> None:
    """A log written by revision 0001 (unpartitioned, identity positions, a burnt position)
    survives the upgrade to partitions: same rows, same keys, positions continue after it."""
    import json
    import secrets
    from datetime import datetime, timezone

    from backfill.store.eventlog import EventStore
    from backfill.store.retention import list_partitions
    from backfill.store.runs import RunStore
    from tests.store.contract import record, run_row

    schema = f"t_{secrets.token_hex(6)}"
    migrate.upgrade(pg_url, schema, "0001")
    engine = make_engine(pg_url, schema)
    try:
        old = [record(f"old/{i}", n=i) for i in range(50)]
        with engine.begin() as conn:  # what revision 0001's EventStore wrote: identity positions
            for r in old[:30]:
                conn.execute(
                    sa.text("INSERT INTO events (type, version, stream, idempotency_key, at, data) VALUES (:t, :v, :s, :k, :at, CAST(:d AS jsonb))"),
                    {"t": r.type, "v": r.version, "s": r.stream, "k": r.idempotency_key, "at": r.at, "d": r.data},
                )
            conn.execute(sa.text("SELECT nextval(pg_get_serial_sequence('events', 'position'))"))  # a rolled-back append's position 31
            for r in old[30:]:
                conn.execute(
                    sa.text("INSERT INTO events (type, version, stream, idempotency_key, at, data) VALUES (:t, :v, :s, :k, :at, CAST(:d AS jsonb))"),
                    {"t": r.type, "v": r.version, "s": r.stream, "k": r.idempotency_key, "at": r.at, "d": r.data},
                )
            conn.execute(sa.text("INSERT INTO checkpoints (name, position) VALUES ('runs', 40)"))
        rows = [run_row("u1", 1), run_row("u1", 2, result="succeeded", ended_at=datetime(2026, 1, 2, tzinfo=timezone.utc), running_seconds=60.0)]
        v1 = (  # revision 0001's columns (the runs table grew segments in 0003)
            "namespace", "backfill", "backfill_uid", "model", "node", "job_name", "job_uid", "attempt", "generation",
            "admitted_at", "started_at", "ended_at", "result", "reason", "running_seconds", "deciding_position",
        )
        with engine.begin() as conn:
            conn.execute(
                sa.text(f"INSERT INTO runs ({', '.join(v1)}) VALUES ({', '.join(':' + c for c in v1)})"),
                [{c: getattr(r, c) for c in v1} for r in rows],
            )
        with engine.connect() as conn:
            before = conn.execute(sa.text("SELECT position, idempotency_key, data::text, recorded_at FROM events ORDER BY position")).all()
        assert [p for p, *_ in before] == list(range(1, 31)) + list(range(32, 52))
        engine.dispose()

        migrate.upgrade(pg_url, schema)
        assert migrate.current(pg_url, schema) == migrate.head_revision()
        assert _diff(pg_url, schema) == []
        store = EventStore(engine)
        after = list(store.read())
        assert [(e.position, e.idempotency_key, json.loads(e.data), e.recorded_at) for e in after] == [
            (p, k, json.loads(d), rec) for p, k, d, rec in before
        ]
        assert store.get_checkpoint("runs") == 40 and RunStore(engine).query() == rows
        assert store.append([record("old/7"), record("old/49")]) == [None, None]  # keys carried over
        assert store.append([record("new/0")]) == [52]  # the sequence continues after the old one
        with store.engine.connect() as conn:
            raw = conn.connection.driver_connection
            assert [(p.lo, p.hi) for p in list_partitions(raw)] == [(1, 1_000_001)]
        store.close()
        engine.dispose()

        migrate.downgrade(pg_url, schema, "0001")  # and back, with the data
        with engine.connect() as conn:
            keys = conn.execute(sa.text("SELECT position, idempotency_key FROM events ORDER BY position")).all()
            next_position = conn.execute(sa.text("SELECT nextval(pg_get_serial_sequence('events', 'position'))")).scalar()
        assert keys == [(p, k) for p, k, *_ in before] + [(52, "new/0")]
        assert next_position == 53
    finally:
        engine.dispose()
        migrate.drop_schema(pg_url, schema)


def test_db_upgrade_to_an_older_revision_is_refused_not_a_silent_no_op(pg_url: str, capsys) -> None:
    """A new user's trial: ``db upgrade --revision 0003`` on a schema at 0004 printed "schema ...
    at revision 0004", exit 0 (Alembic's upgrade does nothing below the current revision). An
    older revision is one error line and a non-zero exit; the same revision, or a newer one, is
    an upgrade as before."""
    from backfill.cli import main

    schema = "t_downgrade_refused"
    migrate.drop_schema(pg_url, schema)
    try:
        assert main(["db", "upgrade", "--database-url", pg_url, "--schema", schema, "--revision", "0003"]) in (0, None)
        assert migrate.current(pg_url, schema) == "0003"
        assert main(["db", "upgrade", "--database-url", pg_url, "--schema", schema, "--revision", "0004"]) in (0, None)
        assert main(["db", "upgrade", "--database-url", pg_url, "--schema", schema, "--revision", "0004"]) in (0, None)
        capsys.readouterr()
        assert main(["db", "upgrade", "--database-url", pg_url, "--schema", schema, "--revision", "0003"]) not in (0, None)
        err = capsys.readouterr().err.strip()
        assert err.splitlines() == [
            f"backfill: error: db upgrade: schema {schema} is at revision 0004, past 0003: db upgrade never downgrades "
            "(a downgrade drops what the newer revisions keep; restore a backup taken before the upgrade instead)"
        ], err
        assert migrate.current(pg_url, schema) == "0004"
    finally:
        migrate.drop_schema(pg_url, schema)


def test_db_upgrade_takes_alembics_relative_steps_and_refuses_base_and_steps_to_the_past(pg_url: str, capsys) -> None:
    """An adversarial trial: ``--revision base`` on a schema at 0004 said "at revision 0004",
    exit 0 (the check did not know ``base``), and Alembic's relative steps, which the check
    tried to look up as ids, were refused ("Can't locate revision identified by '+1'"). The
    expected revisions follow the files' order 0001..0004."""
    from backfill.cli import main

    schema = "t_relative_steps"

    def upgrade(revision: str) -> tuple[bool, str, str | None]:
        ok = main(["db", "upgrade", "--database-url", pg_url, "--schema", schema, "--revision", revision]) in (0, None)
        return ok, capsys.readouterr().err.strip(), migrate.current(pg_url, schema)

    migrate.drop_schema(pg_url, schema)
    try:
        assert upgrade("0001")[0]
        assert upgrade("+1")[::2] == (True, "0002")
        assert upgrade("0002+1")[::2] == (True, "0003")
        past = (False, "0003")
        assert upgrade("0001+1")[::2] == past  # 0002: behind the schema
        assert upgrade("0003-1")[::2] == past  # a re-trial: a step back said "at revision", exit 0
        ok, err, at = upgrade("0001-1")
        assert (ok, at) == past and err.splitlines()[-1].startswith(f"backfill: error: db upgrade: schema {schema} is at revision 0003, past base (0001-1): ")
        assert upgrade("base")[::2] == past
        ok, err, at = upgrade("base")
        assert err.splitlines()[-1].startswith(f"backfill: error: db upgrade: schema {schema} is at revision 0003, past base: ")
        assert upgrade("-1")[::2] == past  # Alembic: "Relative revision -1 didn't produce 1 migrations"
        assert upgrade("")[::2] == past
        assert upgrade("+1")[::2] == (True, "0004")
    finally:
        migrate.drop_schema(pg_url, schema)


def test_a_schema_at_a_revision_this_release_does_not_know_or_behind_it_is_refused_in_one_line(pg_url: str, capsys) -> None:
    """A trial: on a schema a newer release migrated (revision 0099 here), the controller said only
    "Can't locate revision identified by '0099'", and ``runs``, ``replay`` and the destructive
    ``db prune`` ran on it unchecked; on a schema at 0001 ``runs`` said "column runs.segment does
    not exist"; ``db upgrade --revision 0004+1`` said "AssertionError"."""
    from backfill.cli import main

    newer, older = "t_rev_newer", "t_rev_older"
    head = migrate.head_revision()

    def error(*args: str) -> str:
        assert main([*args, "--database-url", pg_url]) not in (0, None)
        lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert len(lines) == 1, lines
        return lines[0]

    for s in (newer, older):
        migrate.drop_schema(pg_url, s)
    try:
        migrate.upgrade(pg_url, newer)
        migrate.upgrade(pg_url, older, "0001")
        engine = make_engine(pg_url, newer, poolclass=NullPool)
        with engine.begin() as conn:
            events = conn.execute(sa.text("SELECT count(*) FROM events")).scalar()
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '0099'"))
        engine.dispose()
        unknown = (
            f"schema {newer} is at revision 0099, which this release does not know (its newest is {head}): a newer release "
            "migrated it; use that release (this one could misread or damage its tables)"
        )
        for args in (["runs"], ["replay"], ["db", "prune", "--before", "2999-01-01T00:00:00Z"], ["recommend", "--model", "ns/m"]):
            assert error(*args, "--schema", newer) == f"backfill: error: {unknown}", args
        assert error("db", "upgrade", "--schema", newer) == f"backfill: error: db upgrade: {unknown}"
        assert migrate.current(pg_url, newer) == "0099"
        behind = f"schema {older} is at revision 0001 and this release needs {head}: run `backfill db upgrade --schema {older}` first"
        for args in (["runs"], ["replay"], ["db", "prune", "--before", "2999-01-01T00:00:00Z"]):
            assert error(*args, "--schema", older) == f"backfill: error: {behind}", args
        assert error("db", "upgrade", "--schema", older, "--revision", f"{head}+1") == (
            f"backfill: error: db upgrade: revision {head}+1 is past the newest revision this release has, {head}"
        )
        assert migrate.current(pg_url, older) == "0001" and events == 0
    finally:
        for s in (newer, older):
            migrate.drop_schema(pg_url, s)


@pytest.mark.parametrize("damage", ["DELETE FROM alembic_version", "DROP TABLE alembic_version"])
def test_the_log_tables_with_no_revision_recorded_are_refused_in_one_line(pg_url: str, capsys, damage: str) -> None:
    """A schema whose ``alembic_version`` was emptied or dropped by hand was read as never
    migrated: ``db upgrade`` tried to create the tables again (a traceback of DuplicateTable),
    and readers could not tell which revision's columns the tables had. Every command now
    refuses it in one line, and the events stay."""
    from backfill.cli import main

    schema = "t_rev_none"
    migrate.drop_schema(pg_url, schema)
    try:
        migrate.upgrade(pg_url, schema)
        from backfill.store.eventlog import EventStore
        from tests.store.contract import record

        engine = make_engine(pg_url, schema, poolclass=NullPool)
        EventStore(engine).append([record("kept")])
        with engine.begin() as conn:
            conn.execute(sa.text(damage))
        assert migrate.current(pg_url, schema) is None
        said = (
            f"schema {schema} holds the event log's tables but no Alembic revision (its alembic_version table is empty or gone): "
            "this release cannot tell which revision's tables they are; restore it from a backup, or record the revision they "
            f"are at with `alembic -x schema={schema} stamp <revision>` from a checkout of the release that migrated them"
        )
        for args, prefix in ((["runs"], ""), (["replay"], ""), (["db", "upgrade"], "db upgrade: ")):
            assert main([*args, "--schema", schema, "--database-url", pg_url]) not in (0, None), args
            lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
            assert lines == [f"backfill: error: {prefix}{said}"], (args, lines)
        with pytest.raises(migrate.SchemaRevisionError):
            migrate.upgrade(pg_url, schema)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM events")).scalar() == 1
        engine.dispose()
    finally:
        migrate.drop_schema(pg_url, schema)
