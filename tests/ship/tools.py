"""Where the ship tests find their command-line tools (installed by tests/ship/install_tools.sh,
which the README's test command runs)."""

from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

INSTALL = "bash tests/ship/install_tools.sh"


@lru_cache(maxsize=None)
def _go_bin() -> Path | None:
    go = shutil.which("go")
    if go is None:
        return None
    out = subprocess.run([go, "env", "GOBIN", "GOPATH"], capture_output=True, text=True, timeout=30).stdout.split("\n")
    gobin, gopath = (out + ["", ""])[:2]
    return Path(gobin) if gobin else Path(gopath) / "bin" if gopath else None


def kustomize() -> list[str]:
    """The kustomize command (the pinned binary from go install); fails the test if absent."""
    found = shutil.which("kustomize")
    if found:
        return [found]
    gobin = _go_bin()
    if gobin is not None and (gobin / "kustomize").is_file():
        return [str(gobin / "kustomize")]
    pytest.fail(f"kustomize is not installed: run `{INSTALL}`")


def promtool() -> str | None:
    """promtool on PATH, or None."""
    return shutil.which("promtool")


def build(directory: Path) -> str:
    """`kustomize build DIRECTORY` (what `kubectl apply -k` applies), as YAML text."""
    proc = subprocess.run([*kustomize(), "build", str(directory)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kustomize build {directory}: {proc.stderr}"
    return proc.stdout
