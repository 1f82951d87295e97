"""``backfill recommend``: sweep idleFor (and shard counts) over a model's foreground history.

For every (idleFor, shards) pair the outcome comes from :func:`backfill.sim.sweep.outcome` (equal
to the projector-driven ``simulate``, tested) and the bound from :func:`backfill.sim.bound.clairvoyant`
(it does not depend on idleFor). The recommendation is the smallest idleFor whose outcome stays
within every limit given and does some useful work; with several shard counts, the one with the
most useful seconds at that idleFor.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..core.durations import format_duration
from .bound import clairvoyant, gaps_us
from .cluster import SimParams
from .sweep import Outcome, outcome

#: The default idleFor ladder, seconds: 1m .. 2h.
DEFAULT_IDLE_FORS = (60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0, 5400.0, 7200.0)


@dataclass(frozen=True)
class Limits:
    """User limits; None = no limit.

    Attributes:
        max_waste: largest wasted share of background running time (wasted / (useful + wasted)), 0..1.
        max_preemptions_per_day: largest preemptions per day of simulated history.
        max_overlap: largest total foreground-overlap seconds over the history.
    """

    max_waste: float | None = None
    max_preemptions_per_day: float | None = None
    max_overlap: float | None = None


@dataclass(frozen=True)
class Point(Outcome):
    """The outcome of one (idleFor, shards) pair for one model; seconds for durations.

    Attributes:
        attempts, succeeded, preempted, deadline_exceeded, useful, wasted, overlap: the
            :class:`~backfill.sim.sweep.Outcome`, as in ``simulate``.
        idle_for, shards: the parameters swept.
        bound: the clairvoyant bound's useful seconds for this shard count.
        idle: total idle seconds (first to last busy span).
        days: days of history simulated (first to last arrival).
        violates: the limits this point breaks (``max_waste``, ...), empty when within limits.
    """

    idle_for: float
    shards: int
    bound: float
    idle: float
    days: float
    violates: tuple[str, ...] = ()

    @property
    def bound_share(self) -> float | None:
        """useful / bound (None when the bound is 0)."""
        return self.useful / self.bound if self.bound else None

    @property
    def idle_share(self) -> float | None:
        """useful / all idle time (None when there is none)."""
        return self.useful / self.idle if self.idle else None

    @property
    def waste_share(self) -> float | None:
        """wasted / (useful + wasted): the share of background running time thrown away (None: nothing ran)."""
        ran = self.useful + self.wasted
        return self.wasted / ran if ran else None

    @property
    def preemptions_per_day(self) -> float:
        """Preemptions per day of history (0 with no preemption)."""
        return self.preempted / self.days if self.preempted else 0.0

    def as_dict(self) -> dict:
        """Fields and derived shares, for JSON (``idle_for`` also as a Go duration)."""
        return {"idle_for": self.idle_for, "shards": self.shards} | self.__dict__ | {
            "idle_for_duration": format_duration(self.idle_for),
            "violates": list(self.violates),
            "bound_share": self.bound_share,
            "idle_share": self.idle_share,
            "waste_share": self.waste_share,
            "preemptions_per_day": self.preemptions_per_day,
        }


def violations(p: Point, limits: Limits) -> tuple[str, ...]:
    """Which of ``limits`` the point breaks (names as in :class:`Limits`)."""
    out = []
    if limits.max_waste is not None and (p.waste_share or 0.0) > limits.max_waste:
        out.append("max_waste")
    if limits.max_preemptions_per_day is not None and p.preemptions_per_day > limits.max_preemptions_per_day:
        out.append("max_preemptions_per_day")
    if limits.max_overlap is not None and p.overlap > limits.max_overlap:
        out.append("max_overlap")
    return tuple(out)


@dataclass
class ModelSweep:
    """All points of one model, and the recommendation.

    Attributes:
        model, requests: the model and its request count.
        points: one per (shards, idleFor), shards then idleFor ascending.
        recommended: the smallest idleFor within limits (most useful shard count there), or None.
    """

    model: str
    requests: int
    points: list[Point] = field(default_factory=list)
    recommended: Point | None = None

    def as_dict(self) -> dict:
        """JSON shape: model, requests, points, recommended (a point or null)."""
        return {
            "model": self.model,
            "requests": self.requests,
            "points": [p.as_dict() for p in self.points],
            "recommended": self.recommended.as_dict() if self.recommended else None,
        }


def choose(points: list[Point]) -> Point | None:
    """The smallest idleFor among points within limits that do some useful work; ties: most
    useful, then fewest shards. None when there is no such point."""
    ok = [p for p in points if not p.violates and p.useful > 0]
    return min(ok, key=lambda p: (p.idle_for, -p.useful, p.shards)) if ok else None


def sweep_model(
    model: str,
    requests: list[tuple[float, float]],
    base: SimParams,
    idle_fors: list[float],
    shard_counts: list[int],
    limits: Limits,
) -> ModelSweep:
    """Sweep ``idle_fors`` x ``shard_counts`` for one model's sorted ``(arrival_s, service_s)`` requests.

    ``base`` gives job, maxRun, repeatAfter and cancel latency (its idle_for and shards are
    replaced). Raises ValueError for a shard count < 1 or a job <= 0.
    """
    gaps = gaps_us(requests)
    days = (requests[-1][0] - requests[0][0]) / 86400 if requests else 0.0
    out = ModelSweep(model, len(requests))
    for n in shard_counts:
        b = clairvoyant(gaps, job=base.job, shards=n, repeat_after=base.repeat_after, max_run=base.max_run)
        for idle_for in idle_fors:
            o = outcome(gaps, replace(base, idle_for=idle_for, shards=n))
            p = Point(**o.__dict__, idle_for=idle_for, shards=n, bound=b.useful, idle=b.idle, days=days)
            out.points.append(replace(p, violates=violations(p, limits)))
    out.recommended = choose(out.points)
    return out


def plot(sweeps: list[ModelSweep], limits: Limits, path: Path, title: str) -> None:
    """Draw the trade-off per model: useful work (share of all idle time, the bound dotted) and
    preemptions per day / wasted share against idleFor (log axis), limits dashed, the
    recommendation marked. The format follows ``path``'s suffix.

    Raises:
        OSError: ``path`` cannot be written; ValueError: an unsupported suffix.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    fig, axes = plt.subplots(len(sweeps), 2, figsize=(13, 3.4 * len(sweeps) + 0.6), squeeze=False)
    for row, sw in enumerate(sweeps):
        left, right = axes[row]
        shards = sorted({p.shards for p in sw.points})
        xs_all = sorted({p.idle_for for p in sw.points})
        ax2 = right.twinx()
        for i, n in enumerate(shards):
            pts = [p for p in sw.points if p.shards == n]
            xs = [p.idle_for / 60 for p in pts]
            colour = f"C{i}"
            label = f"{n} shard{'s' if n > 1 else ''}"
            left.plot(xs, [100 * (p.idle_share or 0) for p in pts], "o-", color=colour, label=f"useful, {label}")
            if pts[0].idle:
                left.axhline(100 * pts[0].bound / pts[0].idle, color=colour, linestyle=":", linewidth=1.5,
                             label=f"clairvoyant bound, {label}")
            right.plot(xs, [p.preemptions_per_day for p in pts], "o-", color=colour, label=f"preemptions/day, {label}")
            ax2.plot(xs, [100 * (p.waste_share or 0) for p in pts], "s--", color=colour, alpha=0.6, markersize=4,
                     label=f"wasted % of background time, {label}")
        if limits.max_preemptions_per_day is not None:
            right.axhline(limits.max_preemptions_per_day, color="black", linestyle="--", linewidth=1,
                          label=f"limit {limits.max_preemptions_per_day:g}/day")
        if limits.max_waste is not None:
            ax2.axhline(100 * limits.max_waste, color="grey", linestyle="-.", linewidth=1, label=f"waste limit {100 * limits.max_waste:g}%")
        for ax in (left, right):
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(FixedLocator([x / 60 for x in xs_all]))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([format_duration(x).replace("m0s", "m").replace("h0m", "h") for x in xs_all], fontsize=8)
            ax.set_xlabel("idleFor")
            ax.grid(True, alpha=0.3)
            if sw.recommended is not None:
                ax.axvline(sw.recommended.idle_for / 60, color="tab:green", linewidth=2, alpha=0.5)
        rec = (f"recommended idleFor {format_duration(sw.recommended.idle_for)}"
               + (f" ({sw.recommended.shards} shards)" if len(shards) > 1 else "")) if sw.recommended else "no idleFor within the limits"
        left.set_title(f"{sw.model}: useful work as % of all idle time ({rec})", fontsize=9)
        left.set_ylabel("% of all idle time")
        left.set_ylim(0, max(1.0, 1.1 * max(100 * p.bound / p.idle if p.idle else 0 for p in sw.points)))
        right.set_title(f"{sw.model}: preemptions per day (solid) and wasted % (dashed)", fontsize=9)
        right.set_ylabel("preemptions / day")
        right.set_ylim(bottom=0)
        ax2.set_ylabel("wasted % of background time")
        ax2.set_ylim(bottom=0)
        left.legend(fontsize=7, loc="best")
        h1, l1 = right.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        right.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
