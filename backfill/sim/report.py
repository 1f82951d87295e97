"""Per-model simulation results, the clairvoyant bound, and the timeline plot."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .cluster import SimParams, SimResult
from .traces import Trace


def busy_spans(requests: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge sorted ``(arrival, service)`` requests into busy spans ``(start, end)``, seconds.

    A request keeps its model busy over [t, t+d]; overlapping or touching spans merge.
    """
    spans: list[list[float]] = []
    for t, d in requests:
        end = t + d
        if spans and t <= spans[-1][1]:
            if end > spans[-1][1]:
                spans[-1][1] = end
        else:
            spans.append([t, end])
    return [(a, b) for a, b in spans]


def gaps(requests: list[tuple[float, float]]) -> list[float]:
    """Idle gaps between consecutive busy spans, seconds (first to last span only)."""
    spans = busy_spans(requests)
    return [nxt[0] - cur[1] for cur, nxt in zip(spans, spans[1:])]


def clairvoyant_jobs(gap: float, params: SimParams) -> int:
    """Jobs a clairvoyant scheduler packs into one gap: floor((g + repeatAfter) / (job + repeatAfter)).

    Zero when the job cannot finish within maxRunDuration (it would always hit its deadline).
    """
    if params.job > params.max_run or params.job + params.repeat_after <= 0:
        return 0
    return max(0, math.floor((gap + params.repeat_after) / (params.job + params.repeat_after)))


@dataclass(frozen=True)
class ModelReport:
    """One model's numbers (seconds for every duration)."""

    model: str
    requests: int
    idle_windows: int
    attempts: int
    succeeded: int
    preempted: int
    deadline_exceeded: int
    useful: float
    wasted: float
    overlap: float
    bound_jobs: int
    bound_useful: float

    @property
    def ratio(self) -> float | None:
        """Useful seconds over the clairvoyant bound's useful seconds (None when the bound is 0)."""
        return self.useful / self.bound_useful if self.bound_useful else None


def summarize(trace: Trace, params: SimParams, result: SimResult) -> list[ModelReport]:
    """Per-model reports, sorted by model name.

    ``idle_windows`` counts gaps longer than idleFor (where an admission is possible);
    ``useful`` is the running time of succeeded attempts, ``wasted`` that of every other ended
    attempt; ``overlap`` the seconds a preempted Job kept running into foreground demand.
    """
    by_model: dict[str, list] = {}
    for r in result.runs:
        by_model.setdefault(r.model, []).append(r)
    out = []
    for model, reqs in trace.requests.items():
        g = gaps(reqs)
        runs = by_model.get(model, [])
        bound = sum(clairvoyant_jobs(x, params) for x in g)
        out.append(
            ModelReport(
                model=model,
                requests=len(reqs),
                idle_windows=sum(1 for x in g if x > params.idle_for),
                attempts=len(runs),
                succeeded=sum(1 for r in runs if r.result == "succeeded"),
                preempted=sum(1 for r in runs if r.result == "preempted"),
                deadline_exceeded=sum(1 for r in runs if r.result == "deadline_exceeded"),
                useful=sum(r.running_seconds for r in runs if r.result == "succeeded"),
                wasted=sum(r.running_seconds for r in runs if r.result not in (None, "succeeded")),
                overlap=result.overlap.get(model, 0.0),
                bound_jobs=bound,
                bound_useful=bound * params.job,
            )
        )
    return out


def total(reports: list[ModelReport]) -> ModelReport:
    """The sum over all models (model name ``TOTAL``)."""
    return ModelReport(
        "TOTAL",
        *(sum(getattr(r, f) for r in reports) for f in (
            "requests", "idle_windows", "attempts", "succeeded", "preempted", "deadline_exceeded",
            "useful", "wasted", "overlap", "bound_jobs", "bound_useful",
        )),
    )


def plot(trace: Trace, result: SimResult, path: Path, max_models: int = 12) -> int:
    """Draw a timeline PNG: foreground busy spans, background runs by result, preemptions.

    Shows the ``max_models`` busiest models. Returns how many models were drawn.
    Raises OSError when ``path`` cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    from datetime import datetime, timezone

    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    models = sorted(trace.requests, key=lambda m: -len(trace.requests[m]))[:max_models]
    runs_by_model: dict[str, list] = {}
    for r in result.runs:
        runs_by_model.setdefault(r.model, []).append(r)
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.6 * len(models)))
    colours = {"succeeded": "tab:green", "preempted": "tab:red", "deadline_exceeded": "tab:orange", "failed": "tab:orange", "cancelled": "tab:purple"}
    to_num = mdates.date2num
    for row, model in enumerate(reversed(models)):
        spans = busy_spans(trace.requests[model])
        ax.broken_barh(
            [(to_num(datetime.fromtimestamp(a, timezone.utc)), max((b - a) / 86400, 1 / 86400)) for a, b in spans],
            (row - 0.35, 0.3), facecolors="0.45", label="foreground busy" if row == 0 else None,
        )
        for result_name, colour in colours.items():
            bars = [
                (to_num(r.started_at or r.admitted_at), max(r.running_seconds / 86400, 1 / 86400))
                for r in runs_by_model.get(model, []) if r.result == result_name
            ]
            if bars:
                ax.broken_barh(bars, (row + 0.05, 0.3), facecolors=colour, label=f"backfill {result_name}" if row == 0 else None)
        pre = [to_num(r.ended_at) for r in runs_by_model.get(model, []) if r.result == "preempted" and r.ended_at]
        if pre:
            ax.plot(pre, [row + 0.2] * len(pre), "x", color="black", markersize=4, label="preemption" if row == 0 else None)
    ax.set_yticks(range(len(models)), list(reversed(models)))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    ax.set_title(f"Foreground busy spans and background runs ({trace.name})")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper right", fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(models)
