"""Jobs are listed after the foreground signals (the crash-during-cancellation flake, CI stop 14).

After a restart, a Job that was deleted while nobody watched is reported by the Job relist as
``JobDeleted``; the demand that preempted it reaches the log through the Model relist. The
projector judges a vanished Job by the demand it has already folded, so when the Job list landed
first the run ended ``cancelled``/``JobDeleted`` instead of ``preempted``. The first Job list now
waits (bounded) until the Model, GamingSession and GPULease lists are in the spool's order.
"""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

from backfill.controller.kinds import KINDS
from backfill.controller.translate import Translator
from backfill.controller.watchers import Watcher
from backfill.settings import Settings

from .test_relist_race import NOW, NS

BY_NAME = {k.name: k for k in KINDS}


def _watcher(kind_name: str, list_call, order: list, *, after=(), settings=None, stop=None) -> Watcher:
    kind = BY_NAME[kind_name]
    return Watcher(
        kind, None, namespace=NS, translate=kind.translate(Translator()), known=lambda: [],
        observe=lambda pairs: order.append(kind_name) or [], clock=lambda: NOW,
        settings=settings or Settings(), stop=stop or threading.Event(), list_call=list_call, after=after,
    )  # fmt: skip


def _listing(kind_name: str, order: list, release: threading.Event | None = None):
    def list_call(**kw):
        if kw.get("watch"):  # the watch after the list: park until the test ends
            time.sleep(5)
            raise RuntimeError("parked")
        if release is not None:
            release.wait(5)
        order.append(f"list {kind_name}")
        item = {"metadata": {"namespace": NS, "name": "x", "uid": "u", "resourceVersion": "1"}}
        return SimpleNamespace(data=json.dumps({"items": [item], "metadata": {"resourceVersion": "1"}}))

    return list_call


def test_the_job_kind_lists_after_every_foreground_signal():
    assert set(BY_NAME["job"].lists_after) == {"model", "gamingsession", "gpulease", "backfill"}
    names = [k.name for k in KINDS]
    assert all(names.index(k) < names.index("job") for k in BY_NAME["job"].lists_after), "start order"


def test_first_job_list_waits_until_the_model_list_is_observed():
    order: list = []
    release = threading.Event()
    stop = threading.Event()
    model = _watcher("model", _listing("model", order, release), order, stop=stop)
    job = _watcher("job", _listing("job", order), order, after=[model.listed], stop=stop)
    job.start()
    model.start()
    time.sleep(0.3)
    assert order == [], "the Job list went out before the Model list was in"
    release.set()
    deadline = time.monotonic() + 5
    while "list job" not in order and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    assert order[:2] == ["list model", "model"] and "list job" in order
    assert order.index("model") < order.index("list job")


def test_a_kind_that_never_lists_delays_the_job_list_once_and_boundedly():
    order: list = []
    never = threading.Event()
    stop = threading.Event()
    settings = Settings(api_timeout_seconds=0.5)
    job = _watcher("job", _listing("job", order), order, after=[never], settings=settings, stop=stop)
    t0 = time.monotonic()
    job.start()
    deadline = t0 + 5
    while "list job" not in order and time.monotonic() < deadline:
        time.sleep(0.01)
    waited = time.monotonic() - t0
    stop.set()
    assert "list job" in order, "the Job watcher waited for ever on a kind that never listed"
    assert waited >= 0.5
