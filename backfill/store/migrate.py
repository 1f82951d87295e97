"""Apply the Alembic migrations programmatically (no alembic.ini needed).

The Alembic environment (``env.py``, ``script.py.mako``) lives in the repository's top-level
``alembic/`` directory and the revision files in ``migrations/``. In a built wheel the same two
directories ship as ``backfill/_alembic`` and ``backfill/_migrations`` (see ``[tool.setuptools]``
in pyproject.toml). :func:`locations` finds them either way.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from backfill.store.engine import DEFAULT_SCHEMA, make_engine, normalize_url, validate_schema


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location)
        if path.is_dir():
            return path
    return None


def locations() -> tuple[Path, Path]:
    """``(script_location, version_location)``: the Alembic environment directory and the
    revision files directory.

    The repository layout (``<root>/alembic``, ``<root>/migrations``) wins; otherwise the copies
    shipped inside the installed package (``backfill._alembic``, ``backfill._migrations``).
    """
    root = Path(__file__).resolve().parents[2]
    script, versions = root / "alembic", root / "migrations"
    if (script / "env.py").is_file() and versions.is_dir():
        return script, versions
    script_pkg, versions_pkg = _package_dir("backfill._alembic"), _package_dir("backfill._migrations")
    if script_pkg is not None and versions_pkg is not None and (script_pkg / "env.py").is_file():
        return script_pkg, versions_pkg
    raise RuntimeError(
        "cannot find the Alembic environment: neither the repository's alembic/ and migrations/ "
        "directories nor the packaged backfill._alembic / backfill._migrations"
    )


def alembic_config(url: str, schema: str = DEFAULT_SCHEMA) -> Config:
    """An Alembic :class:`Config` for ``url`` and ``schema``, built in code."""
    validate_schema(schema)
    script, versions = locations()
    cfg = Config()
    cfg.set_main_option("script_location", str(script))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("version_locations", str(versions))
    # Passed as attributes, not options: configparser would interpolate '%' in passwords.
    cfg.attributes["url"] = normalize_url(url)
    cfg.attributes["schema"] = schema
    return cfg


class DowngradeRefused(ValueError):
    """An upgrade to a revision older than the schema's: upgrade never downgrades."""


def upgrade(url: str, schema: str = DEFAULT_SCHEMA, revision: str = "head") -> None:
    """Create ``schema`` if missing and migrate it to ``revision`` (default: the newest).

    Raises:
        DowngradeRefused: the schema is already past ``revision`` (Alembic's upgrade would do
            nothing and say nothing: a new user's trial read "at revision 0004" after asking for
            0003 and took it for done); also ``base`` and a step from a revision it is past
            (``0001+1``).
        ValueError: ``revision`` is empty.
        alembic.util.CommandError: Alembic cannot resolve ``revision`` or step to it.
    """
    if not revision.strip():
        raise ValueError("the revision is empty (a revision id, head, or a relative step such as +1)")
    config = alembic_config(url, schema)
    at = check_revision(url, schema, migrating=True)
    if revision != "head":
        _refuse_a_downgrade(config, at, schema, revision)
    command.upgrade(config, revision)


class SchemaRevisionError(ValueError):
    """The schema is at a revision this release cannot use (the message says why, in one line)."""


def _known_revisions(config: Config) -> list[str]:
    """This release's revisions, oldest first (the history is one line)."""
    from alembic.script import ScriptDirectory

    return [r.revision for r in reversed(list(ScriptDirectory.from_config(config).walk_revisions()))]


def check_revision(url: str, schema: str = DEFAULT_SCHEMA, *, migrating: bool = False) -> str | None:
    """Refuse a schema this release must not read or write: one at a revision it does not know
    (a newer release migrated it: a trial's controller said only "Can't locate revision", and
    ``runs``, ``replay`` and the destructive ``db prune`` ran on it unchecked), or, unless
    ``migrating``, one behind its newest (a trial: "column runs.segment does not exist"), or one
    that holds the log's tables with no revision recorded (``alembic_version`` emptied or
    dropped by hand: an upgrade would try to create the tables again, and a reader cannot tell
    which revision's columns they have). A schema never migrated passes (each command says so
    itself; ``db upgrade`` creates it).

    Returns:
        The schema's revision, None when it was never migrated.

    Raises:
        SchemaRevisionError: as above. Any error of the database (it cannot be reached).
    """
    at = current(url, schema)
    if at is None:
        if _has_the_log(url, schema):
            raise SchemaRevisionError(
                f"schema {schema} holds the event log's tables but no Alembic revision (its alembic_version table is empty "
                "or gone): this release cannot tell which revision's tables they are; restore it from a backup, or record the "
                f"revision they are at with `alembic -x schema={schema} stamp <revision>` from a checkout of the release that migrated them"
            )
        return None
    known = _known_revisions(alembic_config(url, schema))
    if at not in known:
        raise SchemaRevisionError(
            f"schema {schema} is at revision {at}, which this release does not know (its newest is {known[-1]}): "
            "a newer release migrated it; use that release (this one could misread or damage its tables)"
        )
    if not migrating and at != known[-1]:
        raise SchemaRevisionError(
            f"schema {schema} is at revision {at} and this release needs {known[-1]}: run `backfill db upgrade --schema {schema}` first"
        )
    return at


