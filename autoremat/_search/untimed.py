"""Why a candidate sized within reach is not timed: over the budget at run time, dominated.

``Planner`` (``autoremat._search.planner``) inherits ``Untimed``. Its ranking
(``Planner._next_once``) and the device's choice while a compile runs
(``planner_ahead.CompilesAhead.meanwhile``) ask the same ``_untimed`` of a compiled
candidate, so the two agree on what is worth timing:

* no executable (it failed, its size decided it is over, or it was released);
* over at run time (``_over_at_runtime``): where a run decides the fit
  (``device_memory.VALIDATED``), sized over the budget by more than any timed schedule's
  size overstated its run's peak (``overstated``, kept by ``_note_run``; on a TPU v5e an
  unfused big model's by 5.34 GB, its stacked outputs, twice);
* dominated (``_dominated``): a timed schedule needs no more memory and no more time
  than this one is predicted to.

Before a compile, the same figures guess: ``total`` (sized, else the memory model's
guess), ``predict`` (the time model's) and ``_guessed_over`` (over at run time by the
memory model's guess; compiled ahead after the rest).
"""

from __future__ import annotations

from autoremat._measure.device_memory import VALIDATED
from autoremat._measure.measurement import Measurement
from autoremat._search.candidates import Candidate, Verdict
from autoremat._search.memory_model import MemoryModel
from autoremat._search.predict import TimeModel


class Untimed:
    """The rules above; the attributes declared here are the planner's."""

    budget_bytes: int
    platform: str
    timed: dict[str, tuple[int, float]]  # key -> (bytes, s)
    memory_model: MemoryModel
    time_model: TimeModel
    #: The most a sized total exceeded the runtime peak of the same schedule's run, in
    #: bytes (0 when none did; ``None``: no run's peak measured yet).
    overstated: int | None

    def _note_run(self, m: Measurement) -> None:
        """A measured trial: how far its size overstated its run's peak (``overstated``)."""
        if m.runtime_peak_bytes is not None and m.total_bytes is not None:
            self.overstated = max(self.overstated or 0, m.total_bytes - m.runtime_peak_bytes)

    def _untimed(self, cand: Candidate, dominated: bool = False) -> Verdict | None:
        """Why ``cand``, compiled, is not timed (``None``: it may be); ``dominated``: a
        dominated one may (a caller that must measure a given number)."""
        assert cand.compiled is not None
        if cand.compiled.executable is None:
            return Verdict.NO_EXECUTABLE
        if self._over_at_runtime(cand):
            return Verdict.OVER_AT_RUNTIME
        if not dominated and self._dominated(cand, self.predict(cand)):
            return Verdict.DOMINATED
        return None

    def _over_at_runtime(self, cand: Candidate) -> bool:
        """Sized over the budget by more than ``overstated``: its run would be over too.
        Only where a run decides the fit; elsewhere its size did already."""
        sized = cand.sized
        return (self.overstated is not None and sized is not None
                and sized.total_bytes is not None and self.platform in VALIDATED
                and sized.total_bytes - self.overstated > self.budget_bytes)

    def _guessed_over(self, cand: Candidate) -> bool:
        """Over the budget by the memory model's guess, less -- where a run decides the fit
        -- the most a size overstated a run (``overstated``): likely not timed, so compiled
        ahead after the rest. On a TPU v5e the big model's threads compiled four to six
        unfused schedules a tune (3-10 s each) that were then over at run time, while the
        device waited for the fused ones behind them."""
        guess = self.memory_model.predict(cand.structure)
        slack = (self.overstated or 0) if self.platform in VALIDATED else 0
        return guess is not None and guess - slack > self.budget_bytes

    def total(self, cand: Candidate) -> float | None:
        """Total bytes: sized, else the memory model's guess (``None``: no guess yet)."""
        sized = cand.sized
        return (sized.total_bytes if sized is not None
                else self.memory_model.predict(cand.structure))

    def predict(self, cand: Candidate) -> float | None:
        """Predicted step seconds (``None`` before any schedule was timed)."""
        return self.time_model.predict(cand.structure, float(self.total(cand) or 0))

    def _dominated(self, cand: Candidate, predicted: float | None) -> bool:
        """A timed schedule needs no more memory (sized, else the memory model's guess)
        and no more time than ``predicted``."""
        total = self.total(cand)
        if predicted is None or total is None:
            return False
        return any(b <= total and s <= predicted for b, s in self.timed.values())
