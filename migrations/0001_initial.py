"""initial: events, checkpoints, runs and the run-history views

Revision ID: 0001
Revises:
Create Date: 2026-01-01 00:00:00

Tables are unqualified: they land in the schema env.py put on the search_path.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

# The run-history views as this revision created them (later revisions carry their own DDL).
LATEST_RUNS_VIEW = """
CREATE VIEW latest_runs AS
SELECT DISTINCT ON (namespace, backfill) namespace, backfill, backfill_uid, model, node, job_name, job_uid, attempt, generation, admitted_at, started_at, ended_at, result, reason, running_seconds, deciding_position
FROM runs
ORDER BY namespace, backfill, admitted_at DESC, attempt DESC
"""

MODEL_RUN_TOTALS_VIEW = """
CREATE VIEW model_run_totals AS
SELECT
    namespace,
    model,
    count(*) AS attempts,
    count(*) FILTER (WHERE result = 'succeeded') AS succeeded,
    count(*) FILTER (WHERE result = 'preempted') AS preempted,
    count(*) FILTER (WHERE result = 'failed') AS failed,
    count(*) FILTER (WHERE result = 'deadline_exceeded') AS deadline_exceeded,
    count(*) FILTER (WHERE result = 'cancelled') AS cancelled,
    count(*) FILTER (WHERE result IS NULL) AS running,
    coalesce(sum(running_seconds) FILTER (WHERE result = 'succeeded'), 0)::double precision
        AS useful_seconds,
    coalesce(sum(running_seconds) FILTER (WHERE result IS NOT NULL AND result <> 'succeeded'), 0)::double precision
        AS wasted_seconds
FROM runs
GROUP BY namespace, model
"""

PREEMPTIONS_BY_REASON_VIEW = """
CREATE VIEW preemptions_by_reason AS
SELECT
    namespace,
    model,
    reason,
    count(*) AS preemptions,
    coalesce(sum(running_seconds), 0)::double precision AS wasted_seconds
FROM runs
WHERE result = 'preempted'
GROUP BY namespace, model, reason
"""

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RESULTS = ("succeeded", "failed", "preempted", "deadline_exceeded", "cancelled")


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("position", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("version", sa.SmallInteger, nullable=False),
        sa.Column("stream", sa.Text, nullable=False),
        sa.Column("idempotency_key", sa.Text, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("data", pg.JSONB, nullable=False),
        sa.UniqueConstraint("idempotency_key", name="events_idempotency_key_key"),
    )
    op.create_index("events_stream_idx", "events", ["stream"])

    op.create_table(
        "checkpoints",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )

    results_sql = ", ".join(f"'{r}'" for r in _RESULTS)
    op.create_table(
        "runs",
        sa.Column("backfill_uid", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("namespace", sa.Text, nullable=False),
        sa.Column("backfill", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("node", sa.Text, nullable=False),
        sa.Column("job_name", sa.Text, nullable=False),
        sa.Column("job_uid", sa.Text, nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("admitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", sa.Text, nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("running_seconds", sa.Float(precision=53), nullable=False),
        sa.Column("deciding_position", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("backfill_uid", "attempt", name="runs_pkey"),
        sa.CheckConstraint(f"result IS NULL OR result IN ({results_sql})", name="runs_result_check"),
    )
    op.create_index("runs_namespace_backfill_idx", "runs", ["namespace", "backfill"])
    op.create_index("runs_model_idx", "runs", ["model"])
    op.create_index("runs_result_idx", "runs", ["result"])
    op.create_index("runs_admitted_at_idx", "runs", ["admitted_at"])
    op.create_index("runs_started_at_idx", "runs", ["started_at"])

    op.execute(LATEST_RUNS_VIEW)
    op.execute(MODEL_RUN_TOTALS_VIEW)
    op.execute(PREEMPTIONS_BY_REASON_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS preemptions_by_reason")
    op.execute("DROP VIEW IF EXISTS model_run_totals")
    op.execute("DROP VIEW IF EXISTS latest_runs")
    op.drop_table("runs")
    op.drop_table("checkpoints")
    op.drop_table("events")
