"""modelbackfill: run bounded, CPU-only background Jobs in a warm model's foreground-idle time.

Layers (enforced by import-linter, see ``.importlinter``):

- ``backfill.core``: the pure domain. Spec parsing, event types, the projector (``fold`` and
  ``decide``), the run-history projection and the Job-template copy. No I/O, no clock: time is
  always an argument.
- ``backfill.store``: the PostgreSQL event log, checkpoints and the ``runs`` table (SQLAlchemy
  Core + psycopg 3), Alembic migrations and the embedded no-setup server.
- ``backfill.sim``: trace readers and the simulated cluster behind ``backfill simulate``.
- ``backfill.controller``: watchers, actor, HTTP endpoints, metrics and leader election against a
  real Kubernetes API server.
- ``backfill.cli``: the ``backfill`` command.
"""

__version__ = "0.1.0"
