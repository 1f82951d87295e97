"""A controller whose start fails (the store refuses the session, say) stops cleanly, so the
caller sees the start's own error: stopping joined the preemptor's thread, never started, and
"RuntimeError: cannot join thread before it is started" replaced the cause."""

from __future__ import annotations

import pytest
from kubernetes import client

from backfill.controller.loop import Controller
from backfill.controller.metrics import Metrics
from backfill.settings import Settings
from backfill.store.memory import MemoryBackend, MemoryEventStore, MemoryRunStore


class _RefusedRuns(MemoryRunStore):
    """A run store whose first read fails as PostgreSQL fails a session it refuses."""

    def get_checkpoint(self, name):
        raise ConnectionError('invalid value for parameter "statement_timeout": "3000000000"')


def test_a_failed_start_stops_cleanly_and_keeps_its_error():
    backend = MemoryBackend()
    c = Controller(Settings(), client.ApiClient(), MemoryEventStore(backend), _RefusedRuns(backend), Metrics())
    with pytest.raises(ConnectionError, match="statement_timeout"):
        try:
            c.start()
        finally:
            c.stop(timeout=1.0)  # as backfill.controller.run does: must not raise over the cause
