"""The Kubernetes controller: the only layer that imports ``kubernetes``.

``run(settings)`` wires the event store, the watchers, the reconcile loop, the actor, leader
election and the HTTP server, logs one JSON object per line, and stops cleanly on SIGTERM. Once
the watchers synced it freezes the start-up heap (:func:`backfill.core.perf.freeze_heap`), so
that the garbage collector's full passes, which stop every thread including the cancel path, no
longer traverse the imported code and the start-up state (85-155 ms each before, 16-33 ms after,
measured with 1,000 ModelBackfills by ``bench/bench_latency.py``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
from datetime import datetime, timezone
from typing import Any, Callable

from backfill.settings import Settings

_EXTRA = ("backfill", "position", "decision", "resource")


class ControllerConfigError(Exception):
    """A setting the controller cannot start with (one-line message)."""


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, msg, logger and (when set) backfill/position/decision."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
            "logger": record.name,
        }
        for k in _EXTRA:
            if hasattr(record, k):
                out[k] = getattr(record, k)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(out, default=str)


def setup_logging(level: int = logging.INFO) -> None:
    """Send every log record to stderr as one JSON object per line (see :class:`JsonFormatter`)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _first_election_round(leader: Any) -> None:
    """The first leader-election round in the foreground: a missing Lease namespace is a
    setting error (:class:`ControllerConfigError`); any other failure is logged and the election
    thread keeps retrying."""
    try:
        _lease_namespace_exists(leader.try_acquire)
        leader.healthy = True
    except ControllerConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - unreachable/forbidden: the election thread keeps retrying
        leader.report_failure(exc)


def _lease_namespace_exists(call: Callable[[], Any]) -> None:
    """``call()``; its :class:`~backfill.controller.leader.LeaseNamespaceMissing` as the
    one-line :class:`ControllerConfigError` that names the fixes."""
    from .leader import LeaseNamespaceMissing

    try:
        call()
    except LeaseNamespaceMissing as exc:
        raise ControllerConfigError(
            f"leader election: the Lease namespace {exc.namespace!r} does not exist; create it "
            f"(kubectl create namespace {exc.namespace}), set --lease-namespace/BACKFILL_LEASE_NAMESPACE "
            "to an existing namespace, or run without --leader-elect"
        ) from None


def _ready(controller: Any, leader: Any) -> tuple[bool, list[str]]:
    ok, problems = controller.readiness()
    if leader is not None and not (leader.is_leader() or leader.healthy):
        problems = problems + ["leader election: the Lease cannot be read or renewed"]
    if leader is not None and leader.foreign_log is not None:
        holder, theirs = leader.foreign_log
        problems = problems + [f"leader election: the leader {holder} writes to another event log ({theirs}): replicas must share one store"]
    return (not problems, problems)


