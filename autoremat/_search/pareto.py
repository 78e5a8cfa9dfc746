"""The measured memory/time trade-off of a study, as data: its front and the groups a plot
draws (the table, JSON, plot and ``autoremat show`` are the command line's:
``autoremat._cli.front_text``, ``autoremat._cli.plot``, ``autoremat._cli.show_text``).

Every point is a measurement (``autoremat._measure.measure``): ``total_bytes`` from
the compiled executable's ``memory_analysis()``, ``step_seconds`` the median
of timed runs. The front is the set of trials within the study's budget that
no other such trial beats on both (a trial is dominated when another has
``total <=`` and ``step <=``, one of them strictly). On a device that reports
``memory_stats()`` the memory of a point is the figure its fit was decided by
(``Measurement.fit_bytes``: the measured runtime peak, the estimate where nothing
was measured), and the table (``autoremat._cli.front_text``) shows both, with the
transient compile scratch.

Next to the measurements, each point shows its *recompute factor* (step
evaluations per step, ``autoremat.bounds.cost``: 1 plain, 2 per-step remat)
and how far that is from the fewest any schedule storing as many carries can
do (``bounds.distance_to_optimum``: 1.0 = optimal, the binomial kind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autoremat._errors import TuneError
from autoremat._measure.breakdown import breakdown_figures
from autoremat._measure.measurement import OVER_BUDGET
from autoremat._schedules.base import Schedule
from autoremat._search.attrs import DUPLICATE_OF
from autoremat._search.study import (
    MeasuredTrial,
    StudyInfo,
    choose,
    measured_trials,
    trial_schedule,
)
from autoremat._search.trials import fastest_fitting
from autoremat._units import parse_bytes
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
      breakdown: where its memory goes (argument, output, temp, stacked bytes, ...).
      timed_seq_len: the ``T`` its step time was measured at; below the study's
        ``seq_len``, ``step_seconds`` is predicted from that short run.
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


def pareto_front(study: optuna.Study, budget_bytes: int | str | None = None
                 ) -> list[FrontPoint]:
    """The non-dominated trials within the study's budget, sorted by memory: each point
    saves memory over the next only by spending step time on recomputation.

    ``budget_bytes``: another budget to read the front at, in bytes or as text like
    ``tune``'s (``"100MB"``, ``"4GiB"``; default: the study's); ``chosen`` is then the
    fastest within it. Over the study's budget nothing was timed, so a larger budget adds
    no point the study did not time.

    Raises:
      BudgetError: ``budget_bytes`` cannot be read.
      TuneError: the study was not made by ``tune``.
    """
    info = StudyInfo.of(study)
    budget_bytes = None if budget_bytes is None else parse_bytes(budget_bytes, "budget_bytes")
    budget = info.budget_bytes if budget_bytes is None else budget_bytes
    trials = measured_trials(study)
    fits = [t for t in trials if t.measurement.fits(budget)]
    point = {t.number: _point(t) for t in fits}
    front = [t for t in fits if not any(dominates(point[o.number], point[t.number]) for o in fits)]
    if not front:
        return []
    fastest = min(point[t.number][1] for t in front)
    chosen = choose(study) if budget_bytes is None else fastest_fitting(trials, budget, info.seq_len)
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
    """What ``autoremat._cli.plot.plot_study`` draws, besides the front: the groups that have points, and
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
