"""runs: one row per run segment (resumable Indexed Jobs), and the kept seconds of each

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 12:00:00

A ``spec.preemption: Suspend`` declaration (issue 11) suspends its Indexed Job at a preemption and
resumes the same Job later, so one attempt may run several times. ``runs`` gets ``segment``
(1-based; part of the primary key, 1 for every existing row), ``completed_indexes`` (the
indexes completed in the segment, Kubernetes interval syntax) and ``kept_seconds`` (of a
segment that did not succeed, the seconds up to its last completed index; 0 for every existing
row). The views count useful seconds as all of a succeeded run plus the kept seconds of the
others, and the rest as wasted: for existing rows exactly what they computed before.

The view DDL is written out here (the old text for the downgrade too) so this revision keeps
doing what it did when later code changes. A downgrade keeps segment 1 of each attempt only.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_V1_COLUMNS = (
    "namespace, backfill, backfill_uid, model, node, job_name, job_uid, attempt, generation, admitted_at, "
    "started_at, ended_at, result, reason, running_seconds, deciding_position"
)
_V2_COLUMNS = _V1_COLUMNS + ", segment, completed_indexes, kept_seconds"
_USEFUL = "CASE WHEN result = 'succeeded' THEN running_seconds ELSE least(kept_seconds, running_seconds) END"

_TOTALS = """
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
    {useful} AS useful_seconds,
    {wasted} AS wasted_seconds
FROM runs
GROUP BY namespace, model
"""
_PREEMPTIONS = """
CREATE VIEW preemptions_by_reason AS
SELECT
    namespace,
    model,
    reason,
    count(*) AS preemptions,
    coalesce(sum({wasted}), 0)::double precision AS wasted_seconds
FROM runs
WHERE result = 'preempted'
GROUP BY namespace, model, reason
"""
_LATEST = """
CREATE VIEW latest_runs AS
SELECT DISTINCT ON (namespace, backfill) {columns}
FROM runs
ORDER BY namespace, backfill, admitted_at DESC, attempt DESC{segment}
"""

V2_VIEWS = (
    _LATEST.format(columns=_V2_COLUMNS, segment=", segment DESC"),
    _TOTALS.format(
        useful=f"coalesce(sum({_USEFUL}) FILTER (WHERE result IS NOT NULL), 0)::double precision",
        wasted=f"coalesce(sum(running_seconds - {_USEFUL}) FILTER (WHERE result IS NOT NULL), 0)::double precision",
    ),
    _PREEMPTIONS.format(wasted=f"running_seconds - {_USEFUL}"),
)
V1_VIEWS = (
    _LATEST.format(columns=_V1_COLUMNS, segment=""),
    _TOTALS.format(
        useful="coalesce(sum(running_seconds) FILTER (WHERE result = 'succeeded'), 0)::double precision\n       ",
        wasted="coalesce(sum(running_seconds) FILTER (WHERE result IS NOT NULL AND result <> 'succeeded'), 0)::double precision\n       ",
    ),
    _PREEMPTIONS.format(wasted="running_seconds"),
)


def _drop_views() -> None:
    op.execute("DROP VIEW IF EXISTS preemptions_by_reason")
    op.execute("DROP VIEW IF EXISTS model_run_totals")
    op.execute("DROP VIEW IF EXISTS latest_runs")


def upgrade() -> None:
    _drop_views()
    op.execute("ALTER TABLE runs ADD COLUMN segment integer NOT NULL DEFAULT 1")
    op.execute("ALTER TABLE runs ADD COLUMN completed_indexes text NOT NULL DEFAULT ''")
    op.execute("ALTER TABLE runs ADD COLUMN kept_seconds double precision NOT NULL DEFAULT 0")
    op.execute("ALTER TABLE runs DROP CONSTRAINT runs_pkey")
    op.execute("ALTER TABLE runs ADD CONSTRAINT runs_pkey PRIMARY KEY (backfill_uid, attempt, segment)")
    for ddl in V2_VIEWS:
        op.execute(ddl)


def downgrade() -> None:
    _drop_views()
    op.execute("DELETE FROM runs WHERE segment <> 1")
    op.execute("ALTER TABLE runs DROP CONSTRAINT runs_pkey")
    op.execute("ALTER TABLE runs ADD CONSTRAINT runs_pkey PRIMARY KEY (backfill_uid, attempt)")
    for column in ("kept_seconds", "completed_indexes", "segment"):
        op.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    for ddl in V1_VIEWS:
        op.execute(ddl)
