"""Per-model simulation results (with the clairvoyant bound of :mod:`.bound`) and the timeline plot."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from .bound import clairvoyant, gaps_us, spans_us
from .cluster import SimParams, SimResult
from .sweep import Outcome
from .traces import Trace


@dataclass(frozen=True)
class ModelReport(Outcome):
    """One model's numbers (seconds for every duration): an :class:`~backfill.sim.sweep.Outcome`
    (attempts, succeeded, preempted, deadline_exceeded, useful, wasted, overlap) and more.

    ``useful`` counts completed work (a succeeded job, or the finished shards of a preempted
    attempt with ``--shards``); ``wasted`` every other second background Jobs ran. ``bound_jobs``
    / ``bound_useful`` are the clairvoyant optimum (:mod:`backfill.sim.bound`) and ``idle`` the
    total idle seconds between the model's first and last busy span.
    """

    model: str
    requests: int
    idle_windows: int
    bound_jobs: int
    bound_useful: float
    idle: float

    @property
    def ratio(self) -> float | None:
        """Useful seconds over the clairvoyant bound's useful seconds (None when the bound is 0)."""
        return self.useful / self.bound_useful if self.bound_useful else None

    @property
    def idle_share(self) -> float | None:
        """Useful seconds over all idle seconds (None when there is no idle time)."""
        return self.useful / self.idle if self.idle else None

    def as_dict(self) -> dict:
        """The fields (``model`` first) plus ``ratio`` and ``idle_share`` (for JSON)."""
        return {"model": self.model} | self.__dict__ | {"ratio": self.ratio, "idle_share": self.idle_share}


def summarize(trace: Trace, params: SimParams, result: SimResult) -> list[ModelReport]:
    """Per-model reports, in the trace's model order (sorted by name).

    ``idle_windows`` counts gaps longer than idleFor (where an admission is possible);
    ``useful`` is :attr:`SimResult.useful` summed over the ended attempts, ``wasted`` the rest of
    their running time; ``overlap`` the seconds a preempted Job kept running into foreground demand.
    """
    by_model: dict[str, list] = {}
    for r in result.runs:
        by_model.setdefault(r.model, []).append(r)
    out = []
    for model, reqs in trace.requests.items():
        g = gaps_us(reqs)
        runs = [r for r in by_model.get(model, []) if r.result is not None]
        useful = sum(result.useful.get((r.backfill, r.attempt), 0.0) for r in runs)
        bound = clairvoyant(g, job=params.job, shards=params.shards, repeat_after=params.repeat_after, max_run=params.max_run)
        out.append(
            ModelReport(
                model=model,
                requests=len(reqs),
                idle_windows=sum(1 for a, b in g if b - a > params.idle_for * 1e6),
                attempts=len(by_model.get(model, [])),
                succeeded=sum(1 for r in runs if r.result == "succeeded"),
                preempted=sum(1 for r in runs if r.result == "preempted"),
                deadline_exceeded=sum(1 for r in runs if r.result == "deadline_exceeded"),
                useful=useful,
                wasted=sum(r.running_seconds for r in runs) - useful,
                overlap=result.overlap.get(model, 0.0),
                bound_jobs=bound.jobs,
                bound_useful=bound.useful,
                idle=bound.idle,
            )
        )
    return out


def total(reports: list[ModelReport]) -> ModelReport:
    """The sum over all models (model name ``TOTAL``)."""
    names = [f.name for f in fields(ModelReport) if f.name != "model"]
    return ModelReport(model="TOTAL", **{n: sum(getattr(r, n) for r in reports) for n in names})


def plot(trace: Trace, result: SimResult, path: Path, max_models: int = 12) -> int:
    """Draw a timeline: foreground busy spans, background runs by result, preemptions.

    One row per model (the ``max_models`` busiest). Spans shorter than a pixel are widened to
    about one pixel so that dense foreground traffic stays visible over a long trace. The format
    follows ``path``'s suffix. Returns how many models were drawn.

    Raises:
        OSError: ``path`` cannot be written; ValueError: an unsupported suffix.
    """
    import matplotlib

    matplotlib.use("Agg")
    from datetime import datetime, timezone

    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    models = sorted(trace.requests, key=lambda m: (-len(trace.requests[m]), m))[:max_models]
    runs_by_model: dict[str, list] = {}
    for r in result.runs:
        runs_by_model.setdefault(r.model, []).append(r)
    starts = [trace.requests[m][0][0] for m in models if trace.requests[m]]
    ends = [max(t + d for t, d in trace.requests[m]) for m in models if trace.requests[m]]
    span_days = max((max(ends) - min(starts)) / 86400, 1 / 1440) if starts else 1.0
    width_in = 14
    min_w = span_days / (width_in * 110)  # about one pixel at 110 dpi
    colours = {
        "succeeded": "tab:green",
        "preempted": "tab:red",
        "deadline_exceeded": "tab:orange",
        "failed": "tab:orange",
        "cancelled": "tab:purple",
    }
    fig, ax = plt.subplots(figsize=(width_in, 1.6 + 0.55 * len(models)))
    to_num = mdates.date2num
    seen: set[str] = set()
    for row, model in enumerate(reversed(models)):
        spans = [(a / 1e6, b / 1e6) for a, b in spans_us(trace.requests[model])]
        ax.broken_barh(
            [(to_num(datetime.fromtimestamp(a, timezone.utc)), max((b - a) / 86400, min_w)) for a, b in spans],
            (row - 0.38, 0.34), facecolors="0.35", linewidth=0,
        )
        for result_name, colour in colours.items():
            bars = [
                (to_num(r.started_at or r.admitted_at), max(r.running_seconds / 86400, min_w))
                for r in runs_by_model.get(model, []) if r.result == result_name
            ]
            if bars:
                seen.add(result_name)
                ax.broken_barh(bars, (row + 0.04, 0.34), facecolors=colour, linewidth=0)
        pre = [to_num(r.ended_at) for r in runs_by_model.get(model, []) if r.result == "preempted" and r.ended_at]
        if pre:
            ax.plot(pre, [row + 0.21] * len(pre), "x", color="black", markersize=4)
    ax.set_yticks(range(len(models)), list(reversed(models)))
    ax.set_ylim(-0.6, len(models) - 0.4)
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    shown = f"{len(models)} busiest of {len(trace.requests)} models" if len(trace.requests) > len(models) else f"{len(models)} model(s)"
    ax.set_title(f"Foreground busy spans and background runs: {trace.name} ({shown}, UTC)", fontsize=10)
    handles = [Patch(color="0.35", label="foreground busy")]
    handles += [Patch(color=colours[k], label=f"backfill {k}") for k in colours if k in seen]
    if "preempted" in seen:
        handles.append(Line2D([], [], marker="x", color="black", linestyle="", label="preemption"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(models)
