"""What a planner has measured: the timed and cut schedules, the best, the patience left.

A planner stops compiling when ``PATIENCE`` of its own candidates compiled within the
budget since the best last improved by ``IMPROVES`` (where the time model is off,
compiles after the pick changed nothing: ``studies/results/tune_time.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from autoremat._measure.measurement import Measurement
from autoremat._search.planning import untimed

#: Compiles within the budget, since the best last improved, before the search stops.
PATIENCE: Final = 5
#: An improvement of the best by less than this (its timing noise) does not count.
IMPROVES: Final = 0.01


class Standings:
    """The measured figures of one planner's study, written by ``record`` and
    ``compiled_within`` alone; the rest is read-only."""

    def __init__(self, budget_bytes: int) -> None:
        """``budget_bytes``: the memory budget a schedule must fit."""
        self._budget_bytes = budget_bytes
        self._timed: dict[str, tuple[int, float]] = {}
        self._cut: dict[str, tuple[int, float]] = {}
        self._overstated: int | None = None
        self._since_best = 0
        self._improved: float | None = None  # the best's seconds when it last improved
        self._best_key: str | None = None

    @property
    def budget_bytes(self) -> int:
        """The memory budget a schedule must fit."""
        return self._budget_bytes

    @property
    def timed(self) -> Mapping[str, tuple[int, float]]:
        """key -> ``(fit bytes, step seconds)`` of each schedule timed in full (a live,
        read-only view)."""
        return MappingProxyType(self._timed)

    @property
    def cut(self) -> Mapping[str, tuple[int, float]]:
        """key -> ``(fit bytes, seconds of one run)`` of each timing cut short (a live,
        read-only view)."""
        return MappingProxyType(self._cut)

    @property
    def overstated(self) -> int | None:
        """The most a sized total exceeded its run's peak (``untimed.Reach``; ``None``: no
        run's peak yet)."""
        return self._overstated

    @property
    def since_best(self) -> int:
        """The planner's compiles within the budget since the best last improved."""
        return self._since_best

    @property
    def best(self) -> tuple[str, int, float] | None:
        """``(key, fit_bytes, step_seconds)`` of the fastest timed schedule that fits."""
        fits = [(s, b, k) for k, (b, s) in self._timed.items() if b <= self._budget_bytes]
        if not fits:
            return None
        s, b, k = min(fits)
        return k, b, s

    def record(self, key: str, m: Measurement) -> None:
        """One measured trial's figures (its fit: the runtime peak where there is one)."""
        fit = m.fit_bytes
        if m.step_seconds is not None and fit is not None:
            self._timed[key] = (fit, m.step_seconds)
        elif m.cut_seconds is not None and fit is not None:
            self._cut[key] = (fit, m.cut_seconds)
        self._overstated = untimed.overstated_after(self._overstated, m)

    def measured(self) -> dict[str, tuple[int, float]]:
        """Every timing, cut or not: key -> ``(bytes, seconds)`` (what the model fits)."""
        return {**self._cut, **self._timed}

    def new_best(self) -> str | None:
        """The best's key where it changed since the last call (``None``: it did not); an
        improvement by ``IMPROVES`` or more restarts the patience -- over the last best's
        seconds then, or as measured now where a re-timing revised them lower
        (``autoremat._search.retime``: a challenger that leads the runs in turn by less
        than that is within the noise of the last best, not an improvement)."""
        best = self.best
        if best is None:
            return None
        last = self._timed.get(self._best_key) if self._best_key is not None else None
        baseline = self._improved if last is None or self._improved is None else min(
            self._improved, last[1])
        if baseline is None or best[2] < (1 - IMPROVES) * baseline:
            self._improved, self._since_best = best[2], 0
        if best[0] == self._best_key:
            return None
        self._best_key = best[0]
        return best[0]

    def compiled_within(self, fits: bool) -> None:
        """The planner compiled one of its own candidates; ``fits``: within the budget."""
        self._since_best += fits

    def patience_left(self) -> int:
        """How many more of the planner's compiles that fit may come before the best
        improves (``PATIENCE``): after that, no compile more."""
        return max(0, PATIENCE - self._since_best)

    def reach(self, platform: str) -> untimed.Reach:
        """The figures ``untimed``'s rules read."""
        return untimed.Reach(self._budget_bytes, platform, self._overstated,
                             tuple(self._timed.values()))
