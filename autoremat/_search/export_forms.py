"""A study's answer in the user's framework, or the nearest measured one that has a form.

``autoremat export`` writes a trial's schedule as the tuner's YAML, as MaxText's
``remat_policy: custom`` keys or as Flax's ``policy=`` (``FORMATS``; the translation is
``autoremat._schedules.frameworks``). A pick those frameworks cannot write (several
levels, groups with different policies, binomial) is not silently approximated: the
export says why and names the nearest schedule the study *measured* that they can write
-- the fastest such trial within the budget, else the one nearest the budget by memory
-- with its figures (``nearest``), which the command exports when asked.

The problem's ``checkpoint_name`` tags come from the study (``name_costs``, recorded
for a layer stack with tags), so the MaxText block lists every tag, kept or not. A
study of a recurrence (its scan runs time steps, not layers: ``is_recurrence``) has no
MaxText form at all -- MaxText's keys name the values of a decoder layer -- and its Flax
form speaks of the cell run at each time step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from autoremat._errors import TuneError
from autoremat._measure.measurement import Measurement
from autoremat._schedules.base import Schedule
from autoremat._schedules.frameworks import FrameworkPolicy, framework_policy
from autoremat._search.attrs import DOT_FORMS
from autoremat._search.pareto import export_trial
from autoremat._search.study import (
    StudyInfo,
    checkpoint_names,
    choose,
    is_recurrence,
    measured_trials,
    trial_schedule,
)

if TYPE_CHECKING:
    import optuna

#: What ``autoremat export`` writes: the tuner's schedule file, MaxText's config keys,
#: Flax's remat line.
FORMATS: Final = ("yaml", "maxtext", "flax")


@dataclass(frozen=True)
class Figures:
    """A trial's measured figures (``Measurement``).

    Attributes:
      number: the trial (``None``: a schedule file's, from its ``meta``).
      schedule: the schedule in one line.
      total_bytes: the compiled estimate (argument + output + temp - alias).
      fit_bytes: the figure its fit was decided by (the measured runtime peak where one
        was measured, else ``total_bytes``).
      step_seconds: the median step time.
      fits: within the study's budget.
    """

    number: int | None
    schedule: str
    total_bytes: int | None
    fit_bytes: int | None
    step_seconds: float | None
    fits: bool


@dataclass(frozen=True)
class FrameworkExport:
    """What ``export`` found for one trial in one format.

    Attributes:
      format: one of ``FORMATS``.
      schedule: the trial's schedule, with the ``meta`` ``tune`` writes.
      figures: its measured figures.
      form: its one-policy-per-layer form (``framework_policy``).
      budget_bytes: the study's budget (``None``: a schedule file without one).
      nearest: where the format cannot write ``schedule``: the nearest measured trial it
        can (``nearest_expressible``), its schedule and form; ``None`` when none was
        measured, or not needed.
      recurrence: the scan runs the time steps of a recurrence, not layers
        (``is_recurrence``); ``seq_len``: how many (``None``: not known).
    """

    format: str
    schedule: Schedule
    figures: Figures
    form: FrameworkPolicy
    budget_bytes: int | None = None
    nearest: FrameworkExport | None = None
    recurrence: bool = False
    seq_len: int | None = None

    @property
    def expressible(self) -> bool:
        """The format can write this schedule."""
        return expressible(self.form, self.format, self.recurrence)


def expressible(form: FrameworkPolicy, fmt: str, recurrence: bool = False) -> bool:
    """``fmt`` can write the schedule ``form`` translates (YAML writes any; MaxText no
    recurrence: its keys name a decoder layer's values)."""
    if fmt == "maxtext":
        return form.maxtext_ok and not recurrence
    return fmt == "yaml" or form.flax_ok


def check_format(fmt: str) -> str:
    """``fmt`` when it is one of ``FORMATS``, else a ``TuneError`` naming the valid ones."""
    if fmt not in FORMATS:
        raise TuneError(f"format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def study_dots(study: optuna.Study | None) -> dict[str, tuple[str, ...]]:
    """The dots policies the study recorded as keeping exactly some tags (``DOT_FORMS``)."""
    found = study.user_attrs.get(DOT_FORMS) if study is not None else None
    if not isinstance(found, dict):
        return {}
    return {str(p): tuple(map(str, t)) for p, t in found.items() if isinstance(t, list)}


def framework_export(study: optuna.Study, number: int | None = None,
                     fmt: str = "maxtext") -> FrameworkExport:
    """Trial ``number`` (default: the study's pick) in format ``fmt``; where ``fmt`` cannot
    write it, ``nearest`` is the nearest measured trial it can.

    Raises:
      TuneError: a bad format, no such trial, or no pick (nothing fits) when none is named.
    """
    check_format(fmt)
    if number is None:
        pick = choose(study)
        if pick is None:
            raise TuneError(f"trial: study {study.study_name!r} has no trial within its "
                            "budget to export; name one (see 'autoremat pareto')")
        number = pick.number
    schedule = export_trial(study, number)  # first: its error names the trial
    info = StudyInfo.of(study)
    tags, recurrence = checkpoint_names(study), is_recurrence(study)
    dots = study_dots(study)
    m = next(t.measurement for t in measured_trials(study) if t.number == number)
    out = FrameworkExport(fmt, schedule, _figures(number, schedule, m, info.budget_bytes),
                          framework_policy(schedule, tags, dots, recurrence=recurrence),
                          info.budget_bytes, recurrence=recurrence, seq_len=info.seq_len)
    if out.expressible:
        return out
    return _with_nearest(out, study, tags)


def schedule_export(schedule: Schedule, fmt: str = "maxtext",
                    study: optuna.Study | None = None) -> FrameworkExport:
    """A schedule file's schedule in format ``fmt`` (figures from its ``meta``, and whether
    its scan is a recurrence: the study's, else the ``meta``'s ``layer_stack``); where
    ``fmt`` cannot write it and ``study`` is given, ``nearest`` is found there."""
    check_format(fmt)
    meta = dict(schedule.meta)
    budget = meta.get("budget_bytes")
    total, step = meta.get("total_bytes"), meta.get("step_seconds")
    peak = meta.get("runtime_peak_bytes")
    trial = meta.get("trial")
    figures = Figures(trial if isinstance(trial, int) else None, schedule.describe(),
                      total if isinstance(total, int) else None,
                      peak if isinstance(peak, int) else total if isinstance(total, int)
                      else None, step if isinstance(step, (int, float)) else None,
                      isinstance(budget, int) and isinstance(total, int) and total <= budget)
    tags = checkpoint_names(study) if study is not None else ()
    recurrence = is_recurrence(study) if study is not None else meta.get("layer_stack") is False
    seq_len = meta.get("seq_len")
    out = FrameworkExport(fmt, schedule, figures,
                          framework_policy(schedule, tags, study_dots(study),
                                           recurrence=recurrence),
                          budget if isinstance(budget, int) else None, recurrence=recurrence,
                          seq_len=seq_len if isinstance(seq_len, int) else None)
    if out.expressible or study is None:
        return out
    return _with_nearest(out, study, tags)


def nearest_expressible(study: optuna.Study, fmt: str,
                        tags: tuple[str, ...] = ()) -> FrameworkExport | None:
    """The measured trial ``fmt`` can write that is fastest within the study's budget
    (ties: less memory, then the lower number); when none fits, the one with the least
    memory (the nearest the budget); ``None`` when ``fmt`` can write none of them."""
    info = StudyInfo.of(study)
    recurrence = is_recurrence(study)
    dots = study_dots(study)
    found = [(t, form) for t in measured_trials(study)
             if t.measurement.fit_bytes is not None
             and expressible(form := framework_policy(t.schedule, tags, dots,
                                                      recurrence=recurrence),
                             fmt, recurrence)]
    fits = [(t, f) for t, f in found if t.measurement.fits(info.budget_bytes)]
    if fits:
        t, form = min(fits, key=lambda p: (p[0].measurement.step_seconds or 0.0,
                                           p[0].measurement.fit_bytes or 0, p[0].number))
    elif found:
        t, form = min(found, key=lambda p: (p[0].measurement.fit_bytes or 0, p[0].number))
    else:
        return None
    schedule = trial_schedule(study, t, info)
    return FrameworkExport(fmt, schedule,
                           _figures(t.number, schedule, t.measurement, info.budget_bytes),
                           framework_policy(schedule, tags, dots, recurrence=recurrence),
                           info.budget_bytes, recurrence=recurrence, seq_len=info.seq_len)


def _with_nearest(out: FrameworkExport, study: optuna.Study,
                  tags: tuple[str, ...]) -> FrameworkExport:
    nearest = nearest_expressible(study, out.format, tags)
    return replace(out, nearest=nearest)


def _figures(number: int, schedule: Schedule, m: Measurement, budget: int) -> Figures:
    return Figures(number, schedule.describe(), m.total_bytes, m.fit_bytes, m.step_seconds,
                   m.fits(budget))
