"""The wheel the Docker image installs: it carries the migrations, and `backfill.store.migrate`
finds them there outside a source checkout. Plus static checks of the Dockerfile (no Docker
engine runs here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _setuptools_ok_without_isolation() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 69  # pyproject: setuptools>=69


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build the wheel from a copy of the sources (so no build/ directory lands in the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("backfill", "alembic", "migrations"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    out = tmp / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)]
    if _setuptools_ok_without_isolation():
        cmd.insert(4, "--no-build-isolation")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("modelbackfill-*.whl")
    return whl


def test_wheel_contains_the_migrations(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "backfill/_alembic/env.py",
        "backfill/_alembic/script.py.mako",
        "backfill/_migrations/0001_initial.py",
        "backfill/cli.py",
        "backfill/store/migrate.py",
    ):
        assert required in names, required
    revisions = sorted(p.name for p in (ROOT / "migrations").glob("*.py"))
    assert revisions and all(f"backfill/_migrations/{r}" in names for r in revisions)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert re.search(r"^backfill\s*=\s*backfill\.cli:main$", zipfile.ZipFile(wheel).read(entry_points).decode(), re.M)


def test_wheel_contains_every_backfill_package(wheel):
    """Every source directory of backfill/ with modules must ship (pyproject lists packages explicitly)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "backfill").rglob("*.py")
        if "__pycache__" not in p.parts and str(p.relative_to(ROOT)) not in names
    )
    assert not missing, f"not in the wheel (add the package to pyproject [tool.setuptools] packages): {missing}"


def test_migrate_finds_the_migrations_inside_the_unpacked_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    # The venv's site-packages for the dependencies (alembic, sqlalchemy, ...), but the project
    # itself only from the unpacked wheel: the checkout must not be on the path.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = str(site)
    code = (
        "import backfill, sys; from backfill.store.migrate import locations; "
        "s, v = locations(); print(backfill.__file__); print(s); print(v)"
    )
    proc = subprocess.run(
        [sys.executable, "-S", "-c", f"import site; site.main(); {code}"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    package_file, script, versions = (Path(line) for line in proc.stdout.split())
    assert package_file.is_relative_to(site), f"imported {package_file}, not the wheel's copy"
    assert script == site / "backfill" / "_alembic"
    assert versions == site / "backfill" / "_migrations"
    assert (script / "env.py").is_file() and (versions / "0001_initial.py").is_file()


def test_dockerfile_is_multistage_nonroot_and_runs_backfill():
    text = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    froms = [line for line in lines if line.upper().startswith("FROM ")]
    assert len(froms) >= 2, "multi-stage"
    assert all("python:3.11-slim" in f for f in froms)
    assert re.search(r"FROM python:3\.11-slim AS builder", text)
    assert any("pip wheel --no-deps -w /dist ." in line for line in lines)
    assert any(re.match(r"COPY --from=builder /dist/", line) for line in lines)
    users = [line.split()[1] for line in lines if line.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0] == "65532", "the last USER is the non-root uid"
    runtime = text[text.rindex("FROM "):]
    assert "USER 65532" in runtime
    assert 'ENTRYPOINT ["backfill"]' in lines and lines.index('ENTRYPOINT ["backfill"]') > lines.index(froms[-1])
    assert 'CMD ["controller"]' in lines
    for needed in ("COPY alembic", "COPY migrations", "COPY backfill"):
        assert needed in text


def test_dockerignore_excludes_local_state():
    entries = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()}
    assert {".venv", "tests/envtest/bin", ".backfill", ".git"} <= entries
