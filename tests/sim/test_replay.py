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


def _checked(err: str) -> int:
    import re

    m = re.search(r"checked (\d+) decisions", err)
    assert m, err
    return int(m.group(1))


def test_replay_since_until_check_and_count_only_the_decisions_inside_the_window(pg_url, capsys):
    """--since/--until narrowed only the printed trail: every window reported every decision
    checked, and the forged one failed a window that does not hold it."""
    from datetime import timedelta

    from backfill.core.timefmt import rfc3339

    _, forged, pos = _tampered()
    reset(pg_url, "replay_window")
    store = EventStore(make_engine(pg_url, "replay_window"))
    store.append([encode(e, k) for _, e, k in forged])
    store.close()
    at = {p: e.at for p, e, _ in forged}
    decisions = [p for p, e, _ in forged if isinstance(e, ev.DECISIONS)]
    assert len(decisions) >= 3 and decisions[0] < pos  # decisions before the forged one, to leave out
    after = at[pos] + timedelta(microseconds=1)
    base = ["replay", "--database-url", pg_url, "--schema", "replay_window", "--limit", "0"]

    # a window after the forged decision: exit 0, and only the decisions at or after it counted
    assert main(base + ["--since", rfc3339(after)]) == 0
    assert _checked(capsys.readouterr().err) == sum(at[p] >= after for p in decisions)
    # a window before it (until = its time): the decisions before it, no divergence
    assert main(base + ["--until", rfc3339(at[pos])]) == 0
    assert _checked(capsys.readouterr().err) == sum(at[p] < at[pos] for p in decisions) > 0
    # a window holding it: the divergence, and the decisions of the window only
    assert main(base + ["--since", rfc3339(at[pos]), "--until", rfc3339(after)]) == 1
    captured = capsys.readouterr().err
    assert f"backfill: divergence at position {pos}:" in captured
    assert _checked(captured) == sum(at[pos] <= at[p] < after for p in decisions) >= 1
    # an empty window checks nothing
    assert main(base + ["--since", rfc3339(at[pos]), "--until", rfc3339(at[pos])]) == 0
    assert _checked(capsys.readouterr().err) == 0
    # the whole log: every decision
    assert main(base) == 1
    assert _checked(capsys.readouterr().err) == len(decisions)


def test_replay_since_later_than_until_is_one_line(pg_url, capsys):
    args = ["replay", "--database-url", pg_url, "--schema", "replay_window", "--since", "2026-02-01", "--until", "2026-01-01"]
    assert main(args) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == ["backfill: error: --since 2026-02-01T00:00:00Z is later than --until 2026-01-01T00:00:00Z"]


def test_replay_of_a_backfill_not_in_the_log_is_one_line(pg_url, capsys):
    """It printed an empty trail and 'no divergence' (exit 0), where ``recommend`` says the name
    is not in the log (exit 2)."""
    result, _, _ = _tampered()
    reset(pg_url, "replay_names")
    store = EventStore(make_engine(pg_url, "replay_names"))
    store.append([encode(e, k) for _, e, k in result.events])
    store.close()
    (name,) = {e.name for _, e, _ in result.events if isinstance(e, ev.BackfillApplied)}
    base = ["replay", "--database-url", pg_url, "--schema", "replay_names", "--limit", "0"]
    assert main(base + ["--backfill", f"sim/{name}"]) == 0
    assert "no divergence" in capsys.readouterr().out
    assert main(base + ["--backfill", "sim/nope"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[-1] == (
        "backfill: error: --backfill: ModelBackfill sim/nope is not in the log of schema replay_names "
        "(no decision of it, and it is not in the projection)"
    )
    # a bare name, as `backfill runs --backfill NAME` takes it (a new user's trial: refused here):
    # the same decisions as with its namespace
    decisions = sum(1 for _, e, _ in result.events if isinstance(e, (ev.AttemptAdmitted, ev.AttemptCancelled)) and e.backfill == name)
    assert decisions > 0
    for ref in (f"sim/{name}", name):
        assert main(base + ["--backfill", ref]) == 0
        assert f"checked {decisions} decisions" in " ".join(capsys.readouterr().err.split()), ref
    assert main(base + ["--backfill", "nope"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[-1].startswith("backfill: error: --backfill: ModelBackfill nope (in any namespace) is not in the log")


def test_replay_cli_counts_a_deposed_leaders_late_cancel_as_superseded_and_marks_it(pg_url, capsys):
    """A trial: ``backfill replay`` said divergence and exited 1 on such a cancel; then (after
    the auditor learnt it) its trail showed two identical cancel rows with no attempt."""
    from ..core.test_decision_basis import superseded_log

    log = superseded_log()
    reset(pg_url, "replay_superseded")
    store = EventStore(make_engine(pg_url, "replay_superseded"))
    store.append([encode(e, e.natural_key() or f"test/{p}") for p, e in log.events])
    store.close()
    assert main(["replay", "--database-url", pg_url, "--schema", "replay_superseded", "--limit", "10"]) == 0
    captured = capsys.readouterr()
    assert "1 superseded" in captured.err and "at 9" in captured.err and _checked(captured.err) == 2, captured.err
    (row,) = [line for line in captured.out.splitlines() if "superseded" in line]
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert (cells[0], cells[3], cells[4], cells[5]) == ("9", "1", "cancel (superseded)", "ForegroundDemand"), row


def test_replay_names_every_divergent_position_and_marks_them_in_the_trail(pg_url, capsys):
    """A new user's trial: "(3 divergent decision(s) in all)" and no way to find the other two."""
    result, _, _ = _tampered()
    events = list(result.events)
    forged = [i for i, x in enumerate(events) if isinstance(x[1], ev.AttemptCancelled)][:2]
    for i in forged:
        p, e, k = events[i]
        events[i] = (p, e.model_copy(update={"reason": "GamingIntent"}), k)
    positions = [events[i][0] for i in forged]
    reset(pg_url, "replay_two")
    store = EventStore(make_engine(pg_url, "replay_two"))
    store.append([encode(e, k) for _, e, k in events])
    store.close()
    width = ["--limit", str(len(events))]
    assert main(["replay", "--database-url", pg_url, "--schema", "replay_two", *width]) == 1
    captured = capsys.readouterr()
    assert f"(2 divergent decision(s) in all, at positions {positions[0]}, {positions[1]};" in captured.err, captured.err
    marked = [line for line in captured.out.splitlines() if "DIVERGENT" in line]
    assert len(marked) == 2 and all(str(p) in line for p, line in zip(positions, marked)), marked
