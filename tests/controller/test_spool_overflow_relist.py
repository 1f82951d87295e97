"""A spool smaller than one relist must not turn into a relist storm.

With BACKFILL_SPOOL_MAX_RECORDS=3 and PostgreSQL healthy, the first lists overflowed the spool,
the backlog drained, every watcher relisted, which overflowed it again: 1,453 relists a minute
and /readyz never ready. The setting now refuses less than 10,000 (tests/robustness); past
that, a relist that overflows the spool again is paced like a failed watch (doubling from
BACKFILL_BACKOFF_INITIAL_SECONDS up to BACKFILL_BACKOFF_MAX_SECONDS). The tiny spool here is
set past the settings' validation to force the overflow on a small namespace.
"""

from __future__ import annotations

import time

from .conftest import Kube, wait_for


def test_a_relist_that_overflows_the_spool_again_is_paced(kube_cluster, kube_namespace, pg_schema, kube_api):
    from backfill.controller.loop import Controller
    from backfill.controller.metrics import Metrics
    from backfill.settings import Settings
    from backfill.store import EventStore, RunStore, make_engine

    kube = Kube(kube_api, kube_namespace)
    for i in range(12):  # 12 Models and 12 ModelBackfills: one relist is far more than 3 records
        kube.model(f"m{i}")
        kube.backfill(f"bf{i}", model=f"m{i}")
    url, schema = pg_schema
    settings = Settings(
        namespace=kube_namespace, watch_timeout_seconds=5, backoff_initial_seconds=0.2, backoff_max_seconds=2,
    ).model_copy(update={"spool_max_records": 3})
    engine = make_engine(url, schema)
    events = EventStore(engine, poll=0.2)
    api = kube_cluster.api_client()
    c = Controller(settings, api, events, RunStore(engine), Metrics(), identity="test-storm")
    try:
        c.start()
        wait_for(lambda: c.spool.dropped > 0, timeout=10, what="the spool overflowed")
        time.sleep(2.0)  # the pause has grown to its cap by now (0.2 + 0.4 + 0.8 + 1.6 s ...)
        before = sum(w.lists for w in c.watchers)
        time.sleep(6.0)
        relists = sum(w.lists for w in c.watchers) - before
        # a storm relisted every watcher about every 40 ms (about 900 lists in 6 s here); paced,
        # each of the 6 watchers lists at most every 2 s: 3 or 4 times in 6 s
        assert relists <= 6 * 5, f"{relists} lists in 6 s: a relist storm"
    finally:
        c.stop()
        events.close()
        engine.dispose()
        api.close()
