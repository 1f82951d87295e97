"""Leader election on a ``coordination.k8s.io/v1`` Lease.

The holder renews every ``lease_renew_seconds``; another candidate takes the Lease over only
when ``renewTime + leaseDurationSeconds`` has passed. :meth:`LeaderElector.is_leader` is true
until the local renew deadline (the start of the last successful renew plus
``lease_duration - lease_renew``), so a leader that cannot renew stops acting before anyone
else may take over.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("backfill.controller.leader")


def _micro(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquire and renew a Lease in a background thread; ``is_leader()`` for the actor."""

    def __init__(
        self,
        api: Any,
        *,
        name: str,
        namespace: str,
        identity: str,
        duration: float,
        renew: float,
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        self.api = api
        self.coord = client.CoordinationV1Api(api)
        self.name, self.namespace, self.identity = name, namespace, identity
        self.duration, self.renew = duration, renew
        self.clock = clock
        self._deadline = 0.0
        self.healthy = False  # the last attempt reached the API server
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        """True while the lease is held and its local renew deadline has not passed."""
        return time.monotonic() < self._deadline

    def try_acquire(self) -> bool:
        """One acquire-or-renew round; returns whether this candidate holds the lease now."""
        t0 = time.monotonic()
        now = self.clock()
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, now, 0),
            }
            try:
                self.coord.create_namespaced_lease(self.namespace, body)
            except ApiException as exc2:
                if exc2.status == 409:
                    return False
                raise
            return self._won(t0)
        spec = lease.spec
        holder = spec.holder_identity or ""
        renewed = spec.renew_time or spec.acquire_time
        duration = spec.lease_duration_seconds or self.duration
        if holder and holder != self.identity and renewed is not None:
            if renewed.tzinfo is None:
                renewed = renewed.replace(tzinfo=timezone.utc)
            if renewed + timedelta(seconds=duration) > now:
                self._deadline = 0.0
                return False
        transitions = spec.lease_transitions or 0
        acquired = spec.acquire_time if holder == self.identity and spec.acquire_time else now
        if holder != self.identity:
            transitions += 1
        body = self.api.sanitize_for_serialization(lease)
        body["spec"] = self._spec(acquired, now, transitions)
        try:
            self.coord.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                self._deadline = 0.0
                return False
            raise
        return self._won(t0)

    def _spec(self, acquired: datetime, now: datetime, transitions: int) -> dict:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, int(round(self.duration))),
            "acquireTime": _micro(acquired),
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }

    def _won(self, t0: float) -> bool:
        was = self.is_leader()
        self._deadline = t0 + max(self.renew, self.duration - self.renew)
        if not was:
            log.info(f"acquired leader lease {self.namespace}/{self.name} as {self.identity}")
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire()
                self.healthy = True
            except Exception as exc:  # noqa: BLE001 - keep trying; is_leader() expires on its own
                self.healthy = False
                log.warning(f"leader election: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            self._stop.wait(self.renew)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """Stop renewing; when holding the lease, release it so a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if release and self.is_leader():
            self._deadline = 0.0
            try:
                lease = self.coord.read_namespaced_lease(self.name, self.namespace)
                if lease.spec.holder_identity == self.identity:
                    body = self.api.sanitize_for_serialization(lease)
                    body["spec"]["holderIdentity"] = None
                    self.coord.replace_namespaced_lease(self.name, self.namespace, body)
            except Exception as exc:  # noqa: BLE001
                log.warning(f"leader election: release failed: {exc}")
