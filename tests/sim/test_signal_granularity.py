"""``simulate --signal-granularity``: the padding of a coarse lastActiveTime delays every idle window."""

from __future__ import annotations

from backfill.sim.cluster import SimParams, simulate
from backfill.sim.traces import Trace

# One model: instantaneous requests at 0 s and 3600 s, one 1 s request at 10000 s, and a last one.
TRACE = Trace("t", {"m": [(0.0, 0.0), (3600.0, 0.0), (10000.0, 1.0), (20000.0, 0.0)]})


def _admissions(g: float) -> list[float]:
    params = SimParams(idle_for=1800, max_run=1800, repeat_after=60, job=900, signal_granularity=g)
    return [r.admitted_at.timestamp() for r in simulate(TRACE, params).runs]


def test_an_exact_signal_admits_at_idle_since_plus_idle_for():
    # after 0: 1800, then 2760 (success 2700 + 60), 3600 wins; after 3600: 5400, 6360, 7320, ...
    admitted = _admissions(0)
    assert admitted[:2] == [1800.0, 2760.0] and 5400.0 in admitted and 10001.0 + 1800 in admitted


def test_every_idle_window_starts_a_granularity_later():
    admitted = _admissions(60)
    assert admitted[:2] == [1860.0, 2820.0] and 5460.0 in admitted and 10001.0 + 60 + 1800 in admitted
    assert 1800.0 not in admitted


def test_a_granularity_longer_than_the_gap_loses_the_window():
    assert all(t > 3600 for t in _admissions(1801))  # 1801 + 1800 > 3600: the first gap is lost


def test_simulate_prints_what_the_granularity_costs_against_an_exact_signal(capsys):
    # The CLI on the real Alibaba trace; both sides of the printed cost are checked against the
    # independent oracle (tests/sim/oracle.py), the padded side with every request 60 s longer.
    import re

    from backfill.cli import main

    from .oracle import oracle
    from .test_simulate import ALIBABA, _rows_for

    args = ["simulate", "--no-store", "--json", "--trace", str(ALIBABA), "--format", "alibaba-genai", "--model", "M0002",
            "--idle-for", "10m", "--job", "15m", "--repeat-after", "1m", "--signal-granularity", "60s"]
    assert main(args) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("signal granularity")]
    rows = _rows_for(ALIBABA, "M0002")
    padded = oracle([(t, d + 60) for t, d in rows], 600, 900, 60, 1800)
    exact = oracle(rows, 600, 900, 60, 1800)
    assert padded != exact  # the padding changes something on this trace
    sides = re.fullmatch(r"signal granularity 1m0s: (.*); an exact signal: (.*); cost (.*) useful s.*, wasted s (\S+)( \(a negative cost or change: the padding gained it\))?", line)
    assert sides, line
    negative = round(exact["useful"] - padded["useful"]) < 0 or round(padded["wasted"] - exact["wasted"]) < 0
    assert bool(sides.group(5)) == negative  # said only of a negative figure

    def expect(o):
        return (f"{o['attempts']} attempts, {o['succeeded']} succeeded, {o['preempted']} preempted, "
                f"{o['useful']:,.0f} useful s, {o['wasted']:,.0f} wasted s")

    assert sides.group(1) == expect(padded) and sides.group(2) == expect(exact)
    assert sides.group(3) == f"{exact['useful'] - padded['useful']:,.0f}"
    assert sides.group(4) == f"{padded['wasted'] - exact['wasted']:+,.0f}"
