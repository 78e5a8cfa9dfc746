"""What a planner has measured: the timed and cut schedules, the best, the patience left.

A planner stops compiling when ``PATIENCE`` of its own candidates compiled within the
budget since the best last improved by ``IMPROVES`` (where the time model is off,
compiles after the pick changed nothing: ``studies/results/tune_time.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from autoremat._measure.measurement import Measurement
from autoremat._search.planning import untimed

#: Compiles within the budget, since the best last improved, before the search stops.
PATIENCE: Final = 5
#: An improvement of the best by less than this (its timing noise) does not count.
IMPROVES: Final = 0.01


@dataclass
class Standings:
    """The measured figures of one planner's study.

    Attributes:
      budget_bytes: the memory budget a schedule must fit.
      timed: key -> ``(fit bytes, step seconds)`` of each schedule timed in full.
      cut: key -> ``(fit bytes, seconds of one run)`` of each timing cut short.
      overstated: the most a sized total exceeded its run's peak (``untimed.Reach``).
      since_best: the planner's compiles within the budget since the best last improved.
    """

    budget_bytes: int
    timed: dict[str, tuple[int, float]] = field(default_factory=dict)
    cut: dict[str, tuple[int, float]] = field(default_factory=dict)
    overstated: int | None = None
    since_best: int = 0
    _improved: float | None = None  # the best's seconds when it last improved
    _best_key: str | None = None

    @property
    def best(self) -> tuple[str, int, float] | None:
        """``(key, fit_bytes, step_seconds)`` of the fastest timed schedule that fits."""
        fits = [(s, b, k) for k, (b, s) in self.timed.items() if b <= self.budget_bytes]
        if not fits:
            return None
        s, b, k = min(fits)
        return k, b, s

    def record(self, key: str, m: Measurement) -> None:
        """One measured trial's figures (its fit: the runtime peak where there is one)."""
        fit = m.fit_bytes
        if m.step_seconds is not None and fit is not None:
            self.timed[key] = (fit, m.step_seconds)
        elif m.cut_seconds is not None and fit is not None:
            self.cut[key] = (fit, m.cut_seconds)
        self.overstated = untimed.overstated_after(self.overstated, m)

    def measured(self) -> dict[str, tuple[int, float]]:
        """Every timing, cut or not: key -> ``(bytes, seconds)`` (what the model fits)."""
        return {**self.cut, **self.timed}

    def new_best(self) -> str | None:
        """The best's key where it changed since the last call (``None``: it did not); an
        improvement by ``IMPROVES`` or more restarts the patience."""
        best = self.best
        if best is None:
            return None
        if self._improved is None or best[2] < (1 - IMPROVES) * self._improved:
            self._improved, self.since_best = best[2], 0
        if best[0] == self._best_key:
            return None
        self._best_key = best[0]
        return best[0]

    def compiled_within(self, fits: bool) -> None:
        """The planner compiled one of its own candidates; ``fits``: within the budget."""
        self.since_best += fits

    def patience_left(self) -> int:
        """How many more of the planner's compiles that fit may come before the best
        improves (``PATIENCE``): after that, no compile more."""
        return max(0, PATIENCE - self.since_best)

    def reach(self, platform: str) -> untimed.Reach:
        """The figures ``untimed``'s rules read."""
        return untimed.Reach(self.budget_bytes, platform, self.overstated,
                             tuple(self.timed.values()))
