"""How a watcher continues after a watch ends (issue 9, watch faults), with the interleaving
scripted: the kube-apiserver built for the tests answers an expired resourceVersion only inside
the stream (``tests/faults/test_apiserver_faults.py`` covers that end to end), so the HTTP 410 on
the watch *call* and the exact resourceVersions passed are checked here, against the client
library's own ``Watch.stream``.

- a watch the server ends cleanly is watched again from the last resourceVersion it delivered,
  without a relist (client-go's reflector does the same);
- a 410 Gone on the watch call (and an ``ERROR`` 410 event in the stream) makes it relist, then
  watch from the new list's resourceVersion.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

from kubernetes.client.exceptions import ApiException

from backfill.controller.translate import Translator
from backfill.controller.watchers import Watcher
from backfill.settings import Settings

from .test_list_order import BY_NAME
from .test_relist_race import NOW, NS


def _model(rv: str, last_active: str) -> dict:
    return {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "Model",
        "metadata": {"namespace": NS, "name": "m1", "uid": "u-m1", "resourceVersion": rv},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "n1"}},
        "status": {"phase": "Ready", "lastActiveTime": last_active},
    }  # fmt: skip


class _Stream:
    """A watch response: the given events as JSON lines, then a clean end of the stream."""

    status = 200

    def __init__(self, events: list[dict]) -> None:
        self._lines = [(json.dumps(e) + "\n").encode() for e in events]

    def stream(self, amt=None, decode_content=False):
        return iter(self._lines)

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass

    shutdown = close


def _run(script: list, settings: Settings | None = None) -> tuple[list, list]:
    """Run a model watcher over ``script`` (one entry per call: a list body, a watch's events, or
    an exception to raise); returns the calls made (``("list"|"watch", resourceVersion)``) and
    the observed events' types and times."""
    calls: list = []
    observed: list = []
    stop = threading.Event()

    def list_call(**kw):
        calls.append(("watch" if kw.get("watch") else "list", kw.get("resource_version")))
        if not script:
            stop.set()
            return _Stream([])
        step = script.pop(0)
        if isinstance(step, Exception):
            raise step
        if kw.get("watch"):
            return _Stream(step)
        return SimpleNamespace(data=json.dumps(step))

    kind = BY_NAME["model"]
    w = Watcher(
        kind, None, namespace=NS, translate=kind.translate(Translator()), known=lambda: [],
        observe=lambda pairs: observed.extend((type(e).__name__, getattr(e, "at", None)) for e, _ in pairs) or [],
        clock=lambda: NOW, settings=settings or Settings(backoff_initial_seconds=0.01, backoff_max_seconds=0.01),
        stop=stop, list_call=list_call,
    )  # fmt: skip
    w.start()
    w.join(5)
    assert not w.is_alive(), f"the watcher did not finish its script: {calls}"
    return calls, observed


def test_a_clean_end_is_watched_again_from_the_last_resource_version_without_a_relist():
    calls, observed = _run([
        {"items": [_model("4", "2026-12-01T11:00:00Z")], "metadata": {"resourceVersion": "5"}},
        [{"type": "MODIFIED", "object": _model("6", "2026-12-01T11:30:00Z")}],  # then the server ends it
        [{"type": "BOOKMARK", "object": {"kind": "Model", "metadata": {"resourceVersion": "8"}}}],
        [],
    ])  # fmt: skip
    assert calls[:4] == [("list", None), ("watch", "5"), ("watch", "6"), ("watch", "8")]
    assert ("list", None) not in calls[1:], "a clean end of a watch made it relist"
    demands = [at.isoformat() for t, at in observed if t == "ForegroundRequest"]
    assert demands == ["2026-12-01T11:00:00+00:00", "2026-12-01T11:30:00+00:00"]


def test_a_410_on_the_watch_call_or_in_the_stream_relists_then_watches_from_the_new_list(caplog):
    calls, observed = _run([
        {"items": [_model("4", "2026-12-01T11:00:00Z")], "metadata": {"resourceVersion": "5"}},
        ApiException(status=410, reason="Gone"),  # the watch call itself answers 410
        {"items": [_model("9", "2026-12-01T11:40:00Z")], "metadata": {"resourceVersion": "10"}},
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version: 10 (12)"}}],
        {"items": [_model("9", "2026-12-01T11:40:00Z")], "metadata": {"resourceVersion": "13"}},
        [],
    ])  # fmt: skip
    assert calls[:6] == [("list", None), ("watch", "5"), ("list", None), ("watch", "10"), ("list", None), ("watch", "13")]
    failed = [r.getMessage() for r in caplog.records if "watch failed" in r.getMessage()]
    assert failed == [], f"an expired resourceVersion was taken for a broken watch: {failed}"
    demands = [at.isoformat() for t, at in observed if t == "ForegroundRequest"]
    # each relist re-observes the Model: the lastActiveTime that moved is demand, the same one
    # listed again is not (the translator only takes a time moving forward)
    assert demands == ["2026-12-01T11:00:00+00:00", "2026-12-01T11:40:00+00:00"]


def test_the_back_off_of_a_missing_crd_does_not_carry_over_once_it_exists(caplog):
    # a new user's trial: the controller started before the CRDs; the 404s backed off to 16 s,
    # and when the CRD appeared the 429 of its warming watch cache waited the 30 s cap
    import re

    not_found, too_many = ApiException(status=404, reason="Not Found"), ApiException(status=429, reason="Too Many Requests")
    settings = Settings(backoff_initial_seconds=0.1, backoff_max_seconds=2.0)
    calls, _ = _run([not_found, not_found, not_found, too_many, too_many, not_found, too_many,
                     {"items": [], "metadata": {"resourceVersion": "5"}}, []], settings)  # fmt: skip
    waits = [float(m.group(1)) for r in caplog.records if (m := re.search(r"watch failed: HTTP (?:404|429).*retrying in ([0-9.]+)s", r.getMessage()))]
    # 404s double; the first failure after them (the resource exists now) starts again; so does
    # one after another 404; a repeated 429 doubles
    assert waits == [0.1, 0.2, 0.4, 0.1, 0.2, 0.4, 0.1], waits
    assert calls[:9] == [("list", None)] * 8 + [("watch", "5")]  # seven failed lists, then one that answered