def _has_the_log(url: str, schema: str) -> bool:
    """Whether ``schema`` has the event log's table (``events``), whatever its revision."""
    engine = make_engine(url, schema, poolclass=NullPool, timeouts=False)
    try:
        with engine.connect() as conn:
            found = conn.exec_driver_sql(
                "SELECT 1 FROM information_schema.tables WHERE table_schema = %(s)s AND table_name = 'events'", {"s": schema}
            ).first()
            return found is not None
    finally:
        engine.dispose()


def _refuse_a_downgrade(config: Config, at: str | None, schema: str, revision: str) -> None:
    """Raise :class:`DowngradeRefused` when ``revision`` names ``base``, a revision the schema
    is already past, or a step from one (``0001+1`` on a schema at 0004: Alembic's upgrade
    would do nothing and exit 0). A step from the schema's own revision (``+1``) and what
    Alembic cannot resolve are left to Alembic, whose upgrade refuses what it cannot step to.
    ``at``: the schema's revision (:func:`check_revision`)."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    script = ScriptDirectory.from_config(config)
    oldest_first = _known_revisions(config)
    if at not in oldest_first:
        return  # never migrated (a revision this release does not know is refused before)
    if revision == "base":
        wanted = "base"
    else:
        sign = "-" if "-" in revision.lstrip("-") else "+"
        base, plus, steps = revision.rpartition(sign)
        stepped = bool(plus and base and steps.isdigit())  # ``<revision>+<n>``/``-<n>``; ``+<n>`` alone steps from ``at``
        try:
            found = script.get_revision(base if stepped else revision)
        except CommandError:
            return  # a step from the schema's revision, or unknown: Alembic's upgrade says which
        if found is None:
            return
        target = found.revision
        if stepped:
            # a step back (``0004-1``) lands behind the schema: Alembic's upgrade did nothing and
            # exited 0 (a re-trial)
            i = oldest_first.index(target) + (int(steps) if sign == "+" else -int(steps))
            if i < 0:
                raise DowngradeRefused(
                    f"schema {schema} is at revision {at}, past base ({revision}): db upgrade never downgrades "
                    "(a downgrade drops what the newer revisions keep; restore a backup taken before the upgrade instead)"
                )
            if i >= len(oldest_first):  # Alembic's own refusal was an AssertionError with no message
                raise ValueError(f"revision {revision} is past the newest revision this release has, {oldest_first[-1]}")
            target = oldest_first[i]
        if target == at or oldest_first.index(target) > oldest_first.index(at):
            return
        wanted = target if target == found.revision else f"{target} ({revision})"
    raise DowngradeRefused(
        f"schema {schema} is at revision {at}, past {wanted}: db upgrade never downgrades "
        "(a downgrade drops what the newer revisions keep; restore a backup taken before the upgrade instead)"
    )


def downgrade(url: str, schema: str = DEFAULT_SCHEMA, revision: str = "base") -> None:
    """Migrate ``schema`` down to ``revision`` (default: ``base``, i.e. no tables)."""
    command.downgrade(alembic_config(url, schema), revision)


def current(url: str, schema: str = DEFAULT_SCHEMA) -> str | None:
    """The revision ``schema`` is at, or None when it was never migrated (or does not exist)."""
    engine = make_engine(url, schema, poolclass=NullPool, timeouts=False)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table_schema": schema})
            return ctx.get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str | None:
    """The newest revision among the revision files."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("postgresql://localhost/x")).get_current_head()


def drop_schema(url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it (no error when it does not exist)."""
    validate_schema(schema)
    engine = make_engine(url, schema, poolclass=NullPool, timeouts=False)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        engine.dispose()


def reset(url: str, schema: str) -> None:
    """Drop ``schema`` (with all its data) and recreate it at the newest revision.

    ``backfill simulate`` uses this to write each run into a clean schema of its own.
    """
    drop_schema(url, schema)
    upgrade(url, schema)


__all__ = ["locations", "alembic_config", "DowngradeRefused", "upgrade", "downgrade", "current", "head_revision", "drop_schema", "reset"]
