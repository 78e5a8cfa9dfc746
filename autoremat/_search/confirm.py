"""Confirming the answer at full length before it is written.

When the search timed schedules on short runs (``autoremat._search.short_runs``), the
answer (the fastest that fits, or a smaller one tied with it within noise:
``trials.tie_break``) is known only as a prediction. ``confirm`` times it at the
problem's full ``T`` (compiled again; one run when a step is longer than the
time budget) and records the figure beside the prediction, in the study
attr ``confirmed_key(number)``; ``measured_trials`` reads the trial with it
from then on. It goes on while the fastest is still a prediction -- a pick
slower than predicted hands the answer to the next, which is confirmed in
turn -- and confirms the runner-up too when its prediction is within
``BAND`` of the measured pick's time, up to ``MAX_CONFIRMED`` timings.

The time limit bounds the search; the confirmation comes after it. A
full-length step predicted to take longer than the limit and than
``ALWAYS_SECONDS`` (15 minutes) is not run: the pick is written as
predicted (its ``meta`` has ``timed_seq_len < seq_len``), and ``confirm``
says what limit would time it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Final

from autoremat._measure.measure import compile_schedule
from autoremat._measure.measurement import figure_names
from autoremat._measure.problem import Problem
from autoremat._measure.timing import time_compiled
from autoremat._search.attrs import confirmed_key
from autoremat._search.reports import FullLengthTiming, TuneEvent
from autoremat._search.study import MeasuredTrial, StudyInfo, measured_trials
from autoremat._search.trials import fastest_fitting

if TYPE_CHECKING:
    import optuna

#: At most this many full-length timings after a search.
MAX_CONFIRMED: Final = 2
#: A runner-up predicted within this fraction of the measured pick is timed too.
BAND: Final = 0.10
#: A full-length step predicted to take up to this long is timed whatever the time
#: limit (which bounds the search); a longer one only within the limit.
ALWAYS_SECONDS: Final = 900.0


#: The figures a full-length timing replaces (the estimate is the same compile's; the
#: measured runtime peak exists only once the step ran at full length).
_CONFIRMED: Final = figure_names("status", "reason", "failed_at", "out_of_memory",
                                  "step_seconds", "step_samples", "peak_bytes", "loss",
                                  "timed_seq_len", "runtime_peak_bytes")


def _next(trials: list[MeasuredTrial], budget_bytes: int, seq_len: int) -> MeasuredTrial | None:
    """The trial to time at full length next: the answer (``fastest_fitting``: the tie
    break's pick, which ``tune`` returns), if predicted; else the fastest predicted one
    within ``BAND`` of it."""
    best = fastest_fitting(trials, budget_bytes, seq_len)
    if best is None or best.measurement.predicted(seq_len):
        return best
    limit = (1.0 + BAND) * (best.measurement.step_seconds or 0.0)
    rivals = sorted((t for t in trials if t.measurement.fits(budget_bytes)
                     and t.measurement.predicted(seq_len)
                     and (t.measurement.step_seconds or 0.0) <= limit),
                    key=lambda t: (t.measurement.step_seconds, t.number))
    return rivals[0] if rivals else None


def confirm(study: optuna.Study, problem: Problem, info: StudyInfo, *,
            time_limit: float | None, time_budget: float,
            on_confirm: Callable[[TuneEvent], None] | None = None) -> str:
    """Time the pick (and a close runner-up) at full length (module doc), under the
    study's budget (``info``: what the study was made for); the confirmed trials then
    carry ``extrapolated_seconds``. Returns why the pick stays predicted ("": it does not)."""
    budget_bytes = info.budget_bytes
    for _ in range(MAX_CONFIRMED):
        trial = _next(measured_trials(study), budget_bytes, info.seq_len)
        if trial is None:
            break
        predicted = float(trial.measurement.step_seconds or 0.0)
        if time_limit is not None and predicted > max(time_limit, ALWAYS_SECONDS):
            return (f"trial {trial.number}'s step time is predicted from "
                    f"T'={trial.measurement.timed_seq_len}, not measured: one step at "
                    f"T={problem.seq_len} is predicted to take {predicted:.0f} s, over the "
                    f"time limit of {time_limit:.0f} s (a limit of {predicted * 1.2:.0f} s "
                    "would time it)")
        if on_confirm is not None:
            on_confirm(FullLengthTiming(trial.number, trial.schedule, problem.seq_len,
                                        predicted, trial.measurement.short_seq_len))
        compiled = compile_schedule(problem, trial.schedule, budget_bytes=budget_bytes)
        timed = time_compiled(compiled, budget_bytes=budget_bytes, time_budget=time_budget)
        full = replace(timed, timing=replace(timed.timing, timed_seq_len=problem.seq_len))
        compiled.release()
        attrs = full.to_attrs()
        study.set_user_attr(confirmed_key(trial.number), {k: attrs[k] for k in _CONFIRMED})
    return ""
