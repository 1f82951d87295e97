"""Fixtures of the ship tests: the project's wheel, built once per session."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _setuptools_ok_without_isolation() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 69  # pyproject: setuptools>=69


@pytest.fixture(scope="session")
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
