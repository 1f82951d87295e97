"""``backfill replay`` finds a recorded decision the projector would not make, and names it."""

from __future__ import annotations

from backfill.cli import main
from backfill.core import events as ev
from backfill.core.audit import Auditor
from backfill.core.events import encode
from backfill.sim.cluster import SimParams, simulate
from backfill.sim.traces import Trace
from backfill.store import EventStore, make_engine, reset

# two busy spans an hour apart, then a request 20 minutes after the second idle window opened
TRACE = Trace("tiny", {"m": [(0.0, 10.0), (4000.0, 0.0), (4000.0 + 1800 + 600, 0.0), (20000.0, 0.0)]})
PARAMS = SimParams(idle_for=1800, job=3600, max_run=7200, repeat_after=0)


def _tampered():
    result = simulate(TRACE, PARAMS)
    events = list(result.events)
    idx, (pos, cancel, key) = next((i, x) for i, x in enumerate(events) if isinstance(x[1], ev.AttemptCancelled))
    events[idx] = (pos, cancel.model_copy(update={"reason": "GamingIntent"}), key)
    return result, events, pos


def test_auditor_accepts_the_simulation_and_rejects_a_forged_reason():
    result, forged, pos = _tampered()
    clean = Auditor()
    for p, e, _ in result.events:
        clean.feed(p, e)
    assert clean.divergences == [] and clean.checked == sum(isinstance(e, ev.DECISIONS) for _, e, _ in result.events)
    bad = Auditor()
    for p, e, _ in forged:
        bad.feed(p, e)
    assert [d.position for d in bad.divergences] == [pos]
    assert "GamingIntent" in bad.divergences[0].recorded and "ForegroundDemand" in bad.divergences[0].derived


def test_replay_cli_exits_1_naming_the_first_divergent_position(pg_url, capsys):
    _, forged, pos = _tampered()
    reset(pg_url, "replay_forged")
    store = EventStore(make_engine(pg_url, "replay_forged"))
    store.append([encode(e, k) for _, e, k in forged])
    store.close()
    assert main(["replay", "--database-url", pg_url, "--schema", "replay_forged", "--limit", "5"]) == 1
    captured = capsys.readouterr()
    assert f"backfill: divergence at position {pos}:" in captured.err
    assert "cancel" in captured.out and "ForegroundRequest" in captured.out  # the trail names the cause
