"""The pure core: no I/O, no clock, no SQLAlchemy, no Kubernetes client.

Modules:
- ``durations``: Go/Kubernetes duration syntax <-> seconds.
- ``spec``: the ModelBackfill spec model and its contract checks (-> Blocked reasons).
- ``events``: the typed, versioned events of the log (a discriminated union) and their codec.
- ``records``: the storage-neutral shapes of a log row (``EventRecord``, ``StoredEvent``).
- ``state``: the projected world (models, nodes, leases, templates, backfills).
- ``projector``: ``fold(state, event)`` and ``decide(state, now)``.
- ``commands``: what ``decide`` asks the actor to do.
- ``status``: the ModelBackfill status derived from the state at a time.
- ``runs``: the run-history projection (one row per attempt).
- ``jobtemplate``: the Job copied from a CronJob template, and the GPU guard.
"""
