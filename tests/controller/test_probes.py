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
def test_healthz_fails_while_the_running_loop_is_really_wedged(start_controller):
    """End to end on a running controller (real watchers, PostgreSQL, the HTTP server wired as
    ``backfill controller`` wires it): /healthz is 200 while the loop passes, 503 naming the
    reconcile loop once a read it makes hangs for longer than BACKFILL_HEALTH_STALE_SECONDS, and
    200 again when the read returns. An idle loop passes at least every 5 s, so a limit above
    that never fails a healthy controller."""
    stores: list[_WedgeableReads] = []

    def wrap(events):
        stores.append(_WedgeableReads(events))
        return stores[0]

    c = start_controller(wrap_events=wrap, health_stale_seconds=8)
    server = make_server("127.0.0.1:0", Metrics().registry, c.readiness, health=c.liveness)
    serve_in_thread(server)
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
    try:
        t_end = time.monotonic() + 9  # longer than the limit: an idle loop keeps passing
        while time.monotonic() < t_end:
            assert _get(url) == (200, "ok\n")
            time.sleep(0.5)
        stores[0].wedged.set()
        c.signal.set()  # the next pass starts now and hangs in its read
        code, body = wait_for(lambda: (r := _get(url))[0] == 503 and r, timeout=30, interval=0.2,
                              what="/healthz fails while the loop is wedged")
        assert body.startswith("unhealthy\nreconcile loop: no pass for "), body
        assert "preemptor" not in body  # the cancel path still passes: only the wedged part is named
        stores[0].wedged.clear()
        stores[0].release.set()
        wait_for(lambda: _get(url) == (200, "ok\n"), timeout=10, interval=0.2, what="/healthz 200 again")
    finally:
        stores[0].wedged.clear()
        stores[0].release.set()
        server.shutdown()
        server.server_close()
