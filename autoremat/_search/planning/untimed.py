"""Why a candidate sized within reach is not timed: over the budget at run time, dominated.

Pure functions of the figures they name (``Reach``: the budget, the platform, the most a
size overstated a run, the timed schedules' bytes and seconds). The planner's ranking
(``Planner.choose``) and the device's choice while a compile runs (``ahead``'s
``meanwhile``) ask the same ``untimed`` of a compiled candidate, so the two agree on
what is worth timing:

* no executable (it failed, its size decided it is over, or it was released);
* over at run time (``over_at_runtime``): where a run decides the fit
  (``device_memory.VALIDATED``), sized over the budget by more than any timed schedule's
  size overstated its run's peak (``Reach.overstated``, kept by ``overstated_after``; a big
  model's unfused schedules by their stacked outputs, twice: ``studies/results/tune_time.md``);
* dominated (``dominated``): a timed schedule needs no more memory and no more time
  than this one is predicted to.

Before a compile the same figures guess: ``guessed_over`` (over at run time by the
memory model's guess: compiled ahead after the rest).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autoremat._measure.device_memory import VALIDATED
from autoremat._measure.measure import Compiled
from autoremat._measure.measurement import Measurement
from autoremat._search.planning.candidates import Verdict


@dataclass(frozen=True)
class Reach:
    """What decides whether a sized schedule is worth timing.

    Attributes:
      budget_bytes: the memory budget.
      platform: where the study runs (a run decides the fit on ``VALIDATED`` ones).
      overstated: the most a sized total exceeded the runtime peak of the same schedule's
        run, in bytes (0 when none did; ``None``: no run's peak measured yet).
      timed: ``(bytes, step seconds)`` of each schedule timed.
    """

    budget_bytes: int
    platform: str
    overstated: int | None
    timed: tuple[tuple[int, float], ...]


def overstated_after(before: int | None, m: Measurement) -> int | None:
    """``Reach.overstated`` once ``m`` is measured: how far its size overstated its run's
    peak, when that is the most yet."""
    if m.runtime_peak_bytes is not None and m.total_bytes is not None:
        return max(before or 0, m.total_bytes - m.runtime_peak_bytes)
    return before


def over_at_runtime(sized_total: float | None, reach: Reach) -> bool:
    """Sized over the budget by more than ``reach.overstated``: its run would be over too.
    Only where a run decides the fit; elsewhere its size did already."""
    return (reach.overstated is not None and sized_total is not None
            and reach.platform in VALIDATED
            and sized_total - reach.overstated > reach.budget_bytes)


def guessed_over(guess: float | None, reach: Reach) -> bool:
    """Over the budget by the memory model's ``guess``, less -- where a run decides the fit
    -- the most a size overstated a run: likely not timed, so compiled ahead after the rest
    (a big model's threads compiled unfused schedules that were then over at run time,
    while the device waited for the fused ones behind them)."""
    slack = (reach.overstated or 0) if reach.platform in VALIDATED else 0
    return guess is not None and guess - slack > reach.budget_bytes


def dominated(total: float | None, predicted: float | None,
              timed: Iterable[tuple[int, float]]) -> bool:
    """A timed schedule needs no more memory than ``total`` (sized, else guessed) and no
    more time than ``predicted``."""
    if predicted is None or total is None:
        return False
    return any(b <= total and s <= predicted for b, s in timed)


def untimed(compiled: Compiled, predicted: float | None, reach: Reach,
            dominated_too: bool = False) -> Verdict | None:
    """Why a compiled candidate predicted at ``predicted`` seconds is not timed (``None``:
    it may be); ``dominated_too``: a dominated one may (a caller that must measure a given
    number)."""
    if compiled.executable is None:
        return Verdict.NO_EXECUTABLE
    total = compiled.measurement.total_bytes
    if over_at_runtime(total, reach):
        return Verdict.OVER_AT_RUNTIME
    if not dominated_too and dominated(total, predicted, reach.timed):
        return Verdict.DOMINATED
    return None
