"""`backfill --version`, the controller flags' environment variables in --help, `db url` hiding
the password, and BACKFILL_DATABASE_URL_FILE."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backfill.settings import Settings

BACKFILL = str(Path(sys.executable).parent / "backfill")
ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")}
    return subprocess.run([BACKFILL, *args], capture_output=True, text=True, timeout=60, env={**base, **(env or {})},
                          cwd=ROOT)


def test_version_is_the_projects():
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    proc = _run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"backfill {version}"


def _help_records() -> dict[str, str]:
    """flag -> the help text `backfill controller --help` prints for it (click's own rendering)."""
    import typer

    from backfill.cli import app

    group = typer.main.get_command(app)
    cmd = group.commands["controller"]
    ctx = cmd.make_context("controller", [], resilient_parsing=True)
    records = {}
    for param in cmd.get_params(ctx):
        rec = param.get_help_record(ctx)
        if rec and "--help" not in rec[0]:
            records[rec[0].split()[0].split("/")[0]] = rec[1]
    return records


def test_every_controller_flag_names_its_environment_variable():
    records = _help_records()
    assert {"--kubeconfig", "--namespace", "--database-url", "--metrics-address", "--leader-elect", "--lease-name",
            "--lease-namespace", "--schema"} <= set(records)
    fields = set(Settings.model_fields)
    for flag, text in records.items():
        m = re.search(r"\[env var: (BACKFILL_[A-Z_]+)", text)
        assert m, f"{flag}: no environment variable in its help: {text!r}"
        env = m.group(1)
        # the variable is the one Settings reads (or BACKFILL_SCHEMA, the CLI's own)
        assert env == "BACKFILL_SCHEMA" or env.removeprefix("BACKFILL_").lower() in fields, env
        assert env.removeprefix("BACKFILL_").lower().replace("_", "-") == flag.removeprefix("--"), (flag, env)
    assert "/v1/foreground" in records["--metrics-address"]
    shown = " ".join(_run("controller", "--help").stdout.split())
    assert "[env var: BACKFILL_LEADER_ELECT]" in shown and "/v1/foreground" in shown


@pytest.mark.parametrize("show", [False, True])
def test_db_url_hides_the_password_unless_asked(show):
    url = "postgresql+psycopg://alice:s3cr%40t@db.example:5432/modelbackfill"
    proc = _run("db", "url", "--database-url", url, *(["--show-password"] if show else []))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    if show:
        assert out == "postgresql://alice:s3cr%40t@db.example:5432/modelbackfill"
    else:
        assert out == "postgresql://alice:***@db.example:5432/modelbackfill" and "s3cr" not in proc.stdout + proc.stderr


def test_database_url_from_a_mounted_file(tmp_path, monkeypatch):
    f = tmp_path / "database-url"
    f.write_text("postgresql+psycopg://bob:pw@h/db\n")
    monkeypatch.setenv("BACKFILL_DATABASE_URL_FILE", str(f))
    monkeypatch.delenv("BACKFILL_DATABASE_URL", raising=False)
    assert Settings().database_url == "postgresql+psycopg://bob:pw@h/db"
    # the URL itself (flag or env) wins over the file
    assert Settings(database_url="postgresql+psycopg://x@y/z").database_url == "postgresql+psycopg://x@y/z"
    proc = _run("db", "url", env={"BACKFILL_DATABASE_URL_FILE": str(f)})
    assert proc.returncode == 0 and proc.stdout.strip() == "postgresql://bob:***@h/db", proc.stderr


def test_database_url_file_errors_are_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    for path, fragment in ((tmp_path / "absent", "No such file"), (empty, "is empty")):
        proc = _run("controller", "--kubeconfig", str(tmp_path / "kc"), env={"BACKFILL_DATABASE_URL_FILE": str(path)})
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        msg = json.loads(lines[0])["msg"]  # the controller's lines are JSON log objects
        assert msg.startswith("backfill: error: settings: BACKFILL_DATABASE_URL_FILE: ") and fragment in msg, msg
