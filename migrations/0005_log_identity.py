"""log_identity: one random id per event log, so that replicas can tell they share one store

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07 03:50:00

Every replica of a deployment must read and write the same log. Replicas started on separate
stores (each its own embedded server, or another database URL) cannot tell from the log alone:
one that takes over knows none of the other's runs, deletes the Job running as unexplained and
runs finished one-shot declarations again (an operator's trial). The leader writes this id into
the leader Lease (``backfill.controller.leader``); another replica that reads a different one
says so and is not ready. A schema reset (``simulate --store``) gets a new id.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "log_identity",
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("id", name="log_identity_pkey"),
    )
    op.bulk_insert(table, [{"id": uuid.uuid4().hex}])


def downgrade() -> None:
    op.drop_table("log_identity")
