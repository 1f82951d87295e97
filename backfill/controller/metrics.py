"""The controller's Prometheus metrics: the seed's four families, and whether this replica leads,
on a given registry."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics

# Exactly the seed's four families: no ``*_created`` gauge beside each counter.
disable_created_metrics()

from backfill.core.runs import RunRow


class Metrics:
    """The four counters of seed 000 "Monitor" and the leader gauge, registered on ``registry``
    (not the global one).

    The HELP texts are the seed's, extended where issue 11's run segments count too. A labelled
    series is exported from its first count (1): it is not 0-initialised (11 series per
    ModelBackfill: about 13 MB and 2 s of CPU per scrape at 10,000), so the alerts and the
    dashboard's range panels count what a series born in their window holds
    (``deploy/monitoring/prometheusrule.yaml``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ("backfill", "namespace", "model")
        self.starts = Counter(
            "flexinfer_model_backfill_starts",
            "Admitted Job attempts, including retries after preemption; also each resume of a suspended Job (a new run segment).",
            labels,
            registry=self.registry,
        )
        self.completions = Counter(
            "flexinfer_model_backfill_completions",
            "Terminal attempts by bounded result (for a resumable Job, each ended run segment: a suspension ends one as preempted).",
            labels + ("result",),
            registry=self.registry,
        )
        self.preemptions = Counter(
            "flexinfer_model_backfill_preemptions",
            "Attempts cancelled for foreground or gaming priority.",
            labels + ("reason",),
            registry=self.registry,
        )
        self.useful_seconds = Counter(
            "flexinfer_model_backfill_useful_running_seconds",
            "Cumulative time spent running background work; waiting time is excluded.",
            labels,
            registry=self.registry,
        )
        # Not a seed family: with no replica leading nothing admits, and watched demand cancels
        # nothing (only ingest reports reach a standby's preemptor); a fault trial had both
        # replicas standing by behind a Lease edited to last 100,000 s, /readyz ok on both, and
        # no series to alert on (deploy/monitoring: ModelBackfillNoLeader).
        self.leader = Gauge(
            "flexinfer_model_backfill_leader",
            "1 while this replica holds the leader Lease and acts (always 1 without --leader-elect), else 0.",
            registry=self.registry,
        )
        # Not a seed family either: replicas on separate stores each know none of the other's
        # runs (a replica that takes over deletes the running Jobs as unexplained and runs the
        # finished one-shots again); the error line and /readyz were the only signals, and
        # ModelBackfillNoLeader stays quiet beside the other log's leader.
        self.foreign_log = Gauge(
            "flexinfer_model_backfill_foreign_event_log",
            "1 while the leader Lease names an event log other than this replica's (replicas on separate stores), else 0.",
            registry=self.registry,
        )

    def follow_leadership(self, leads: Callable[[], bool], foreign: Callable[[], bool] | None = None) -> None:
        """Export ``leads()`` as ``flexinfer_model_backfill_leader`` and ``foreign()`` (default:
        never) as ``flexinfer_model_backfill_foreign_event_log``, each read at each scrape."""
        self.leader.set_function(lambda: 1.0 if leads() else 0.0)
        if foreign is not None:
            self.foreign_log.set_function(lambda: 1.0 if foreign() else 0.0)

    def follow(self, row: RunRow, previous: RunRow | None, *, admitted: bool = False) -> None:
        """Count a ``runs`` row the log just created or changed (``previous``: the same row
        before, None if it is new): a start when an admission or resume (``admitted``) begins it,
        an end when its ``result`` is first set, and a preemption when an ended row becomes
        ``preempted`` afterwards (:meth:`preempted_late`)."""
        if row.result is None:
            if admitted:
                self.started(row)
            return
        if previous is None or previous.result is None:
            self.ended(row)
        elif row.result == "preempted" and previous.result != "preempted":
            self.preempted_late(row)

    def started(self, row: RunRow) -> None:
        """An attempt was admitted, or a suspended one resumed (a new run segment, issue 11)."""
        self.starts.labels(row.backfill, row.namespace, row.model).inc()

    def ended(self, row: RunRow) -> None:
        """An attempt (a run segment: a suspension ends one as ``preempted``) ended
        (``row.result`` set); counted once per row, so the counters add up to the ``runs`` rows."""
        base = (row.backfill, row.namespace, row.model)
        self.completions.labels(*base, row.result).inc()
        if row.result == "preempted":
            self.preemptions.labels(*base, row.reason).inc()
        if row.running_seconds > 0:
            self.useful_seconds.labels(*base).inc(row.running_seconds)

    def preempted_late(self, row: RunRow) -> None:
        """An ended row became ``preempted`` afterwards: the cancel decision that deleted its Job
        reached the log after the deletion (two replicas, or a store that was away), so the row
        first read ``cancelled``/``JobDeleted``. The preemption is counted now; the completion
        stays counted under its first result (a counter never goes back)."""
        self.preemptions.labels(row.backfill, row.namespace, row.model, row.reason).inc()
