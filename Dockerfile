# syntax=docker/dockerfile:1
# ModelBackfill controller image: `backfill controller` by default; `backfill db upgrade` runs the
# migrations, which ship inside the wheel (backfill._alembic, backfill._migrations).

# ---- builder: build the wheel of this project ---------------------------------------------
FROM python:3.11-slim AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# pyproject.toml names README.md as the package's long description.
COPY pyproject.toml README.md ./
COPY backfill ./backfill
COPY alembic ./alembic
COPY migrations ./migrations
RUN pip wheel --no-deps -w /dist .

# ---- runtime ------------------------------------------------------------------------------
FROM python:3.11-slim AS runtime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN groupadd --system --gid 65532 backfill \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin backfill
COPY --from=builder /dist/*.whl /tmp/dist/
RUN pip install /tmp/dist/*.whl && rm -rf /tmp/dist
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["backfill"]
CMD ["controller"]
