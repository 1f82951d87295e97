"""Smoke test of ``python -m bench --quick``: every figure is printed and written to the output
file with the date, machine and commit. It asserts no timing (speed targets live in the table,
never in tests): only that each row is there, measured where it must be, and that the table's
ratio and met columns agree with its measured, baseline and target columns.

Runs against the session's PostgreSQL (``pg_url``) and starts its own kube-apiserver (the
binaries of ``tests/envtest``); with an external database the "PostgreSQL stopped" rows of the
latency benchmark are not measured (the benchmark only stops an embedded server).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ROWS = [
    "EventStore.append, batches of 1,000",
    "EventStore.append, batches of 10,000",
    "EventStore.read, whole log (raw, no decode)",
    "decode_many, compiled path",
    "db restore: the log's write lock held",
    "fold in memory, 100 ModelBackfills",
    "fold in memory, 1,000 ModelBackfills",
    "fold in memory, 10,000 ModelBackfills",
    "fold flatness, 10,000 / 100 ModelBackfills",
    "fold_all in memory (start-up, catch-up), 100 ModelBackfills",
    "fold_all in memory (start-up, catch-up), 1,000 ModelBackfills",
    "fold_all in memory (start-up, catch-up), 10,000 ModelBackfills",
    "fold_all flatness, 10,000 / 100 ModelBackfills",
    "simulate --repeat-after 1m",
    "read from PostgreSQL (lean rows, no decode)",
    "full replay from PostgreSQL: read + decode + fold",
    "full replay from PostgreSQL, a log of foreground requests",
    "read-ahead: replay of the request log",
    "switch interval 0.2 ms: replay of the request log",
    "compiled events: replay of the request log",
    "replay audit from PostgreSQL (backfill replay)",
    "cancel latency p50, PostgreSQL up",
    "cancel latency p99, PostgreSQL up",
    "cancel latency burst p99, PostgreSQL up",
    "cancel latency p50, PostgreSQL stopped",
    "cancel latency p99, PostgreSQL stopped",
    "cancel latency burst p99, PostgreSQL stopped",
    "suspend latency p50, PostgreSQL up",
    "suspend latency p99, PostgreSQL up",
    "speed-up over the upstream 5 s poller, p50",
    "speed-up over the upstream 5 s poller, p99",
    "scale: cold start (synced + first reconcile pass)",
    "scale: first start until every status is written",
    "scale: idle CPU",
    "scale: resident memory attributable to the controller",
    "scale: admissions due at once (one per Model), all created",
]
"""Every figure the issues ask for (10: Benchmarks; 8: Speed), by name."""

NUMBER = re.compile(r"^[≥≤]?\s*([0-9][0-9,]*(?:\.[0-9]+)?)")


def number(cell: str) -> float | None:
    m = NUMBER.match(cell.strip())
    return float(m.group(1).replace(",", "")) if m else None


def table_rows(markdown: str) -> dict[str, list[str]]:
    """The markdown table's rows by figure name (cells unescaped)."""
    out = {}
    for line in markdown.splitlines():
        if line.startswith("| ") and not line.startswith("| figure"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            out[cells[0]] = cells
    return out


def run_bench(tmp_path: Path, pg_url: str, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    output = tmp_path / "BENCHMARKS.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *args, "--output", str(output), "--database-url", pg_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return proc, output


def test_quick_run_writes_every_figure(tmp_path: Path, pg_url: str) -> None:
    proc, output = run_bench(tmp_path, pg_url, "--quick")
    assert proc.returncode == 0, proc.stderr[-4000:]
    md = output.read_text()
    for field in ("- date: ", "- machine: ", "cores", "memory, Python ", "- commit: "):
        assert field in md
    rows = table_rows(md)
    assert [name for name in ROWS if name not in rows] == []
    assert [name for name in rows if name not in ROWS] == []  # no FAILED group, nothing unnamed
    for name in ROWS:
        assert name in proc.stdout, f"{name!r} missing from the printed table"
        _, measured, baseline, ratio, target, met = rows[name]
        if "PostgreSQL stopped" in name:  # an external database is never stopped
            assert measured == "n/a"
            continue
        if name == "decode_many, compiled path" and measured == "n/a":
            continue  # a build without the compiled decode path says so
        value = number(measured)
        assert value is not None and value >= 0, (name, measured)
        # the ratio column is measured / baseline (or / target when there is no baseline)
        ref = number(baseline) if baseline not in ("(target)", "-") else number(target)
        if ref:
            shown = number(ratio)
            assert shown is not None and abs(shown - value / ref) <= 0.03 * value / ref + 0.011, (name, measured, baseline, ratio)
        # met agrees with the target's direction
        if target != "-":
            limit = number(target[1:])
            assert met == ("yes" if (value >= limit if target.startswith("≥") else value <= limit) else "NO"), (name, measured, target, met)
        else:
            assert met == "-"


def test_only_runs_the_named_groups(tmp_path: Path, pg_url: str) -> None:
    proc, output = run_bench(tmp_path, pg_url, "--quick", "--only", "fold")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(table_rows(output.read_text())) == sorted(n for n in ROWS if n.startswith("fold"))


def test_unknown_group_is_a_one_line_error(tmp_path: Path, pg_url: str) -> None:
    proc, output = run_bench(tmp_path, pg_url, "--only", "fold,nope")
    assert proc.returncode == 2
    assert "error: --only: unknown group(s) nope" in proc.stderr
    assert not output.exists()


def test_only_naming_no_group_and_an_unwritable_output_are_refused_before_any_run(tmp_path: Path, pg_url: str) -> None:
    # a new user's trial: ``--only ,`` ran every group at full size and rewrote BENCHMARKS.md;
    # ``--output`` into a missing directory failed after the whole run
    for only in (",", ""):
        proc, output = run_bench(tmp_path, pg_url, "--only", only)
        assert proc.returncode == 2, (only, proc.stderr[-2000:])
        assert "error: --only: no group named" in proc.stderr
        assert not output.exists() and "bench: store" not in proc.stderr  # no group started
    missing = tmp_path / "no-such-dir" / "x.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "fold", "--output", str(missing), "--database-url", pg_url],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and f"error: --output: cannot write {missing}" in proc.stderr
    assert "fold in memory" not in proc.stdout and not missing.parent.exists()


def test_the_header_names_the_command_as_run(tmp_path: Path, pg_url: str) -> None:
    proc, output = run_bench(tmp_path, pg_url, "--quick", "--only", "fold")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "- run: `python -m bench --quick --only fold` (quick sizes)" in output.read_text()


def test_a_run_keeps_the_sections_written_below_the_table_and_a_subset_leaves_benchmarks_md_alone(tmp_path: Path, pg_url: str) -> None:
    """A subset run (``--only simulate,replay``) replaced BENCHMARKS.md by its four rows and erased
    every side-by-side section below the table (a session's measurements)."""
    output = tmp_path / "BENCHMARKS.md"
    kept = "## Measured by hand\n\nbefore 1 s, after 2 s\n\n## Another\n\nkept too\n"
    output.write_text("# Benchmarks\n\n| figure |\n|---|\n| old |\n\n## Notes\n\n- **old**: a note\n\n" + kept)
    proc, _ = run_bench(tmp_path, pg_url, "--quick", "--only", "fold")  # writes to ``output``
    assert proc.returncode == 0, proc.stderr[-4000:]
    md = output.read_text()
    assert md.endswith("\n" + kept) and "| old |" not in md and "fold in memory, 100 ModelBackfills" in md
    repo = ROOT / "BENCHMARKS.md"
    before = repo.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "fold"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "BENCHMARKS.md not written" in proc.stdout and repo.read_bytes() == before