def run(
    settings: Settings,
    schema: str = "backfill",
    ingest: Any = None,
    *,
    stop: threading.Event | None = None,
    configure_logging: bool = True,
    migrate: Callable[[], None] | None = None,
) -> None:
    """Run the controller until SIGTERM/SIGINT (main thread) or until ``stop`` is set.

    The settings that can be checked without the database come first (the ingest token file,
    the HTTP address, the Lease namespace): a bad one is one error before any slow step.

    Args:
        settings: every tunable; ``database_url`` unset starts the embedded server.
        schema: the PostgreSQL schema (migrated by ``migrate``, else already).
        ingest: optional handler of POST /v1/foreground (see :mod:`backfill.controller.http`).
        stop: set it to stop the controller (tests, embedding).
        configure_logging: install the JSON log formatter on the root logger.
        migrate: called once those checks passed, before the store is opened (``backfill
            controller``: the schema's migration).

    Raises:
        ControllerConfigError: a setting the controller cannot start with (one line).
    """
    from backfill.core.perf import freeze_heap
    from backfill.store import open_store

    from .http import make_server, serve_in_thread
    from .kube import api_client
    from .leader import LeaderElector, led_elsewhere
    from .loop import Controller
    from .metrics import Metrics

    if configure_logging:
        setup_logging()
    log = logging.getLogger("backfill.controller")
    api = api_client(settings)
    identity = settings.identity or f"{socket.gethostname()}-{os.getpid()}"
    controller: Controller | None = None  # built once the store is open; the server serves after that
    leader: LeaderElector | None = None
    if ingest is None and settings.ingest_token_file is not None:
        from .ingest import IngestEndpoint, load_token

        try:
            token = load_token(settings.ingest_token_file)
        except ValueError as exc:
            raise ControllerConfigError(f"ingest token file {settings.ingest_token_file}: {exc}") from None

        def known_model(namespace: str, model: str) -> bool:
            if controller is None:  # the HTTP server answers before the store is open
                from .ingest import ModelsNotLoadedError

                raise ModelsNotLoadedError("this replica is starting (opening the event store); retry")
            return controller.model_known(namespace, model)

        ingest = IngestEndpoint(
            token,
            lambda *a, **k: controller.ingest_append(*a, **k),  # type: ignore[union-attr]
            known_model,
            lambda: controller.signal.set(),  # type: ignore[union-attr]
            settings,
            lambda: datetime.now(timezone.utc),
            scope=settings.namespace,
        )
    metrics = Metrics()
    try:
        server = make_server(
            settings.metrics_address,
            metrics.registry,
            ready=lambda: _ready(controller, leader),
            health=lambda: controller.liveness(),  # type: ignore[union-attr]
            ingest=ingest,
            tls_cert=settings.tls_cert_file,
            tls_key=settings.tls_key_file,
        )
    except (OSError, ValueError, OverflowError) as exc:  # ssl.SSLError is an OSError
        raise ControllerConfigError(f"HTTP server on {settings.metrics_address}: {exc}") from None
    store = None
    try:
        if settings.leader_elect:  # off unless asked for (controller-runtime's convention); on in the Deployment
            leader = LeaderElector(
                api,
                name=settings.lease_name,
                namespace=settings.lease_namespace,
                identity=identity,
                duration=settings.lease_duration_seconds,
                renew=settings.lease_renew_seconds,
            )
            _lease_namespace_exists(leader.check_namespace)
        else:
            other = led_elsewhere(
                api, settings.lease_name, settings.lease_namespace, datetime.now(timezone.utc),
                settings.lease_duration_seconds, settings.api_timeout_seconds,
            )
            if other is not None:
                log.warning(
                    f"leader election is off, but {other} holds the leader Lease "
                    f"{settings.lease_namespace}/{settings.lease_name}: another controller is running, and both will "
                    "admit and cancel backfill Jobs; stop one, or run this one with --leader-elect"
                )
        if leader is not None:
            metrics.follow_leadership(leader.is_leader, lambda: leader.foreign_log is not None)
        else:
            metrics.follow_leadership(lambda: True)
        if migrate is not None:
            migrate()
        # The one factory of the store (a trial: building it here as well had left
        # BACKFILL_EVENT_PARTITION_SIZE unapplied: partitions stayed at the default size).
        store = open_store(settings, schema)
        if store.note:
            log.info(store.note)
        if leader is not None:
            try:  # written into the Lease: replicas on separate stores are told apart
                leader.log_identity = store.events.log_identity()
            except Exception as exc:  # noqa: BLE001 - the start-up refold reports a store that is away
                log.warning(f"reading the event log's id failed ({error_line(exc)}): replicas on separate stores go unnoticed")
        controller = Controller(settings, api, store.events, store.runs, metrics, leader=leader, identity=identity)
    except BaseException:
        server.server_close()
        if store is not None:
            store.close()
        raise
    stop = stop if stop is not None else threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info(f"signal {signum}: stopping")
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    serve_in_thread(server)
    try:
        # The controller first refolds the log and starts its watchers and preemptor; only then
        # does it stand for leadership: a replica that took the Lease while still refolding (a
        # minute for millions of events without a snapshot) would cancel nothing meanwhile.
        controller.start()
        if leader is not None:
            _first_election_round(leader)
            leader.start()
        log.info(f"controller started as {identity}; HTTP on {settings.metrics_address}")
        frozen = False
        while not stop.wait(1.0):
            if not frozen and controller.synced:
                frozen = True
                n = freeze_heap()
                log.info(f"start-up heap frozen: {n} objects left out of the garbage collector's passes")
    finally:
        # The Lease first: this replica cancels as the leader until it is released, and a standby
        # takes over at once; the controller's stop then waits up to 5 s for its threads (a fault
        # trial: with PostgreSQL hung, the loop's join kept the Lease 5 s after SIGTERM while the
        # preemptor was already stopped, and a demand then waited 4-5 s for its cancel).
        if leader is not None:
            leader.stop()
        controller.stop()
        server.shutdown()
        server.server_close()
        store.close()
        log.info("controller stopped")
