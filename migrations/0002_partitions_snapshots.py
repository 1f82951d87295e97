"""events partitioned by position range, event_keys for idempotency, snapshots

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 00:00:00

Why the log is partitioned by ranges of ``position`` (and not by a timestamp column) and why
the idempotency keys moved to their own table: see :mod:`backfill.store.retention`.

Upgrade with data: the rows of the old (unpartitioned) ``events`` table are copied into
partitions of 1,000,000 positions each (none when it is empty: the first append creates the
first partition) (``[1, 1000001)``, ``[1000001, 2000001)``, ...), their
keys into ``event_keys``, and the position sequence continues after the last position the old
identity handed out (burnt positions of rolled-back appends stay unused). The copy runs in the
migration's transaction: budget about 10 s per million events.

The SQL is written out here (not imported from the application) so this revision keeps doing
what it did when later code changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PARTITION_SIZE = 1_000_000
_COLUMNS = "position, recorded_at, type, version, stream, idempotency_key, at, data"


#: The last position the old identity handed out (burnt ones included), or 0.
_ISSUED_V1 = "(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM events_v1_position_seq)"


def upgrade() -> None:
    op.execute("ALTER TABLE events RENAME TO events_v1")
    op.execute("ALTER TABLE events_v1 RENAME CONSTRAINT events_pkey TO events_v1_pkey")
    op.execute("ALTER TABLE events_v1 RENAME CONSTRAINT events_idempotency_key_key TO events_v1_idempotency_key_key")
    op.execute("ALTER INDEX events_stream_idx RENAME TO events_v1_stream_idx")
    op.execute(
        """
        CREATE TABLE events (
            position bigint NOT NULL,
            recorded_at timestamptz NOT NULL DEFAULT now(),
            type text NOT NULL,
            version smallint NOT NULL,
            stream text NOT NULL,
            idempotency_key text NOT NULL,
            at timestamptz NOT NULL,
            data jsonb NOT NULL,
            CONSTRAINT events_pkey PRIMARY KEY (position)
        ) PARTITION BY RANGE (position)
        """
    )
    op.execute("CREATE INDEX events_stream_idx ON events (stream)")
    op.execute(
        "CREATE TABLE event_keys (idempotency_key text NOT NULL, position bigint NOT NULL, "
        "CONSTRAINT event_keys_pkey PRIMARY KEY (idempotency_key))"
    )

    # Data-dependent steps run in the server (PL/pgSQL), so `alembic upgrade --sql` works too.
    op.execute("ALTER SEQUENCE events_position_seq RENAME TO events_v1_position_seq")
    op.execute("CREATE SEQUENCE events_position_seq AS bigint")
    op.execute(
        f"""
        DO $$
        DECLARE
            last bigint;
            lo bigint := 1;
        BEGIN
            SELECT greatest(coalesce(max(position), 0), {_ISSUED_V1}) INTO last FROM events_v1;
            -- cover what exists and half a partition ahead; an empty log gets its first
            -- partition from its first append (in the size the store is configured with)
            WHILE last > 0 AND lo <= last + {PARTITION_SIZE // 2} LOOP
                EXECUTE format('CREATE TABLE %I PARTITION OF events FOR VALUES FROM (%s) TO (%s)',
                               'events_p' || lpad(lo::text, 12, '0'), lo, lo + {PARTITION_SIZE});
                lo := lo + {PARTITION_SIZE};
            END LOOP;
            IF last > 0 THEN
                PERFORM setval('events_position_seq', last, true);
            END IF;
        END
        $$
        """
    )
    op.execute(f"INSERT INTO events ({_COLUMNS}) SELECT {_COLUMNS} FROM events_v1 ORDER BY position")
    op.execute("INSERT INTO event_keys (idempotency_key, position) SELECT idempotency_key, position FROM events_v1")
    op.execute("DROP TABLE events_v1")  # and its identity sequence
    op.execute("ALTER SEQUENCE events_position_seq OWNED BY events.position")
    op.execute("ALTER TABLE events ALTER COLUMN position SET DEFAULT nextval('events_position_seq'::regclass)")

    op.execute(
        """
        CREATE TABLE snapshots (
            name text NOT NULL,
            code_version text NOT NULL,
            position bigint NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            payload bytea NOT NULL,
            CONSTRAINT snapshots_pkey PRIMARY KEY (name, code_version, position)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE snapshots")
    op.execute("ALTER TABLE events RENAME TO events_v2")
    op.execute("ALTER TABLE events_v2 RENAME CONSTRAINT events_pkey TO events_v2_pkey")
    op.execute("ALTER INDEX events_stream_idx RENAME TO events_v2_stream_idx")
    op.execute("ALTER SEQUENCE events_position_seq RENAME TO events_v2_position_seq")
    op.execute(
        """
        CREATE TABLE events (
            position bigint GENERATED BY DEFAULT AS IDENTITY,
            recorded_at timestamptz NOT NULL DEFAULT now(),
            type text NOT NULL,
            version smallint NOT NULL,
            stream text NOT NULL,
            idempotency_key text NOT NULL,
            at timestamptz NOT NULL,
            data jsonb NOT NULL,
            CONSTRAINT events_pkey PRIMARY KEY (position),
            CONSTRAINT events_idempotency_key_key UNIQUE (idempotency_key)
        )
        """
    )
    op.execute("CREATE INDEX events_stream_idx ON events (stream)")
    op.execute(f"INSERT INTO events ({_COLUMNS}) SELECT {_COLUMNS} FROM events_v2 ORDER BY position")
    op.execute(
        """
        DO $$
        DECLARE
            last bigint;
        BEGIN
            SELECT greatest(coalesce(max(position), 0),
                            (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM events_v2_position_seq))
              INTO last FROM events;
            IF last > 0 THEN
                PERFORM setval(pg_get_serial_sequence('events', 'position'), last, true);
            END IF;
        END
        $$
        """
    )
    op.execute("DROP TABLE events_v2")  # with every partition and the position sequence
    op.execute("DROP TABLE event_keys")
