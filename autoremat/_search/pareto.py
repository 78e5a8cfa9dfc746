"""The measured memory/time trade-off of a study: its front, table and plot.

Every point is a measurement (``autoremat._measure.measure``): ``total_bytes`` from
the compiled executable's ``memory_analysis()``, ``step_seconds`` the median
of timed runs. The front is the set of trials within the study's budget that
no other such trial beats on both (a trial is dominated when another has
``total <=`` and ``step <=``, one of them strictly). On a device that reports
``memory_stats()`` the memory of a point is the figure its fit was decided by
(``Measurement.fit_bytes``: the measured runtime peak, the estimate where nothing
was measured), and the table shows both, with the transient compile scratch.

Next to the measurements, each point shows its *recompute factor* (step
evaluations per step, ``autoremat.bounds.cost``: 1 plain, 2 per-step remat)
and how far that is from the fewest any schedule storing as many carries can
do (``bounds.distance_to_optimum``: 1.0 = optimal, the binomial kind).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoremat._errors import TuneError
from autoremat._measure.breakdown import DEVICE_KEYS, KEYS, breakdown_figures, breakdown_lines
from autoremat._measure.measurement import OVER_BUDGET, fit_figure
from autoremat._measure.mesh import device_note
from autoremat._measure.stale import TIMING, TUNED_FOR
from autoremat._schedules.base import Schedule
from autoremat._search.attrs import DUPLICATE_OF
from autoremat._search.study import (
    MeasuredTrial,
    StudyInfo,
    _choose,
    choose,
    measured_trials,
    trial_schedule,
)
from autoremat._units import format_bytes
from autoremat.bounds import cost, distance_to_optimum

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class FrontPoint:
    """One non-dominated trial.

    Attributes:
      number: the Optuna trial number (``autoremat export NUMBER``).
      total_bytes: measured argument + output + temp - alias bytes.
      step_seconds: measured median step time.
      ratio_to_fastest: ``step_seconds`` / the fastest front point's.
      schedule: the schedule in one line (``Schedule.describe``).
      chosen: the trial ``tune`` picks under the study's budget.
      recompute: step evaluations per step of one forward + backward pass.
      vs_optimum: evaluations over the optimum at the same stored carries.
      breakdown: where its memory goes (``autoremat._measure.breakdown.KEYS``).
      timed_seq_len: the ``T`` its step time was measured at; below the study's
        ``seq_len``, ``step_seconds`` is predicted from that short run
        (``autoremat._search.short_runs``).
    """

    number: int
    total_bytes: int
    step_seconds: float
    ratio_to_fastest: float
    schedule: str
    chosen: bool
    recompute: float
    vs_optimum: float
    breakdown: dict[str, Any] = field(default_factory=dict)
    timed_seq_len: int | None = None


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """``a`` is no worse than ``b`` on both objectives and better on one."""
    return a[0] <= b[0] and a[1] <= b[1] and a != b


def pareto_front(study: optuna.Study, budget_bytes: int | None = None) -> list[FrontPoint]:
    """The non-dominated trials within the study's budget, sorted by memory.

    ``budget_bytes``: another budget to read the front at (default: the study's); ``chosen``
    is then the fastest within it. Over the study's budget nothing was timed, so a larger
    budget adds no point the study did not time."""
    info = StudyInfo.of(study)
    budget = info.budget_bytes if budget_bytes is None else budget_bytes
    trials = measured_trials(study)
    fits = [t for t in trials if t.measurement.fits(budget)]
    point = {t.number: _point(t) for t in fits}
    front = [t for t in fits if not any(dominates(point[o.number], point[t.number]) for o in fits)]
    if not front:
        return []
    fastest = min(point[t.number][1] for t in front)
    chosen = choose(study) if budget_bytes is None else _choose(trials, budget, info.seq_len)
    front.sort(key=lambda t: (*point[t.number], t.number))
    return [
        FrontPoint(
            number=t.number,
            total_bytes=int(t.measurement.total_bytes or 0),
            step_seconds=point[t.number][1],
            ratio_to_fastest=point[t.number][1] / fastest if fastest > 0 else 1.0,
            schedule=t.schedule.describe(),
            chosen=chosen is not None and t.number == chosen.number,
            recompute=cost(t.schedule, info.seq_len).recompute_factor,
            vs_optimum=distance_to_optimum(t.schedule, info.seq_len),
            breakdown=breakdown_figures(t.measurement.to_attrs()),
            timed_seq_len=t.measurement.timed_seq_len,
        )
        for t in front
    ]


def _point(t: MeasuredTrial) -> tuple[float, float]:
    """``(fit_bytes, step_seconds)`` of a trial that fits (so both are measured):
    the measured runtime peak where there is one, else ``total_bytes``."""
    m = t.measurement
    assert m.fit_bytes is not None and m.step_seconds is not None
    return float(m.fit_bytes), float(m.step_seconds)


def front_table(points: list[FrontPoint], budget_bytes: int, note: str = "",
                seq_len: int | None = None) -> str:
    """A plain-text table of the front; ``*`` marks the chosen schedule; ``note``: what the
    memory figures are (``mesh.device_note``: per device, on how many, which mesh);
    ``seq_len``: the study's ``T`` (the ``timed`` column says where a step time is
    predicted from a shorter run). Where the device measured memory (GPU/TPU), three
    more columns: the measured runtime peak, the transient compile scratch, and which
    of estimate and runtime peak bound the fit."""
    device = any(k in p.breakdown for p in points for k in DEVICE_KEYS[:2])
    lines = [
        f"Pareto front within budget {format_bytes(budget_bytes)} ({len(points)} points; "
        "* = chosen: fastest that fits)" + (f"; memory {note}" if note else ""),
        f"  {'trial':>5}  {'total':>10}  " + (_DEVICE_HEADER if device else "")
        + f"{'step':>10}  {'vs fastest':>10}  {'recompute':>9}  "
        f"{'vs opt':>6}  {'timed':>16}  schedule",
    ]
    for p in points:
        mark = "*" if p.chosen else " "
        lines.append(
            f"{mark} {p.number:>5}  {format_bytes(p.total_bytes):>10}  "
            + (_device_cells(p) if device else "")
            + f"{format_seconds(p.step_seconds):>10}  {p.ratio_to_fastest:>9.2f}x  {p.recompute:>8.2f}x  "
            f"{p.vs_optimum:>6.2f}  {_timed(p.timed_seq_len, seq_len):>16}  {p.schedule}"
        )
    lines.append("  recompute: step runs per step (1 plain scan, 2 per-step remat); vs opt: over the "
                 "fewest any schedule storing as many carries needs (autoremat.bounds)")
    if device:
        lines.append("  total: the estimate (memory_analysis); runtime peak: measured, this step "
                     "alone (memory_stats); compile scratch: transient, while compiling; the "
                     "fit is decided by the runtime peak where measured (bound), else the "
                     "estimate")
    for p in points:
        memory = breakdown_lines(p.breakdown) if p.chosen else []
        if memory:
            lines += [f"chosen (trial {p.number}):", *memory]
    return "\n".join(lines)


_DEVICE_HEADER = f"{'runtime peak':>12}  {'compile scr.':>12}  {'bound':>12}  "


def _device_cells(p: FrontPoint) -> str:
    """The runtime peak, compile scratch and bound cells of a point's row."""
    runtime = p.breakdown.get("runtime_peak_bytes")
    scratch = p.breakdown.get("compile_scratch_bytes")
    bound = fit_figure(p.total_bytes, runtime)[1]
    return (f"{format_bytes(runtime) if runtime is not None else '-':>12}  "
            f"{format_bytes(scratch) if scratch is not None else '-':>12}  {bound:>12}  ")


