"""pruned_partitions: what backfill db prune dropped, so that a restore can be checked complete

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 19:30:00

``backfill db prune`` records each partition it drops: its positions ``[lo, hi)``, how many
events it held, when, and the export file it was written to (if any). ``backfill db restore``
checks that the files it is given hold exactly that many events in every dropped range (a
partial set of exports left a hole no later check could see: positions are not contiguous,
since an append that rolled back burns its positions) and deletes the rows of what it restored.
A log pruned before this revision has no rows here for those partitions.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pruned_partitions",
        sa.Column("lo", sa.BigInteger, nullable=False),
        sa.Column("hi", sa.BigInteger, nullable=False),
        sa.Column("events", sa.BigInteger, nullable=False),
        sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("export", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("lo", name="pruned_partitions_pkey"),
    )


def downgrade() -> None:
    op.drop_table("pruned_partitions")
