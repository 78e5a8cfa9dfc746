"""What a planner's models say of a candidate: its time, its bytes, whether to go on.

The time model (``predict.TimeModel``, calibrated on the study's own timed trials) and
the memory model (``MemoryModel``) predict; ``untimed``'s pure rules decide on their
figures and the ``Standings``. The stop rule: a candidate predicted slower than the best
measured schedule that fits by ``STOP_RATIO``, widened by twice the time model's
leave-one-out error (a model off by 15% must not rule out a schedule predicted 20%
slower), up to ``MAX_STOP``, is not worth timing -- nor is anything ranked after it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from autoremat._search.planning import untimed
from autoremat._search.planning.candidates import Candidate, Verdict
from autoremat._search.planning.memory_model import MemoryModel
from autoremat._search.planning.predict import TimeModel
from autoremat._search.planning.presets import Presets
from autoremat._search.planning.standings import Standings

#: Stop when the best prediction left is this much slower than the best measured
#: (at least; ``Judge.stop_ratio`` widens it by the model's error, up to ``MAX_STOP``).
STOP_RATIO: Final = 1.15
MAX_STOP: Final = 1.6


@dataclass
class Judge:
    """The models and the standings of one planner, asked of one candidate at a time.

    Attributes:
      platform: where the study runs (``untimed.Reach``).
      explore_front: every fitting schedule not dominated is timed (no timing competes
        with the best: ``rival``).
      presets: a layer stack's presets, ranked first (``None``: not a layer stack).
    """

    platform: str
    standings: Standings
    time_model: TimeModel
    memory_model: MemoryModel
    explore_front: bool = False
    presets: Presets | None = None

    @property
    def budget_bytes(self) -> int:
        return self.standings.budget_bytes

    def total(self, cand: Candidate) -> float | None:
        """Total bytes: sized, else the memory model's guess (``None``: no guess yet)."""
        sized = cand.sized
        return sized.total_bytes if sized is not None else self.memory_model.predict(
            cand.structure)

    def predict(self, cand: Candidate) -> float | None:
        """Predicted step seconds (``None`` before any schedule was timed)."""
        return self.time_model.predict(cand.structure, float(self.total(cand) or 0))

    def calibrated(self) -> bool:
        """The stop rule applies: two timings fitted, one of them fits the budget."""
        return self.time_model.points >= 2 and self.standings.best is not None

    def stop_ratio(self, cand: Candidate | None = None) -> float:
        """``STOP_RATIO`` widened by twice the time model's median error, at most
        ``MAX_STOP``; for ``cand``, scaled by its distance to the nearest timed
        schedule (``TimeModel.nearest``): a neighbour of a timed one is predicted
        well, so it must be predicted within ``STOP_RATIO`` to be timed."""
        d = 1.0
        if cand is not None:
            d = self.time_model.nearest(cand.structure, float(self.total(cand) or 0))[0]
        return min(MAX_STOP, max(STOP_RATIO, 1.0 + 2.0 * self.time_model.error * d))

    def past_stop(self, predicted: float, cand: Candidate | None = None, *,
                  explore: bool = False) -> bool:
        """Predicted slower than the stop allows: not worth timing -- and, without
        ``cand``, nor anything ranked after it; with ``cand``, by its own ratio (near a
        timed schedule, narrower). Never while ``explore`` (no stop on the predicted
        ratio), nor before the model is ``calibrated``."""
        best = self.standings.best
        return (not explore and self.calibrated() and best is not None
                and predicted > self.stop_ratio(cand) * best[2])

    def stop_seconds(self) -> float | None:
        """The slowest step still worth timing (``None``: no best yet)."""
        best = self.standings.best
        return None if best is None else self.stop_ratio() * best[2]

    def rival(self) -> float | None:
        """The best step that fits, which a timing competes with (``timing.CUT_RATIO``,
        ``BEATEN``); ``None``: time in full (none yet, or the whole front wanted)."""
        best = self.standings.best
        return None if self.explore_front or best is None else best[2]

    def untimed(self, cand: Candidate, dominated: bool = False) -> Verdict | None:
        """Why ``cand``, compiled, is not timed (``untimed.untimed``; ``None``: it may be)."""
        assert cand.compiled is not None
        return untimed.untimed(cand.compiled, self.predict(cand),
                               self.standings.reach(self.platform), dominated)

    def dominated(self, cand: Candidate, predicted: float | None) -> bool:
        """A timed schedule needs no more memory and no more time (``untimed.dominated``)."""
        return untimed.dominated(self.total(cand), predicted, self.standings.timed.values())

    def over_at_runtime(self, cand: Candidate) -> bool:
        return untimed.over_at_runtime(None if cand.sized is None else self.total(cand),
                                       self.standings.reach(self.platform))

    def guessed_over(self, cand: Candidate) -> bool:
        return untimed.guessed_over(self.memory_model.predict(cand.structure),
                                    self.standings.reach(self.platform))

    def surely_over(self, cand: Candidate) -> bool:
        """Not worth a compile: over the budget by the memory model's rule or far over it by
        its guess (``MemoryModel.far_over``) or, in a layer stack, by what the schedule
        keeps (``Presets.over``)."""
        return self.memory_model.surely_over(cand.structure) or self.memory_model.far_over(
            cand.structure, self.budget_bytes) or (
            self.presets is not None and self.presets.over(cand.schedule))

    def first(self, cand: Candidate) -> int | None:
        """The rank of a candidate tried before all others (a layer stack's preset)."""
        return None if self.presets is None else self.presets.priority(cand)

    def rank(self, candidates: Iterable[Candidate],
             compiled_first: bool = False) -> list[tuple[float, Candidate]]:
        """``candidates`` by predicted time (before any timing: fewest evaluations, the
        time model's prior), a layer stack's presets first in their order;
        ``compiled_first``: those already compiled first."""
        ranked = [(self.predict(c), c) for c in candidates]

        def order(pc: tuple[float, Candidate]) -> tuple[float, bool, float]:
            first = self.first(pc[1])
            return (math.inf if first is None else first,
                    compiled_first and pc[1].compiled is None, pc[0])

        return sorted(((p if p is not None else c.structure.evaluations, c) for p, c in ranked),
                      key=order)
