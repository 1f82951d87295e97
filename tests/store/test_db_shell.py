"""``backfill db shell``: psql on the store's schema; a schema that does not exist is named."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.db, pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")]


def _shell(url: str, schema: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from backfill.cli import main; sys.exit(main(sys.argv[1:]))",
         "db", "shell", "--database-url", url, "--schema", schema],
        input="SELECT 'search_path=' || current_setting('search_path');\n", cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
    )


def test_db_shell_opens_psql_on_the_schema_and_names_one_that_does_not_exist(pg_schema, tmp_path: Path) -> None:
    """A regression trial: ``db shell --schema nosuch`` opened psql on an empty search_path and
    said nothing, so every query there answered "relation does not exist"."""
    url, schema = pg_schema
    ok = _shell(url, schema, tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert f"search_path={schema}" in ok.stdout and "does not exist" not in ok.stderr
    missing = _shell(url, "nosuch", tmp_path)
    assert missing.returncode == 0, missing.stderr
    assert "search_path=nosuch" in missing.stdout
    assert "note: schema nosuch does not exist in this database (\\dn lists the schemas)" in missing.stderr.splitlines()
