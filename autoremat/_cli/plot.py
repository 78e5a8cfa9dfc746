"""A study drawn: every measured trial, memory against step time, the front joined
(``autoremat pareto --plot``; ``autoremat.plot_front``). What it draws is data from
``autoremat._search.pareto`` (``pareto_front``, ``plot_groups``); matplotlib is imported
only when a plot is drawn."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoremat._measure.measurement import fit_figure
from autoremat._search.pareto import FrontPoint, pareto_front, plot_groups
from autoremat._search.study import StudyInfo
from autoremat._units import format_bytes, format_seconds, parse_bytes

if TYPE_CHECKING:
    import optuna


def plot_study(study: optuna.Study, path: str | Path,
               budget_bytes: int | str | None = None) -> Path:
    """Draw every measured trial: memory (log axis) vs step time (``plot_groups``).

    Within budget: filled circles (hollow: the step time is predicted from a
    short run at long T); the front joined by a line; the chosen
    point labelled. Cut trials (timed once, stopped as slower than the best that
    fits): grey triangles at that one run's time. Over budget (not timed): red crosses
    along the top edge at their memory. The budget is a vertical dashed line. On a
    device that measured memory, a point's memory is the figure its fit was decided by
    (``Measurement.fit_bytes``). The file type follows the suffix (``.png``, ``.svg``,
    ``.pdf``). ``budget_bytes`` as in ``pareto_front``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    info = StudyInfo.of(study)
    budget_bytes = None if budget_bytes is None else parse_bytes(budget_bytes, "budget_bytes")
    budget = info.budget_bytes if budget_bytes is None else budget_bytes
    groups, failed = plot_groups(study, budget_bytes)
    by_kind = {g.kind: g for g in groups}
    front = pareto_front(study, budget_bytes)

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    ax.set_xscale("log")
    style: dict[str, dict[str, Any]] = {
        "timed": {"s": 28, "color": "tab:blue", "alpha": 0.6},
        "predicted": {"s": 28, "facecolors": "none", "edgecolors": "tab:blue", "alpha": 0.8},
        "cut": {"s": 30, "marker": "^", "color": "tab:gray", "alpha": 0.7},
    }
    for kind in ("timed", "predicted", "cut"):
        if kind in by_kind:
            g = by_kind[kind]
            ax.scatter([p[0] for p in g.points], [p[1] for p in g.points], label=g.label,
                       **style[kind])
    if front:
        ax.plot([_memory(p) for p in front], [p.step_seconds for p in front],
                "-o", color="tab:green", ms=5, lw=1.5, label=f"Pareto front ({len(front)})")
    ymax = max([p[1] for k in ("timed", "predicted", "cut") if k in by_kind
                for p in by_kind[k].points], default=1.0) * 1.15
    if "over" in by_kind:
        over = by_kind["over"]
        ax.scatter([p[0] for p in over.points], [ymax] * len(over.points),
                   marker="x", color="tab:red", s=36, label=over.label)
    ax.axvline(budget, color="black", ls="--", lw=1, label=f"budget {format_bytes(budget)}")
    chosen = next((p for p in front if p.chosen), None)
    if chosen is not None:
        ax.scatter([_memory(chosen)], [chosen.step_seconds], s=120, facecolors="none",
                   edgecolors="black", lw=1.5, zorder=5)
        ax.annotate(
            f"chosen: trial {chosen.number}\n{chosen.schedule}\n"
            f"{format_bytes(_memory(chosen))}, {format_seconds(chosen.step_seconds)}",
            (_memory(chosen), chosen.step_seconds), xytext=(12, 12),
            textcoords="offset points", fontsize=8,
            arrowprops={"arrowstyle": "-", "color": "black", "lw": 0.8},
        )
    ax.set_ylim(bottom=0, top=ymax * 1.08)
    ax.set_xlabel("total memory, bytes (argument + output + temp - alias; log scale)"
                  if not any(p.breakdown.get("runtime_peak_bytes") for p in front) else
                  "memory, bytes: the measured runtime peak, else the estimate (log scale)")
    ax.set_ylabel("step time, s (median)")
    ax.set_title(f"{info.problem or study.study_name} on {info.device_kind}"
                 + (f"  ({failed} failed)" if failed else ""), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _memory(p: FrontPoint) -> int:
    """A front point's memory as plotted: the figure its fit was decided by."""
    runtime = p.breakdown.get("runtime_peak_bytes")
    return int(fit_figure(p.total_bytes, None if runtime is None else int(runtime))[0] or 0)