def _timed(timed_seq_len: int | None, seq_len: int | None) -> str:
    """``measured at T`` or ``predicted, T'=N`` (``-``: not recorded, an older study)."""
    if timed_seq_len is None:
        return "-"
    if seq_len is not None and timed_seq_len < seq_len:
        return f"predicted T'={timed_seq_len}"
    return "measured at T"


def front_json(points: list[FrontPoint], budget_bytes: int) -> str:
    """The front as JSON: ``{"budget_bytes": ..., "front": [FrontPoint fields...]}``."""
    return json.dumps({"budget_bytes": budget_bytes, "front": [asdict(p) for p in points]},
                      indent=2)


def export_trial(study: optuna.Study, number: int) -> Schedule:
    """Trial ``number``'s schedule with the same ``meta`` as ``tune`` writes.

    Raises:
      TuneError: no such trial, or it holds no measured schedule.
    """
    from optuna.trial import TrialState

    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    trial = trials.get(number)
    if trial is None:
        raise TuneError(
            f"trial: no trial {number} in study {study.study_name!r} "
            f"(trials 0..{max(trials, default=-1)})"
        )
    measured = MeasuredTrial.of(trial, study.user_attrs)
    if trial.state != TrialState.COMPLETE or measured is None:
        why = (measured.measurement.reason if measured is not None else "") or (
            f"duplicate of trial {trial.user_attrs[DUPLICATE_OF]}"
            if DUPLICATE_OF in trial.user_attrs else trial.state.name.lower())
        raise TuneError(f"trial: trial {number} has no measured schedule ({why})")
    return trial_schedule(study, measured)


