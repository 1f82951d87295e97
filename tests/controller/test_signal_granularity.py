"""A coarse lastActiveTime gets its granularity added to the idle window (issue 13 item 6).

The proxy writes ``Model.status.lastActiveTime`` at most about once a minute, so the real last
request can be up to a minute after the value seen; the idle window must start at
``lastActiveTime + granularity`` (default 60 s). Ingest reports are exact and are not padded.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from backfill.controller.translate import MODIFIED, Translator
from backfill.core import events as ev
from backfill.core.commands import Admit
from backfill.core.projector import decide, fold
from backfill.core.state import World
from backfill.settings import Settings

T = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)
NS = "ns"
TEMPLATE = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}


def _model(last_active: datetime) -> dict:
    return {
        "metadata": {"namespace": NS, "name": "m", "uid": "mu", "resourceVersion": "2"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "n1"}},
        "status": {"phase": "Ready", "lastActiveTime": last_active.strftime("%Y-%m-%dT%H:%M:%SZ")},
    }


def _world(foreground: list) -> World:
    w = World()
    setup = [
        ev.ModelReady(at=T - timedelta(hours=1), namespace=NS, model="m", node="n1"),
        ev.CronJobSeen(at=T - timedelta(hours=1), namespace=NS, name="cj", job_template=TEMPLATE),
        ev.BackfillApplied(
            at=T - timedelta(hours=1), namespace=NS, name="b", uid="u", generation=1,
            spec={"modelRef": "m", "templateRef": "cj", "idleFor": "10m"},
        ),
    ]
    for pos, e in enumerate(setup + foreground, 1):
        w = fold(w, e, pos)
    return w


def _admitted(world: World, seconds_after_t: float) -> bool:
    return any(isinstance(c, Admit) for c in decide(world, T + timedelta(seconds=seconds_after_t)))


def test_the_default_granularity_is_a_documented_60_seconds():
    assert Settings().foreground_signal_granularity_seconds == 60.0
    field = Settings.model_fields["foreground_signal_granularity_seconds"]
    assert "lastActiveTime" in (field.description or "")


def test_last_active_time_is_busy_for_the_granularity():
    (request,) = [e for e, _ in Translator(signal_granularity=60).model(MODIFIED, _model(T), T) if isinstance(e, ev.ForegroundRequest)]
    assert (request.at, request.busy_until, request.source) == (T, T + timedelta(seconds=60), "lastActiveTime")


def test_an_idle_window_from_last_active_time_starts_a_granularity_later():
    (request,) = [e for e, _ in Translator(signal_granularity=60).model(MODIFIED, _model(T), T) if isinstance(e, ev.ForegroundRequest)]
    world = _world([request])
    assert not _admitted(world, 600)  # lastActiveTime + idleFor: the real last request may be later
    assert not _admitted(world, 659)
    assert _admitted(world, 660)  # lastActiveTime + granularity + idleFor


def test_a_granularity_of_zero_keeps_the_bare_value():
    (request,) = [e for e, _ in Translator(signal_granularity=0).model(MODIFIED, _model(T), T) if isinstance(e, ev.ForegroundRequest)]
    assert request.busy_until is None
    assert _admitted(_world([request]), 600)


def test_an_ingest_report_is_not_padded():
    report = ev.ForegroundRequest(at=T, namespace=NS, model="m", source="ingest")
    assert _admitted(_world([report]), 600)
