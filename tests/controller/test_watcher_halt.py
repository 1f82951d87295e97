"""A halted watcher stops at once wherever it is (CI stop 15: ``watch-backfill`` outlived stop()).

The halt used to find the open watch response through ``Watch._resp``, which the client sets only
after the request returns: a halt that came while the watch request was in flight found nothing to
shut down, and the thread then read the stream until the server ended the watch (the watch
timeout), longer than stop()'s budget. The two bounded waits of a relist (for the kinds it lists
after, for the spool to commit the list) did not look at the stop either.
"""

from __future__ import annotations

import threading

from backfill.controller.translate import Translator
from backfill.controller.watchers import Watcher
from backfill.settings import Settings

from .test_list_order import BY_NAME, _listing
from .test_relist_race import NOW, NS


class _BlockingResponse:
    """A watch response whose stream yields nothing until it is shut down (a quiet watch)."""

    status = 200

    def __init__(self) -> None:
        self.shut = threading.Event()

    def stream(self, amt=None, decode_content=False):
        self.shut.wait(30)  # the server would end the watch only after its timeout
        return iter(())

    def shutdown(self) -> None:
        self.shut.set()

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def _watcher(list_call, *, committed=lambda entries, timeout: True, after=(), settings=None) -> Watcher:
    kind = BY_NAME["backfill"]
    return Watcher(
        kind, None, namespace=NS, translate=kind.translate(Translator()),
        known=lambda: [], observe=lambda pairs: [object()] * len(pairs), clock=lambda: NOW,
        settings=settings or Settings(api_timeout_seconds=30, watch_timeout_seconds=30),
        stop=threading.Event(), list_call=list_call, after=after, committed=committed,
    )  # fmt: skip


def test_a_halt_while_the_watch_request_is_in_flight_shuts_the_response_down():
    in_flight, halted = threading.Event(), threading.Event()
    resp = _BlockingResponse()
    listing = _listing("backfill", [])

    def list_call(**kw):
        if not kw.get("watch"):
            return listing(**kw)
        in_flight.set()
        halted.wait(5)  # the halt lands before the response exists
        return resp

    w = _watcher(list_call)
    w.start()
    assert in_flight.wait(5), "the watch request never went out"
    w.halt()
    halted.set()
    w.join(5)
    assert resp.shut.is_set(), "the response that came after the halt was not shut down"
    assert not w.is_alive()


def test_a_halt_while_a_watch_is_open_shuts_it_down():
    resp = _BlockingResponse()
    listing = _listing("backfill", [])
    opened = threading.Event()

    def list_call(**kw):
        if not kw.get("watch"):
            return listing(**kw)
        opened.set()
        return resp

    w = _watcher(list_call)
    w.start()
    assert opened.wait(5)
    w.halt()
    w.join(5)
    assert resp.shut.is_set() and not w.is_alive()


def test_a_halt_while_waiting_for_an_earlier_kind_or_for_the_commit_ends_the_wait():
    never = threading.Event()
    calls: list = []
    waiting = _watcher(lambda **kw: calls.append(kw) or _listing("backfill", [])(**kw), after=[never])
    waiting.start()
    waiting.halt()
    waiting.join(5)
    assert not waiting.is_alive() and calls == [], "it listed after the halt, or kept waiting"

    asked = threading.Event()

    def committed(entries, timeout):  # the store never answers
        asked.set()
        return False

    committing = _watcher(_listing("backfill", []), committed=committed)
    committing.start()
    assert asked.wait(5), "the relist did not wait for its commit"
    committing.halt()
    committing.join(5)
    assert not committing.is_alive(), "the wait for the commit ignored the halt"
