# syntax=docker/dockerfile:1
# ModelBackfill controller image: `backfill controller` by default; `backfill db upgrade` runs the
# migrations, which ship inside the wheel (backfill._alembic, backfill._migrations).
#
# Reproducible: the runtime dependencies are installed from requirements.lock (pip-compile
# --generate-hashes) with --require-hashes, the wheel is built with the build backend of
# requirements-build.lock (setuptools, wheel; hashed too, no build isolation fetching whatever
# setuptools is newest), and the base image is pinned to an exact version tag
# (python 3.11.7, the interpreter the lock was resolved with, on Debian bookworm). Pin it by digest
# as well (python:3.11.7-slim-bookworm@sha256:...) once you resolve the digest in your registry.
# Lean: no matplotlib (the `plot` extra) and no embedded PostgreSQL (the `embedded` extra): the
# image always talks to BACKFILL_DATABASE_URL / BACKFILL_DATABASE_URL_FILE. No pip at run time.

# ---- builder: a virtualenv with the locked dependencies and this project's wheel ----------
FROM python:3.11.7-slim-bookworm AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock requirements-build.lock ./
RUN python -m venv --without-pip /opt/venv \
 && pip --python /opt/venv/bin/python install --require-hashes --no-deps -r requirements.lock \
 && python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --no-deps -r requirements-build.lock
# pyproject.toml names README.md as the package's long description.
COPY pyproject.toml README.md ./
COPY backfill ./backfill
COPY alembic ./alembic
COPY migrations ./migrations
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation -w /dist . \
 && pip --python /opt/venv/bin/python install --no-deps /dist/*.whl \
 && /opt/venv/bin/python -c "import backfill.cli, backfill.controller.loop, backfill.store"

# ---- runtime: the base image without pip, the virtualenv, a non-root user -----------------
FROM python:3.11.7-slim-bookworm AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp PATH=/opt/venv/bin:$PATH
RUN python -m pip uninstall -y -q pip setuptools wheel \
 && rm -rf /usr/local/lib/python3.11/ensurepip \
 && groupadd --system --gid 65532 backfill \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin backfill
COPY --from=builder /opt/venv /opt/venv
USER 65532:65532
WORKDIR /tmp
EXPOSE 8443
ENTRYPOINT ["backfill"]
CMD ["controller"]
