"""The ``runs`` table (one row per Job attempt) and its views.

:meth:`RunStore.apply` upserts the rows a projection derived from the log *and* moves that
projection's checkpoint in one transaction: after a crash either both or neither are visible,
so the projection resumes exactly where its rows end.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Engine

from backfill.core.runs import RunRow
from backfill.store.schema import RUN_COLUMNS, checkpoints, runs

_KEY = ("backfill_uid", "attempt", "segment")
_SELECT_RUNS = sa.select(*(runs.c[name] for name in RUN_COLUMNS))


def _checkpoint_upsert(name: str, position: int) -> sa.Executable:
    stmt = pg_insert(checkpoints).values(name=name, position=int(position), updated_at=sa.func.now())
    return stmt.on_conflict_do_update(
        index_elements=[checkpoints.c.name],
        set_={"position": stmt.excluded.position, "updated_at": stmt.excluded.updated_at},
    )


_insert_runs = pg_insert(runs)
_UPSERT_RUNS = _insert_runs.on_conflict_do_update(
    index_elements=[runs.c.backfill_uid, runs.c.attempt, runs.c.segment],
    set_={name: _insert_runs.excluded[name] for name in RUN_COLUMNS if name not in _KEY},
)


class RunStore:
    """Run history in the schema an engine from :func:`backfill.store.make_engine` is bound to."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def engine(self) -> Engine:
        return self._engine

    def apply(self, rows: Sequence[RunRow], checkpoint: str, position: int) -> None:
        """Upsert ``rows`` by ``(backfill_uid, attempt, segment)`` and set checkpoint ``checkpoint`` to
        ``position``, atomically. When one row appears several times the last one wins.

        Raises (and changes nothing) when a row breaks a constraint, e.g. an unknown ``result``.
        """
        latest: dict[tuple[str, int, int], RunRow] = {}
        for row in rows:
            latest[row.identity] = row
        params = [{name: getattr(row, name) for name in RUN_COLUMNS} for row in latest.values()]
        with self._engine.begin() as conn:
            conn.execute(_checkpoint_upsert(checkpoint, position))
            if params:
                conn.execute(_UPSERT_RUNS, params)

    def get_checkpoint(self, name: str) -> int:
        """The position checkpoint ``name`` was last set to (0 when never set)."""
        with self._engine.connect() as conn:
            value = conn.execute(sa.select(checkpoints.c.position).where(checkpoints.c.name == name)).scalar()
        return int(value) if value is not None else 0

    def query(
        self,
        namespace: str | None = None,
        backfill: str | None = None,
        model: str | None = None,
        result: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
        newest: bool = False,
    ) -> list[RunRow]:
        """Runs matching every given filter, oldest admission first.

        ``result`` may be ``"running"`` for live attempts (no result yet); ``since`` keeps runs
        admitted at or after it; ``limit`` keeps the first ``limit`` runs, or with ``newest`` the
        last ``limit`` (still returned oldest first).
        """
        stmt = _SELECT_RUNS
        if namespace is not None:
            stmt = stmt.where(runs.c.namespace == namespace)
        if backfill is not None:
            stmt = stmt.where(runs.c.backfill == backfill)
        if model is not None:
            stmt = stmt.where(runs.c.model == model)
        if result is not None:
            stmt = stmt.where(runs.c.result.is_(None) if result == "running" else runs.c.result == result)
        if since is not None:
            stmt = stmt.where(runs.c.admitted_at >= since)
        order = (runs.c.admitted_at, runs.c.backfill_uid, runs.c.attempt, runs.c.segment)
        if newest:
            stmt = stmt.order_by(*(c.desc() for c in order))
        else:
            stmt = stmt.order_by(*order)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._engine.connect() as conn:
            rows = [RunRow(*row) for row in conn.execute(stmt)]
        return rows[::-1] if newest else rows

    def _view(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self._engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(sa.text(sql), params)]

    def latest(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The ``latest_runs`` view: the latest attempt of each (namespace, backfill)."""
        return self._view(
            "SELECT * FROM latest_runs WHERE (CAST(:ns AS text) IS NULL OR namespace = :ns) ORDER BY namespace, backfill",
            {"ns": namespace},
        )

    def model_totals(self, namespace: str | None = None, model: str | None = None) -> list[dict[str, Any]]:
        """The ``model_run_totals`` view: per (namespace, model) attempts, outcomes, useful and
        wasted seconds."""
        return self._view(
            "SELECT * FROM model_run_totals WHERE (CAST(:ns AS text) IS NULL OR namespace = :ns) "
            "AND (CAST(:model AS text) IS NULL OR model = :model) ORDER BY namespace, model",
            {"ns": namespace, "model": model},
        )

    def preemptions_by_reason(self, namespace: str | None = None, model: str | None = None) -> list[dict[str, Any]]:
        """The ``preemptions_by_reason`` view: per (namespace, model, reason) count and wasted seconds."""
        return self._view(
            "SELECT * FROM preemptions_by_reason WHERE (CAST(:ns AS text) IS NULL OR namespace = :ns) "
            "AND (CAST(:model AS text) IS NULL OR model = :model) ORDER BY namespace, model, reason",
            {"ns": namespace, "model": model},
        )


__all__ = ["RunStore"]
