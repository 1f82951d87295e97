"""/healthz and /readyz: 503 with one problem per line; the controller's liveness fails when its
reconcile loop or preemptor stops completing passes (a wedged process the kubelet must restart),
and its readiness names the store while a read has not answered."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from backfill.controller.http import make_server, serve_in_thread
from backfill.controller.loop import Controller
from backfill.controller.metrics import Metrics
from backfill.settings import Settings
from backfill.store.memory import MemoryBackend, MemoryEventStore, MemoryRunStore

from .conftest import wait_for


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_probe_bodies_list_the_problems():
    state = {"health": (True, []), "ready": (False, ["watcher model: stale", "store: appends fail"])}
    server = make_server("127.0.0.1:0", Metrics().registry, lambda: state["ready"], health=lambda: state["health"])
    serve_in_thread(server)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _get(base + "/readyz") == (503, "not ready\nwatcher model: stale\nstore: appends fail\n")
        assert _get(base + "/healthz") == (200, "ok\n")
        state["health"] = (False, ["reconcile loop: no pass for 300s"])
        assert _get(base + "/healthz") == (503, "unhealthy\nreconcile loop: no pass for 300s\n")
        state["ready"] = lambda: 1 / 0  # a check that raises is a failing probe, not a crash
        server_ready = make_server("127.0.0.1:0", Metrics().registry, lambda: 1 / 0)
        serve_in_thread(server_ready)
        try:
            code, body = _get(f"http://127.0.0.1:{server_ready.server_address[1]}/readyz")
            assert code == 503 and "ZeroDivisionError" in body
        finally:
            server_ready.shutdown()
            server_ready.server_close()
    finally:
        server.shutdown()
        server.server_close()


def test_liveness_fails_when_the_loop_stops_passing_and_readiness_names_a_stalled_read():
    backend = MemoryBackend()
    settings = Settings(health_stale_seconds=30, store_stall_seconds=3)
    c = Controller(settings, client.ApiClient(), MemoryEventStore(backend), MemoryRunStore(backend), Metrics())
    try:
        c._threads = [object()]  # as if started
        now = time.monotonic()
        c.last_pass = c.preemptor.last_pass = now
        assert c.liveness() == (True, [])
        c.last_pass = now - 31
        ok, problems = c.liveness()
        assert not ok and len(problems) == 1 and problems[0].startswith("reconcile loop: no pass for 3")
        c.last_pass, c.preemptor.last_pass = now, now - 40
        assert c.liveness()[1][0].startswith("preemptor: no pass for 4")
        c._reading_since = time.monotonic() - 5
        assert any(p.startswith("store: a read of the event log has not answered for 5") for p in c.readiness()[1])
        # waiting on the store is no wedge of the loop (/readyz says it): a restart would not
        # bring the store back, and the new process cancels nothing until it answers
        c.last_pass, c.preemptor.last_pass = now - 31, now
        c._store_since = now - 31
        assert c.liveness() == (True, [])
    finally:
        c.spool.stop(0.5)
        c.actor.close()


class _WedgeableReads:
    """The controller's event store, whose reads block while ``wedged`` is set (until ``release``)."""

    def __init__(self, inner) -> None:
        import threading

        self.inner = inner
        self.wedged, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def read_payloads(self, *args, **kwargs):
        if self.wedged.is_set():
            self.release.wait(60)
        return self.inner.read_payloads(*args, **kwargs)


@pytest.mark.kube
@pytest.mark.db
def test_healthz_stays_ok_while_the_loop_waits_on_a_hung_store_and_readyz_says_so(start_controller, kube):
    """End to end on a running controller (real watchers, PostgreSQL, the HTTP server wired as
    ``backfill controller`` wires it). A fault trial: with PostgreSQL hung for 121 s /healthz
    went 503 ("reconcile loop: no pass"), and the Deployment's liveness probe would have
    restarted a replica that still cancelled in 0.4 s; the restarted one could not start (its
    migration needs the store) and a demand then left the Job running. While the loop waits on
    the store /healthz stays 200 and /readyz 503 names the stalled read; both are 200 again
    when it answers, and the loop passes again."""
    stores: list[_WedgeableReads] = []

    def wrap(events):
        stores.append(_WedgeableReads(events))
        return stores[0]

    c = start_controller(wrap_events=wrap, health_stale_seconds=4, store_stall_seconds=1)
    server = make_server("127.0.0.1:0", Metrics().registry, c.readiness, health=c.liveness)
    serve_in_thread(server)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        wait_for(lambda: _get(base + "/readyz")[0] == 200, timeout=20, what="/readyz 200")
        stores[0].wedged.set()
        c.signal.set()  # the next pass starts now and hangs in its read
        code, body = wait_for(lambda: (r := _get(base + "/readyz"))[0] == 503 and r, timeout=20, interval=0.2,
                              what="/readyz names the stalled read")  # fmt: skip
        assert "store: a read of the event log has not answered for" in body, body
        wedged_at = c.last_pass
        time.sleep(6)  # past the liveness limit, the loop still in its read
        assert c.last_pass == wedged_at and time.monotonic() - c.last_pass > 4
        assert _get(base + "/healthz") == (200, "ok\n")
        stores[0].wedged.clear()
        stores[0].release.set()
        wait_for(lambda: c.last_pass > wedged_at, timeout=10, interval=0.2, what="the loop passes again")
        wait_for(lambda: _get(base + "/readyz")[0] == 200, timeout=10, interval=0.2, what="/readyz 200 again")
        assert _get(base + "/healthz") == (200, "ok\n")
    finally:
        stores[0].wedged.clear()
        stores[0].release.set()
        server.shutdown()
        server.server_close()
