"""The store's tables (SQLAlchemy Core) and views (DDL text).

Every table is *unqualified*: it lives in the PostgreSQL schema named at run time (default
``backfill``), which the engine puts first and alone on the connection's ``search_path`` (see
:mod:`backfill.store.engine`). Alembic owns every table: the revision files in ``migrations/``
create them and ``tests/store/test_migrations.py`` checks that the migrated database and
:data:`metadata` agree.

Tables:

- ``events``: the append-only log, partitioned by ranges of ``position`` (one partition per
  ``event_partition_size`` positions, created ahead by the appends; old ones dropped by
  ``backfill db prune``). ``position`` is the global order (a sequence, never reused; gaps only
  where an append rolled back). ``data`` is the whole event as JSON (``jsonb``).
- ``event_keys``: the idempotency key of every stored event (unique), with its position.
- ``checkpoints``: how far each projection has folded the log, written in the same transaction
  as the projection's rows (or its snapshot).
- ``snapshots``: serialized projections (opaque bytes) at a position, per code version.
- ``pruned_partitions``: what ``backfill db prune`` dropped (positions, event count, export),
  checked by ``backfill db restore``.
- ``log_identity``: one random id of this log, written into the leader Lease.
- ``runs``: one row per run segment of a Job attempt (:class:`backfill.core.runs.RunRow`; one
  segment per attempt unless a ``spec.preemption: Suspend`` declaration's Job was suspended
  and resumed), keyed by ``(backfill_uid, attempt, segment)``.

Views (created by the migrations from the DDL constants below):

- ``latest_runs``: the latest segment of each (namespace, backfill).
- ``model_run_totals``: per (namespace, model): attempts (rows: run segments), succeeded,
  preempted, failed, deadline_exceeded, cancelled, running (live), useful_seconds and
  wasted_seconds (:attr:`backfill.core.runs.RunRow.useful_seconds`: the running seconds of
  succeeded runs, plus ``kept_seconds`` of other ended ones, the completed shards of a
  resumable Job; wasted: the rest of every ended run).
- ``preemptions_by_reason``: per (namespace, model, reason) over ``preempted`` runs: count and
  wasted seconds.

A revision that changes a view must carry its own copy of the new DDL (and the old one for its
downgrade) instead of editing the constants a previous revision used.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from backfill.core.runs import RESULTS

metadata = sa.MetaData()

#: Partitioning of ``events``: by range of ``position`` (see :mod:`backfill.store.retention`).
EVENTS_PARTITION_BY = "RANGE (position)"
#: Name of the sequence that hands out positions (owned by ``events.position``).
POSITION_SEQUENCE = "events_position_seq"

events = sa.Table(
    "events",
    metadata,
    # Default nextval('events_position_seq'), a sequence OWNED BY the column (a partitioned
    # table cannot have an identity column before PostgreSQL 17).
    sa.Column("position", sa.BigInteger, primary_key=True),
    sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("type", sa.Text, nullable=False),
    sa.Column("version", sa.SmallInteger, nullable=False),
    sa.Column("stream", sa.Text, nullable=False),
    sa.Column("idempotency_key", sa.Text, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("data", pg.JSONB, nullable=False),
    sa.Index("events_stream_idx", "stream"),
    postgresql_partition_by=EVENTS_PARTITION_BY,
)

#: Idempotency keys of the stored events: a UNIQUE key over a table partitioned by position
#: would have to include the position, so the keys live in this unpartitioned table instead.
event_keys = sa.Table(
    "event_keys",
    metadata,
    sa.Column("idempotency_key", sa.Text, primary_key=True),
    sa.Column("position", sa.BigInteger, nullable=False),
)

checkpoints = sa.Table(
    "checkpoints",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)

#: Snapshots of projections: opaque ``payload`` bytes of the projection ``name`` folded up to
#: ``position`` by code version ``code_version``; written with checkpoint ``name``.
snapshots = sa.Table(
    "snapshots",
    metadata,
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("code_version", sa.Text, nullable=False),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("payload", sa.LargeBinary, nullable=False),
    sa.PrimaryKeyConstraint("name", "code_version", "position", name="snapshots_pkey"),
)

pruned_partitions = sa.Table(
    "pruned_partitions",
    metadata,
    # One row per partition ``backfill db prune`` dropped: positions [lo, hi), the events it held,
    # when, and the export file (None: not exported); ``backfill db restore`` checks against it.
    sa.Column("lo", sa.BigInteger, nullable=False),
    sa.Column("hi", sa.BigInteger, nullable=False),
    sa.Column("events", sa.BigInteger, nullable=False),
    sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("export", sa.Text, nullable=True),
    sa.PrimaryKeyConstraint("lo", name="pruned_partitions_pkey"),
)

log_identity = sa.Table(
    "log_identity",
    metadata,
    # One row: a random id of this log (revision 0005), which the leader writes into the Lease
    # so that replicas on separate stores are told apart (backfill.controller.leader).
    sa.Column("id", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.PrimaryKeyConstraint("id", name="log_identity_pkey"),
)

#: SQL list of the allowed ``runs.result`` values, e.g. ``'succeeded', 'failed', ...``.
RESULTS_SQL = ", ".join(f"'{r}'" for r in RESULTS)

runs = sa.Table(
    "runs",
    metadata,
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
    sa.Column("segment", sa.Integer, nullable=False, server_default=sa.text("1")),
    sa.Column("completed_indexes", sa.Text, nullable=False, server_default=sa.text("''")),
    sa.Column("kept_seconds", sa.Float(precision=53), nullable=False, server_default=sa.text("0")),
    sa.PrimaryKeyConstraint("backfill_uid", "attempt", "segment", name="runs_pkey"),
    sa.CheckConstraint(f"result IS NULL OR result IN ({RESULTS_SQL})", name="runs_result_check"),
    sa.Index("runs_namespace_backfill_idx", "namespace", "backfill"),
    sa.Index("runs_model_idx", "model"),
    sa.Index("runs_result_idx", "result"),
    sa.Index("runs_admitted_at_idx", "admitted_at"),
    sa.Index("runs_started_at_idx", "started_at"),
)

#: Column order of :class:`backfill.core.runs.RunRow` (its constructor's positional order).
RUN_COLUMNS = (
    "namespace",
    "backfill",
    "backfill_uid",
    "model",
    "node",
    "job_name",
    "job_uid",
    "attempt",
    "generation",
    "admitted_at",
    "started_at",
    "ended_at",
    "result",
    "reason",
    "running_seconds",
    "deciding_position",
    "segment",
    "completed_indexes",
    "kept_seconds",
)

_RUN_COLUMNS_SQL = ", ".join(RUN_COLUMNS)

LATEST_RUNS_VIEW = f"""
CREATE VIEW latest_runs AS
SELECT DISTINCT ON (namespace, backfill) {_RUN_COLUMNS_SQL}
FROM runs
ORDER BY namespace, backfill, admitted_at DESC, attempt DESC, segment DESC
"""

#: A row's useful seconds in SQL (:attr:`backfill.core.runs.RunRow.useful_seconds`): all of a
#: succeeded run, the kept part of another ended one.
_USEFUL = "CASE WHEN result = 'succeeded' THEN running_seconds ELSE least(kept_seconds, running_seconds) END"

MODEL_RUN_TOTALS_VIEW = f"""
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
    coalesce(sum({_USEFUL}) FILTER (WHERE result IS NOT NULL), 0)::double precision AS useful_seconds,
    coalesce(sum(running_seconds - {_USEFUL}) FILTER (WHERE result IS NOT NULL), 0)::double precision AS wasted_seconds
FROM runs
GROUP BY namespace, model
"""

PREEMPTIONS_BY_REASON_VIEW = f"""
CREATE VIEW preemptions_by_reason AS
SELECT
    namespace,
    model,
    reason,
    count(*) AS preemptions,
    coalesce(sum(running_seconds - {_USEFUL}), 0)::double precision AS wasted_seconds
FROM runs
WHERE result = 'preempted'
GROUP BY namespace, model, reason
"""

#: Views in creation order (drop in reverse).
VIEWS: tuple[tuple[str, str], ...] = (
    ("latest_runs", LATEST_RUNS_VIEW),
    ("model_run_totals", MODEL_RUN_TOTALS_VIEW),
    ("preemptions_by_reason", PREEMPTIONS_BY_REASON_VIEW),
)

__all__ = [
    "metadata",
    "events",
    "event_keys",
    "EVENTS_PARTITION_BY",
    "POSITION_SEQUENCE",
    "checkpoints",
    "snapshots",
    "runs",
    "RUN_COLUMNS",
    "RESULTS_SQL",
    "LATEST_RUNS_VIEW",
    "MODEL_RUN_TOTALS_VIEW",
    "PREEMPTIONS_BY_REASON_VIEW",
    "VIEWS",
]
