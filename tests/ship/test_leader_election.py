"""Leader election against the real API server, through a TCP proxy the test can cut off.

The proxy's "down" mode is a black hole: it accepts connections and never answers, the way an
unreachable API server behind a dead load balancer looks. Without a client-side
``_request_timeout`` on every Lease call the election thread would hang there for ever.
"""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlparse

import pytest
from kubernetes import client

from backfill.controller.leader import LeaderElector, LeaseNamespaceMissing
from tests.controller.conftest import wait_for

pytestmark = pytest.mark.kube


class BlackholeProxy:
    """A TCP relay to ``target``; ``down()`` cuts every connection and swallows new ones."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = True
        self._conns: list[socket.socket] = []
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                if not self.up:
                    self._held.append(conn)  # accepted, never answered
                    continue
                upstream = socket.create_connection(self.target)
                self._conns += [conn, upstream]
            threading.Thread(target=self._pipe, args=(conn, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, conn), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def down(self) -> None:
        with self._lock:
            self.up = False
            for s in self._conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._conns.clear()

    def restore(self) -> None:
        with self._lock:
            self.up = True  # the held connections stay silent: only a client timeout frees them

    def close(self) -> None:
        self.listener.close()
        self.down()
        for s in self._held:
            s.close()


@pytest.fixture
def proxy(kube_cluster):
    url = urlparse(kube_cluster.host)
    p = BlackholeProxy(url.hostname, url.port)
    yield p
    p.close()


def _api_via(kube_cluster, port: int) -> client.ApiClient:
    cfg = kube_cluster.configuration()
    cfg.host = f"https://127.0.0.1:{port}"  # the serving certificate names 127.0.0.1
    return client.ApiClient(cfg)


def _lease(kube_api, ns: str, name: str):
    return client.CoordinationV1Api(kube_api).read_namespaced_lease(name, ns)


def test_a_leader_cut_off_from_the_apiserver_takes_its_lease_back_at_once(kube_cluster, kube_api, kube_namespace, proxy):
    api = _api_via(kube_cluster, proxy.port)
    a = LeaderElector(api, name="cutoff", namespace=kube_namespace, identity="a", duration=10, renew=5,
                      request_timeout=0.5)
    assert a.retry == 1.0 and a.next_wait() == 1.0  # not leading: retry quickly
    a.start()
    try:
        wait_for(a.is_leader, timeout=5, what="a leads")
        assert a.next_wait() == 5  # leading: renew period
        proxy.down()
        # The local renew deadline (5 s after the last renew) passes: a stops acting on its own.
        wait_for(lambda: not a.is_leader(), timeout=10, what="a's lease lapses while the apiserver is unreachable")
        # The calls into the black hole end at the client-side timeout (no timeout: hung for ever).
        wait_for(lambda: not a.healthy, timeout=5, what="a round fails at the request timeout")
        assert not a.is_leader()
        proxy.restore()
        t_up = time.monotonic()
        wait_for(a.is_leader, timeout=10, interval=0.02, what="a takes its lease back")
        took = time.monotonic() - t_up
        # Retried every 1 s (plus a round trip), not every renew period (5 s).
        assert took < a.renew - 1, f"took {took:.2f}s, the renew period is {a.renew}s"
        lease = _lease(kube_api, kube_namespace, "cutoff")
        assert lease.spec.holder_identity == "a" and (lease.spec.lease_transitions or 0) == 0
    finally:
        a.stop()
        api.close()


def test_a_graceful_stop_hands_the_lease_over_at_once(kube_api, kube_namespace):
    a = LeaderElector(kube_api, name="handover", namespace=kube_namespace, identity="a", duration=15, renew=5)
    b = LeaderElector(kube_api, name="handover", namespace=kube_namespace, identity="b", duration=15, renew=5)
    a.start()
    wait_for(a.is_leader, timeout=5, what="a leads")
    assert b.try_acquire() is False  # held for 15 s unless released
    t0 = time.monotonic()
    a.stop()
    stop_seconds = time.monotonic() - t0
    assert not a.is_leader()
    released = _lease(kube_api, kube_namespace, "handover")
    assert not released.spec.holder_identity and released.spec.lease_duration_seconds == 1
    assert b.try_acquire() is True and b.is_leader()  # the first attempt, well under the 15 s duration
    lease = _lease(kube_api, kube_namespace, "handover")
    assert lease.spec.holder_identity == "b" and lease.spec.lease_transitions == 1
    assert stop_seconds < 3 * a.request_timeout + 0.5  # the bound the Deployment's grace period relies on


def test_a_missing_lease_namespace_is_its_own_error(kube_api):
    a = LeaderElector(kube_api, name="x", namespace="no-such-namespace-5b1e", identity="a", duration=15, renew=5)
    with pytest.raises(LeaseNamespaceMissing) as info:
        a.try_acquire()
    assert info.value.namespace == "no-such-namespace-5b1e"
