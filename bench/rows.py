"""One row per figure, the table ``python -m bench`` prints, and ``BENCHMARKS.md``.

A :class:`Row` holds one measured value, the baseline measured in the same run (or, when there
is none, the target stands in for it), their ratio, the target and whether it is met. Every
``bench_*`` module exposes functions returning lists of rows; :mod:`bench.__main__` collects
them into one table.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "traces" / "alibaba-genai-2026" / "lora_request_trace.csv"

UNITS = {
    "ev/s": lambda v: f"{v:,.0f} ev/s",
    "rows/s": lambda v: f"{v:,.0f} rows/s",
    "s": lambda v: f"{v:.2f} s",
    "ms": lambda v: f"{v:.1f} ms",
    "%": lambda v: f"{v:.1f}%",
    "MB": lambda v: f"{v:,.0f} MB",
    "x": lambda v: f"{v:.2f}x",
}


@dataclass
class Row:
    """One figure.

    Attributes:
        name: what is measured (unique in a run; the smoke test checks them by name).
        value: the measured value in ``unit`` (None: not measured in this run, ``note`` says why).
        unit: a key of :data:`UNITS` (``ev/s``, ``s``, ``ms``, ``%``, ``MB``, ``x``).
        baseline: the reference measured in the same run, same unit (None: none; the ratio is
            then taken to the target).
        baseline_name: what the baseline is ("raw COPY", "floor", ...).
        target: the issue's target in ``unit`` (None: no target).
        higher_is_better: True for rates (met when ``value >= target``), False for times and
            sizes (met when ``value <= target``).
        note: sizes, sample counts, why a value is missing.
    """

    name: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: float | None = None
    higher_is_better: bool = True
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """``value / baseline``, else ``value / target``; None when either is missing or 0."""
        ref = self.baseline if self.baseline is not None else self.target
        if self.value is None or ref is None or ref == 0 or math.isnan(self.value) or math.isnan(ref):
            return None
        return self.value / ref

    @property
    def met(self) -> bool | None:
        """Whether the target is met; None without a target or a value."""
        if self.target is None or self.value is None or math.isnan(self.value):
            return None
        return self.value >= self.target if self.higher_is_better else self.value <= self.target

    def cells(self) -> list[str]:
        """``[name, value, baseline, ratio, target, met]`` as text."""
        fmt = UNITS[self.unit]
        value = "n/a" if self.value is None or math.isnan(self.value) else fmt(self.value)
        if self.baseline is not None:
            base = f"{fmt(self.baseline)} ({self.baseline_name})" if self.baseline_name else fmt(self.baseline)
            ratio = "" if self.ratio is None else f"{self.ratio:.2f}x"
        else:
            base = "(target)" if self.target is not None else "-"
            ratio = "" if self.ratio is None else f"{self.ratio:.2f}x of target"
        target = "-" if self.target is None else ("≥ " if self.higher_is_better else "≤ ") + fmt(self.target)
        met = "-" if self.met is None else ("yes" if self.met else "NO")
        return [self.name, value, base, ratio, target, met]


COLUMNS = ("figure", "measured", "baseline (same run)", "ratio", "target", "met")


def best(fn: Callable[[], object], repeat: int) -> float:
    """The shortest wall time (seconds) of ``repeat`` calls of ``fn`` (a collection before each)."""
    times = []
    for _ in range(max(1, repeat)):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def machine() -> dict[str, str]:
    """Date (UTC), cores, memory, CPU model, Python and the git commit of this checkout."""
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        mem = f"{kib / 2**20:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD")
    if commit and git("status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": str(os.cpu_count() or "?"),
        "memory": mem,
        "cpu": cpu or "?",
        "python": platform.python_version(),
        "commit": commit or "?",
    }


def markdown(
    rows: Sequence[Row], info: dict[str, str], mode: str, seconds: float, notes: Sequence[str] = (), command: str | None = None
) -> str:
    """``BENCHMARKS.md``: the machine, the command (``command``, else ``python -m bench`` with
    ``--quick`` for the quick mode), the table, and one note per row."""
    command = command or f"python -m bench{' --quick' if mode == 'quick' else ''}"
    out = [
        "# Benchmarks",
        "",
        "Written by `python -m bench` (see README, Benchmarks). Every baseline is measured in the same",
        "run as the figure it is compared with; where a figure has no baseline, the ratio is to its target.",
        "",
        f"- date: {info['date']}",
        f"- machine: {info['cores']} cores ({info['cpu']}), {info['memory']} memory, Python {info['python']}",
        f"- commit: {info['commit']}",
        f"- run: `{command}` ({mode} sizes), {seconds:.0f} s in all",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(COLUMNS))) + "|",
    ]
    for r in rows:
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in r.cells()) + " |")
    out += ["", "## Notes", ""]
    for r in rows:
        if r.note:
            out.append(f"- **{r.name}**: {r.note}")
    for n in notes:
        out.append(f"- {n}")
    return "\n".join(out) + "\n"


def history(previous: str) -> str:
    """The sections of a previous ``BENCHMARKS.md`` (text ``previous``) below its generated part:
    from the first ``## `` heading after ``## Notes`` on (side-by-side measurements and
    experiments written by hand), with a blank line before; "" when there are none. A new table
    replaces the generated part only, so a run never erases them."""
    lines = previous.splitlines(keepends=True)
    notes = next((i for i, line in enumerate(lines) if line.rstrip() == "## Notes"), None)
    if notes is None:
        return ""
    start = next((i for i in range(notes + 1, len(lines)) if lines[i].startswith("## ")), None)
    return "" if start is None else "\n" + "".join(lines[start:])