@dataclass(frozen=True)
class PlotGroup:
    """One kind of point in the plot (``plot_groups``): its legend label and points.

    Attributes:
      kind: ``"timed"``, ``"predicted"`` (time from a short run), ``"cut"`` (timed
        once and stopped as slower than the best that fits: at its one run's time, a
        lower bound of its median) or ``"over"`` (over budget: its estimate, or its
        measured runtime peak; not timed).
      label: the legend's text (with the count).
      points: ``(memory bytes, seconds)``; ``over`` points have no time (``nan``,
        drawn along the top edge).
      trials: the trial number of each point.
    """

    kind: str
    label: str
    points: tuple[tuple[float, float], ...]
    trials: tuple[int, ...]


def plot_groups(study: optuna.Study, budget_bytes: int | None = None,
                ) -> tuple[list[PlotGroup], int]:
    """What ``plot_study`` draws, besides the front: the groups that have points, and
    how many trials failed (build, compile or run: not drawn); ``budget_bytes`` as in
    ``pareto_front``."""
    info = StudyInfo.of(study)
    budget = info.budget_bytes if budget_bytes is None else budget_bytes
    sorted_out: dict[str, list[tuple[int, tuple[float, float]]]] = {
        "timed": [], "predicted": [], "cut": [], "over": []}
    failed = 0
    for t in measured_trials(study):
        m = t.measurement
        fit = m.fit_bytes
        if m.fits(budget):
            kind = "predicted" if m.predicted(info.seq_len) else "timed"
            sorted_out[kind].append((t.number, _point(t)))
        elif m.status == OVER_BUDGET or (fit is not None and fit > budget):
            sorted_out["over"].append((t.number, (float(fit or 0), math.nan)))
        elif m.feasible and m.cut_seconds is not None and fit is not None:
            sorted_out["cut"].append((t.number, (float(fit), float(m.cut_seconds))))
        else:
            failed += 1
    labels = {"timed": "within budget", "predicted": "within budget, time predicted from a "
              "short run", "cut": "cut: timed once, slower than the best (at that run's time)",
              "over": "over budget, not timed"}
    groups = [PlotGroup(kind, f"{labels[kind]} ({len(found)})",
                        tuple(p for _, p in found), tuple(n for n, _ in found))
              for kind, found in sorted_out.items() if found]
    return groups, failed


def plot_study(study: optuna.Study, path: str | Path, budget_bytes: int | None = None) -> Path:
    """Draw every measured trial: memory (log axis) vs step time (``plot_groups``).

    Within budget: filled circles (hollow: the step time is predicted from a
    short run, ``autoremat._search.short_runs``); the front joined by a line; the chosen
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


def describe_schedule(schedule: Schedule) -> str:
    """A human summary: levels, policies, and what ``meta`` records."""
    lines = [f"schedule: {schedule.describe()}", *schedule.explain()]
    meta = dict(schedule.meta)
    if not meta:
        lines.append("  meta: none (not written by autoremat tune)")
        return "\n".join(lines)
    lines.append(f"tuned for: {meta.get('problem')} (seq_len {meta.get('seq_len')}, "
                 f"fingerprint {meta.get('fingerprint')})")
    lines.append(f"  on {meta.get('device_kind')} ({meta.get('platform')}), jax "
                 f"{meta.get('jax_version')}, flax {meta.get('flax_version')}")
    if "devices" in meta:
        lines.append(f"  figures {device_note(int(meta['devices']), str(meta.get('mesh') or ''))}")
    lines.append(f"  budget {format_bytes(meta.get('budget_bytes'))}; study "
                 f"{meta.get('study_name')!r} trial {meta.get('trial')} in {meta.get('storage')}"
                 f"; {meta.get('date')}")
    lines.append(f"measured: total {format_bytes(meta.get('total_bytes'))}, temp "
                 f"{format_bytes(meta.get('temp_bytes'))}, step "
                 f"{format_seconds(meta.get('step_seconds'))}, compile "
                 f"{format_seconds(meta.get('compile_seconds'))}")
    timed, seq_len = meta.get("timed_seq_len"), meta.get("seq_len")
    if isinstance(timed, int) and isinstance(seq_len, int) and timed < seq_len:
        lines.append(f"  step time predicted from a run of T'={timed} steps, not measured "
                     f"at T={seq_len}")
    elif meta.get("extrapolated_seconds") is not None:
        lines.append(f"  step time measured at T={seq_len}; short runs had predicted "
                     f"{format_seconds(meta['extrapolated_seconds'])}")
    lines += breakdown_lines(meta)
    if meta.get("fuse_why"):  # fusing the readout was a choice of the search
        lines.append(f"  fuse: {meta['fuse_why']}")
    known = {*TUNED_FOR, *TIMING, *KEYS, *DEVICE_KEYS, "fuse_why"}
    extra = {k: v for k, v in meta.items() if k not in known}
    if extra:
        lines.append(f"other meta: {extra}")
    return "\n".join(lines)


def format_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"
